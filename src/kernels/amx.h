#pragma once
// What the kernels on AMX's tile units share (amx_linear.cpp, amx_conv.cpp): the build switch, the tile
// configuration's layout, whether this process may use the tiles, and bf16 rounding in AVX-512 registers.
// A file that includes it is compiled alone (CMakeLists.txt keeps it out of the unity build's batches): the
// two warnings below are off for the rest of the file.
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define FASTTRAIN_AMX_BUILD 1
#include <immintrin.h>
#define FASTTRAIN_AMX_CODE __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))
#define FASTTRAIN_AVX512_CODE __attribute__((target("avx512f,avx512bw,avx512vl")))
// GCC 12's AVX512 intrinsics fill unused lanes from _mm512_undefined_epi32() (`__Y = __Y`), which it then
// reports as uninitialised where they are inlined into a function with a target attribute.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#else
#define FASTTRAIN_AMX_BUILD 0
#endif

namespace fasttrain::kernels::detail {

// Whether this CPU has AMX-BF16 tiles (and AVX-512BW/VL for the epilogues, whose state the OS saves) and
// Linux lends them to this process; asked once. False in a build without AMX code.
bool amx_tiles_granted();

// ldtilecfg's 64 bytes: palette 1, then each tile's bytes per row and rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

#if FASTTRAIN_AMX_BUILD
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
#endif

}  // namespace fasttrain::kernels::detail
