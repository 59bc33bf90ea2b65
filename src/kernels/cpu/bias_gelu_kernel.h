#pragma once
// The bias + tanh-GELU kernel's contract between its dispatcher (src/kernels/bias_gelu.cpp) and its
// bodies (bias_gelu_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's entry
// point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// rows x width values, u = pre + bias (bias broadcast over the rows). Forward: y = gelu_tanh(u) in pre's
// dtype. Backward: grad_pre = grad_y gelu_tanh'(u) in pre's dtype, and each chunk's partial column
// sums of it (fp32, [chunks][width]) for grad_bias. pre, y, grad_y and grad_pre are fp32 or bf16 as
// the flag says; bias fp32.
struct BiasGeluRows {
  int64_t rows = 0, width = 0;
  bool bf16 = false;
  const void* pre = nullptr;
  const float* bias = nullptr;
  void* y = nullptr;
  const void* grad_y = nullptr;
  void* grad_pre = nullptr;
  float* grad_bias_partial = nullptr;
};

// Rows [begin, end); backward adds its column sums into partial row `chunk`.
using BiasGeluForward = void (*)(const BiasGeluRows& rows, int64_t begin, int64_t end);
using BiasGeluBackward = void (*)(const BiasGeluRows& rows, int64_t begin, int64_t end, int64_t chunk);

struct BiasGeluKernels {
  BiasGeluForward forward;
  BiasGeluBackward backward;
};

}  // namespace fasttrain::kernels::detail
