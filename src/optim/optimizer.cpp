#include "fasttrain/optim/optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// Each counter + 1. On the CPU a write to each 0-dim fp32 counter: the foreach op dispatches an add (and
// a cast of the 1) per counter, 57-69 us a step for the main job's seven in its profile.
void count_step(std::vector<torch::Tensor>& steps) {
  const bool host_counters = std::all_of(steps.begin(), steps.end(), [](const torch::Tensor& s) {
    return s.device().is_cpu() && s.scalar_type() == torch::kFloat && s.numel() == 1;
  });
  if (!host_counters) {
    torch::_foreach_add_(steps, 1);
    return;
  }
  for (auto& s : steps) *s.data_ptr<float>() += 1;
}

}  // namespace

// Defined with each kind (optim/adam.cpp, optim/sgd.cpp).
OptimizerRecipe sgd_recipe();
OptimizerRecipe adam_recipe();
OptimizerRecipe adamw_recipe();
OptimizerRecipe muon_recipe();

// ---- the registry ----

Registry<OptimizerRecipe>& optimizer_registry() {
  static Registry<OptimizerRecipe> registry = [] {
    Registry<OptimizerRecipe> optimizers("optim.name");
    optimizers.add("sgd", "SGD with momentum (optim.momentum) and optional Nesterov (optim.nesterov)",
                   sgd_recipe());
    optimizers.add("adam", "Adam; weight decay is L2, added to the gradient", adam_recipe());
    optimizers.add("adamw", "Adam with decoupled weight decay (p <- p (1 - lr wd) before the update)",
                   adamw_recipe());
    optimizers.add(
        "muon",
        "Muon: momentum orthogonalised by Newton-Schulz for weight matrices and conv kernels (flattened "
        "to [out, in x kernel]), AdamW for the rest (optim.muon_*)",
        muon_recipe());
    return optimizers;
  }();
  return registry;
}

std::vector<std::string> optimizer_names() {
  return optimizer_registry().names();
}

const std::vector<std::string>& optimizer_kernel_names() {
  static const std::vector<std::string> names = {"auto", "fused", "foreach"};
  return names;
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<ParamGroup> groups, const OptimizerOptions& options) {
  check_keys(options, "optim");
  const OptimizerRecipe& recipe = optimizer_registry().at(options.name());
  std::unique_ptr<Optimizer> optimizer = recipe.make(std::move(groups), options);
  optimizer->factory_ = recipe.make;
  return optimizer;
}

std::unique_ptr<Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters, const OptimizerOptions& options) {
  check_keys(options, "optim");
  // Decaying biases and norm scales toward 0 only hurts (they set offsets and scales, not
  // capacity), so every parameter with dim <= 1 trains without weight decay.
  ParamGroup decay{{}, {}, options.weight_decay()}, no_decay{{}, {}, 0.0};
  for (const auto& item : named_parameters) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;  // frozen parameters are not the optimizer's to update
    ParamGroup& group = p.dim() <= 1 ? no_decay : decay;
    group.names.push_back(item.key());
    group.params.push_back(p);
  }
  FT_CHECK(!decay.params.empty() || !no_decay.params.empty(),
           "optimizer '{}' got no trainable parameters ({} parameters, none requires grad)", options.name(),
           named_parameters.size());
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return make_optimizer(std::move(groups), options);
}

// ---- Optimizer ----

Optimizer::Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options, const char* fused_kernel,
                     double momentum)
    : groups_(std::move(groups)),
      options_(std::move(options)),
      momentum_(momentum),
      fused_kernel_(fused_kernel != nullptr ? fused_kernel : "") {
  check_keys(options_, "optim");
  FT_CHECK(!groups_.empty(), "optimizer '{}' got no parameter groups", name());
  for (const auto& group : groups_) {
    FT_CHECK(group.names.size() == group.params.size(), "a parameter group has {} names for {} parameters",
             group.names.size(), group.params.size());
  }
  state_.resize(groups_.size());
  steps_.resize(groups_.size());
  fresh_.resize(groups_.size());
  resolve_kernel();
}

