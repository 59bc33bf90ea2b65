#pragma once
// The max-pool kernel's backward, for the dispatchers that pool with its argmax bytes (max_pool.cpp,
// conv_max_pool.cpp).
#include <torch/types.h>

#include "fasttrain/kernels/cpu.h"

namespace fasttrain::kernels::detail {

// max_pool2d(input, 2) of channels_last [N, C, H, W] in its dtype, and a byte per output value saying
// which of its window's four won (max_pool_kernel.h's): the max-pool kernel's forward.
struct Pooled {
  torch::Tensor output, argmax;
};
Pooled pool2x2(const torch::Tensor& input, CpuCapability capability);

// grad_output [N, C, H / 2, W / 2] (channels_last, the dtype of the pooled maps) written at each window's
// winner (argmax: a byte per output value, max_pool_kernel.h's) into [N, C, H, W] of `input_sizes`,
// channels_last, zero elsewhere.
torch::Tensor unpool2x2(const torch::Tensor& grad_output, const torch::Tensor& argmax,
                        c10::IntArrayRef input_sizes, CpuCapability capability);

}  // namespace fasttrain::kernels::detail
