#pragma once
// The tanh-GELU and its derivative on a vector of fp32 lanes, in the namespace of the capability each body
// is compiled for: shared by the bias + GELU kernel and the GELU matmul's epilogues, so both give the same
// bits for the same u.
//   y = u/2 (1 + tanh(s)),  s = sqrt(2/pi) (u + 0.044715 u^3)
//   dy/du = 1/2 (1 + t) + u/2 (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 u^2),  t = tanh(s)
// ATen's formula, with tanh written through exp (below).
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// GELU through z = exp(-2 |s|), which keeps every term accurate in fp32 where tanh(s) is near +-1:
//   (1 + t) / 2 = 1 / (1 + z) for s >= 0, z / (1 + z) below;   1 - t^2 = 4 z / (1 + z)^2
// (the derivative's u/2 (1 - t^2) ds/du multiplies 1 - t^2 by a cube, so 1 - t^2 computed from a
// rounded t would cost ~1e-5 relative far out). Past |s| = 43.5 z is exp_inline's floor, 1.6e-38, where
// it would be smaller: y there is u 1.6e-38 instead of about 0 (-inf at u = -inf, where ATen's is NaN), the
// derivative off by as little. NaN stays NaN.
struct GeluTerms {
  Vec half_one_plus_t, sech2_quarter_z;  // (1 + t) / 2 and z / (1 + z)^2 = (1 - t^2) / 4
};

inline GeluTerms gelu_terms(const Vec& u, const Vec& u2) {
  const Vec s = u * at::vec::fmadd(u2, Vec(kSqrt2OverPi * kGeluCubic), Vec(kSqrt2OverPi));
  const Vec z = exp_inline(s.abs() * Vec(-2.f));
  const Vec r = Vec(1.f) / (Vec(1.f) + z);
  return {Vec::blendv(z * r, r, s >= Vec(0.f)), z * r * r};
}

inline Vec gelu(const Vec& u) {
  return u * gelu_terms(u, u * u).half_one_plus_t;
}

// (1 + t) / 2 + u/2 (1 - t^2) ds/du, ds/du = sqrt(2/pi) (1 + 3 0.044715 u^2).
inline Vec gelu_derivative(const Vec& u) {
  const Vec u2 = u * u;
  const GeluTerms terms = gelu_terms(u, u2);
  const Vec ds = at::vec::fmadd(u2, Vec(3.f * kSqrt2OverPi * kGeluCubic), Vec(kSqrt2OverPi));
  return at::vec::fmadd(Vec(2.f) * u * ds, terms.sech2_quarter_z, terms.half_one_plus_t);
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
