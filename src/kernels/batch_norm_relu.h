#pragma once
// batch_norm_relu's per-channel terms (batch_norm_relu.cpp), for a kernel that runs an evaluation's
// BatchNorm + ReLU in its own epilogue (the AMX conv's and the fp32 conv bodies' pool_and_store, through
// conv_max_pool.cpp) and must compute what batch_norm_relu computes.
#include <torch/types.h>

namespace fasttrain::kernels::detail {

// Whether `t` is what batch_norm_relu takes for a per-channel parameter or statistic: fp32 [channels],
// contiguous, on the CPU.
bool channel_vector(const torch::Tensor& t, int64_t channels);

// The per-channel values both directions of batch_norm_relu read, for y = max(0, (x - mean) * scale + shift),
// fp32 [4, C] in one allocation.
struct ChannelTerms {
  torch::Tensor all;  // rows: mean, invstd, scale (weight * invstd), shift (the bias)
  float* row(int64_t i) { return all.data_ptr<float>() + i * all.size(1); }
  float* mean() { return row(0); }
  float* invstd() { return row(1); }
  float* scale() { return row(2); }
  float* shift() { return row(3); }
};

// The terms batch_norm_relu evaluates with, from BatchNorm2d's running statistics, weight and bias (fp32 [C]
// each) and eps.
ChannelTerms batch_norm_relu_running_terms(const torch::Tensor& weight, const torch::Tensor& bias,
                                           const torch::Tensor& running_mean,
                                           const torch::Tensor& running_var, double eps);

}  // namespace fasttrain::kernels::detail
