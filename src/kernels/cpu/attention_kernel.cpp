// Causal self-attention on the CPU, forward and backward, straight from a packed qkv [B, T, 3, H, D]
// into out [B, T, H, D]: no q/k/v views made contiguous, no [B, H, T, T] scores in memory, no
// transposed output copied back. One (batch, head) pair at a time, in fp32 in the core's cache:
//   forward   s_ij = scale q_i . k_j (j <= i),  p_ij = exp(s_ij - lse_i),  o_i = sum_j p_ij v_j
//   backward  dp_ij = do_i . v_j,  ds_ij = p_ij (dp_ij - do_i . o_i),
//             dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i,  dv_j = sum_i p_ij do_i
// Backward keeps a block of rows of p and ds (at most kBlockValues values each) so that dk and dv are
// sums over columns, accumulated in registers.
// This file is compiled once per CPU capability (CMakeLists.txt: DEFAULT, AVX2, AVX512) with that
// capability's flags; CPU_CAPABILITY names the namespace, as in ATen's own kernels, so ATen's
// Vectorized<float> is 8 lanes of scalars, AVX2 or AVX512 accordingly.
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

constexpr int64_t kBlockValues = int64_t{1} << 20;  // 4 MB of fp32 per matrix

int64_t round_up(int64_t n) {
  return (n + kLanes - 1) / kLanes * kLanes;
}

// One (batch, head) pair's operands in fp32, rows padded with zeros to whole vectors: rows [T][Dp]
// (for sums over j of a row times a scalar), and K or V transposed, [Dp][Tp] (for the scores of one
// query against every key, a vector of keys at a time).
struct HeadTiles {
  int64_t length, dim, dim_padded, length_padded, block_rows;
  std::vector<float> q, k, v, k_cols, v_cols, o, grad_o, grad_q, grad_k, grad_v, scores, probs, dscores;

  HeadTiles(int64_t length_, int64_t dim_, bool backward)
      : length(length_),
        dim(dim_),
        dim_padded(round_up(dim_)),
        length_padded(round_up(length_)),
        block_rows(std::clamp<int64_t>(kBlockValues / round_up(length_), 1, length_)) {
    const size_t rows = static_cast<size_t>(length * dim_padded);
    const size_t cols = static_cast<size_t>(dim_padded * length_padded);
    q.assign(rows, 0.f);
    k.assign(rows, 0.f);
    v.assign(rows, 0.f);
    k_cols.assign(cols, 0.f);
    scores.assign(static_cast<size_t>(length_padded), 0.f);
    if (backward) {
      v_cols.assign(cols, 0.f);
      o.assign(rows, 0.f);
      grad_o.assign(rows, 0.f);
      grad_q.assign(rows, 0.f);
      grad_k.assign(rows, 0.f);
      grad_v.assign(rows, 0.f);
      probs.assign(static_cast<size_t>(block_rows * length_padded), 0.f);
      dscores.assign(static_cast<size_t>(block_rows * length_padded), 0.f);
    }
  }
  float* row(std::vector<float>& tile, int64_t t) { return tile.data() + t * dim_padded; }
};

template <typename T>
void load_rows(const T* first, int64_t row_stride, HeadTiles& tiles, std::vector<float>& into) {
  for (int64_t t = 0; t < tiles.length; ++t) {
    const T* src = first + t * row_stride;
    float* dst = tiles.row(into, t);
    for (int64_t d = 0; d < tiles.dim; ++d) dst[d] = static_cast<float>(src[d]);
  }
}

template <typename T>
void store_rows(const HeadTiles& tiles, const std::vector<float>& from, T* first, int64_t row_stride) {
  for (int64_t t = 0; t < tiles.length; ++t) {
    const float* src = from.data() + t * tiles.dim_padded;
    T* dst = first + t * row_stride;
    for (int64_t d = 0; d < tiles.dim; ++d) dst[d] = static_cast<T>(src[d]);
  }
}

