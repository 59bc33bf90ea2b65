// Causal self-attention on the CPU, forward and backward, straight from a packed qkv [B, T, 3, H, D]
// (and its Linear's bias where given, added as the rows are read) into out [B, T, H, D]: no q/k/v views
// made contiguous, no bias added in a pass of its own, no [B, H, T, T] scores in memory, no
// transposed output copied back. A batch element's heads are loaded together, in one pass over its token
// rows, then computed one (batch, head) pair at a time, in fp32 in the core's cache:
//   forward   s_ij = scale q_i . k_j (j <= i),  p_ij = exp(s_ij - lse_i),  o_i = sum_j p_ij v_j
//   backward  dp_ij = do_i . v_j,  ds_ij = p_ij (dp_ij - do_i . o_i),
//             dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i,  dv_j = sum_i p_ij do_i
// Every product is a register tile of kRows rows by up to kMaxVectors vectors, as a GEMM's micro-kernel:
// the scores of kRows queries against a few vectors of keys (the depth D inner), and kRows rows of a
// sum of weighted rows (o, dq; dk and dv with the weights read down a column of p or ds). Rows go in
// groups of kRows; a group's scores run to the last row's keys, the earlier rows' extra ones made 0.
// So a row's sums take 0 x the values of up to kRows - 1 later keys: finite values change nothing, but an
// inf or NaN there (a diverged run, whose loss is NaN already) makes the earlier row NaN too, as
// ATen's math path (softmax then matmul) does.
// This file is compiled once per CPU capability (CMakeLists.txt: DEFAULT, AVX2, AVX512) with that
// capability's flags; CPU_CAPABILITY names the namespace, as in ATen's own kernels, so ATen's
// Vectorized<float> is 8 scalars, 8 AVX2 lanes or 16 AVX512 lanes accordingly.
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

constexpr int64_t kBlockValues = int64_t{1} << 20;  // 4 MB of fp32 per matrix
// Rows of a register tile. On AVX512, 8: a weighted sum of rows of a 32-wide head (2 vectors) then keeps 16
// accumulators in flight, where 8 (4 rows) barely covered two FMA units' latency; with the transposes in
// registers (transpose_block), 0.88x the attention's time at configs/gpt_text.toml's shape (BENCHMARKS "Own
// CPU kernels, twenty-first part"). AVX2's 16 registers hold 4 rows.
constexpr int64_t kRows = kLanes >= 16 ? 8 : 4;
// Vectors across a register tile: 8 x 3 accumulators, 3 vectors of b and a broadcast fit AVX512's 32
// registers; 4 x 2 fit AVX2's 16.
constexpr int kMaxVectors = kLanes >= 16 ? 3 : 2;
static_assert(kMaxVectors <= 3, "by_tiles instantiates tiles of up to 3 vectors");
static_assert(kLanes % kRows == 0, "a vector of keys holds whole groups of rows");

int64_t round_up(int64_t n, int64_t to = kLanes) {
  return (n + to - 1) / to * to;
}

// One (batch, head) pair's operands in fp32, rows [T4][Dp] with T4 = T rounded up to whole groups of
// kRows and D to whole vectors, zeros beyond T and D; and K or V transposed, [Dp][Tp] (a vector of
// keys at a time). Forward reads v as rows and k as columns; backward k as both and v as columns.
// Every operand is copied in as rows (the forward's k and the backward's v only as the transposes' source);
// the columns are transposed from them (transpose_rows).
struct HeadTiles {
  int64_t length, dim, rows, dim_padded, length_padded;
  std::vector<float> q, k, v, k_cols, v_cols, o, grad_o, grad_q, grad_k, grad_v;

