#pragma once
// The cross-entropy kernel's contract between its dispatcher (src/kernels/cross_entropy.cpp) and its
// bodies (cross_entropy_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's entry
// point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// rows x classes logits (fp32, or bf16 where the flag says) and a target class per row, in fp32 arithmetic,
// each row shifted by its maximum m (x - m is exact near the top, where the softmax lives):
//   forward   log_sum[r] = log sum_j exp(x[r, j] - m[r]),
//             loss[r] = log_sum[r] - (1 - e) (x[r, t] - m[r]) - e mean_j (x[r, j] - m[r])   (0 where t is
//             ignore_target)
//   backward  grad[r, j] = scale (exp(x[r, j] - m[r] - log_sum[r]) - e / classes - (1 - e) [j = t])   (0
//             where ignored)
// e = smoothing. Targets were checked by the dispatcher: each is ignore_target or in [0, classes).
struct CrossEntropyRows {
  int64_t rows = 0, classes = 0, ignore_target = -100;
  bool bf16 = false;
  float smoothing = 0.f;
  const void* logits = nullptr;
  const int64_t* targets = nullptr;
  float* row_max = nullptr;  // [rows]: m, written by forward, read by backward
  float* log_sum = nullptr;  // [rows]: the same
  float* losses = nullptr;   // [rows]: forward's
  float scale = 0.f;         // backward: the loss's gradient over the rows counted in its mean
  void* grad_logits = nullptr;
};

// Rows [begin, end).
using CrossEntropyRowsKernel = void (*)(const CrossEntropyRows& rows, int64_t begin, int64_t end);

struct CrossEntropyKernels {
  CrossEntropyRowsKernel forward;
  CrossEntropyRowsKernel backward;
};

}  // namespace fasttrain::kernels::detail
