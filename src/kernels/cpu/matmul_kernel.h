#pragma once
// fasttrain's fp32 matmul's contract between its dispatchers (src/kernels/matmul.cpp, gelu_mlp.cpp) and its
// bodies (matmul_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// A matmul a [rows, depth] @ b [depth, width] in fp32, with an epilogue on the product's tile while it is in
// registers and cache:
//   product        out = a @ b
//   gelu_forward   pre = a @ b,  y = gelu_tanh(pre + bias)                  (the MLP's fc, a = x, b = fc^T)
//   gelu_backward  grad_pre = (a @ b) gelu_tanh'(pre + bias), grad_bias += grad_pre (a = grad_y, b = proj)
// b is read packed: `panel_width` columns at a time, [panels][depth][panel_width], zeros past width.
struct TiledMatmul {
  int64_t rows = 0, depth = 0, width = 0;
  const float* a = nullptr;         // [rows, depth]
  const float* b_panels = nullptr;  // pack's output
  float* out = nullptr;             // [rows, width], product
  const float* bias = nullptr;      // [width]
  float* pre = nullptr;             // [rows, width]: forward writes it, backward reads it
  float* y = nullptr;               // [rows, width], forward
  float* grad_pre = nullptr;        // [rows, width], backward
  float* grad_bias_partial =
      nullptr;  // [chunks][width], backward adds its rows' column sums into its chunk's
};

// b's panels [begin, end) into `panels`: b is [depth, width], or with `transposed` a weight [width, depth].
using PackPanels = void (*)(const float* b, int64_t depth, int64_t width, bool transposed, float* panels,
                            int64_t begin, int64_t end);
// Rows [begin, end).
using MatmulRows = void (*)(const TiledMatmul& m, int64_t begin, int64_t end);
using MatmulRowsSummed = void (*)(const TiledMatmul& m, int64_t begin, int64_t end, int64_t chunk);

struct MatmulKernels {
  int64_t panel_width;
  PackPanels pack;
  MatmulRows product;
  MatmulRows gelu_forward;
  MatmulRowsSummed gelu_backward;
};

}  // namespace fasttrain::kernels::detail
