#pragma once
// The Newton-Schulz kernel's contract between its dispatcher (src/kernels/newton_schulz.cpp) and its
// bodies (newton_schulz_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's
// entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// One matrix X [rows, cols], rows <= cols (the wide orientation: X X^T the smaller Gram matrix), held
// in fp32 with bf16 values, orthogonalised in place: X <- X / |X|_F, then `steps` times
// X <- a X + (b G + c G G) X with G = X X^T, each product rounded to bf16 where torch.optim.Muon's
// bf16 matmuls round (fp32 sums inside).
struct NewtonSchulzMatrix {
  int64_t rows = 0, cols = 0, steps = 0;
  float a = 0, b = 0, c = 0, eps = 0;
  float* x = nullptr;
};

using NewtonSchulzRun = void (*)(const NewtonSchulzMatrix& matrix);

struct NewtonSchulzKernels {
  NewtonSchulzRun run;
};

}  // namespace fasttrain::kernels::detail