  HeadTiles(int64_t length_, int64_t dim_, bool backward)
      : length(length_),
        dim(dim_),
        rows(round_up(length_, kRows)),
        dim_padded(round_up(dim_)),
        length_padded(round_up(length_)) {
    const size_t tile = static_cast<size_t>(rows * dim_padded);
    const size_t cols = static_cast<size_t>(dim_padded * length_padded);
    q.assign(tile, 0.f);
    k.assign(tile, 0.f);
    v.assign(tile, 0.f);
    k_cols.assign(cols, 0.f);
    o.assign(tile, 0.f);
    if (backward) {
      v_cols.assign(cols, 0.f);
      grad_o.assign(tile, 0.f);
      grad_q.assign(tile, 0.f);
      grad_k.assign(tile, 0.f);
      grad_v.assign(tile, 0.f);
    }
  }
  float* row(std::vector<float>& tile, int64_t t) { return tile.data() + t * dim_padded; }
  int64_t bytes() const {
    size_t values = 0;
    for (const auto* tile : {&q, &k, &v, &k_cols, &v_cols, &o, &grad_o, &grad_q, &grad_k, &grad_v})
      values += tile->size();
    return static_cast<int64_t>(values * sizeof(float));
  }
  // Keys a group of rows from `first` sees: up to its last row, whole vectors.
  int64_t keys_of_group(int64_t first) const { return round_up(first + kRows); }
};

// The rows of p and of ds one head works on at a time, [block_rows][Tp], shared by the heads of a run:
// forward a group of kRows rows of p; backward a block of rows of both (at most kBlockValues values each,
// or kRows rows where a row is longer), so that dk and dv are sums over its columns.
struct Block {
  int64_t rows;
  std::vector<float> probs, dscores;

  Block(const HeadTiles& tiles, bool backward)
      : rows(backward
                 ? std::clamp<int64_t>(kBlockValues / tiles.length_padded / kRows * kRows, kRows, tiles.rows)
                 : kRows),
        probs(static_cast<size_t>(rows * tiles.length_padded), 0.f),
        dscores(backward ? probs.size() : 0, 0.f) {}
};

// A pair's rows are a head's slice of each token's row, too far apart for the hardware to run ahead:
// the loads ask for the row kRowsAhead on while they convert this one.
constexpr int64_t kRowsAhead = 8;

template <typename T>
void prefetch_row(const T* row, int64_t dim) {
  const char* bytes = reinterpret_cast<const char*>(row);
  const int64_t size = dim * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < size; b += 64) __builtin_prefetch(bytes + b);
  __builtin_prefetch(bytes + size - 1);
}

// Row t of a tile from a head's slice of a token row, `bias` (the slice's part of qkv's bias, or null)
// added as it is read.
template <typename T>
void copy_row(const T* src, const float* bias, HeadTiles& tiles, std::vector<float>& into, int64_t t) {
  float* dst = tiles.row(into, t);
  if (bias == nullptr) {
    for (int64_t d = 0; d < tiles.dim; ++d) dst[d] = static_cast<float>(src[d]);
  } else {
    for (int64_t d = 0; d < tiles.dim; ++d) dst[d] = static_cast<float>(src[d]) + bias[d];
  }
}

