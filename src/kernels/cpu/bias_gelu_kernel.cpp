// The bias add and the tanh-GELU after it, one row at a time in fp32:
//   forward   u = pre + bias,  y = u/2 (1 + tanh(s)),  s = sqrt(2/pi) (u + 0.044715 u^3)
//   backward  grad_pre = grad_y (1/2 (1 + t) + u/2 (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 u^2)),  t = tanh(s)
//             grad_bias += grad_pre (fp32, before any rounding to bf16)
// ATen's formula, with tanh written through exp (below). Compiled once per CPU capability (CMakeLists.txt),
// as attention_kernel.cpp is.
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

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
  const Vec s = u * at::vec::fmadd(u2, Vec(kSqrt2OverPi * kCubic), Vec(kSqrt2OverPi));
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
  const Vec ds = at::vec::fmadd(u2, Vec(3.f * kSqrt2OverPi * kCubic), Vec(kSqrt2OverPi));
  return at::vec::fmadd(Vec(2.f) * u * ds, terms.sech2_quarter_z, terms.half_one_plus_t);
}

void forward(const detail::BiasGeluRows& g, int64_t begin, int64_t end) {
  const int64_t width = g.width;
  std::vector<float> pre_row(g.bf16 ? width : 0), y_row(g.bf16 ? width : 0);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    const float* pre = row_in(g.pre, g.bf16, offset, width, pre_row);
    float* y = row_out(g.y, g.bf16, offset, y_row);
    by_vectors(width, [&](int64_t i, int64_t count) {
      gelu(Vec::loadu(pre + i, count) + Vec::loadu(g.bias + i, count)).store(y + i, count);
    });
    finish_row(y, g.y, g.bf16, offset, width);
  }
}

void backward(const detail::BiasGeluRows& g, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t width = g.width;
  std::vector<float> pre_row(g.bf16 ? width : 0), dy_row(g.bf16 ? width : 0), dpre_row(g.bf16 ? width : 0);
  float* grad_bias = g.grad_bias_partial + chunk * width;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    const float* pre = row_in(g.pre, g.bf16, offset, width, pre_row);
    const float* dy = row_in(g.grad_y, g.bf16, offset, width, dy_row);
    float* dpre = row_out(g.grad_pre, g.bf16, offset, dpre_row);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec u = Vec::loadu(pre + i, count) + Vec::loadu(g.bias + i, count);
      const Vec d = Vec::loadu(dy + i, count) * gelu_derivative(u);
      d.store(dpre + i, count);
      accumulate(grad_bias, i, count, d);
    });
    finish_row(dpre, g.grad_pre, g.bf16, offset, width);
  }
}

}  // namespace

detail::BiasGeluKernels bias_gelu_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
