// A residual add and the LayerNorm after it, one row at a time in fp32 in the core's cache:
//   forward   s = x + branch,  y = (s - mean(s)) rstd w + b,  rstd = 1 / sqrt(var(s) + eps)
//   backward  g = dy w,  ds = rstd (g - mean(g) - xhat mean(g xhat)) + d(s from later use),
//             dx = dbranch = ds,  dw += dy xhat,  db += dy
// where xhat = (s - mean) rstd. y may be written in another dtype than x (bf16 for the matmul after it
// under autocast), which saves the cast autocast would make. Compiled once per CPU capability
// (CMakeLists.txt), as attention_kernel.cpp is.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

// Partial loads fill the missing lanes with zeros, so the sum needs no mask.
float row_sum(const float* a, int64_t width) {
  Vec total(0.f);
  by_vectors(width, [&](int64_t i, int64_t count) { total = total + Vec::loadu(a + i, count); });
  return lanes_sum(total);
}

void forward(const detail::LayerNormRows& n, int64_t begin, int64_t end) {
  const int64_t width = n.width;
  std::vector<float> s(static_cast<size_t>(width)), other(static_cast<size_t>(width));
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    load_row(n.x, n.x_bf16, offset, width, s.data());
    if (n.branch != nullptr) {
      load_row(n.branch, n.branch_bf16, offset, width, other.data());
      by_vectors(width, [&](int64_t i, int64_t count) {
        (Vec::loadu(s.data() + i, count) + Vec::loadu(other.data() + i, count)).store(s.data() + i, count);
      });
      store_row(s.data(), n.sum, n.x_bf16, offset, width);
      // What is normalised is the sum as stored, which backward reads again.
      if (n.x_bf16) load_row(n.sum, true, offset, width, s.data());
    }
    const float mean = row_sum(s.data(), width) / static_cast<float>(width);
    const Vec mean_v(mean);
    Vec squares(0.f);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec centred = Vec::loadu(s.data() + i, count) - mean_v;
      const Vec kept = Vec::set(Vec(0.f), centred, count);  // the missing lanes are -mean
      squares = at::vec::fmadd(kept, kept, squares);
    });
    const float rstd = 1.f / std::sqrt(lanes_sum(squares) / static_cast<float>(width) + n.eps);
    const Vec rstd_v(rstd);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec xhat = (Vec::loadu(s.data() + i, count) - mean_v) * rstd_v;
      at::vec::fmadd(xhat, Vec::loadu(n.weight + i, count), Vec::loadu(n.bias + i, count))
          .store(other.data() + i, count);
    });
    store_row(other.data(), n.y, n.y_bf16, offset, width);
    n.mean[r] = mean;
    n.rstd[r] = rstd;
  }
}

void backward(const detail::LayerNormRows& n, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t width = n.width;
  std::vector<float> xhat(static_cast<size_t>(width)), dy(static_cast<size_t>(width)),
      g(static_cast<size_t>(width)), ds(static_cast<size_t>(width));
  float* grad_weight = n.grad_weight_partial + chunk * width;
  float* grad_bias = n.grad_bias_partial + chunk * width;
  const float inverse_width = 1.f / static_cast<float>(width);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    load_row(n.x, n.x_bf16, offset, width, xhat.data());
    load_row(n.grad_y, n.y_bf16, offset, width, dy.data());
    const Vec mean_v(n.mean[r]), rstd_v(n.rstd[r]);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec x = (Vec::loadu(xhat.data() + i, count) - mean_v) * rstd_v;
      x.store(xhat.data() + i, count);
      const Vec d = Vec::loadu(dy.data() + i, count);
      (d * Vec::loadu(n.weight + i, count)).store(g.data() + i, count);
      at::vec::fmadd(d, x, Vec::loadu(grad_weight + i, count)).store(grad_weight + i, count);
      (d + Vec::loadu(grad_bias + i, count)).store(grad_bias + i, count);
    });
    const Vec mean_g(row_sum(g.data(), width) * inverse_width);
    const Vec mean_gx(row_dot(g.data(), xhat.data(), width) * inverse_width);
    if (n.grad_sum != nullptr) {
      load_row(n.grad_sum, n.x_bf16, offset, width, ds.data());
    } else {
      std::fill(ds.begin(), ds.end(), 0.f);
    }
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec centred =
          Vec::loadu(g.data() + i, count) - mean_g - Vec::loadu(xhat.data() + i, count) * mean_gx;
      at::vec::fmadd(centred, rstd_v, Vec::loadu(ds.data() + i, count)).store(ds.data() + i, count);
    });
    store_row(ds.data(), n.grad_x, n.x_bf16, offset, width);
    if (n.grad_branch != nullptr) store_row(ds.data(), n.grad_branch, n.branch_bf16, offset, width);
  }
}

}  // namespace

detail::LayerNormKernels layer_norm_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