// dst[d][t] = src[t][d] for d, t < kLanes: a block of a tile's rows (src_stride apart) into its columns.
void transpose_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
#if defined(CPU_CAPABILITY_AVX512)
  // Pairs of rows interleaved by 32 bits, then 64, then 128-bit quarters twice: 64 shuffles for 256 values.
  // The masked forms with every lane set, as lanes_fold's (GCC 12 warns of the unmasked ones' undefined).
  constexpr __mmask16 kAll = 0xFFFF;
  constexpr __mmask8 kAll8 = 0xFF;
  const auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * src_stride);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_mask_unpacklo_ps(r[i], kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_mask_unpackhi_ps(r[i], kAll, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(pd(t[i]), kAll8, pd(t[i]), pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(pd(t[i]), kAll8, pd(t[i]), pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(pd(t[i + 1]), kAll8, pd(t[i + 1]), pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(pd(t[i + 1]), kAll8, pd(t[i + 1]), pd(t[i + 3])));
  }
  for (int h = 0; h < 16; h += 8) {
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_mask_shuffle_f32x4(r[h + i], kAll, r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_mask_shuffle_f32x4(r[h + i], kAll, r[h + i], r[h + i + 4], 0xDD);
    }
  }
  for (int i = 0; i < 8; ++i) {
    _mm512_storeu_ps(dst + i * dst_stride, _mm512_mask_shuffle_f32x4(t[i], kAll, t[i], t[i + 8], 0x88));
    _mm512_storeu_ps(dst + (i + 8) * dst_stride, _mm512_mask_shuffle_f32x4(t[i], kAll, t[i], t[i + 8], 0xDD));
  }
#elif defined(CPU_CAPABILITY_AVX2)
  // Pairs of rows interleaved by 32 bits, then 64, then the 128-bit halves: 24 shuffles for 64 values.
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
#else
  for (int64_t t = 0; t < kLanes; ++t)
    for (int64_t d = 0; d < kLanes; ++d) dst[d * dst_stride + t] = src[t * src_stride + d];
#endif
}

// cols [Dp][Tp] = a row tile's first T rows transposed: whole blocks of kLanes rows, then the last rows
// value by value. The columns past T keep the zeros they were made with.
void transpose_rows(const HeadTiles& tiles, const std::vector<float>& rows, std::vector<float>& cols) {
  const int64_t dp = tiles.dim_padded, tp = tiles.length_padded;
  int64_t t = 0;
  for (; t + kLanes <= tiles.length; t += kLanes)
    for (int64_t d = 0; d < dp; d += kLanes)
      transpose_block(rows.data() + t * dp + d, dp, cols.data() + d * tp + t, tp);
  for (; t < tiles.length; ++t)
    for (int64_t d = 0; d < tiles.dim; ++d) cols[d * tp + t] = rows[t * dp + d];
}

template <typename T>
void store_head_row(const HeadTiles& tiles, const std::vector<float>& from, int64_t t, T* dst) {
  const float* src = from.data() + t * tiles.dim_padded;
  for (int64_t d = 0; d < tiles.dim; ++d) dst[d] = static_cast<T>(src[d]);
}

// The sum of a tile's first `length` rows, [D] into `sums`: the bias's gradient for the head's slice
// (the padding columns are 0, so whole vectors are summed and D values kept).
void column_sums(const HeadTiles& tiles, const std::vector<float>& from, float* sums) {
  std::vector<float> total(static_cast<size_t>(tiles.dim_padded), 0.f);
  for (int64_t t = 0; t < tiles.length; ++t) {
    const float* row = from.data() + t * tiles.dim_padded;
    for (int64_t d = 0; d < tiles.dim_padded; d += kLanes)
      accumulate(total.data(), d, kLanes, Vec::loadu(row + d));
  }
  std::copy(total.begin(), total.begin() + tiles.dim, sums);
}

// The heads [first, first + count) of one batch element, loaded together: each token's row is read in one
// pass over the heads' slices (prefetched kRowsAhead rows on). One head at a time would read a 128-byte
// slice of each 1.5-KB row, and wait on each. A run's tiles stay within kRunBytes, a core's L2 on the CPUs
// measured: longer sequences or wider heads run fewer heads at a time, down to one.
struct HeadRun {
  int64_t batch, first, count;
};

constexpr int64_t kRunBytes = int64_t{1} << 20;

// Where a row's values for a run lie: `segments` runs of `values`, `stride` apart (q, k and v of qkv; o).
struct RowSegments {
  int64_t segments, stride, values;
};

template <typename T, typename RowOp>
void stream_rows(const T* first, int64_t row_stride, int64_t length, RowSegments read, const RowOp& op) {
  for (int64_t t = 0; t < length; ++t) {
    const T* row = first + t * row_stride;
    if (t + kRowsAhead < length) {
      for (int64_t s = 0; s < read.segments; ++s)
        prefetch_row(row + kRowsAhead * row_stride + s * read.stride, read.values);
    }
    op(t, row);
  }
}

// c[r][j] = scale * sum_{d < depth} a[r][d] b_cols[d][j] for r < kRows and j < V vectors: the tile in
// registers, one vector of b and kRows broadcasts of a per step of d.
template <int V>
void product_tile(const float* a, int64_t a_stride, const float* b_cols, int64_t b_stride, int64_t depth,
                  float scale, float* c, int64_t c_stride) {
  Vec acc[kRows][V];
  for (auto& row : acc)
    for (Vec& lane : row) lane = Vec(0.f);
  for (int64_t d = 0; d < depth; ++d) {
    Vec b[V];
    for (int v = 0; v < V; ++v) b[v] = Vec::loadu(b_cols + d * b_stride + v * kLanes);
    for (int64_t r = 0; r < kRows; ++r) {
      const Vec ar(a[r * a_stride + d]);
      for (int v = 0; v < V; ++v) acc[r][v] = at::vec::fmadd(ar, b[v], acc[r][v]);
    }
  }
  const Vec scaled(scale);
  for (int64_t r = 0; r < kRows; ++r)
    for (int v = 0; v < V; ++v) (acc[r][v] * scaled).store(c + r * c_stride + v * kLanes);
}

// tile(std::integral_constant<int, V>, offset) over [0, width) (whole vectors), V of at most kMaxVectors
// vectors at a time: the register tiles' widths as compile-time constants.
template <typename Tile>
void by_tiles(int64_t width, const Tile& tile) {
  for (int64_t offset = 0; offset < width; offset += kMaxVectors * kLanes) {
    switch (std::min<int64_t>(kMaxVectors, (width - offset) / kLanes)) {
      case 3:
        tile(std::integral_constant<int, 3>{}, offset);
        break;
      case 2:
        tile(std::integral_constant<int, 2>{}, offset);
        break;
      default:
        tile(std::integral_constant<int, 1>{}, offset);
        break;
    }
  }
}

// The same over the first `count` (whole vectors) columns of b_cols.
void product_rows(const float* a, int64_t a_stride, const float* b_cols, int64_t b_stride, int64_t depth,
                  int64_t count, float scale, float* c, int64_t c_stride) {
  by_tiles(count, [&](auto vectors, int64_t j) {
    product_tile<decltype(vectors)::value>(a, a_stride, b_cols + j, b_stride, depth, scale, c + j, c_stride);
  });
}

// Where the weights of a weighted sum of rows lie: w(r, j) = at[r * row_stride + j * step].
struct Weights {
  const float* at;
  int64_t row_stride, step;
};

// acc[r][0, V vectors) += sum_{j < count} w(r, j) rows[j] for r < kRows: the tile in registers, one
// row of `rows` and kRows broadcasts of w per step of j.
template <int V>
void accumulate_tile(Weights w, const float* rows, int64_t row_stride, int64_t count, float* acc,
                     int64_t acc_stride) {
  Vec a[kRows][V];
  for (int64_t r = 0; r < kRows; ++r)
    for (int v = 0; v < V; ++v) a[r][v] = Vec::loadu(acc + r * acc_stride + v * kLanes);
  for (int64_t j = 0; j < count; ++j) {
    Vec x[V];
    for (int v = 0; v < V; ++v) x[v] = Vec::loadu(rows + j * row_stride + v * kLanes);
    for (int64_t r = 0; r < kRows; ++r) {
      const Vec wr(w.at[r * w.row_stride + j * w.step]);
      for (int v = 0; v < V; ++v) a[r][v] = at::vec::fmadd(wr, x[v], a[r][v]);
    }
  }
  for (int64_t r = 0; r < kRows; ++r)
    for (int v = 0; v < V; ++v) a[r][v].store(acc + r * acc_stride + v * kLanes);
}

// The same across whole rows of the tiles (Dp values, the stride of rows and acc).
void accumulate_rows(Weights w, const float* rows, int64_t count, int64_t dim_padded, float* acc) {
  by_tiles(dim_padded, [&](auto vectors, int64_t d) {
    accumulate_tile<decltype(vectors)::value>(w, rows + d, dim_padded, count, acc + d, dim_padded);
  });
}

// The scores [0, count) of query i -> exp(score - shift), 0 past key i; returns their sum. exp_inline's
// floor (1.6e-38) never reaches the sum: the keys past i are written as 0, whatever their scores hold, and
// a padding row (shift +inf) is 0 throughout.
float exp_row(float* scores, int64_t i, int64_t count, float shift) {
  const int64_t keys = std::isinf(shift) && shift > 0 ? 0 : std::min(i + 1, count);
  const Vec shift_v(shift);
  Vec sum(0.f);
  for (int64_t j = 0; j < keys; j += kLanes) {
    const Vec p = Vec::set(Vec(0.f), exp_inline(Vec::loadu(scores + j) - shift_v), keys - j);
    p.store(scores + j);
    sum = sum + p;
  }
  std::fill(scores + round_up(keys), scores + count, 0.f);
  return lanes_sum(sum);
}

// The scores of the group of rows from `first` against its keys, into p ([kRows][Tp]), made the rows'
// unnormalised probabilities exp(s - max); per row its 1 / sum into `inverse` and lse.
void softmax_group(const detail::PackedAttention& a, HeadTiles& tiles, int64_t first, float* p,
                   float* inverse, float* lse) {
  const int64_t keys = tiles.keys_of_group(first);
  product_rows(tiles.row(tiles.q, first), tiles.dim_padded, tiles.k_cols.data(), tiles.length_padded,
               a.head_dim, keys, a.scale, p, tiles.length_padded);
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t i = first + r;
    float* s = p + r * tiles.length_padded;
    const float top = row_max(s, i + 1);
    const float total = exp_row(s, i, keys, top);
    inverse[r] = 1.f / total;
    if (i < a.length) lse[i] = top + std::log(total);
  }
}

// One head's output rows (out[i * embed], its slice of token i's row) and lse.
template <typename T>
void head_forward(const detail::PackedAttention& a, HeadTiles& tiles, Block& block, T* out, float* lse) {
  const int64_t embed = a.heads * a.head_dim;
  float inverse[kRows];
  for (int64_t first = 0; first < tiles.rows; first += kRows) {
    softmax_group(a, tiles, first, block.probs.data(), inverse, lse);
    float* o = tiles.row(tiles.o, first);  // o [kRows][Dp] = p v, one key per step
    std::fill(o, o + kRows * tiles.dim_padded, 0.f);
    accumulate_rows({block.probs.data(), tiles.length_padded, 1}, tiles.v.data(), first + kRows,
                    tiles.dim_padded, o);
    for (int64_t i = first; i < std::min(first + kRows, a.length); ++i) {
      const float* row = tiles.row(tiles.o, i);
      for (int64_t d = 0; d < a.head_dim; ++d)
        out[i * embed + d] = static_cast<T>(row[d] * inverse[i - first]);
    }
  }
}

// Rows [first, last) (whole groups) of p and scale * ds into the block matrices (row i - first), and
// dq of those rows; then what they add to dk and dv.
void backward_rows(const detail::PackedAttention& a, HeadTiles& tiles, Block& block, const float* lse,
                   int64_t first, int64_t last) {
  const int64_t stride = tiles.length_padded;
  for (int64_t group = first; group < last; group += kRows) {
    const int64_t keys = tiles.keys_of_group(group);
    float* p = block.probs.data() + (group - first) * stride;
    float* ds = block.dscores.data() + (group - first) * stride;
    product_rows(tiles.row(tiles.q, group), tiles.dim_padded, tiles.k_cols.data(), stride, a.head_dim, keys,
                 a.scale, p, stride);
    product_rows(tiles.row(tiles.grad_o, group), tiles.dim_padded, tiles.v_cols.data(), stride, a.head_dim,
                 keys, 1.f, ds, stride);
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t i = group + r;
      float* p_i = p + r * stride;
      float* ds_i = ds + r * stride;
      // The padding rows past T have no probabilities: lse +inf makes them 0, and so their ds.
      exp_row(p_i, i, keys, i < a.length ? lse[i] : std::numeric_limits<float>::infinity());
      const Vec delta(row_dot(tiles.row(tiles.grad_o, i), tiles.row(tiles.o, i), tiles.dim_padded));
      const Vec scale(a.scale);
      for (int64_t j = 0; j < keys; j += kLanes)
        (Vec::loadu(p_i + j) * (Vec::loadu(ds_i + j) - delta) * scale).store(ds_i + j);
    }
    accumulate_rows({ds, stride, 1}, tiles.k.data(), group + kRows, tiles.dim_padded,
                    tiles.row(tiles.grad_q, group));
  }
  // dk_j and dv_j gain the block's rows i >= j: kRows columns of the block at a time. Every group's row
  // holds the keys up to its group's end, so the columns from `from` on are there (0 past the row's i).
  for (int64_t key = 0; key < last; key += kRows) {
    const int64_t from = std::max(key, first);
    const int64_t offset = (from - first) * stride + key;
    accumulate_rows({block.dscores.data() + offset, 1, stride}, tiles.row(tiles.q, from), last - from,
                    tiles.dim_padded, tiles.row(tiles.grad_k, key));
    accumulate_rows({block.probs.data() + offset, 1, stride}, tiles.row(tiles.grad_o, from), last - from,
                    tiles.dim_padded, tiles.row(tiles.grad_v, key));
  }
}

