// A Linear (and the ReLU after it) in bf16 on AMX's tile units, for CPU autocast's bf16 on CPUs with
// AMX-BF16 (Sapphire Rapids and later):
//   forward   y = relu(x W^T + b)           [M, K] x [N, K]^T -> [M, N] bf16, fp32 sums
//   backward  dz = dy where y > 0, else 0    [M, N]
//             dx = dz W                      [M, N] x [N, K] -> [M, K], rounded to bf16
//             dW = dz^T x                    [N, M] x [M, K] -> [N, K] fp32, not rounded
//             db = sum over rows of dz       [N] fp32
// ATen under autocast casts W to bf16, runs oneDNN's matmul (which packs W for its tiles on every call),
// adds the bias, runs the ReLU, and in backward casts the bf16 dW and db back to fp32: here W is rounded
// and packed in one pass, the bias and the ReLU ride on the matmul's output, and dW and db come out in
// fp32. Each matmul is tiles of 32 x 32 outputs, four accumulator tiles fed by two A and two B tiles, K in
// steps of 32; B is packed as AMX reads it, (k, k + 1) pairs of bf16 in each 32-bit column.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "amx.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

#if FASTTRAIN_AMX_BUILD
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fasttrain::kernels {

namespace detail {

#if FASTTRAIN_AMX_BUILD

// Whether the OS saves the AVX-512 registers across switches (XCR0's opmask, ZMM_Hi256 and Hi16_ZMM bits,
// with SSE and AVX's): the epilogues are AVX-512 code, which a CPU that has it still faults on otherwise.
bool os_saves_avx512_state() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 27)) == 0) return false;  // OSXSAVE
  unsigned low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  constexpr unsigned kAvx512State = 0xE6;  // bits 1, 2, 5, 6, 7
  return (low & kAvx512State) == kAvx512State;
}

bool amx_tiles_granted() {
  static const bool granted = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tiles = (edx & (1u << 24)) != 0, bf16 = (edx & (1u << 22)) != 0;
    const bool avx512bw = (ebx & (1u << 30)) != 0 && (ebx & (1u << 31)) != 0;  // and VL
    // AVX-512 BF16 (leaf 7, subleaf 1): every CPU with AMX-BF16 so far has it.
    const bool avx512_bf16 = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)) != 0;
    if (!tiles || !bf16 || !avx512bw || !avx512_bf16 || !os_saves_avx512_state()) return false;
    // Linux lends a process the tiles' 8 KiB of state only when asked (ARCH_REQ_XCOMP_PERM, XTILEDATA).
    constexpr long kRequestPermission = 0x1023, kTileData = 18;
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
}

#else

bool amx_tiles_granted() {
  return false;
}

#endif

}  // namespace detail

