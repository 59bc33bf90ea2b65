#pragma once
// The narrow linear kernel's contract between its dispatcher (src/kernels/narrow_linear.cpp) and its bodies
// (narrow_linear_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// y = x W^T + b for a Linear with few outputs, in bf16 as CPU autocast runs it: x and W rounded to bf16,
// fp32 sums, y rounded once:
//   forward          y[r, o] = bf16(sum_i x[r, i] w[o, i] + b[o])                  rows [begin, end)
//   input_gradient   dx[r, i] = bf16(sum_o dy[r, o] w[o, i])                        rows [begin, end)
//   weight_gradient  dw[o, i] = sum_r dy[r, o] x[r, i], fp32, not rounded           inputs [begin, end)
// x is read as bf16 values (an fp32 x is rounded on the way in); weight and bias are already rounded.
struct NarrowLinearMaps {
  int64_t rows = 0, inputs = 0, outputs = 0;
  const void* x = nullptr;  // [rows, inputs], fp32 or bf16
  bool x_bf16 = false;
  const float* weight = nullptr;  // [outputs, inputs], bf16 values
  const float* bias = nullptr;    // [outputs], bf16 values, or none
  void* y = nullptr;              // [rows, outputs] bf16
  const void* grad_y = nullptr;   // [rows, outputs] bf16
  void* grad_x = nullptr;         // [rows, inputs], x's dtype, bf16 values
  float* grad_weight = nullptr;   // [outputs, inputs]
};

using NarrowLinearKernel = void (*)(const NarrowLinearMaps& m, int64_t begin, int64_t end);

struct NarrowLinearKernels {
  NarrowLinearKernel forward;
  NarrowLinearKernel input_gradient;
  NarrowLinearKernel weight_gradient;
};

}  // namespace fasttrain::kernels::detail
