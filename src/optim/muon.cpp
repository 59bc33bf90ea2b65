// Muon (Keller Jordan's; torch.optim.Muon's arithmetic) for weight matrices, AdamW for the rest.
// For a matrix W [A, B] with gradient G:
//   M <- mu M + (1 - mu) G                          (torch.optim.Muon's buffer: an EMA, not a sum)
//   U <- G + mu (M - G) if Nesterov, else M
//   O <- NS5(U): U / |U|_F, then 5 quintic Newton-Schulz steps X <- a X + (b X X^T + c (X X^T)^2) X,
//        in bf16, on the wide orientation (X X^T the smaller Gram matrix); for small fp32 matrices on the
//        CPU the whole step (M, U, O and W) is one fasttrain kernel call (optim.muon_newton_schulz)
//   W <- W (1 - lr wd) - lr s O,  s = 0.2 sqrt(max(A, B)) (match_rms_adamw) or sqrt(max(1, A / B))
// Conv kernels [out, in, kh, kw] are orthogonalised as [out, in kh kw] (Keller's form; torch.optim.Muon
// takes only 2-d parameters). Everything else (biases, norms, optim.muon_exclude) steps with AdamW at
// lr x optim.muon_adamw_lr_scale. Each incoming group splits into a muon group and an AdamW group
// with its weight decay, so a checkpoint names which is which by its state fields.
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <vector>

#include "adam_update.h"
#include "fasttrain/detail/compat.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

bool steps_as_matrix(const std::string& name, const torch::Tensor& param, const OptimizerOptions& options) {
  if (param.dim() < 2) return false;
  for (const auto& excluded : options.muon_exclude()) {
    if (name.find(excluded) != std::string::npos) return false;
  }
  return true;
}

// Each group's matrices, then its other parameters, as two groups with the group's weight decay.
struct SplitGroups {
  std::vector<ParamGroup> groups;
  std::vector<bool> muon;  // per group
};

SplitGroups split(std::vector<ParamGroup> groups, const OptimizerOptions& options) {
  SplitGroups out;
  for (auto& group : groups) {
    ParamGroup matrices{{}, {}, group.weight_decay}, others{{}, {}, group.weight_decay};
    for (size_t i = 0; i < group.params.size(); ++i) {
      ParamGroup& to = steps_as_matrix(group.names[i], group.params[i], options) ? matrices : others;
      to.names.push_back(group.names[i]);
      to.params.push_back(group.params[i]);
    }
    if (!matrices.params.empty()) out.groups.push_back(std::move(matrices)), out.muon.push_back(true);
    if (!others.params.empty()) out.groups.push_back(std::move(others)), out.muon.push_back(false);
  }
  return out;
}

// The lr multiplier of a matrix [A, B] (a conv kernel as [out, in kh kw]).
double lr_adjustment(const torch::Tensor& param, const std::string& rule) {
  const double a = static_cast<double>(param.size(0));
  const double b = static_cast<double>(param.numel() / param.size(0));
  return rule == "original" ? std::sqrt(std::max(1.0, a / b)) : 0.2 * std::sqrt(std::max(a, b));
}

enum : size_t { kMuonMomentum = 0 };  // a matrix's one state slot (AdamW's parameters: detail::AdamSlot)

class Muon : public Optimizer {
 public:
  Muon(SplitGroups split, const OptimizerOptions& options)
      : Optimizer(std::move(split.groups), options, "aten::_fused_adamw_", options.beta1()),
        muon_(std::move(split.muon)) {}

  const std::vector<std::string>& state_fields(size_t group) const override {
    static const std::vector<std::string> buffer = {"momentum_buffer"}, moments = {"exp_avg", "exp_avg_sq"};
    return muon_[group] ? buffer : moments;
  }
  bool counts_steps(size_t group) const override { return !muon_[group]; }
  bool steps_shards() const override { return false; }

  nlohmann::json group_options(size_t group) const override {
    if (muon_[group]) {
      return {{"lr", options().lr()},
              {"momentum", muon_momentum_},
              {"nesterov", options().muon_nesterov()},
              {"ns_steps", options().muon_ns_steps()},
              {"adjust_lr_fn", options().muon_adjust_lr()},
              {"weight_decay", weight_decay_of(group)}};
    }
    return detail::adam_group_options(options().lr() * options().muon_adamw_lr_scale(),
                                      adamw_hyperparameters(group));
  }

  void set_group_options(size_t group, const nlohmann::json& j) override {
    FT_CHECK(j.contains("momentum") == muon_[group],
             "optimizer state group {} was saved as {} but is {} here (optim.muon_exclude changed?)", group,
             j.contains("momentum") ? "a muon group" : "an AdamW group", muon_[group] ? "muon's" : "AdamW's");
    if (muon_[group]) {
      muon_momentum_ = j.at("momentum").get<double>();
    } else {
      const detail::AdamHyperparameters saved = detail::read_adam_group_options(j, "muon's AdamW", true);
      set_momentum(saved.beta1);
      beta2_ = saved.beta2;
      eps_ = saved.eps;
    }
    set_weight_decay(group, j.at("weight_decay").get<double>());
  }