namespace {

using detail::amx_tiles_granted;
#if FASTTRAIN_AMX_BUILD
using detail::interleave_rows;
using detail::round_to_bf16_lanes;
#endif

constexpr int64_t kBlock = 32;  // an output block's rows and columns: 2 x 2 tiles of 16 x 16 fp32
constexpr int64_t kStep = 32;   // the K values a tile row holds: 32 bf16, 64 bytes
constexpr int64_t kTileValues = 16 * kStep;  // a packed B tile: 16 rows of 16 (k, k + 1) pairs

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

const uint16_t* bf16_data(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}
uint16_t* bf16_data(torch::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
}

#if FASTTRAIN_AMX_BUILD

// Tiles 0-3 accumulate C (fp32), 4-5 hold A's rows, 6-7 B's pairs: 16 rows of 64 bytes each.
FASTTRAIN_AMX_CODE void configure_tiles() {
  detail::load_tile_config({16, 16, 16, 16, 16, 16, 16, 16}, {64, 64, 64, 64, 64, 64, 64, 64});
}

FASTTRAIN_AMX_CODE void release_tiles() {
  _tile_release();
}

// c[32 x 32] (row stride ldc floats) = a[32 rows, K] (row stride lda values) x the packed B's column
// block `column_block` (32 columns): K / 32 steps.
FASTTRAIN_AMX_CODE void multiply_block(const uint16_t* a, int64_t lda, const uint16_t* packed,
                                       int64_t tiles_per_step, int64_t column_block, int64_t k, float* c,
                                       int64_t ldc) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const uint16_t* b = packed + 2 * column_block * kTileValues;
  for (int64_t step = 0; step < k / kStep; ++step, a += kStep, b += tiles_per_step * kTileValues) {
    // Each load just before the first product that reads it, so the next loads overlap the products.
    _tile_loadd(4, a, lda * 2);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b + kTileValues, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + 16 * lda, lda * 2);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  _tile_stored(2, c + 16 * ldc, ldc * 4);
  _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

// 16 rows of 16 32-bit values transposed in registers.
FASTTRAIN_AVX512_CODE void transpose16x16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // each 128-bit lane L of r[i + c]: column 4 L + c of rows i .. i + 3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i low_ab = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44),
                  high_ab = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i low_cd = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i high_cd = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(low_ab, low_cd, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(low_ab, low_cd, 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(high_ab, high_cd, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(high_ab, high_cd, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// W^T's pairs from an fp32 weight [N, K] (N, K multiples of 32): tile (step, column) row r, column n holds
// (W[16 column + n][32 step + 2 r], W[..][32 step + 2 r + 1]) in bf16: an fp32 -> bf16 pass and a 16 x 16
// transpose of 32-bit pairs, both in registers.
FASTTRAIN_AVX512_CODE void pack_transposed_rows(const float* weight, int64_t k, int64_t n_tile, int64_t step,
                                                uint16_t* tile, uint16_t* row_pair_tiles,
                                                int64_t row_pair_tiles_per_step) {
  __m512i rows[16];
  for (int n = 0; n < 16; ++n) {
    const float* src = weight + (16 * n_tile + n) * k + kStep * step;
    const __m512i even_odd_low = round_to_bf16_lanes(_mm512_loadu_ps(src));
    const __m512i even_odd_high = round_to_bf16_lanes(_mm512_loadu_ps(src + 16));
    // 32 bf16 in order: k, k + 1, ... as 16 pairs.
    const __m256i low = _mm512_cvtepi32_epi16(even_odd_low), high = _mm512_cvtepi32_epi16(even_odd_high);
    rows[n] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
  if (row_pair_tiles != nullptr) {  // W's rows 2 r and 2 r + 1 interleaved: dz W's B, from the same loads
    const int64_t row = 16 * n_tile, pair_step = row / kStep, first_pair = (row % kStep) / 2;
    uint16_t* low_tile = row_pair_tiles + (pair_step * row_pair_tiles_per_step + 2 * step) * kTileValues;
    for (int n = 0; n < 16; n += 2) {
      uint16_t* at = low_tile + (first_pair + n / 2) * kStep;
      interleave_rows(rows[n], rows[n + 1], at, at + kTileValues);
    }
  }
  transpose16x16(rows);
  for (int r = 0; r < 16; ++r) _mm512_storeu_si512(tile + r * kStep, rows[r]);
}

// Pairs of rows: B [K, N] bf16 read row-major from `rows` (rows_valid of them, beyond which zeros; N a
// multiple of 32), the two tiles (step, 2 chunk) and (step, 2 chunk + 1), row r, column c holding
// (B[32 step + 2 r][32 chunk + c], B[.. + 1][..]).
FASTTRAIN_AVX512_CODE void pack_row_pairs_chunk(const uint16_t* rows, int64_t rows_valid, int64_t n,
                                                int64_t step, int64_t chunk, uint16_t* low_tile) {
  for (int r = 0; r < 16; ++r) {
    const int64_t row = kStep * step + 2 * r;
    const __m512i first =
        row < rows_valid ? _mm512_loadu_si512(rows + row * n + 32 * chunk) : _mm512_setzero_si512();
    const __m512i second =
        row + 1 < rows_valid ? _mm512_loadu_si512(rows + (row + 1) * n + 32 * chunk) : _mm512_setzero_si512();
    interleave_rows(first, second, low_tile + r * kStep, low_tile + kTileValues + r * kStep);
  }
}

// 32 fp32 sums (one row of a block) plus `add` (nullptr: none), through the ReLU where `relu` (a NaN passes,
// as ATen's relu lets it), rounded to bf16 into `out`.
FASTTRAIN_AVX512_CODE void store_block_row(const float* sums, const float* add, bool relu, uint16_t* out) {
  for (int half = 0; half < 2; ++half) {
    __m512 v = _mm512_loadu_ps(sums + 16 * half);
    if (add != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(add + 16 * half));
    if (relu) v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ), v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * half),
                        _mm512_cvtepi32_epi16(round_to_bf16_lanes(v)));
  }
}

// dz[j] = dy[j] where y[j] passes the ReLU (y > 0, or a NaN: ATen's threshold_backward), else 0, for n values
// (a multiple of 16) of one row, in bf16.
FASTTRAIN_AVX512_CODE void relu_gradient_row(const uint16_t* y, const uint16_t* dy, int64_t n, uint16_t* dz) {
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 values = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + j))), 16));
    const __mmask16 passes = _mm512_cmp_ps_mask(values, _mm512_setzero_ps(), _CMP_NLE_UQ);
    const __m256i grad = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dy + j));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dz + j), _mm256_maskz_mov_epi16(passes, grad));
  }
}

