#include "fasttrain/precision/grad_scaler.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

#include "fasttrain/detail/compat.h"
#include "fasttrain/detail/json.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace portable_amp {

// The arithmetic of aten/src/ATen/native/cuda/AmpKernels.cu, as tensor ops; neither reads a value
// back to the host.
void non_finite_check_and_unscale(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                  const torch::Tensor& inv_scale) {
  std::vector<torch::Tensor> all_finite;
  all_finite.reserve(grads.size());
  for (const torch::Tensor& grad : grads) {
    all_finite.push_back(torch::isfinite(grad).all());
    grad.mul_(inv_scale);
  }
  torch::Tensor found = torch::stack(all_finite).all().logical_not().to(found_inf.scalar_type());
  found_inf.copy_(torch::maximum(found_inf, found));
}

void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval) {
  torch::Tensor found = found_inf > 0;
  torch::Tensor successful = growth_tracker + 1;
  torch::Tensor grow = torch::logical_and(found.logical_not(), successful == growth_interval);
  torch::Tensor grown = scale * growth_factor;
  torch::Tensor kept_or_grown = torch::where(torch::logical_and(grow, torch::isfinite(grown)), grown, scale);
  scale.copy_(torch::where(found, scale * backoff_factor, kept_or_grown));
  growth_tracker.copy_(
      torch::where(torch::logical_or(found, grow), torch::zeros_like(successful), successful));
}

}  // namespace portable_amp

namespace {

// ATen's fused kernel where the build has one for the device, else the same arithmetic as tensor ops.
void non_finite_check_and_unscale(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                  const torch::Tensor& inv_scale) {
  if (compat::has_amp_kernels(found_inf.device())) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  } else {
    portable_amp::non_finite_check_and_unscale(grads, found_inf, inv_scale);
  }
}

void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (compat::has_amp_kernels(scale.device())) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
  } else {
    portable_amp::update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                               growth_interval);
  }
}

}  // namespace

nlohmann::json GradScalerState::to_json() const {
  return {{"enabled", enabled},
          {"scale", scale},
          {"growth_tracker", growth_tracker},
          {"growth_factor", growth_factor},
          {"backoff_factor", backoff_factor},
          {"growth_interval", growth_interval},
          {"skipped_steps", skipped_steps}};
}

GradScalerState GradScalerState::from_json(const nlohmann::json& json) {
  const std::string kWhat = "GradScaler state";
  GradScalerState state;
  state.enabled = json_field<bool>(json, "enabled", kWhat);
  state.scale = json_field<double>(json, "scale", kWhat);
  state.growth_tracker = json_field<int64_t>(json, "growth_tracker", kWhat);
  state.growth_factor = json_field<double>(json, "growth_factor", kWhat);
  state.backoff_factor = json_field<double>(json, "backoff_factor", kWhat);
  state.growth_interval = json_field<int64_t>(json, "growth_interval", kWhat);
  state.skipped_steps = json_field<int64_t>(json, "skipped_steps", kWhat);
  return state;
}

GradScaler::GradScaler(GradScalerOptions options) : options_(std::move(options)) {
  FT_CONFIG_CHECK(std::isfinite(options_.init_scale()) && options_.init_scale() > 0,
                  "scaler.init_scale must be a finite number > 0, got {}", options_.init_scale());
  FT_CONFIG_CHECK(std::isfinite(options_.growth_factor()) && options_.growth_factor() > 1,
                  "scaler.growth_factor must be > 1, got {}", options_.growth_factor());
  FT_CONFIG_CHECK(options_.backoff_factor() > 0 && options_.backoff_factor() < 1,
                  "scaler.backoff_factor must be in (0, 1), got {}", options_.backoff_factor());
  FT_CONFIG_CHECK(options_.growth_interval() >= 1, "scaler.growth_interval must be >= 1, got {}",
                  options_.growth_interval());
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!enabled()) return loss;
  if (!scale_.defined()) {
    auto options = torch::TensorOptions().device(loss.device());
    scale_ = torch::full({}, options_.init_scale(), options.dtype(torch::kFloat));
    growth_tracker_ = torch::full({}, initial_growth_tracker_, options.dtype(torch::kInt));
  }
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

