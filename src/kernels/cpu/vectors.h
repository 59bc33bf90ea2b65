#pragma once
// What the kernel bodies share, in the namespace of the capability each is compiled for.
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../cache_line.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

// v's lanes folded pairwise by `op` in a tree (log2 of kLanes shuffles and ops), the result in lane 0:
// the attention's and LayerNorm's rows are a few vectors each, and a chain of kLanes scalar steps was a
// third of a row's time. `scalar` folds two floats the same way where there are no vector registers.
template <typename VecOp, typename ScalarOp>
inline float lanes_fold(Vec v, const VecOp& op, const ScalarOp& scalar) {
#if defined(CPU_CAPABILITY_AVX512)
  (void)scalar;
  // The masked forms with every lane set: the unmasked ones start from _mm512_undefined_ps, which GCC 12
  // warns of as uninitialised.
  constexpr __mmask16 kAll = 0xFFFF;
  v = op(v, Vec(_mm512_mask_shuffle_f32x4(v, kAll, v, v, 0x4E)));  // 256-bit halves swapped
  v = op(v, Vec(_mm512_mask_shuffle_f32x4(v, kAll, v, v, 0xB1)));  // 128-bit quarters
  v = op(v, Vec(_mm512_mask_permute_ps(v, kAll, v, 0x4E)));        // pairs of lanes
  v = op(v, Vec(_mm512_mask_permute_ps(v, kAll, v, 0xB1)));        // lanes
  return _mm512_cvtss_f32(v);
#elif defined(CPU_CAPABILITY_AVX2)
  (void)scalar;
  v = op(v, Vec(_mm256_permute2f128_ps(v, v, 1)));
  v = op(v, Vec(_mm256_permute_ps(v, 0x4E)));
  v = op(v, Vec(_mm256_permute_ps(v, 0xB1)));
  return _mm256_cvtss_f32(v);
#else
  (void)op;
  float lanes[kLanes];
  v.store(lanes);
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; ++l) lanes[l] = scalar(lanes[l], lanes[l + width]);
  return lanes[0];
#endif
}

inline float lanes_sum(const Vec& v) {
  return lanes_fold(
      v, [](const Vec& a, const Vec& b) { return a + b; }, [](float a, float b) { return a + b; });
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// v 2^n for whole numbers n held as floats, |n| <= 252: AVX512's scalef; AVX2 multiplies by 2^(n / 2) and
// 2^(n - n / 2), each a normal float.
inline Vec times_power_of_two(const Vec& v, const Vec& n) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_scalef_ps(v, n);
#else
  const __m256 half = _mm256_floor_ps(_mm256_mul_ps(n, _mm256_set1_ps(0.5f)));
  const auto power = [](__m256 k) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
  };
  return Vec(_mm256_mul_ps(_mm256_mul_ps(v, power(half)), power(_mm256_sub_ps(n, half))));
#endif
}
#endif

// e^x, within about 2 ulp of the true value for x in [-87, 88.7] (Cephes' expf: n = round(x log2 e),
// f = x - n ln 2 by a two-part ln 2, e^f by a degree-5 polynomial, then 2^n), inline: at::vec's exp is
// Sleef's, an out-of-line call per vector (the GELU's backward ran 1.6x as long with it). Below -87 it gives
// e^-87 (1.6e-38), not less: a subnormal result costs a microcode assist per vector, and zeroing those
// lanes here measured slower again, so a caller whose results must reach 0 (the softmax's masked scores)
// writes its zeros itself. Past ~88.7 inf; NaN stays NaN. (The AVX512 and AVX2 builds; the other runs
// at::vec's.)
inline Vec exp_inline(const Vec& x) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  const Vec clamped = at::vec::minimum(at::vec::maximum(x, Vec(-87.f)), Vec(89.f));  // NaN passes
  const Vec scaled = clamped * Vec(1.44269504088896341f);
#if defined(CPU_CAPABILITY_AVX512)
  const Vec n = _mm512_roundscale_ps(scaled, _MM_FROUND_TO_NEAREST_INT);
#else
  const Vec n = _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
  const Vec f = at::vec::fmadd(n, Vec(2.12194440e-4f), at::vec::fmadd(n, Vec(-0.693359375f), clamped));
  Vec p = at::vec::fmadd(Vec(1.9875691500e-4f), f, Vec(1.3981999507e-3f));
  p = at::vec::fmadd(p, f, Vec(8.3334519073e-3f));
  p = at::vec::fmadd(p, f, Vec(4.1665795894e-2f));
  p = at::vec::fmadd(p, f, Vec(1.6666665459e-1f));
  p = at::vec::fmadd(p, f, Vec(5.0000001201e-1f));
  return times_power_of_two(at::vec::fmadd(p, f * f, f) + Vec(1.f), n);
#else
  return x.exp();
#endif
}

// Scratch rows that start on a cache line (see CacheLineAllocator).
using AlignedFloats = std::vector<float, detail::CacheLineAllocator<float>>;