#else

// Never called in a build without AMX code (amx_linear_runs_here() is false there): the same rules, scalar.
void store_block_row(const float* sums, const float* add, bool relu, uint16_t* out) {
  for (int64_t c = 0; c < kBlock; ++c) {
    const float value = sums[c] + (add != nullptr ? add[c] : 0.f);
    out[c] = c10::BFloat16(relu && !(value > 0.f) && value == value ? 0.f : value).x;
  }
}

void relu_gradient_row(const uint16_t* y, const uint16_t* dy, int64_t n, uint16_t* dz) {
  for (int64_t j = 0; j < n; ++j)
    dz[j] = !(static_cast<float>(c10::BFloat16(y[j], c10::BFloat16::from_bits())) <= 0.f) ? dy[j] : 0;
}

#endif

// B, packed: [K / 32 steps][N / 16 column tiles] tiles of kTileValues.
struct PackedB {
  PackedB(int64_t k_size, int64_t n_size)  // every value is written: no zero fill
      : k(k_size), n(n_size), storage(torch::empty({k_size * n_size}, torch::kBFloat16)) {}
  PackedB(int64_t k_size, int64_t n_size, torch::Tensor values)
      : k(k_size), n(n_size), storage(std::move(values)) {}
  int64_t k, n;
  torch::Tensor storage;  // from the allocator's cache: no fresh pages a call
  int64_t tiles_per_step() const { return n / 16; }
  uint16_t* values() { return bf16_data(storage); }
  uint16_t* tile(int64_t step, int64_t n_tile) {
    return values() + (step * tiles_per_step() + n_tile) * kTileValues;
  }
};

// weight [N, K] fp32 as the B of x W^T ([K, N]), and where `row_pairs` is given, in the same pass, as the B
// of dz W ([N, K], pack_row_pairs's layout).
PackedB pack_transposed(const torch::Tensor& weight, PackedB* row_pairs) {
  PackedB packed(weight.size(1), weight.size(0));
#if FASTTRAIN_AMX_BUILD
  const float* w = weight.data_ptr<float>();
  const int64_t steps = packed.k / kStep, n_tiles = packed.tiles_per_step();
  uint16_t* pairs = row_pairs != nullptr ? row_pairs->values() : nullptr;
  const int64_t pair_tiles_per_step = row_pairs != nullptr ? row_pairs->tiles_per_step() : 0;
  // A task's tiles run along K: each of its 16 rows of W is then read front to back.
  detail::parallel_pieces(0, steps * n_tiles, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      pack_transposed_rows(w, packed.k, t / steps, t % steps, packed.tile(t % steps, t / steps), pairs,
                           pair_tiles_per_step);
  });
#else
  (void)row_pairs;
#endif
  return packed;
}

// rows [rows_valid, N] (bf16, contiguous, N a multiple of 32) as the B [K = round_up(rows_valid, 32), N] of a
// product.
PackedB pack_row_pairs(const torch::Tensor& rows) {
  PackedB packed(round_up(rows.size(0), kStep), rows.size(1));
#if FASTTRAIN_AMX_BUILD
  const uint16_t* data = bf16_data(rows);
  const int64_t steps = packed.k / kStep, chunks = packed.n / 32, valid = rows.size(0);
  detail::parallel_pieces(0, steps * chunks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      pack_row_pairs_chunk(data, valid, packed.n, t / chunks, t % chunks,
                           packed.tile(t / chunks, 2 * (t % chunks)));
  });
#else
  (void)rows;
#endif
  return packed;
}