void Optimizer::resolve_kernel() {
  FT_CONFIG_CHECK(options_.kernel() != "fused" || !fused_kernel_.empty(),
                  "optim.kernel = \"fused\": optimizer '{}' has no fused kernel; use \"foreach\" or \"auto\"",
                  name());
  const torch::Device device =
      groups_.front().params.empty() ? torch::Device(torch::kCPU) : groups_.front().params.front().device();
  const bool available =
      !fused_kernel_.empty() && compat::has_fused_optimizer_kernel(fused_kernel_.c_str(), device);
  FT_CONFIG_CHECK(
      options_.kernel() != "fused" || available,
      "optim.kernel = \"fused\": ATen's {} is not available for {} in LibTorch {} (it needs 2.4 or "
      "later); use \"foreach\" or \"auto\"",
      fused_kernel_, device.str(), compat::torch_version());
  fused_ = options_.kernel() != "foreach" && available;
}

void Optimizer::update_fused(size_t, const std::vector<size_t>&, const torch::Tensor&, const torch::Tensor&) {
  FT_CHECK(false, "optimizer '{}' has no fused kernel (its update_fused was called)", name());
}

std::string Optimizer::describe_kernel() const {
  return fused_ ? fmt::format("fused ({})", fused_kernel_.substr(fused_kernel_.find("::") + 2)) : "foreach";
}

std::vector<torch::Tensor> Optimizer::parameters() const {
  std::vector<torch::Tensor> all;
  for (const auto& group : groups_) all.insert(all.end(), group.params.begin(), group.params.end());
  return all;
}

void Optimizer::set_momentum(double momentum) {
  FT_CHECK(std::isfinite(momentum) && momentum >= 0 && momentum < 1, "momentum must be in [0, 1), got {}",
           momentum);
  momentum_ = momentum;
}

double Optimizer::momentum() const {
  return momentum_;
}

void Optimizer::size_state() {
  if (!stepped_.empty()) return;
  stepped_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const size_t n = groups_[g].params.size();
    state_[g].assign(state_fields(g).size(), std::vector<torch::Tensor>(n));
    steps_[g].assign(n, torch::Tensor());
    stepped_[g].assign(n, false);
    fresh_[g].assign(n, false);
  }
}

bool Optimizer::has_state(size_t group, size_t index) const {
  return !stepped_.empty() && stepped_[group][index];
}

void Optimizer::ensure_state(size_t group, const std::vector<size_t>& with_grad) {
  size_state();
  const auto& params = groups_[group].params;
  fresh_[group].assign(params.size(), false);
  for (size_t i : with_grad) {
    if (stepped_[group][i]) continue;
    for (auto& field : state_[group]) field[i] = torch::zeros_like(params[i], torch::MemoryFormat::Preserve);
    if (counts_steps(group)) steps_[group][i] = torch::zeros({}, params[i].options().dtype(torch::kFloat));
    stepped_[group][i] = fresh_[group][i] = true;
  }
}

void Optimizer::step(const torch::Tensor& lr, const torch::Tensor& found_inf) {
  FT_CHECK(lr.defined() && lr.dim() == 0 && lr.is_floating_point(),
           "Optimizer::step takes the learning rate as a 0-dim floating tensor");
  torch::NoGradGuard no_grad;
  // The foreach ops cannot skip on the device: decide on the host (one read), as torch.amp does.
  if (!fused_ && found_inf.defined() && found_inf.item<double>() > 0) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<size_t> with_grad;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (groups_[g].params[i].grad().defined()) with_grad.push_back(i);
    }
    if (with_grad.empty()) continue;
    ensure_state(g, with_grad);
    if (counts_steps(g)) {
      auto steps = gather_steps(g, with_grad);
      count_step(steps);
      if (fused_) {
        update_fused(g, with_grad, lr, found_inf);
        // A skipped step is not counted (what torch.optim's fused path does).
        if (found_inf.defined())
          torch::_foreach_sub_(steps, std::vector<torch::Tensor>(steps.size(), found_inf));
      } else {
        update_foreach(g, with_grad, lr);
      }
    } else if (fused_) {
      update_fused(g, with_grad, lr, found_inf);
    } else {
      update_foreach(g, with_grad, lr);
    }
  }
}