void head_backward(const detail::PackedAttention& a, HeadTiles& tiles, Block& block, const float* lse) {
  std::fill(tiles.grad_q.begin(), tiles.grad_q.end(), 0.f);
  std::fill(tiles.grad_k.begin(), tiles.grad_k.end(), 0.f);
  std::fill(tiles.grad_v.begin(), tiles.grad_v.end(), 0.f);
  for (int64_t first = 0; first < tiles.rows; first += block.rows)
    backward_rows(a, tiles, block, lse, first, std::min(tiles.rows, first + block.rows));
}

// Where a run's heads lie in the packed tensors: `qkv` and `out` point at the first head's slice of the
// batch element's first token row (q's slice in qkv); head h of the run is h * D on.
template <typename T>
struct RunLayout {
  int64_t embed, dim;
  int64_t qkv_offset, out_offset;
  int64_t length, count;
  int64_t first_dim;  // the run's first head's offset in a row's q (k, v) part

  RunLayout(const detail::PackedAttention& a, HeadRun run)
      : embed(a.heads * a.head_dim),
        dim(a.head_dim),
        qkv_offset(run.batch * a.length * 3 * embed + run.first * dim),
        out_offset(run.batch * a.length * embed + run.first * dim),
        length(a.length),
        count(run.count),
        first_dim(run.first * dim) {}

