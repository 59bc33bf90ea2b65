// A residual add and the LayerNorm after it, one row at a time in fp32 in the core's cache:
//   forward   s = x + branch (+ branch_bias),  y = (s - mean(s)) rstd w + b,  rstd = 1 / sqrt(var(s) + eps)
//   backward  g = dy w,  ds = rstd (g - mean(g) - xhat mean(g xhat)) + d(s from later use),
//             dx = dbranch = ds,  dw += dy xhat,  db += dy,  dbranch_bias += ds
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

void forward(const detail::LayerNormRows& n, int64_t begin, int64_t end) {
  const int64_t width = n.width;
  const auto scratch = [&] { return std::vector<float>(static_cast<size_t>(width)); };
  std::vector<float> x_scratch = scratch(), branch_scratch = scratch(), sum_scratch = scratch(),
                     y_scratch = scratch();
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    const float* s = row_in(n.x, n.x_bf16, offset, width, x_scratch);
    if (n.branch != nullptr) {
      const float* branch = row_in(n.branch, n.branch_bf16, offset, width, branch_scratch);
      float* sum = row_out(n.sum, n.x_bf16, offset, sum_scratch);
      by_vectors(width, [&](int64_t i, int64_t count) {
        Vec v = Vec::loadu(s + i, count) + Vec::loadu(branch + i, count);
        if (n.branch_bias != nullptr) v = v + Vec::loadu(n.branch_bias + i, count);
        v.store(sum + i, count);
      });
      finish_row(sum, n.sum, n.x_bf16, offset, width);
      // What is normalised is the sum as stored, which backward reads again.
      if (n.x_bf16) load_row(n.sum, true, offset, width, sum);
      s = sum;
    }
    Vec total(0.f);
    by_vectors(width, [&](int64_t i, int64_t count) { total = total + Vec::loadu(s + i, count); });
    const float mean = lanes_sum(total) / static_cast<float>(width);
    const Vec mean_v(mean);
    Vec squares(0.f);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec centred = Vec::loadu(s + i, count) - mean_v;
      const Vec kept = Vec::set(Vec(0.f), centred, count);  // the missing lanes are -mean
      squares = at::vec::fmadd(kept, kept, squares);
    });
    const float rstd = 1.f / std::sqrt(lanes_sum(squares) / static_cast<float>(width) + n.eps);
    const Vec rstd_v(rstd);
    float* y = row_out(n.y, n.y_bf16, offset, y_scratch);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec xhat = (Vec::loadu(s + i, count) - mean_v) * rstd_v;
      at::vec::fmadd(xhat, Vec::loadu(n.weight + i, count), Vec::loadu(n.bias + i, count))
          .store(y + i, count);
    });
    finish_row(y, n.y, n.y_bf16, offset, width);
    n.mean[r] = mean;
    n.rstd[r] = rstd;
  }
}

void backward(const detail::LayerNormRows& n, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t width = n.width;
  const auto scratch = [&] { return std::vector<float>(static_cast<size_t>(width)); };
  std::vector<float> x_scratch = scratch(), dy_scratch = scratch(), grad_sum_scratch = scratch(),
                     ds_scratch = scratch(), xhat = scratch(), g = scratch();
  float* grad_weight = n.grad_weight_partial + chunk * width;
  float* grad_bias = n.grad_bias_partial + chunk * width;
  float* grad_branch_bias =
      n.grad_branch_bias_partial == nullptr ? nullptr : n.grad_branch_bias_partial + chunk * width;
  const float inverse_width = 1.f / static_cast<float>(width);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    const float* s = row_in(n.x, n.x_bf16, offset, width, x_scratch);
    const float* dy = row_in(n.grad_y, n.y_bf16, offset, width, dy_scratch);
    const Vec mean_v(n.mean[r]), rstd_v(n.rstd[r]);
    // g = dy w; the row's sums of g and g xhat ride along (the missing lanes of a partial vector load 0
    // for dy, so for g).
    Vec sum_g(0.f), sum_gx(0.f);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec x = (Vec::loadu(s + i, count) - mean_v) * rstd_v;
      const Vec d = Vec::loadu(dy + i, count);
      const Vec gi = d * Vec::loadu(n.weight + i, count);
      x.store(xhat.data() + i, count);
      gi.store(g.data() + i, count);
      sum_g = sum_g + gi;
      sum_gx = at::vec::fmadd(gi, x, sum_gx);
      accumulate(grad_weight, i, count, d * x);
      accumulate(grad_bias, i, count, d);
    });
    const Vec mean_g(lanes_sum(sum_g) * inverse_width), mean_gx(lanes_sum(sum_gx) * inverse_width);
    const float* grad_sum =
        n.grad_sum == nullptr ? nullptr : row_in(n.grad_sum, n.x_bf16, offset, width, grad_sum_scratch);
    float* ds = row_out(n.grad_x, n.x_bf16, offset, ds_scratch);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec centred =
          Vec::loadu(g.data() + i, count) - mean_g - Vec::loadu(xhat.data() + i, count) * mean_gx;
      Vec d = centred * rstd_v;
      if (grad_sum != nullptr) d = d + Vec::loadu(grad_sum + i, count);
      d.store(ds + i, count);
      if (grad_branch_bias != nullptr) accumulate(grad_branch_bias, i, count, d);
    });
    finish_row(ds, n.grad_x, n.x_bf16, offset, width);
    if (n.grad_branch != nullptr) store_row(ds, n.grad_branch, n.branch_bf16, offset, width);
  }
}

}  // namespace

detail::LayerNormKernels layer_norm_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