void GradScaler::require_scale(const char* caller) const {
  FT_CHECK(scale_.defined(),
           "GradScaler::{} before any scale(loss): scale the loss and call backward() on the result first",
           caller);
}

namespace {

std::vector<torch::Tensor> parameters_of(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> parameters;
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) parameters.push_back(parameter);
  }
  return parameters;
}

}  // namespace

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  unscale_parameters(&optimizer, parameters_of(optimizer));
}

void GradScaler::unscale_(Optimizer& optimizer) {
  unscale_parameters(&optimizer, optimizer.parameters());
}

void GradScaler::unscale_parameters(const void* key, const std::vector<torch::Tensor>& parameters) {
  if (!enabled()) return;
  require_scale("unscale_");
  OptimizerState& state = per_optimizer_[key];
  FT_CHECK(state.stage != Stage::kUnscaled,
           "GradScaler::unscale_ was already called on this optimizer since the last update()");
  FT_CHECK(state.stage != Stage::kStepped,
           "GradScaler::unscale_ is being called after step(); call it before");

  // 1/scale in double, as torch does, so the reciprocal of a power of two stays exact.
  torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);

  // The fused kernel wants one device and dtype per call: group the gradients that way.
  std::map<std::pair<std::string, int>, std::vector<torch::Tensor>> groups;
  for (const auto& parameter : parameters) {
    const torch::Tensor& grad = parameter.grad();
    if (!grad.defined()) continue;
    FT_CHECK(
        grad.scalar_type() != torch::kHalf,
        "GradScaler::unscale_: a parameter has an fp16 gradient; keep parameters in fp32 (autocast casts "
        "them per op) so the unscaled gradients cannot overflow");
    torch::Tensor values = grad;
    if (grad.is_sparse()) values = grad._values();
    groups[{values.device().str(), static_cast<int>(values.scalar_type())}].push_back(values);
  }
  for (auto& [group_key, grads] : groups) {
    torch::Device device = grads.front().device();
    torch::Tensor* found_inf = nullptr;
    for (auto& [found_device, flag] : state.found_inf) {
      if (found_device == device) found_inf = &flag;
    }
    if (!found_inf) {
      state.found_inf.emplace_back(device, torch::zeros({}, torch::TensorOptions().device(device)));
      found_inf = &state.found_inf.back().second;
    }
    non_finite_check_and_unscale(grads, *found_inf, inv_scale.to(device, /*non_blocking=*/true));
  }
  // An optimizer without gradients still records a (clean) flag, so step() and update() see it.
  if (state.found_inf.empty()) {
    state.found_inf.emplace_back(scale_.device(),
                                 torch::zeros({}, torch::TensorOptions().device(scale_.device())));
  }
  state.stage = Stage::kUnscaled;
}