  // Head h's slice of qkv's bias for q (part 0), k (1) or v (2); null without a bias.
  const float* bias(const detail::PackedAttention& a, int64_t h, int part) const {
    return a.qkv_bias == nullptr ? nullptr : a.qkv_bias + part * embed + first_dim + h * dim;
  }
  // each(t, h, q) for every token row t of qkv and head h of the run, q head h's q slice in row t (k and
  // v at embed and 2 embed on): the rows read in order.
  template <typename HeadOp>
  void each_qkv_row(const void* qkv, const HeadOp& each) const {
    each_head_row(qkv, 3 * embed, qkv_offset, {3, embed, count * dim}, each);
  }
  // The same over the rows of out [B, T, H, D] (or its gradient).
  template <typename HeadOp>
  void each_out_row(const void* out, const HeadOp& each) const {
    each_head_row(out, embed, out_offset, {1, 0, count * dim}, each);
  }

 private:
  template <typename HeadOp>
  void each_head_row(const void* base, int64_t row_stride, int64_t offset, RowSegments read,
                     const HeadOp& each) const {
    stream_rows(static_cast<const T*>(base) + offset, row_stride, length, read, [&](int64_t t, const T* row) {
      for (int64_t h = 0; h < count; ++h) each(t, h, row + h * dim);
    });
  }
};

