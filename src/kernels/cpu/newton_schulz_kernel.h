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

// One Muon step of a matrix parameter [rows, cols] (fp32, row-major; a conv kernel flattened after its
// first dimension), around the iteration, each line as the ATen op muon composes it from rounds it:
//   buffer <- lerp(buffer, grad, 1 - momentum)                          (buffer.lerp_)
//   update  = nesterov ? lerp(grad, buffer, momentum) : buffer          (grad.lerp)
//   X       = bf16(update), transposed where rows > cols (the wide orientation); `ns` iterates it in place
//   param  <- param * decay - bf16(X) * scale                           (mul_, then sub_ of a product)
// ns.x is scratch of rows * cols values; ns.rows and ns.cols are the wide orientation's. Element i of the
// matrix (row-major, the order reshape gives) sits at memory offset offsets[i] in param, grad and buffer
// (a channels_last conv kernel), or at i where offsets is null.
struct MuonMatrix {
  int64_t rows = 0, cols = 0;
  // momentum and 1 - momentum each rounded from double, as ATen rounds a lerp's weight
  float momentum = 0, to_grad = 1, decay = 1, scale = 0;
  bool nesterov = true;
  float* param = nullptr;
  const float* grad = nullptr;
  float* buffer = nullptr;
  const int64_t* offsets = nullptr;
  NewtonSchulzMatrix ns;
};

using MuonMatrixRun = void (*)(const MuonMatrix& matrix);

struct NewtonSchulzKernels {
  NewtonSchulzRun run;
  MuonMatrixRun muon_step;
};

}  // namespace fasttrain::kernels::detail
