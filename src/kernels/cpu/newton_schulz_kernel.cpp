// Muon's quintic Newton-Schulz iteration for one small matrix X [S, L] (S <= L), in one call:
//   X <- bf16(X / bf16(|X|_F))
//   S steps of   G = bf16(X X^T)            [S, S]
//                P = bf16(b G + c G G)      [S, S]
//                X = bf16(a X + P X)        [S, L]
// torch.optim.Muon computes each line as a bf16 matmul (ATen's mm and addmm: fp32 sums, one rounding
// of the result); this body rounds at the same points, so the two differ only where their fp32 sums,
// added in another order, fall on either side of a bf16 rounding boundary. For the small matrices
// (conv kernels, a classifier) ATen's fifteen matmuls cost their dispatch many times over; here they
// are three loops over rows that stay in L1, four rows (or four dot products) at a time sharing each load,
// every sum in the order of one row's, and vector passes for the roundings and the momentum. Compiled once
// per CPU capability (CMakeLists.txt).
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

// Each value rounded to bf16 as c10::BFloat16 rounds a finite value or an infinity (a NaN stays a NaN, its
// sign and payload kept where c10 writes 0x7FC0).
void round_row_bf16(float* row, int64_t width) {
  by_vectors(width, [&](int64_t i, int64_t n) { round_to_bf16(Vec::loadu(row + i, n)).store(row + i, n); });
}

// out_r = alpha (sum_k weights_r[k] rows[k]) + beta self_r for kRows rows r at once: weights_r rows of
// `count`, rows, self_r and out_r rows of `width`, all row-major; addmm's alpha A B + beta C, in fp32. The
// rows share each load of rows[k], and their sums are independent chains; each lane's sum still runs
// k = 0, 1, ... in order, as one row's would.
template <int kRows>
void addmm_rows(float alpha, const float* weights, const float* rows, int64_t count, float beta,
                const float* self, int64_t width, float* out) {
  by_vectors(width, [&](int64_t j, int64_t n) {
    whole_or_partial(n, [&](auto whole) {
      Vec sum[kRows];
      for (int r = 0; r < kRows; ++r) sum[r] = Vec(0.f);
      for (int64_t k = 0; k < count; ++k) {
        const Vec row = load_lanes<whole.value>(rows + k * width + j, n);
        for (int r = 0; r < kRows; ++r) sum[r] = at::vec::fmadd(Vec(weights[r * count + k]), row, sum[r]);
      }
      for (int r = 0; r < kRows; ++r) {
        const Vec kept = Vec(beta) * Vec::loadu(self + r * width + j, n);
        at::vec::fmadd(Vec(alpha), sum[r], kept).store(out + r * width + j, n);
      }
    });
  });
}

// out = alpha A B + beta C for A [s, s] and B, C, out [s, width], each value rounded to bf16: four rows at a
// time, then one.
void addmm_rounded(float alpha, const float* a, const float* b, float beta, const float* c, int64_t s,
                   int64_t width, float* out) {
  int64_t i = 0;
  for (; i + 4 <= s; i += 4)
    addmm_rows<4>(alpha, a + i * s, b, s, beta, c + i * width, width, out + i * width);
  for (; i < s; ++i) addmm_rows<1>(alpha, a + i * s, b, s, beta, c + i * width, width, out + i * width);
  round_row_bf16(out, s * width);
}

// dots[d] = a . b_d for kDots rows b_d (`width` apart), sharing each load of a: each dot's lanes and their
// sum as row_dot's.
template <int kDots>
void row_dots(const float* a, const float* b, int64_t width, float* dots) {
  Vec total[kDots];
  for (int d = 0; d < kDots; ++d) total[d] = Vec(0.f);
  by_vectors(width, [&](int64_t i, int64_t count) {
    whole_or_partial(count, [&](auto whole) {
      const Vec x = load_lanes<whole.value>(a + i, count);
      for (int d = 0; d < kDots; ++d)
        total[d] = at::vec::fmadd(x, load_lanes<whole.value>(b + d * width + i, count), total[d]);
    });
  });
  for (int d = 0; d < kDots; ++d) dots[d] = lanes_sum(total[d]);
}

