#pragma once
// The BatchNorm + ReLU kernel's contract between its dispatcher (src/kernels/batch_norm_relu.cpp) and its
// bodies (batch_norm_relu_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's
// entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// Channels_last maps [N, C, H, W] seen as rows x channels (rows = N * H * W, a row the C values of one
// pixel, contiguous in NHWC). x, y, grad_y and grad_x are fp32 or bf16 as the flag says; the per-channel
// arrays are fp32 [channels]; the partial arrays fp32 [chunks][channels].
//   forward   y = max(0, (x - mean) * scale + shift)     scale = weight * invstd, shift = bias
//   backward  g = grad_y where (x - mean) * scale + shift > 0, else 0 (ReLU's mask, recomputed from x)
//             grad_x = g * scale + (x - mean) * grad_centered + grad_offset   (training: batch statistics)
//             grad_x = g * scale                                            (evaluation: running ones)
struct BatchNormReluMaps {
  int64_t rows = 0, channels = 0;
  bool bf16 = false;
  bool batch_statistics = false;  // backward: the gradient through the mean and variance too
  const void* x = nullptr;
  void* y = nullptr;
  const void* grad_y = nullptr;
  void* grad_x = nullptr;
  const float* mean = nullptr;
  const float* scale = nullptr;
  const float* shift = nullptr;
  const float* grad_centered = nullptr;
  const float* grad_offset = nullptr;
  // statistics: each chunk's mean and its sum of squared deviations from that mean (Chan's merge is the
  // dispatcher's); backward_sums: each chunk's sum of g and of g * (x - mean).
  float* partial_first = nullptr;
  float* partial_second = nullptr;
};

// Chan et al.'s pairwise update of one channel's (mean, sum of squared deviations) over `count` values by a
// group of `n` more with their own: how the bodies merge blocks into a chunk and the dispatcher chunks into
// the batch. The caller adds n to its count after.
inline void join_moments(double count, double n, double group_mean, double group_squares, double& mean,
                         double& squares) {
  const double delta = group_mean - mean, total = count + n;
  squares += group_squares + delta * delta * count * n / total;
  mean += delta * n / total;
}

// Rows [begin, end); the chunked ones write partial row `chunk`.
using BatchNormReluStatistics = void (*)(const BatchNormReluMaps& maps, int64_t begin, int64_t end,
                                         int64_t chunk);
using BatchNormReluNormalize = void (*)(const BatchNormReluMaps& maps, int64_t begin, int64_t end);
using BatchNormReluBackwardSums = void (*)(const BatchNormReluMaps& maps, int64_t begin, int64_t end,
                                           int64_t chunk);
using BatchNormReluBackwardInput = void (*)(const BatchNormReluMaps& maps, int64_t begin, int64_t end);

struct BatchNormReluKernels {
  BatchNormReluStatistics statistics;
  BatchNormReluNormalize normalize;
  BatchNormReluBackwardSums backward_sums;
  BatchNormReluBackwardInput backward_input;
};

}  // namespace fasttrain::kernels::detail