void transpose(const HeadTiles& tiles, const std::vector<float>& rows, std::vector<float>& cols) {
  for (int64_t t = 0; t < tiles.length; ++t)
    for (int64_t d = 0; d < tiles.dim; ++d)
      cols[d * tiles.length_padded + t] = rows[t * tiles.dim_padded + d];
}

// out[j] = scale * (x . cols[:, j]) for the first `count` (a whole number of vectors) columns. Four
// vectors of columns at a time; a lone vector splits the sum over d in four, so four FMA chains run.
void dot_columns(const float* x, const float* cols, int64_t dim, int64_t stride, int64_t count, float scale,
                 float* out) {
  const Vec scaled(scale);
  int64_t j = 0;
  for (; j + 4 * kLanes <= count; j += 4 * kLanes) {
    Vec a0(0.f), a1(0.f), a2(0.f), a3(0.f);
    for (int64_t d = 0; d < dim; ++d) {
      const Vec xd(x[d]);
      const float* c = cols + d * stride + j;
      a0 = at::vec::fmadd(xd, Vec::loadu(c), a0);
      a1 = at::vec::fmadd(xd, Vec::loadu(c + kLanes), a1);
      a2 = at::vec::fmadd(xd, Vec::loadu(c + 2 * kLanes), a2);
      a3 = at::vec::fmadd(xd, Vec::loadu(c + 3 * kLanes), a3);
    }
    (a0 * scaled).store(out + j);
    (a1 * scaled).store(out + j + kLanes);
    (a2 * scaled).store(out + j + 2 * kLanes);
    (a3 * scaled).store(out + j + 3 * kLanes);
  }
  for (; j < count; j += kLanes) {
    Vec a0(0.f), a1(0.f), a2(0.f), a3(0.f);
    const float* c = cols + j;
    int64_t d = 0;
    for (; d + 4 <= dim; d += 4) {
      a0 = at::vec::fmadd(Vec(x[d]), Vec::loadu(c + d * stride), a0);
      a1 = at::vec::fmadd(Vec(x[d + 1]), Vec::loadu(c + (d + 1) * stride), a1);
      a2 = at::vec::fmadd(Vec(x[d + 2]), Vec::loadu(c + (d + 2) * stride), a2);
      a3 = at::vec::fmadd(Vec(x[d + 3]), Vec::loadu(c + (d + 3) * stride), a3);
    }
    for (; d < dim; ++d) a0 = at::vec::fmadd(Vec(x[d]), Vec::loadu(c + d * stride), a0);
    (((a0 + a1) + (a2 + a3)) * scaled).store(out + j);
  }
}

// acc[0, V lanes) += sum_{j < count} w[j * w_stride] * rows[j * row_stride], the V vectors of the sum
// in registers and four rows in flight (4 V FMA chains).
template <int kVectors>
void add_weighted_rows_in_registers(const float* w, int64_t w_stride, const float* rows, int64_t row_stride,
                                    int64_t count, float* acc) {
  Vec a[4][kVectors];
  for (int v = 0; v < kVectors; ++v) {
    a[0][v] = Vec::loadu(acc + v * kLanes);
    a[1][v] = a[2][v] = a[3][v] = Vec(0.f);
  }
  int64_t j = 0;
  for (; j + 4 <= count; j += 4) {
    for (int r = 0; r < 4; ++r) {
      const Vec wr(w[(j + r) * w_stride]);
      const float* row = rows + (j + r) * row_stride;
      for (int v = 0; v < kVectors; ++v) a[r][v] = at::vec::fmadd(wr, Vec::loadu(row + v * kLanes), a[r][v]);
    }
  }
  for (; j < count; ++j) {
    const Vec wj(w[j * w_stride]);
    const float* row = rows + j * row_stride;
    for (int v = 0; v < kVectors; ++v) a[0][v] = at::vec::fmadd(wj, Vec::loadu(row + v * kLanes), a[0][v]);
  }
  for (int v = 0; v < kVectors; ++v) ((a[0][v] + a[1][v]) + (a[2][v] + a[3][v])).store(acc + v * kLanes);
}