void normalise(const detail::NewtonSchulzMatrix& m) {
  const int64_t count = m.rows * m.cols;
  const float norm = round_bf16(std::sqrt(row_dot(m.x, m.x, count)));
  const float divisor = std::max(norm, round_bf16(m.eps));
  by_vectors(count, [&](int64_t i, int64_t n) {
    round_to_bf16(Vec::loadu(m.x + i, n) / Vec(divisor)).store(m.x + i, n);
  });
}

void run(const detail::NewtonSchulzMatrix& m) {
  const int64_t s = m.rows, l = m.cols;
  std::vector<float> gram(s * s), poly(s * s), next(s * l);
  normalise(m);
  for (int64_t step = 0; step < m.steps; ++step) {
    for (int64_t i = 0; i < s; ++i) {  // G = X X^T, symmetric
      int64_t j = 0;
      for (; j + 4 <= i + 1; j += 4) {
        float dots[4];
        row_dots<4>(m.x + i * l, m.x + j * l, l, dots);
        for (int64_t d = 0; d < 4; ++d) gram[i * s + j + d] = gram[(j + d) * s + i] = round_bf16(dots[d]);
      }
      for (; j <= i; ++j)
        gram[i * s + j] = gram[j * s + i] = round_bf16(row_dot(m.x + i * l, m.x + j * l, l));
    }
    // P = b G + c G G;  X = a X + P X
    addmm_rounded(m.c, gram.data(), gram.data(), m.b, gram.data(), s, s, poly.data());
    addmm_rounded(1.f, poly.data(), m.x, m.a, m.x, s, l, next.data());
    std::copy(next.begin(), next.end(), m.x);
  }
}

// ATen's lerp as its vectorised CPU kernel computes it: one fused multiply-add from whichever end is nearer.
inline Vec lerp_as_aten(const Vec& start, const Vec& end, float weight) {
  return std::abs(weight) < 0.5f ? fused_multiply_add(Vec(weight), end - start, start)
                                 : fused_multiply_add(Vec(weight - 1.f), end - start, end);
}

// The element-wise passes run in memory order (param, grad and buffer share one layout, and a dense layout's
// offsets are a permutation); only the moves into and out of X's row-major [S, L] follow the offsets.
void muon_step(const detail::MuonMatrix& m) {
  const int64_t count = m.rows * m.cols;
  const bool tall = m.rows > m.cols;
  auto memory = [&](int64_t i) { return m.offsets ? m.offsets[i] : i; };
  auto wide = [&](int64_t i) { return tall ? (i % m.cols) * m.rows + i / m.cols : i; };  // i's place in X
  std::vector<float> update(static_cast<size_t>(count));                                 // in memory order
  by_vectors(count, [&](int64_t i, int64_t n) {
    const Vec grad = Vec::loadu(m.grad + i, n);
    const Vec buffer = lerp_as_aten(Vec::loadu(m.buffer + i, n), grad, m.to_grad);
    buffer.store(m.buffer + i, n);
    round_to_bf16(m.nesterov ? lerp_as_aten(grad, buffer, m.momentum) : buffer).store(update.data() + i, n);
  });
  for (int64_t i = 0; i < count; ++i) m.ns.x[wide(i)] = update[memory(i)];
  run(m.ns);
  // Three passes, as mul_, the product and sub_ are three ops: fused, the update would round once less.
  by_vectors(count, [&](int64_t i, int64_t n) {
    (Vec::loadu(m.param + i, n) * Vec(m.decay)).store(m.param + i, n);
  });
  by_vectors(count, [&](int64_t i, int64_t n) {
    (round_to_bf16(Vec::loadu(m.ns.x + i, n)) * Vec(m.scale)).store(m.ns.x + i, n);
  });
  for (int64_t i = 0; i < count; ++i) update[memory(i)] = m.ns.x[wide(i)];
  by_vectors(count, [&](int64_t i, int64_t n) {
    (Vec::loadu(m.param + i, n) - Vec::loadu(update.data() + i, n)).store(m.param + i, n);
  });
}

}  // namespace

detail::NewtonSchulzKernels newton_schulz_kernels() {
  return {&run, &muon_step};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