// Applies `op(i, count)` to [0, width) a vector at a time, the last one partial.
template <typename Op>
void by_vectors(int64_t width, const Op& op) {
  for (int64_t i = 0; i < width; i += kLanes) op(i, std::min(kLanes, width - i));
}

// x[0, count) where !kWhole; where kWhole a whole vector, count then being kLanes (whole_or_partial picks
// kWhole so). A loop that keeps an array of sums in registers needs its loads whole: where a partial load's
// path is compiled into the loop, GCC keeps the array on the stack, a store and a reload per multiply-add.
template <bool kWhole>
inline Vec load_lanes(const float* x, int64_t count) {
  if constexpr (kWhole) {
    return Vec::loadu(x);
  } else {
    return Vec::loadu(x, count);
  }
}

// op(std::true_type{}) where count == kLanes, else op(std::false_type{}): a loop body compiled for whole
// vectors (load_lanes) and once more for the last, partial one.
template <typename Op>
inline void whole_or_partial(int64_t count, const Op& op) {
  if (count == kLanes) {
    op(std::true_type{});
  } else {
    op(std::false_type{});
  }
}

// A row of partial sums += v over its lanes [i, i + count) (a kernel's per-chunk parameter gradients).
inline void accumulate(float* partial, int64_t i, int64_t count, const Vec& v) {
  (Vec::loadu(partial + i, count) + v).store(partial + i, count);
}

// a * b + c in each lane with one rounding, in every build: at::vec::fmadd is the FMA instruction where the
// build has vectors, and an unfused multiply and add in the scalar one, where each lane here takes std::fma.
inline Vec fused_multiply_add(const Vec& a, const Vec& b, const Vec& c) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return at::vec::fmadd(a, b, c);
#else
  float x[kLanes], y[kLanes], z[kLanes];
  a.store(x);
  b.store(y);
  c.store(z);
  for (int64_t l = 0; l < kLanes; ++l) x[l] = std::fma(x[l], y[l], z[l]);
  return Vec::loadu(x);
#endif
}

// Each lane rounded to the nearest bf16 (ties to even), kept as fp32: what a bf16 op's output holds, for
// comparisons that must see the values it would see. A NaN stays a NaN, made quiet, so that its upper
// half (store_bf16_row) is a NaN too and not an infinity.
inline Vec round_to_bf16(const Vec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))),
                       _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m512 quiet = _mm512_castsi512_ps(_mm512_or_si512(bits, _mm512_set1_epi32(0x00400000)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), quiet, _mm512_castsi512_ps(rounded));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))),
                       _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m256 quiet = _mm256_castsi256_ps(_mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)));
  return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), quiet, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
#else
  float lanes[kLanes];
  v.store(lanes);
  for (float& lane : lanes) lane = static_cast<float>(static_cast<c10::BFloat16>(lane));
  return Vec::loadu(lanes);
#endif
}

// width fp32 values that hold bf16 values already (round_to_bf16's) to the bf16 `base` at element `offset`:
// their upper halves, a loop GCC vectorises (store_row's rounding conversion stays scalar).
inline void store_bf16_row(const float* row, void* base, int64_t offset, int64_t width) {
  uint16_t* dst = static_cast<uint16_t*>(base) + offset;
  for (int64_t i = 0; i < width; ++i) {
    uint32_t bits;
    std::memcpy(&bits, row + i, sizeof(bits));
    dst[i] = static_cast<uint16_t>(bits >> 16);
  }
}

// Small whole numbers held as floats (an argmax row) written as bytes. Through int32: GCC leaves a direct
// float-to-byte cast's loop scalar, and vectorises this one.
inline void store_bytes(const float* values, uint8_t* bytes, int64_t n) {
  for (int64_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(static_cast<int32_t>(values[i]));
}

// a . b over [0, width). Partial loads fill the missing lanes with zeros, so no mask is needed.
inline float row_dot(const float* a, const float* b, int64_t width) {
  Vec total(0.f);
  by_vectors(width, [&](int64_t i, int64_t count) {
    total = at::vec::fmadd(Vec::loadu(a + i, count), Vec::loadu(b + i, count), total);
  });
  return lanes_sum(total);
}

// All bits set where `v` is NaN. Not `v != v`: LibTorch 1.13's AVX512 `!=` is an ordered compare, false
// for NaN.
inline Vec is_nan(const Vec& v) {
  const Vec all_set = Vec(0.f) == Vec(0.f);
  return (v == v) ^ all_set;
}

// The positions of a 2x2 max-pool window: top left, top right, bottom left, bottom right.
constexpr int kWindow = 4;

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// A partial vector's missing lanes hold `fill`: loadu(count) fills them with zeros, which would count.
inline Vec load_or(const float* x, int64_t count, float fill) {
  const Vec values = Vec::loadu(x, count);
  return count == kLanes ? values : Vec::set(Vec(fill), values, count);
}

// max_{i < width} x_i; a NaN anywhere makes it NaN.
inline float row_max(const float* x, int64_t width) {
  Vec max(kMinusInfinity);
  by_vectors(width, [&](int64_t i, int64_t count) {
    max = at::vec::maximum(max, load_or(x + i, count, kMinusInfinity));
  });
  // A NaN, once in, stays: at::vec::maximum propagates it, as the scalar fold does.
  return lanes_fold(
      max, [](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); },
      [](float a, float b) {
        return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
      });
}

