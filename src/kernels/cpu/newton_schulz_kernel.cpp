// Muon's quintic Newton-Schulz iteration for one small matrix X [S, L] (S <= L), in one call:
//   X <- bf16(X / bf16(|X|_F))
//   S steps of   G = bf16(X X^T)            [S, S]
//                P = bf16(b G + c G G)      [S, S]
//                X = bf16(a X + P X)        [S, L]
// torch.optim.Muon computes each line as a bf16 matmul (ATen's mm and addmm: fp32 sums, one rounding
// of the result); this body rounds at the same points, so the two differ only where their fp32 sums,
// added in another order, fall on either side of a bf16 rounding boundary. For the small matrices
// (conv kernels, a classifier) ATen's fifteen matmuls cost their dispatch many times over; here they
// are three loops over rows that stay in L1. Compiled once per CPU capability (CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

inline float round_bf16(float value) {
  return static_cast<float>(c10::BFloat16(value));
}

void round_row_bf16(float* row, int64_t width) {
  for (int64_t i = 0; i < width; ++i) row[i] = round_bf16(row[i]);
}

// out [width] = alpha (sum_k weights[k] rows[k]) + beta self, rows `stride` apart: addmm's alpha A B +
// beta C for one row, in fp32.
void addmm_row(float alpha, const float* weights, const float* rows, int64_t count, int64_t stride,
               float beta, const float* self, int64_t width, float* out) {
  by_vectors(width, [&](int64_t j, int64_t n) {
    Vec sum(0.f);
    for (int64_t k = 0; k < count; ++k)
      sum = at::vec::fmadd(Vec(weights[k]), Vec::loadu(rows + k * stride + j, n), sum);
    at::vec::fmadd(Vec(alpha), sum, Vec(beta) * Vec::loadu(self + j, n)).store(out + j, n);
  });
}

void normalise(const detail::NewtonSchulzMatrix& m) {
  const int64_t count = m.rows * m.cols;
  const float norm = round_bf16(std::sqrt(row_dot(m.x, m.x, count)));
  const float divisor = std::max(norm, round_bf16(m.eps));
  for (int64_t i = 0; i < count; ++i) m.x[i] = round_bf16(m.x[i] / divisor);
}

void run(const detail::NewtonSchulzMatrix& m) {
  const int64_t s = m.rows, l = m.cols;
  std::vector<float> gram(s * s), poly(s * s), next(s * l);
  normalise(m);
  for (int64_t step = 0; step < m.steps; ++step) {
    for (int64_t i = 0; i < s; ++i) {  // G = X X^T, symmetric
      for (int64_t j = 0; j <= i; ++j)
        gram[i * s + j] = gram[j * s + i] = round_bf16(row_dot(m.x + i * l, m.x + j * l, l));
    }
    for (int64_t i = 0; i < s; ++i) {  // P = b G + c G G
      addmm_row(m.c, gram.data() + i * s, gram.data(), s, s, m.b, gram.data() + i * s, s,
                poly.data() + i * s);
      round_row_bf16(poly.data() + i * s, s);
    }
    for (int64_t i = 0; i < s; ++i) {  // X = a X + P X
      addmm_row(1.f, poly.data() + i * s, m.x, s, l, m.a, m.x + i * l, l, next.data() + i * l);
      round_row_bf16(next.data() + i * l, l);
    }
    std::copy(next.begin(), next.end(), m.x);
  }
}

// ATen's lerp as its vectorised CPU kernel computes it: one fused multiply-add from whichever end is nearer.
inline float lerp_as_aten(float start, float end, float weight) {
  return std::abs(weight) < 0.5f ? std::fma(weight, end - start, start)
                                 : std::fma(weight - 1.f, end - start, end);
}

void muon_step(const detail::MuonMatrix& m) {
  const int64_t count = m.rows * m.cols;
  const bool tall = m.rows > m.cols;
  auto memory = [&](int64_t i) { return m.offsets ? m.offsets[i] : i; };
  auto wide = [&](int64_t i) { return tall ? (i % m.cols) * m.rows + i / m.cols : i; };  // i's place in X
  for (int64_t i = 0; i < count; ++i) {
    const int64_t at = memory(i);
    m.buffer[at] = lerp_as_aten(m.buffer[at], m.grad[at], m.to_grad);
    const float update = m.nesterov ? lerp_as_aten(m.grad[at], m.buffer[at], m.momentum) : m.buffer[at];
    m.ns.x[wide(i)] = round_bf16(update);
  }
  run(m.ns);
  // Three passes, as mul_, the product and sub_ are three ops: fused, the update would round once less.
  for (int64_t i = 0; i < count; ++i) m.param[memory(i)] *= m.decay;
  for (int64_t i = 0; i < count; ++i) m.ns.x[i] = round_bf16(m.ns.x[i]) * m.scale;
  for (int64_t i = 0; i < count; ++i) m.param[memory(i)] -= m.ns.x[wide(i)];
}

}  // namespace

detail::NewtonSchulzKernels newton_schulz_kernels() {
  return {&run, &muon_step};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