// A operand: `rows` [M, K] as bf16 with M padded to a multiple of 32 by zero rows (a view where it needs
// no padding and no cast).
torch::Tensor padded_bf16_rows(const torch::Tensor& rows) {
  const int64_t m = rows.size(0), padded = round_up(m, kBlock);
  if (padded == m && rows.scalar_type() == torch::kBFloat16 && rows.is_contiguous()) return rows;
  torch::Tensor out = torch::zeros({padded, rows.size(1)}, rows.options().dtype(torch::kBFloat16));
  out.narrow(0, 0, m).copy_(rows);
  return out;
}

// c = a x B for every 32 x 32 block, in parallel; each block's fp32 sums go to finish(row_block,
// column_block, block [32 x 32], stride 32), or straight to `direct` (row stride B's n) where given.
template <typename Finish>
void multiply(const torch::Tensor& a, PackedB& b, float* direct, const Finish& finish) {
#if FASTTRAIN_AMX_BUILD
  const int64_t row_blocks = a.size(0) / kBlock, column_blocks = b.n / kBlock, lda = a.size(1);
  const uint16_t* a_data = bf16_data(a);
  detail::parallel_pieces(0, row_blocks * column_blocks, 1, [&](int64_t begin, int64_t end) {
    configure_tiles();  // the tile configuration is each thread's own state
    alignas(64) float block[kBlock * kBlock];
    for (int64_t index = begin; index < end; ++index) {
      const int64_t i = index / column_blocks, j = index % column_blocks;
      const uint16_t* a_rows = a_data + i * kBlock * lda;
      if (direct != nullptr) {
        multiply_block(a_rows, lda, b.values(), b.tiles_per_step(), j, b.k,
                       direct + i * kBlock * b.n + j * kBlock, b.n);
      } else {
        multiply_block(a_rows, lda, b.values(), b.tiles_per_step(), j, b.k, block, kBlock);
        finish(i, j, block);
      }
    }
    release_tiles();
  });
#else
  (void)a, (void)b, (void)direct, (void)finish;
  FT_FAIL("amx_linear: this build has no AMX code");
#endif
}