// acc[0, Dp) += sum_{j < count} w[j * w_stride] * rows[j] (rows of Dp values), up to four vectors of
// the row at a time.
void add_weighted_rows(const float* w, int64_t w_stride, const float* rows, int64_t count, int64_t dim_padded,
                       float* acc) {
  for (int64_t d = 0; d < dim_padded; d += 4 * kLanes) {
    const float* part = rows + d;
    switch (std::min<int64_t>(4, (dim_padded - d) / kLanes)) {
      case 4:
        add_weighted_rows_in_registers<4>(w, w_stride, part, dim_padded, count, acc + d);
        break;
      case 3:
        add_weighted_rows_in_registers<3>(w, w_stride, part, dim_padded, count, acc + d);
        break;
      case 2:
        add_weighted_rows_in_registers<2>(w, w_stride, part, dim_padded, count, acc + d);
        break;
      default:
        add_weighted_rows_in_registers<1>(w, w_stride, part, dim_padded, count, acc + d);
        break;
    }
  }
}

// scores[0, i] -> exp(scores - shift), zero beyond i up to the padded count; returns their sum.
float exp_row(float* scores, int64_t i, int64_t count, float shift) {
  for (int64_t j = i + 1; j < count; ++j) scores[j] = -std::numeric_limits<float>::infinity();
  const Vec shift_v(shift);
  Vec sum(0.f);
  for (int64_t j = 0; j < count; j += kLanes) {
    const Vec p = (Vec::loadu(scores + j) - shift_v).exp();
    p.store(scores + j);
    sum = sum + p;
  }
  return lanes_sum(sum);
}

float row_max(const float* scores, int64_t i) {
  float best = scores[0];
  for (int64_t j = 1; j <= i; ++j) best = std::max(best, scores[j]);
  return best;
}

template <typename T>
struct Layout {  // where one (b, h) pair's rows lie in the packed tensors
  int64_t qkv_row, out_row;
  const T* q;
  const T* k;
  const T* v;
  int64_t out_offset;

  Layout(const detail::PackedAttention& a, int64_t pair) {
    const int64_t b = pair / a.heads, h = pair % a.heads;
    const int64_t embed = a.heads * a.head_dim;
    qkv_row = 3 * embed;
    out_row = embed;
    const T* base = static_cast<const T*>(a.qkv) + b * a.length * qkv_row + h * a.head_dim;
    q = base;
    k = base + embed;
    v = base + 2 * embed;
    out_offset = b * a.length * out_row + h * a.head_dim;
  }
};

template <typename T>
void forward_pairs(const detail::PackedAttention& a, int64_t begin, int64_t end) {
  HeadTiles tiles(a.length, a.head_dim, /*backward=*/false);
  std::vector<float> out_row(static_cast<size_t>(tiles.dim_padded));
  for (int64_t pair = begin; pair < end; ++pair) {
    const Layout<T> at(a, pair);
    load_rows(at.q, at.qkv_row, tiles, tiles.q);
    load_rows(at.k, at.qkv_row, tiles, tiles.k);
    load_rows(at.v, at.qkv_row, tiles, tiles.v);
    transpose(tiles, tiles.k, tiles.k_cols);
    T* out = static_cast<T*>(a.out_mut) + at.out_offset;
    float* lse = a.lse + pair * a.length;
    for (int64_t i = 0; i < a.length; ++i) {
      const int64_t count = round_up(i + 1);
      float* s = tiles.scores.data();
      dot_columns(tiles.row(tiles.q, i), tiles.k_cols.data(), a.head_dim, tiles.length_padded, count, a.scale,
                  s);
      const float top = row_max(s, i);
      const float total = exp_row(s, i, count, top);
      std::fill(out_row.begin(), out_row.end(), 0.f);
      add_weighted_rows(s, 1, tiles.v.data(), i + 1, tiles.dim_padded, out_row.data());
      const float inverse = 1.f / total;
      T* o = out + i * at.out_row;
      for (int64_t d = 0; d < a.head_dim; ++d) o[d] = static_cast<T>(out_row[d] * inverse);
      lse[i] = top + std::log(total);
    }
  }
}