// run(HeadRun) over the pairs [begin, end), up to `most` consecutive heads of a batch element at a time.
template <typename RunOp>
void by_runs(const detail::PackedAttention& a, int64_t begin, int64_t end, int64_t most, const RunOp& op) {
  for (int64_t pair = begin; pair < end;) {
    const HeadRun run{pair / a.heads, pair % a.heads, std::min({a.heads - pair % a.heads, end - pair, most})};
    op(run);
    pair += run.count;
  }
}

// One head's tiles for each head a run of [begin, end) may hold: as many as fit kRunBytes, at least one.
std::vector<HeadTiles> tiles_for(const detail::PackedAttention& a, int64_t begin, int64_t end,
                                 bool backward) {
  const HeadTiles one(a.length, a.head_dim, backward);
  const int64_t fit = std::max<int64_t>(1, kRunBytes / std::max<int64_t>(one.bytes(), 1));
  return std::vector<HeadTiles>(static_cast<size_t>(std::min({a.heads, end - begin, fit})), one);
}

template <typename T>
void forward_pairs(const detail::PackedAttention& a, int64_t begin, int64_t end) {
  std::vector<HeadTiles> tiles = tiles_for(a, begin, end, /*backward=*/false);
  Block block(tiles[0], /*backward=*/false);
  by_runs(a, begin, end, static_cast<int64_t>(tiles.size()), [&](HeadRun run) {
    const RunLayout<T> at(a, run);
    at.each_qkv_row(a.qkv, [&](int64_t t, int64_t h, const T* q) {
      copy_row(q, at.bias(a, h, 0), tiles[h], tiles[h].q, t);
      copy_row(q + at.embed, at.bias(a, h, 1), tiles[h], tiles[h].k, t);
      copy_row(q + 2 * at.embed, at.bias(a, h, 2), tiles[h], tiles[h].v, t);
    });
    for (int64_t h = 0; h < run.count; ++h) {
      transpose_rows(tiles[h], tiles[h].k, tiles[h].k_cols);
      T* out = static_cast<T*>(a.out_mut) + at.out_offset + h * at.dim;
      head_forward(a, tiles[h], block, out, a.lse + (run.batch * a.heads + run.first + h) * a.length);
    }
  });
}