GradScaler::OptimizerState& GradScaler::prepare_step(const void* key, const std::function<void()>& unscale) {
  require_scale("step");
  FT_CHECK(per_optimizer_[key].stage != Stage::kStepped,
           "GradScaler::step was already called on this optimizer since the last update()");
  if (per_optimizer_[key].stage == Stage::kReady) unscale();
  OptimizerState& state = per_optimizer_[key];
  if (found_inf_reducer_) {
    for (auto& [device, flag] : state.found_inf) found_inf_reducer_(flag);
  }
  state.stage = Stage::kStepped;
  return state;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!enabled()) {
    optimizer.step();
    return true;
  }
  OptimizerState& state = prepare_step(&optimizer, [&] { unscale_(optimizer); });
  // The one host read of a step: whether to step at all.
  double found = 0;
  for (auto& [device, flag] : state.found_inf) found += flag.item<double>();
  if (found != 0) {
    ++skipped_steps_;
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::step(Optimizer& optimizer, const torch::Tensor& lr) {
  if (!enabled()) {
    optimizer.step(lr);
    return;
  }
  OptimizerState& state = prepare_step(&optimizer, [&] { unscale_(optimizer); });
  // Every device's flag, summed where the learning rate lives: the optimizer skips on it.
  torch::Tensor found;
  for (auto& [device, flag] : state.found_inf) {
    torch::Tensor here = flag.to(lr.device(), /*non_blocking=*/true);
    found = found.defined() ? found + here : here;
  }
  found = found.clamp_max(1);
  if (!skipped_on_device_.defined()) skipped_on_device_ = torch::zeros({}, found.options());
  skipped_on_device_.add_(found);
  optimizer.step(lr, found);
}

void GradScaler::update() {
  if (!enabled()) return;
  require_scale("update");
  torch::Tensor found_inf;
  for (auto& [optimizer, state] : per_optimizer_) {
    for (auto& [device, flag] : state.found_inf) {
      torch::Tensor here = flag.to(scale_.device(), /*non_blocking=*/true);
      found_inf = found_inf.defined() ? found_inf + here : here;
    }
  }
  FT_CHECK(
      found_inf.defined(),
      "GradScaler::update without an unscale_() or step() since the last update(): no inf checks to use");
  update_scale(scale_, growth_tracker_, found_inf, options_.growth_factor(), options_.backoff_factor(),
               options_.growth_interval());
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!enabled()) return;
  require_scale("update");
  FT_CHECK(std::isfinite(new_scale) && new_scale > 0,
           "GradScaler::update: new scale must be finite and > 0, got {}", new_scale);
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::scale() const {
  if (!enabled()) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale();
}

int64_t GradScaler::skipped_steps() const {
  if (!skipped_on_device_.defined()) return skipped_steps_;
  return skipped_steps_ + static_cast<int64_t>(skipped_on_device_.item<double>());
}

int64_t GradScaler::growth_tracker() const {
  if (!enabled()) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : initial_growth_tracker_;
}

GradScalerState GradScaler::state() const {
  GradScalerState state;
  state.enabled = enabled();
  state.scale = scale();
  state.growth_tracker = growth_tracker();
  state.growth_factor = options_.growth_factor();
  state.backoff_factor = options_.backoff_factor();
  state.growth_interval = options_.growth_interval();
  state.skipped_steps = skipped_steps();
  return state;
}

void GradScaler::load_state(const GradScalerState& state) {
  if (!enabled()) return;
  FT_CHECK(
      state.enabled,
      "GradScaler::load_state: the state was saved from a disabled GradScaler (scaler.enabled = false); it "
      "has no scale to resume");
  // The saved factors win, as in torch's load_state_dict; validate them like options.
  GradScaler validated(GradScalerOptions()
                           .init_scale(state.scale)
                           .growth_factor(state.growth_factor)
                           .backoff_factor(state.backoff_factor)
                           .growth_interval(state.growth_interval));
  FT_CHECK(state.growth_tracker >= 0, "GradScaler::load_state: growth_tracker must be >= 0, got {}",
           state.growth_tracker);
  options_ = validated.options_.enabled(true);
  skipped_steps_ = state.skipped_steps;
  skipped_on_device_ = torch::Tensor();
  initial_growth_tracker_ = state.growth_tracker;
  if (scale_.defined()) {
    scale_.fill_(state.scale);
    growth_tracker_.fill_(state.growth_tracker);
  }
  per_optimizer_.clear();
}

void GradScaler::put_back(const GradScalerState& saved) {
  if (!enabled()) return;
  if (scale_.defined()) {
    scale_.fill_(saved.scale);
    growth_tracker_.fill_(saved.growth_tracker);
  } else {
    initial_growth_tracker_ = saved.growth_tracker;
  }
  if (skipped_on_device_.defined()) skipped_on_device_.zero_();
  skipped_steps_ = saved.skipped_steps;  // the device's count was in it
  per_optimizer_.clear();
}

}  // namespace fasttrain
