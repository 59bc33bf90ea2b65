#pragma once
// The only place that knows which LibTorch we build against (Debian's 1.13 CPU, or a CUDA 2.x).
#include <torch/version.h>

#define FASTTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// LibTorch 2.x has torch::scaled_dot_product_attention, fused AdamW and Kineto with CUDA kernels.
#define FASTTRAIN_HAS_SDPA FASTTRAIN_TORCH_AT_LEAST(2, 0)

namespace fasttrain::compat {
inline const char* torch_version() { return TORCH_VERSION; }
}  // namespace fasttrain::compat
