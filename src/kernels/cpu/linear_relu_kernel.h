#pragma once
// The fp32 Linear + ReLU's backward: the contract between its dispatcher (src/kernels/linear_relu.cpp) and
// its bodies (linear_relu_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's entry
// point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// dz = dy where y > 0, else 0 ([rows, outputs]), held as its nonzeros twice: by output (for the weight's
// gradient) and by row (for x's). Each body sums, for inputs [begin, end):
//   input_gradient   dx[r, i] = sum over row r's nonzeros (o, v) of v w[o, i]
//   weight_gradient  dw[o, i] = sum over output o's nonzeros (r, v) of v x[r, i]
// A row or output without nonzeros gets zeros.
struct LinearReluMaps {
  int64_t rows = 0, inputs = 0, outputs = 0;
  const float* x = nullptr;       // [rows, inputs]
  const float* weight = nullptr;  // [outputs, inputs]
  const int64_t* by_output =
      nullptr;  // [outputs + 1]: output o's nonzeros are [by_output[o], by_output[o + 1])
  const int32_t* output_rows = nullptr;  // their rows, increasing
  const float* output_values = nullptr;  // their dz
  const int64_t* by_row = nullptr;       // [rows + 1]: row r's nonzeros are [by_row[r], by_row[r + 1])
  const int32_t* row_outputs = nullptr;  // their outputs, increasing
  const float* row_values = nullptr;     // their dz
  float* grad_x = nullptr;               // [rows, inputs]
  float* grad_weight = nullptr;          // [outputs, inputs]
};

using LinearReluKernel = void (*)(const LinearReluMaps& m, int64_t begin, int64_t end);

struct LinearReluKernels {
  LinearReluKernel input_gradient;
  LinearReluKernel weight_gradient;
};

}  // namespace fasttrain::kernels::detail
