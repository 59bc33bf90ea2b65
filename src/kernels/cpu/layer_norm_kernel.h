#pragma once
// The residual add + LayerNorm kernel's contract between its dispatcher (src/kernels/layer_norm.cpp)
// and its bodies (layer_norm_kernel.cpp, compiled once per CPU capability; bodies.h declares each
// one's entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// rows x width values. Forward: sum = x + branch (+ branch_bias, where set) when there is a branch, in
// x's dtype; y = (sum - mean) * rstd * weight + bias in y's dtype, mean and rstd per row (fp32).
// Backward: x is what forward normalised (its sum where it had a branch); from grad_y (y's dtype) and
// grad_sum (x's dtype: the gradient of the sum, or of x passed on, from its later use; none where it has
// none) it writes grad_x (x's dtype), grad_branch (branch's dtype, where set; where the dtypes agree the
// caller takes grad_x for it) and each chunk's partial sums of grad_weight, grad_bias and, where set,
// grad_branch_bias (fp32, [chunks][width]). Tensors are fp32 or bf16 as the flags say; weight, bias and
// branch_bias fp32.
struct LayerNormRows {
  int64_t rows = 0, width = 0;
  float eps = 0;
  bool x_bf16 = false, branch_bf16 = false, y_bf16 = false;
  const void* x = nullptr;
  const void* branch = nullptr;  // none: y = LayerNorm(x)
  void* sum = nullptr;           // forward writes it where there is a branch
  void* y = nullptr;
  const float* weight = nullptr;
  const float* bias = nullptr;
  const float* branch_bias = nullptr;  // CPU only: the CUDA kernel takes none
  float* mean = nullptr;
  float* rstd = nullptr;
  const void* grad_y = nullptr;
  const void* grad_sum = nullptr;
  void* grad_x = nullptr;
  void* grad_branch = nullptr;
  float* grad_weight_partial = nullptr;
  float* grad_bias_partial = nullptr;
  float* grad_branch_bias_partial = nullptr;
};

// Rows [begin, end); backward adds its parameter gradients into partial row `chunk`.
using LayerNormForward = void (*)(const LayerNormRows& rows, int64_t begin, int64_t end);
using LayerNormBackward = void (*)(const LayerNormRows& rows, int64_t begin, int64_t end, int64_t chunk);

struct LayerNormKernels {
  LayerNormForward forward;
  LayerNormBackward backward;
};

}  // namespace fasttrain::kernels::detail
