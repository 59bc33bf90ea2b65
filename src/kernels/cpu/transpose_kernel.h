#pragma once
// The transpose kernel's contract between its dispatcher (src/kernels/flatten.cpp) and its bodies
// (transpose_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// A batch of matrices, each src [rows, cols] row-major, transposed into dst [cols, rows]:
// dst[m][j][i] = src[m][i][j]. A channels_last map [H * W, C] to NCHW order [C, H * W] is one
// (rows = H * W, cols = C); its gradient back is the other way round. src and dst are fp32 or bf16 as
// the flag says, and do not overlap.
struct TransposeBatch {
  int64_t rows = 0, cols = 0;
  bool bf16 = false;
  const void* src = nullptr;
  void* dst = nullptr;
};

// Matrices [begin, end) of the batch.
using TransposeRun = void (*)(const TransposeBatch& batch, int64_t begin, int64_t end);

struct TransposeKernels {
  TransposeRun run;
};

}  // namespace fasttrain::kernels::detail
