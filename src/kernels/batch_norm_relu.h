#pragma once
// batch_norm_relu's per-channel terms (batch_norm_relu.cpp), for a kernel that runs an evaluation's
// BatchNorm + ReLU in its own epilogue (the AMX conv's, conv_max_pool.cpp) and must compute what
// batch_norm_relu computes.
#include <torch/types.h>

namespace fasttrain::kernels::detail {

// Whether `t` is what batch_norm_relu takes for a per-channel parameter or statistic: fp32 [channels],
// contiguous, on the CPU.
bool channel_vector(const torch::Tensor& t, int64_t channels);

// fp32 [4, C], rows mean, invstd, scale (weight * invstd) and shift (the bias), for y = max(0, (x - mean) *
// scale + shift), from BatchNorm2d's running statistics, weight and bias (fp32 [C] each) and eps: the terms
// batch_norm_relu evaluates with.
torch::Tensor batch_norm_relu_running_terms(const torch::Tensor& weight, const torch::Tensor& bias,
                                            const torch::Tensor& running_mean,
                                            const torch::Tensor& running_var, double eps);

}  // namespace fasttrain::kernels::detail
