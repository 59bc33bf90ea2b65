#pragma once
// LibTorch-version knowledge for mixed precision: the autocast state API and which devices have
// ATen's fused loss-scaling kernels. PROPOSAL: this block belongs in util/compat.h (the one place
// that knows 1.13 vs 2.x); it lives here only until the lead moves it, and nothing else in
// precision/ or memory/ calls at::autocast's per-device functions directly.
//
//   fasttrain::compat::set_autocast_enabled(torch::kCPU, true);
//   fasttrain::compat::set_autocast_dtype(torch::kCPU, torch::kBFloat16);
//   if (fasttrain::compat::has_amp_kernels(device)) { /* at::_amp_update_scale_ runs there */ }
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorOptions.h>
#include <torch/types.h>

#include "fasttrain/util/compat.h"

namespace fasttrain::compat {

// Autocast state of one device type (thread-local in every LibTorch). 1.13 has one function per
// device (is_enabled() is CUDA, is_cpu_enabled() is CPU); 2.4 takes the device type and deprecates
// the old names, which would warn under -Wall.
inline bool autocast_enabled(c10::DeviceType type) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType type, bool enabled) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType type) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                      : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

// Whether ATen registers a kernel of `op` (an overload-free name such as
// "aten::_amp_update_scale_") for tensors on `device`. LibTorch 1.13 declares
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ for every build but
// registers them for CUDA only; later releases add CPU kernels. Asking the dispatcher instead of
// comparing version numbers keeps this right for every build.
inline bool has_kernel(const char* op, const torch::Device& device) {
  auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  if (!handle) return false;
  return handle->hasKernelForDispatchKey(c10::computeDispatchKey(c10::nullopt, c10::kStrided, device));
}

// Both fused loss-scaling kernels exist for `device`.
inline bool has_amp_kernels(const torch::Device& device) {
  return has_kernel("aten::_amp_foreach_non_finite_check_and_unscale_", device) &&
         has_kernel("aten::_amp_update_scale_", device);
}

}  // namespace fasttrain::compat
