#pragma once
// Autocast: run the forward pass in lower precision (bf16 on CPU; fp16 or bf16 on CUDA) where it
// is safe (matmul, conv, linear) and in fp32 where it is not (reductions, losses), as
// torch.autocast does. Parameters stay fp32; autocast casts them per op and caches the casts of
// weights until the outermost guard exits, so a weight used twice in a forward is cast once.
//
//   torch::ScalarType dtype = fasttrain::parse_precision("bf16", device);   // kBFloat16
//   {
//     fasttrain::AutocastGuard autocast(device, dtype);   // no-op for fp32
//     loss = loss_fn(model->forward(x), y);               // matmuls in bf16, the loss in fp32
//   }
//   scaler.scale(loss).backward();                        // backward outside the guard
//
// Autocast state is thread-local: a guard affects only the thread that created it (not DataLoader
// workers, not other trainers' threads). Guards nest; each restores exactly the state it found.
#include <torch/types.h>

#include <optional>
#include <string>

#include "fasttrain/detail/compat.h"

namespace fasttrain {

// "fp32" -> kFloat (no autocast), "bf16" -> kBFloat16, "fp16" -> kHalf. Anything else, or a dtype
// the device's autocast lacks (fp16 on CPU), is a ConfigError naming train.precision, the value
// and what is allowed. ("auto" is the run layer's to resolve: run/auto.h.)
torch::ScalarType parse_precision(const std::string& name, const torch::Device& device);
// The same rule for a dtype: kFloat, or one `device`'s autocast runs.
void check_precision(torch::ScalarType dtype, const torch::Device& device);

// "fp32" | "bf16" | "fp16" for the dtypes parse_precision returns.
std::string precision_name(torch::ScalarType dtype);

// The autocast state of the current thread for CPU and CUDA: what a region that must run "as the
// forward did" (activation checkpointing's recompute) restores.
struct AutocastState {
  bool cpu_enabled = false;
  torch::ScalarType cpu_dtype = torch::kBFloat16;
  bool cuda_enabled = false;
  torch::ScalarType cuda_dtype = torch::kHalf;
  bool cache_enabled = true;

  static AutocastState current() {
    AutocastState state;
    state.cpu_enabled = compat::autocast_enabled(c10::DeviceType::CPU);
    state.cpu_dtype = compat::autocast_dtype(c10::DeviceType::CPU);
    state.cuda_enabled = compat::autocast_enabled(c10::DeviceType::CUDA);
    state.cuda_dtype = compat::autocast_dtype(c10::DeviceType::CUDA);
    state.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return state;
  }
};

// Installs `state` for its lifetime as one autocast nesting level: the weight-cast cache is cleared
// when the outermost level exits (as torch.autocast.__exit__ does), then the previous state comes
// back. Thread-local, like the state it sets.
class AutocastStateGuard {
 public:
  explicit AutocastStateGuard(const AutocastState& state) : previous_(AutocastState::current()) {
    apply(state);
    at::autocast::increment_nesting();
  }
  ~AutocastStateGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    apply(previous_);
  }
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  static void apply(const AutocastState& state) {
    compat::set_autocast_enabled(c10::DeviceType::CPU, state.cpu_enabled);
    compat::set_autocast_dtype(c10::DeviceType::CPU, state.cpu_dtype);
    compat::set_autocast_enabled(c10::DeviceType::CUDA, state.cuda_enabled);
    compat::set_autocast_dtype(c10::DeviceType::CUDA, state.cuda_dtype);
    at::autocast::set_autocast_cache_enabled(state.cache_enabled);
  }
  AutocastState previous_;
};

// Enables autocast for `device`'s type with `dtype` until the guard exits, then restores the
// previous enabled flag and dtype. A disabled guard (enabled = false, or dtype fp32) changes
// nothing at all; in particular it does not switch off an enclosing autocast region (unlike
// torch.autocast(enabled=False)). Valid dtypes: bf16 on CPU, fp16 or bf16 on CUDA; others throw.
class AutocastGuard {
 public:
  AutocastGuard(torch::Device device, torch::ScalarType dtype, bool enabled = true);
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  bool active() const { return guard_.has_value(); }

 private:
  std::optional<AutocastStateGuard> guard_;
};

}  // namespace fasttrain
