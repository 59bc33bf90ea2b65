#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

// Beyond these the iteration's matmuls outweigh their dispatch, and ATen's blocked GEMMs are faster.
constexpr int64_t kLargestSmallerSide = 64;
constexpr int64_t kLargestMatrix = 65536;

detail::NewtonSchulzKernels newton_schulz_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(newton_schulz_kernels, capability);
}

}  // namespace

bool newton_schulz_takes(const torch::Tensor& update) {
  return detail::cpu_float_or_bf16(update) && update.dim() == 2 && update.numel() > 0 &&
         std::min(update.size(0), update.size(1)) <= kLargestSmallerSide && update.numel() <= kLargestMatrix;
}

torch::Tensor newton_schulz(const torch::Tensor& update, int64_t steps,
                            const NewtonSchulzCoefficients& coefficients, CpuCapability capability) {
  FT_CHECK(
      newton_schulz_takes(update),
      "newton_schulz takes a matrix [A, B] on the CPU in fp32 or bf16 with min(A, B) <= {} and at most {} "
      "values; got {} {}",
      kLargestSmallerSide, kLargestMatrix, update.defined() ? update.sizes() : c10::IntArrayRef{},
      update.defined() ? c10::toString(update.scalar_type()) : "none");
  FT_CHECK(steps >= 0, "newton_schulz: steps must be >= 0, got {}", steps);
  detail::check_runnable(capability, "newton_schulz");
  torch::NoGradGuard no_grad;
  const bool tall = update.size(0) > update.size(1);
  torch::Tensor x = update.to(torch::kBFloat16);
  if (tall) x = x.t();                   // [S, L], S <= L
  x = x.to(torch::kFloat).contiguous();  // its bf16 values, in the fp32 the body computes in
  detail::NewtonSchulzMatrix matrix;
  matrix.rows = x.size(0);
  matrix.cols = x.size(1);
  matrix.steps = steps;
  matrix.a = static_cast<float>(coefficients.a);
  matrix.b = static_cast<float>(coefficients.b);
  matrix.c = static_cast<float>(coefficients.c);
  matrix.eps = static_cast<float>(coefficients.eps);
  matrix.x = x.data_ptr<float>();
  newton_schulz_bodies(capability).run(matrix);
  x = x.to(torch::kBFloat16);
  return tall ? x.t() : x;
}

torch::Tensor newton_schulz_aten(const torch::Tensor& update, int64_t steps,
                                 const NewtonSchulzCoefficients& coefficients) {
  const NewtonSchulzCoefficients& k = coefficients;
  const bool tall = update.size(0) > update.size(1);
  torch::Tensor x = update.to(torch::kBFloat16);
  if (tall) x = x.t();  // [S, L]: X X^T is the smaller Gram matrix
  x = x / x.norm().clamp_min(k.eps);
  for (int64_t step = 0; step < steps; ++step) {
    const torch::Tensor gram = torch::mm(x, x.t());                       // [S, S]
    const torch::Tensor poly = torch::addmm(gram, gram, gram, k.b, k.c);  // b G + c G G
    x = torch::addmm(x, poly, x, k.a);                                    // a X + P X
  }
  return tall ? x.t() : x;
}

}  // namespace fasttrain::kernels
