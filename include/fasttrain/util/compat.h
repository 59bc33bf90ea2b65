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

#include <torch/optim/optimizer.h>

namespace fasttrain::compat {

// Drops every gradient (grad = None) so the next backward writes instead of accumulating and the
// memory is freed between steps. LibTorch 2.x has zero_grad(set_to_none); 1.13 only zeroes.
inline void zero_grad_to_none(torch::optim::Optimizer& optimizer) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 0)
  optimizer.zero_grad(/*set_to_none=*/true);
#else
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) parameter.mutable_grad() = torch::Tensor();
  }
#endif
}

}  // namespace fasttrain::compat