 protected:
  void update_fused(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr,
                    const torch::Tensor& found_inf) override {
    if (muon_[g]) {
      // No fused kernel to skip on the device: read the flag here (one synchronisation).
      if (!found_inf.defined() || found_inf.item<double>() == 0) update_matrices(g, with_grad, lr);
      return;
    }
    detail::adam_fused(gather_params(g, with_grad), gather_grads(g, with_grad),
                       gather(g, detail::kExpAvg, with_grad), gather(g, detail::kExpAvgSq, with_grad),
                       gather_steps(g, with_grad), fused_lr(adamw_lr(lr)), adamw_hyperparameters(g),
                       found_inf);
  }

  void update_foreach(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr) override {
    if (muon_[g]) return update_matrices(g, with_grad, lr);
    detail::adam_foreach(gather_params(g, with_grad), gather_grads(g, with_grad),
                         gather(g, detail::kExpAvg, with_grad), gather(g, detail::kExpAvgSq, with_grad),
                         gather_steps(g, with_grad), adamw_lr(lr), adamw_hyperparameters(g));
  }

 private:
  void update_matrices(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr) {
    const double mu = muon_momentum_, weight_decay = weight_decay_of(g);
    const bool nesterov = options().muon_nesterov();
    const int64_t ns_steps = options().muon_ns_steps();
    const std::string& adjust_rule = options().muon_adjust_lr();
    const bool own_kernel = options().muon_newton_schulz() == "fasttrain";
    std::vector<size_t> composed;  // the matrices muon_matrix_step does not take
    std::vector<kernels::MuonMatrixUpdate> on_kernel;
    std::optional<double> lr_value;
    for (size_t i : with_grad) {
      const torch::Tensor& param = groups()[g].params[i];
      const torch::Tensor& buffer = state(g, kMuonMomentum, i);
      if (!own_kernel || !kernels::muon_matrix_step_takes(param, param.grad(), buffer)) {
        composed.push_back(i);
        continue;
      }
      // The lr is a CPU tensor here: reading it is not a synchronisation.
      if (!lr_value) lr_value = lr.item<double>();
      kernels::MuonMatrixStep step;
      step.momentum = mu;
      step.nesterov = nesterov;
      step.steps = ns_steps;
      step.decay = 1 - *lr_value * weight_decay;
      step.scale = *lr_value * lr_adjustment(param, adjust_rule);
      on_kernel.push_back({param, param.grad(), buffer, step});
    }
    if (!on_kernel.empty()) kernels::muon_matrix_steps(on_kernel);
    if (composed.empty()) return;
    const torch::Tensor lr64 = lr.to(torch::kDouble);
    // The group's decay factor once, not per matrix: these small updates are bound by operator dispatch.
    const torch::Tensor decay = weight_decay != 0 ? 1 - lr64 * weight_decay : torch::Tensor();
    for (size_t i : composed) {
      const torch::Tensor& param = groups()[g].params[i];
      const torch::Tensor grad = param.grad();
      const torch::Tensor& buffer = state(g, kMuonMomentum, i);
      buffer.lerp_(grad, 1 - mu);
      const torch::Tensor update = nesterov ? grad.lerp(buffer, mu) : buffer;
      const torch::Tensor matrix = update.reshape({update.size(0), -1});  // [A, B]
      const torch::Tensor orthogonal =
          (own_kernel && kernels::newton_schulz_takes(matrix) ? kernels::newton_schulz(matrix, ns_steps)
                                                              : kernels::newton_schulz_aten(matrix, ns_steps))
              .reshape(update.sizes());
      if (decay.defined()) param.mul_(decay.to(param.scalar_type()));
      const double adjustment = lr_adjustment(param, adjust_rule);
      param.sub_(orthogonal.to(param.scalar_type()) * (lr64 * adjustment).to(param.scalar_type()));
    }
  }

  torch::Tensor adamw_lr(const torch::Tensor& lr) const {
    const double scale = options().muon_adamw_lr_scale();
    return scale == 1.0 ? lr : lr * scale;
  }
  detail::AdamHyperparameters adamw_hyperparameters(size_t g) const {
    return {momentum(), beta2_, eps_, weight_decay_of(g), /*decoupled=*/true};
  }

  std::vector<bool> muon_;  // per group: stepped by Newton-Schulz (else AdamW)
  double muon_momentum_ = options().muon_momentum();
  double beta2_ = options().beta2();
  double eps_ = options().eps();
};

}  // namespace

OptimizerRecipe muon_recipe() {
  return {[](const OptimizerOptions& options) { return options.beta1(); },
          [](std::vector<ParamGroup> groups, const OptimizerOptions& options) -> std::unique_ptr<Optimizer> {
            return std::make_unique<Muon>(split(std::move(groups), options), options);
          }};
}

}  // namespace fasttrain
