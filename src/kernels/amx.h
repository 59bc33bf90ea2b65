#pragma once
// What the kernels on AMX's tile units share (amx_linear.cpp, amx_conv.cpp): the build switch, the tile
// configuration's layout, whether this process may use the tiles, and bf16 rounding and (k, k + 1) pair
// interleaving in AVX-512 registers.
// A file that includes it is compiled alone (CMakeLists.txt keeps it out of the unity build's batches): the
// two warnings below are off for the rest of the file.
#include <array>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define FASTTRAIN_AMX_BUILD 1
#include <immintrin.h>
// The AMX loops may inline the AVX-512 (BF16) epilogues: amx_tiles_granted asks for both.
#define FASTTRAIN_AMX_CODE __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define FASTTRAIN_AVX512_CODE __attribute__((target("avx512f,avx512bw,avx512vl")))
#define FASTTRAIN_AVX512_BF16_CODE __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// GCC 12's AVX512 intrinsics fill unused lanes from _mm512_undefined_epi32() (`__Y = __Y`), which it then
// reports as uninitialised where they are inlined into a function with a target attribute.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#else
#define FASTTRAIN_AMX_BUILD 0
#endif

namespace fasttrain::kernels::detail {

// Whether this CPU has AMX-BF16 tiles (and AVX-512BW/VL and AVX-512 BF16 for the epilogues, whose state the
// OS saves) and Linux lends them to this process; asked once. False in a build without AMX code.
bool amx_tiles_granted();

// ldtilecfg's 64 bytes: palette 1, then each tile's bytes per row and rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

#if FASTTRAIN_AMX_BUILD
// This thread's tile configuration: tile t gets rows[t] rows of bytes_per_row[t] bytes.
FASTTRAIN_AMX_CODE inline void load_tile_config(const std::array<int, 8>& rows,
                                                const std::array<int, 8>& bytes_per_row) {
  // Static: GCC drops a local's stores, which ldtilecfg's builtin does not declare that it reads.
  static thread_local TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = static_cast<uint8_t>(rows[t]);
    config.bytes_per_row[t] = static_cast<uint16_t>(bytes_per_row[t]);
  }
  // ldtilecfg's builtin declares no read of the rows and widths above: they must be in memory before it.
  asm volatile("" ::: "memory");
  _tile_loadconfig(&config);
}

// 16 fp32 values rounded to bf16 (c10's rule: to nearest, ties to even; a NaN stays a quiet NaN), in the
// low halves of 16 32-bit lanes.
FASTTRAIN_AVX512_CODE inline __m512i round_to_bf16_lanes(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
}

// 32 bf16 of rows `first` and `second` interleaved as (first[c], second[c]) pairs: columns 0-15 in `low`,
// 16-31 in `high` (a row of two adjacent tiles of (k, k + 1) pairs each).
FASTTRAIN_AVX512_CODE inline void interleave_rows(__m512i first, __m512i second, uint16_t* low,
                                                  uint16_t* high) {
  const __m512i first_half = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                              39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i second_half = _mm512_add_epi16(first_half, _mm512_set1_epi16(16));
  _mm512_storeu_si512(low, _mm512_permutex2var_epi16(first, first_half, second));
  _mm512_storeu_si512(high, _mm512_permutex2var_epi16(first, second_half, second));
}
#endif

}  // namespace fasttrain::kernels::detail