class AmxLinearFunction : public torch::autograd::Function<AmxLinearFunction> {
 public:
  // x [M, K], weight [N, K] fp32, bias [N] fp32 -> y [M, N] bf16.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool relu,
                               bool input_grad) {
    const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
    const torch::Tensor a = padded_bf16_rows(x);  // [M', K] bf16
    // dz W's B comes from the same pass over the weight where x's gradient will be asked for.
    std::optional<PackedB> w_rows;
    if (input_grad) w_rows.emplace(n, k);
    PackedB b = pack_transposed(weight.contiguous(), w_rows ? &*w_rows : nullptr);
    const torch::Tensor bias_bf16 = detail::bf16_rounded(bias);  // autocast casts it
    torch::Tensor y = torch::empty({m, n}, x.options().dtype(torch::kBFloat16));
    uint16_t* out = bf16_data(y);
    multiply(a, b, nullptr, [&](int64_t i, int64_t j, const float* block) {
      for (int64_t r = 0; r < kBlock && i * kBlock + r < m; ++r)
        store_block_row(block + r * kBlock, bias_bf16.data_ptr<float>() + j * kBlock, relu,
                        out + (i * kBlock + r) * n + j * kBlock);
    });
    ctx->save_for_backward({a, weight, y, w_rows ? w_rows->storage : torch::Tensor()});
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["rows"] = m;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("amx_linear");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &a = saved[0], &weight = saved[1], &y = saved[2], &w_pairs = saved[3];
    const bool relu = ctx->saved_data["relu"].toBool();
    const int64_t m = ctx->saved_data["rows"].toInt(), n = weight.size(0), k = weight.size(1);
    // dz [M', N] bf16 and its transpose [N, M'] (what dW's A tiles read), zero past row M: the gradient where
    // the ReLU let the value through, both written in one pass.
    const int64_t padded = a.size(0);
    torch::Tensor dz = torch::empty({padded, n}, y.options()), dz_t = torch::empty({n, padded}, y.options());
    if (padded > m) {
      dz.narrow(0, m, padded - m).zero_();
      dz_t.narrow(1, m, padded - m).zero_();
    }
    const torch::Tensor dy = grads[0].to(torch::kBFloat16).contiguous();  // a no-op for y's own gradient
    const uint16_t *dy_data = bf16_data(dy), *y_data = bf16_data(y);
    uint16_t *dz_data = bf16_data(dz), *dz_t_data = bf16_data(dz_t);
    // By blocks of 32 rows, each transposed while its lines are in L1.
    detail::parallel_pieces(0, (m + kBlock - 1) / kBlock, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i0 = begin * kBlock; i0 < std::min(m, end * kBlock); i0 += kBlock) {
        const int64_t rows = std::min(kBlock, m - i0);
        if (relu) {
          for (int64_t i = i0; i < i0 + rows; ++i)
            relu_gradient_row(y_data + i * n, dy_data + i * n, n, dz_data + i * n);
        } else {
          std::memcpy(dz_data + i0 * n, dy_data + i0 * n, static_cast<size_t>(rows * n) * sizeof(uint16_t));
        }
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = i0; i < i0 + rows; ++i) dz_t_data[j * padded + i] = dz_data[i * n + j];
      }
    });
    torch::autograd::variable_list out(5);
    if (ctx->needs_input_grad(0)) {  // dx = dz W, rounded to bf16 as the bf16 matmul's output
      FT_CHECK(w_pairs.defined(), "amx_linear: x's gradient was asked for in backward, not in forward");
      PackedB w_rows(n, k, w_pairs);
      torch::Tensor dx = torch::empty({m, k}, y.options());
      uint16_t* dx_data = bf16_data(dx);
      multiply(dz, w_rows, nullptr, [&](int64_t i, int64_t j, const float* block) {
        for (int64_t r = 0; r < kBlock && i * kBlock + r < m; ++r)
          store_block_row(block + r * kBlock, nullptr, false, dx_data + (i * kBlock + r) * k + j * kBlock);
      });
      const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      out[0] = dx.to(x_dtype);
    }
    if (ctx->needs_input_grad(1)) {  // dW = dz^T x in fp32: [N, M'] x [M', K]
      PackedB x_rows = pack_row_pairs(a.narrow(0, 0, m));
      torch::Tensor dw = torch::empty({n, k}, weight.options());
      multiply(dz_t, x_rows, dw.data_ptr<float>(), [](int64_t, int64_t, const float*) {});
      out[1] = dw;
    }
    if (ctx->needs_input_grad(2)) {  // db: each row of dz^T summed in fp32
      torch::Tensor db = torch::empty({n}, weight.options());
      float* db_data = db.data_ptr<float>();
      std::fill(db_data, db_data + n, 0.f);
      const at::BFloat16* dz_values = dz.data_ptr<at::BFloat16>();
      for (int64_t i = 0; i < m; ++i)  // row by row: the sums run along contiguous values
        for (int64_t j = 0; j < n; ++j) db_data[j] += static_cast<float>(dz_values[i * n + j]);
      out[2] = db;
    }
    return out;
  }
};

bool fp32_cpu_matrix(const torch::Tensor& t, int64_t dims) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.dim() == dims;
}

}  // namespace

bool amx_linear_runs_here() {
  return amx_tiles_granted();
}

bool amx_linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return amx_tiles_granted() && detail::cpu_float_or_bf16(x) && x.dim() == 2 && x.size(0) > 0 &&
         cpu_compute_dtype(x) == torch::kBFloat16 && fp32_cpu_matrix(weight, 2) &&
         weight.size(1) == x.size(1) && weight.size(0) % kBlock == 0 && weight.size(1) % kStep == 0 &&
         weight.size(0) > 0 && weight.size(1) > 0 && fp32_cpu_matrix(bias, 1) &&
         bias.size(0) == weight.size(0);
}

torch::Tensor amx_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         bool relu) {
  const auto describe = [](const torch::Tensor& t) {
    return t.defined() ? fmt::format("{} {}", t.sizes(), c10::toString(t.scalar_type()))
                       : std::string("none");
  };
  FT_CHECK(amx_linear_runs_here(),
           "amx_linear needs a CPU with AMX-BF16 whose tiles the system lends this process");
  FT_CHECK(amx_linear_takes(x, weight, bias),
           "amx_linear takes x [M, K] (bf16, or fp32 under CPU autocast in bf16), weight fp32 [N, K] and "
           "bias fp32 "
           "[N], N a multiple of 32 and K of 32, on the CPU; got x {}, weight {}, bias {}",
           describe(x), describe(weight), describe(bias));
  return AmxLinearFunction::apply(x, weight, bias, relu, torch::GradMode::is_enabled() && x.requires_grad());
}

}  // namespace fasttrain::kernels