template <typename T>
void backward_pairs(const detail::PackedAttention& a, int64_t begin, int64_t end) {
  std::vector<HeadTiles> tiles = tiles_for(a, begin, end, /*backward=*/true);
  Block block(tiles[0], /*backward=*/true);
  by_runs(a, begin, end, static_cast<int64_t>(tiles.size()), [&](HeadRun run) {
    const RunLayout<T> at(a, run);
    at.each_qkv_row(a.qkv, [&](int64_t t, int64_t h, const T* q) {
      copy_row(q, at.bias(a, h, 0), tiles[h], tiles[h].q, t);
      copy_row(q + at.embed, at.bias(a, h, 1), tiles[h], tiles[h].k, t);
      copy_row(q + 2 * at.embed, at.bias(a, h, 2), tiles[h], tiles[h].v, t);
    });
    at.each_out_row(a.out,
                    [&](int64_t t, int64_t h, const T* o) { copy_row(o, nullptr, tiles[h], tiles[h].o, t); });
    at.each_out_row(a.grad_out, [&](int64_t t, int64_t h, const T* g) {
      copy_row(g, nullptr, tiles[h], tiles[h].grad_o, t);
    });
    for (int64_t h = 0; h < run.count; ++h) {
      transpose_rows(tiles[h], tiles[h].k, tiles[h].k_cols);
      transpose_rows(tiles[h], tiles[h].v, tiles[h].v_cols);
      const int64_t pair = run.batch * a.heads + run.first + h;
      head_backward(a, tiles[h], block, a.lse + pair * a.length);
      if (a.grad_bias_pairs == nullptr) continue;
      float* sums = a.grad_bias_pairs + pair * 3 * a.head_dim;
      column_sums(tiles[h], tiles[h].grad_q, sums);
      column_sums(tiles[h], tiles[h].grad_k, sums + a.head_dim);
      column_sums(tiles[h], tiles[h].grad_v, sums + 2 * a.head_dim);
    }
    T* grad = static_cast<T*>(a.grad_qkv) + at.qkv_offset;
    for (int64_t t = 0; t < a.length; ++t) {
      T* row = grad + t * 3 * at.embed;
      for (int64_t h = 0; h < run.count; ++h) {
        store_head_row(tiles[h], tiles[h].grad_q, t, row + h * at.dim);
        store_head_row(tiles[h], tiles[h].grad_k, t, row + at.embed + h * at.dim);
        store_head_row(tiles[h], tiles[h].grad_v, t, row + 2 * at.embed + h * at.dim);
      }
    }
  });
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