// Rows [first, last) of p and scale * ds into the block matrices (row i - first), and dq of those rows.
void backward_rows(const detail::PackedAttention& a, HeadTiles& tiles, const float* lse, int64_t first,
                   int64_t last) {
  for (int64_t i = first; i < last; ++i) {
    const int64_t count = round_up(i + 1);
    float* p = tiles.probs.data() + (i - first) * tiles.length_padded;
    float* ds = tiles.dscores.data() + (i - first) * tiles.length_padded;
    const float* grad_o_i = tiles.row(tiles.grad_o, i);
    dot_columns(tiles.row(tiles.q, i), tiles.k_cols.data(), a.head_dim, tiles.length_padded, count, a.scale,
                p);
    exp_row(p, i, count, lse[i]);
    dot_columns(grad_o_i, tiles.v_cols.data(), a.head_dim, tiles.length_padded, count, 1.f, ds);
    const float delta = row_dot(grad_o_i, tiles.row(tiles.o, i), tiles.dim_padded);
    for (int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (ds[j] - delta) * a.scale;
    add_weighted_rows(ds, 1, tiles.k.data(), i + 1, tiles.dim_padded, tiles.row(tiles.grad_q, i));
  }
  // dk_j and dv_j gain the block's rows i >= j: a column of the block each.
  for (int64_t j = 0; j < last; ++j) {
    const int64_t from = std::max(j, first);
    const int64_t offset = (from - first) * tiles.length_padded + j;
    add_weighted_rows(tiles.dscores.data() + offset, tiles.length_padded, tiles.row(tiles.q, from),
                      last - from, tiles.dim_padded, tiles.row(tiles.grad_k, j));
    add_weighted_rows(tiles.probs.data() + offset, tiles.length_padded, tiles.row(tiles.grad_o, from),
                      last - from, tiles.dim_padded, tiles.row(tiles.grad_v, j));
  }
}

template <typename T>
void backward_pairs(const detail::PackedAttention& a, int64_t begin, int64_t end) {
  HeadTiles tiles(a.length, a.head_dim, /*backward=*/true);
  for (int64_t pair = begin; pair < end; ++pair) {
    const Layout<T> at(a, pair);
    load_rows(at.q, at.qkv_row, tiles, tiles.q);
    load_rows(at.k, at.qkv_row, tiles, tiles.k);
    load_rows(at.v, at.qkv_row, tiles, tiles.v);
    load_rows(static_cast<const T*>(a.out) + at.out_offset, at.out_row, tiles, tiles.o);
    load_rows(static_cast<const T*>(a.grad_out) + at.out_offset, at.out_row, tiles, tiles.grad_o);
    transpose(tiles, tiles.k, tiles.k_cols);
    transpose(tiles, tiles.v, tiles.v_cols);
    std::fill(tiles.grad_q.begin(), tiles.grad_q.end(), 0.f);
    std::fill(tiles.grad_k.begin(), tiles.grad_k.end(), 0.f);
    std::fill(tiles.grad_v.begin(), tiles.grad_v.end(), 0.f);
    const float* lse = a.lse + pair * a.length;
    for (int64_t first = 0; first < a.length; first += tiles.block_rows)
      backward_rows(a, tiles, lse, first, std::min(a.length, first + tiles.block_rows));
    T* grad = static_cast<T*>(a.grad_qkv) + (at.q - static_cast<const T*>(a.qkv));
    const int64_t embed = a.heads * a.head_dim;
    store_rows(tiles, tiles.grad_q, grad, at.qkv_row);
    store_rows(tiles, tiles.grad_k, grad + embed, at.qkv_row);
    store_rows(tiles, tiles.grad_v, grad + 2 * embed, at.qkv_row);
  }
}

void forward(const detail::PackedAttention& a, int64_t begin, int64_t end) {
  a.bf16 ? forward_pairs<c10::BFloat16>(a, begin, end) : forward_pairs<float>(a, begin, end);
}

void backward(const detail::PackedAttention& a, int64_t begin, int64_t end) {
  a.bf16 ? backward_pairs<c10::BFloat16>(a, begin, end) : backward_pairs<float>(a, begin, end);
}

}  // namespace

detail::AttentionKernels attention_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