void Optimizer::zero_grad() {
  for (auto& group : groups_) {
    for (auto& parameter : group.params) parameter.mutable_grad() = torch::Tensor();
  }
}

torch::Tensor Optimizer::fused_lr(const torch::Tensor& lr) {
  return lr.is_cpu() ? lr : lr.to(torch::kFloat);
}

std::vector<torch::Tensor> Optimizer::gather(size_t group, size_t field,
                                             const std::vector<size_t>& indices) const {
  std::vector<torch::Tensor> out;
  out.reserve(indices.size());
  for (size_t i : indices) out.push_back(state_[group][field][i]);
  return out;
}

std::vector<torch::Tensor> Optimizer::gather_params(size_t group, const std::vector<size_t>& indices) const {
  std::vector<torch::Tensor> out;
  out.reserve(indices.size());
  for (size_t i : indices) out.push_back(groups_[group].params[i]);
  return out;
}

std::vector<torch::Tensor> Optimizer::gather_grads(size_t group, const std::vector<size_t>& indices) const {
  std::vector<torch::Tensor> out;
  out.reserve(indices.size());
  for (size_t i : indices) out.push_back(groups_[group].params[i].grad());
  return out;
}

std::vector<torch::Tensor> Optimizer::gather_steps(size_t group, const std::vector<size_t>& indices) const {
  std::vector<torch::Tensor> out;
  out.reserve(indices.size());
  for (size_t i : indices) out.push_back(steps_[group][i]);
  return out;
}

void Optimizer::set_state(size_t group, size_t index, std::vector<torch::Tensor> fields, int64_t step) {
  FT_CHECK(group < groups_.size() && index < groups_[group].params.size(),
           "optimizer state for parameter {} of group {}, which the optimizer lacks", index, group);
  FT_CHECK(fields.size() == state_fields(group).size(),
           "optimizer '{}' keeps {} state tensors per parameter of group {}, got {}", name(),
           state_fields(group).size(), group, fields.size());
  size_state();
  for (size_t f = 0; f < fields.size(); ++f) state_[group][f][index] = std::move(fields[f]);
  if (counts_steps(group)) {
    const torch::Tensor& param = groups_[group].params[index];
    steps_[group][index] = torch::full({}, static_cast<double>(step), param.options().dtype(torch::kFloat));
  }
  stepped_[group][index] = true;
}

void Optimizer::clear_state() {
  stepped_.clear();
  size_state();
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& t) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& field : state_[g]) std::for_each(field.begin(), field.end(), add);
    std::for_each(steps_[g].begin(), steps_[g].end(), add);
  }
  return bytes;
}

std::unique_ptr<Optimizer> Optimizer::rebuild(std::vector<ParamGroup> groups) const {
  FT_CHECK(groups.size() == groups_.size(), "rebuild: {} parameter groups for an optimizer of {}",
           groups.size(), groups_.size());
  FT_CHECK(factory_,
           "optimizer '{}' was not made by make_optimizer, so it cannot be rebuilt over other "
           "parameters (ZeRO shards)",
           name());
  auto rebuilt = factory_(std::move(groups), options_);
  rebuilt->factory_ = factory_;
  rebuilt->set_momentum(momentum_);
  for (size_t g = 0; g < groups_.size(); ++g) rebuilt->set_group_options(g, group_options(g));
  return rebuilt;
}

}  // namespace fasttrain
