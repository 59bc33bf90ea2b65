#pragma once
// GradScaler: dynamic loss scaling for mixed precision, with torch.amp.GradScaler's semantics.
// fp16 gradients underflow to zero below ~6e-8; multiplying the loss by a large scale S before
// backward keeps them representable, and dividing the gradients by S before the optimizer step
// undoes it. S starts at init_scale, is multiplied by backoff_factor whenever a step produced an
// inf/NaN gradient (that optimizer step is skipped), and by growth_factor after growth_interval
// clean steps in a row. With bf16 (same range as fp32) scaling is rarely needed; a disabled
// scaler is a pass-through, so the training step is written once.
//
//   fasttrain::GradScaler scaler(fasttrain::GradScalerOptions().enabled(dtype == torch::kHalf));
//   scaler.scale(loss).backward();          // per micro-batch
//   scaler.unscale_(optimizer);             // optional: before clipping, so the norm is the true one
//   fasttrain::clip_grad_norm(parameters, 1.0);
//   scaler.step(optimizer, lr);             // fasttrain's optimizers skip an inf/NaN step on the device
//   scaler.update();                        // backoff or growth of the scale
//
// Host synchronisation: none with fasttrain's optimizers (optim/optimizer.h), which take the
// found-inf flag and skip on the device (their foreach kernels read it once). With LibTorch's own
// torch::optim optimizers, step() reads found_inf once: it must decide whether to call
// optimizer.step(). scale(), unscale_() and update() stay on the device. Where the LibTorch build
// has ATen's fused kernels for the device (CUDA everywhere; CPU in releases after 1.13) they do the
// work (compat::has_amp_kernels); elsewhere the same arithmetic runs as ordinary tensor ops.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct GradScalerOptions {
  FT_ARG(double, init_scale) = 65536.0;  // 2^16
  FT_ARG(double, growth_factor) = 2.0;
  FT_ARG(double, backoff_factor) = 0.5;
  // Consecutive steps without inf/NaN gradients before the scale grows.
  FT_ARG(int64_t, growth_interval) = 2000;
  FT_ARG(bool, enabled) = true;
};

// What a checkpoint needs to resume scaling exactly (torch's GradScaler.state_dict() plus the
// skipped-step count).
struct GradScalerState {
  bool enabled = true;
  double scale = 65536.0;
  int64_t growth_tracker = 0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t skipped_steps = 0;

  nlohmann::json to_json() const;
  // A missing or mistyped key is an Error naming it.
  static GradScalerState from_json(const nlohmann::json& json);
};

class GradScaler {
 public:
  // Invalid options (init_scale <= 0, growth_factor <= 1, backoff_factor outside (0, 1),
  // growth_interval < 1) throw ConfigError naming scaler.<key>.
  explicit GradScaler(GradScalerOptions options = GradScalerOptions());

  // loss * scale. The scale tensor is created on the first call, on loss's device.
  torch::Tensor scale(const torch::Tensor& loss);

  // Divides the gradients of `optimizer`'s parameters by the scale in place and records whether any
  // was inf/NaN. At most once per optimizer between update()s, and not after step(). Call it before
  // clipping or reading gradients; step() calls it when you did not. fp16 gradients are an error
  // (keep parameters fp32; autocast casts them per op).
  void unscale_(Optimizer& optimizer);
  void unscale_(torch::optim::Optimizer& optimizer);

  // Unscales (if unscale_ was not called) and steps the optimizer at `lr` with the found-inf flag,
  // which skips the update on the device when a gradient was inf/NaN (no host read; counted in
  // skipped_steps()). Once per optimizer between update()s.
  void step(Optimizer& optimizer, const torch::Tensor& lr);
  // LibTorch's optimizers: unscales (if unscale_ was not called) and calls optimizer.step() unless
  // a gradient was inf/NaN (one host read). Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);

  // Once per iteration, after the step()s of all optimizers: backs the scale off if any of them saw
  // inf/NaN, else grows it after growth_interval clean steps. Forgets this iteration's optimizers.
  void update();
  // Sets the scale to `new_scale` instead (the growth tracker is kept) and forgets this iteration.
  void update(double new_scale);

  bool enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }
  // The current scale (host read; 1.0 when disabled; init_scale before the first scale()).
  double scale() const;
  // The scale as a 0-dim fp32 tensor on the loss's device (undefined before the first scale()).
  const torch::Tensor& scale_tensor() const { return scale_; }
  // Clean steps since the scale last changed (host read).
  int64_t growth_tracker() const;
  // Optimizer steps step() skipped because of inf/NaN gradients (a host read of the device count).
  int64_t skipped_steps() const;

  // Data parallel runs whose ranks hold different gradients (ZeRO): combines each found-inf flag
  // (0-dim) over the ranks (a max) before step() reads it, so every rank skips the same steps.
  void set_found_inf_reducer(std::function<void(torch::Tensor&)> reducer) {
    found_inf_reducer_ = std::move(reducer);
  }

  // Save and restore for checkpoints. load_state() on a disabled scaler does nothing; loading the
  // state of a disabled scaler into an enabled one is an error.
  GradScalerState state() const;
  void load_state(const GradScalerState& state);
  // `saved` (this scaler's own state()) back in the tensors it already holds, which a captured step
  // keeps using: the scale, the growth tracker and the skip count of before steps that are undone.
  void put_back(const GradScalerState& saved);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    Stage stage = Stage::kReady;
    // One 0-dim fp32 flag per device holding this optimizer's gradients: 1 if any was inf/NaN.
    std::vector<std::pair<torch::Device, torch::Tensor>> found_inf;
  };

  void require_scale(const char* caller) const;
  void unscale_parameters(const void* key, const std::vector<torch::Tensor>& parameters);
  // step()'s checks, the unscale when not done yet, and the ranks' flags combined.
  OptimizerState& prepare_step(const void* key, const std::function<void()>& unscale);

  GradScalerOptions options_;
  torch::Tensor scale_;                 // 0-dim fp32, created by the first scale()
  torch::Tensor growth_tracker_;        // 0-dim int32, same device
  int64_t skipped_steps_ = 0;           // counted on the host (torch::optim optimizers)
  torch::Tensor skipped_on_device_;     // counted on the device (fasttrain's optimizers)
  int64_t initial_growth_tracker_ = 0;  // from load_state() before the first scale()
  std::unordered_map<const void*, OptimizerState> per_optimizer_;  // keyed by the optimizer's address
  std::function<void(torch::Tensor&)> found_inf_reducer_;
};

// The arithmetic of ATen's two fused loss-scaling kernels as plain tensor ops, which GradScaler runs
// where the build registers no kernel for the device (CPU in LibTorch 1.13; 2.x has CPU kernels).
// Public so that a test holds them to ATen's kernels where both exist.
namespace portable_amp {
// For each gradient: found_inf = 1 if it holds an inf/NaN (checked before unscaling), then
// gradient *= inv_scale. (at::_amp_foreach_non_finite_check_and_unscale_)
void non_finite_check_and_unscale(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                  const torch::Tensor& inv_scale);
// found_inf > 0: scale *= backoff_factor, tracker = 0. Otherwise tracker + 1 == growth_interval:
// scale *= growth_factor unless that overflows fp32, tracker = 0; else tracker += 1.
// (at::_amp_update_scale_)
void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval);
}  // namespace portable_amp

}  // namespace fasttrain