// `lanes` bf16 values as an fp32 vector (exact: the bits move to the upper halves); missing lanes read 0.
inline Vec load_bf16(const uint16_t* src, int64_t lanes) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m256i bits = lanes == kLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))
                                       : _mm256_maskz_loadu_epi16((__mmask16)((1u << lanes) - 1), src);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
#else
  float values[kLanes] = {};
  for (int64_t l = 0; l < lanes; ++l)
    values[l] = static_cast<float>(c10::BFloat16(src[l], c10::BFloat16::from_bits()));
  return Vec::loadu(values);
#endif
}

// The first `lanes` of `v` as bf16 by c10::BFloat16's rule (nearest, ties to even; every NaN 0x7FC0), so
// that a kernel writing a vector at a time gives what a row rounded by store_row gives.
inline void store_bf16(const Vec& v, uint16_t* dst, int64_t lanes) {
#if defined(CPU_CAPABILITY_AVX512)
  // round_to_bf16's bits, whose NaNs keep their payload: c10 writes every NaN as 0x7FC0.
  const __m512i rounded = _mm512_mask_blend_epi32(
      _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_srli_epi32(_mm512_castps_si512(round_to_bf16(v)), 16),
      _mm512_set1_epi32(0x7FC0));
  _mm512_mask_cvtepi32_storeu_epi16(dst, (__mmask16)(lanes == kLanes ? 0xFFFF : (1u << lanes) - 1), rounded);
#else
  float values[kLanes];
  v.store(values);
  for (int64_t l = 0; l < lanes; ++l) dst[l] = c10::BFloat16(values[l]).x;
#endif
}

// An operand in memory, fp32 or bf16, read and written a vector at a time as fp32 (`i` counts elements):
// a kernel templated on it converts bf16 in registers, with no scratch row to convert into.
struct Fp32Values {
  using Element = float;
  static Vec load(const void* base, int64_t i, int64_t lanes) {
    return Vec::loadu(static_cast<const float*>(base) + i, lanes);
  }
  static void store(const Vec& v, void* base, int64_t i, int64_t lanes) {
    v.store(static_cast<float*>(base) + i, lanes);
  }
};
struct Bf16Values {
  using Element = uint16_t;
  static Vec load(const void* base, int64_t i, int64_t lanes) {
    return load_bf16(static_cast<const uint16_t*>(base) + i, lanes);
  }
  static void store(const Vec& v, void* base, int64_t i, int64_t lanes) {
    store_bf16(v, static_cast<uint16_t*>(base) + i, lanes);
  }
};

// Zeros `count` elements of either dtype from element `i`.
template <typename Values>
void zero_elements(void* base, int64_t i, int64_t count) {
  using Element = typename Values::Element;
  std::memset(static_cast<Element*>(base) + i, 0, static_cast<size_t>(count) * sizeof(Element));
}

// width values from `base` (fp32, or bf16 where `bf16`) at element `offset` into the fp32 `row`.
inline void load_row(const void* base, bool bf16, int64_t offset, int64_t width, float* row) {
  if (bf16) {
    const c10::BFloat16* src = static_cast<const c10::BFloat16*>(base) + offset;
    for (int64_t i = 0; i < width; ++i) row[i] = static_cast<float>(src[i]);
  } else {
    std::memcpy(row, static_cast<const float*>(base) + offset, static_cast<size_t>(width) * sizeof(float));
  }
}

// The fp32 `row` to `base` (fp32, or bf16 where `bf16`, rounded to nearest even) at element `offset`.
inline void store_row(const float* row, void* base, bool bf16, int64_t offset, int64_t width) {
  if (bf16) {
    c10::BFloat16* dst = static_cast<c10::BFloat16*>(base) + offset;
    for (int64_t i = 0; i < width; ++i) dst[i] = static_cast<c10::BFloat16>(row[i]);
  } else {
    std::memcpy(static_cast<float*>(base) + offset, row, static_cast<size_t>(width) * sizeof(float));
  }
}

// A row of `base` as fp32: in place for fp32 tensors, else converted into `scratch` (a vector of floats).
template <typename Floats>
inline const float* row_in(const void* base, bool bf16, int64_t offset, int64_t width, Floats& scratch) {
  if (!bf16) return static_cast<const float*>(base) + offset;
  load_row(base, true, offset, width, scratch.data());
  return scratch.data();
}

// Where a row is computed: the output in place for fp32, else `scratch`, which finish_row rounds out.
template <typename Floats>
inline float* row_out(void* base, bool bf16, int64_t offset, Floats& scratch) {
  return bf16 ? scratch.data() : static_cast<float*>(base) + offset;
}

inline void finish_row(const float* row, void* base, bool bf16, int64_t offset, int64_t width) {
  if (bf16) store_row(row, base, true, offset, width);
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
