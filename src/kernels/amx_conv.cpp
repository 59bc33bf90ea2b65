// The 3x3 conv (stride 1, padding 1) and the 2x2 max-pool after it, forward, in bf16 on AMX's tile units:
// an implicit GEMM, with the max-pool in its epilogue; over one input channel a window's 4x4 patch per tile
// row (below); and the weight's and the input's gradients (further below).
//   conv[n, y, x, co] = sum over K blocks b of A_b[(y, x), 0:32] . B_b[0:32, co]          fp32 sums
//   A_b's row for (y, x) is 32 bf16 read straight from the zero-padded input (channels_last): two adjacent
//   taps of 16 channels where Cin is 16 (the third tap's pair is the fourth column's, with zero weights), or
//   32 channels of one tap; rows of consecutive x are one stride apart, so no im2col copy is made.
//   An accumulator tile is 16 x's of one row by 16 output channels. A pooling window's two rows run together:
//   2 rows x 2 channel tiles = 4 accumulators, each B tile loaded once for both rows.
//   y[n, oh, ow, co] = max over the window of bf16(conv + bias), and which of the four won (a byte)
// oneDNN's bf16 conv writes all four outputs of every window for the max-pool kernel to read back; here the
// sums go from the tiles to a 4 KiB scratch in L1 and only the pooled maps are written.
#include "amx_conv.h"

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "amx.h"
#include "cache_line.h"
#include "runnable.h"

namespace fasttrain::kernels::detail {

namespace {

constexpr int64_t kTileRows = 16;                      // positions (x's) per accumulator tile
constexpr int64_t kStep = 32;                          // K values per tile row of A: 32 bf16, 64 bytes
constexpr int64_t kChannelTile = 16;                   // output channels per accumulator tile
constexpr int64_t kTileValues = kChannelTile * kStep;  // a packed B tile: 16 rows of 16 (k, k + 1) pairs

// Which tap (dy, dx) and input channel the K value k (0-31) of K block `block` multiplies.
struct Tap {
  int64_t dy, dx, channel;
};
Tap tap_of(int64_t in_channels, int64_t block, int64_t k) {
  if (in_channels == 16) return {block / 2, 2 * (block % 2) + k / 16, k % 16};  // dx 3: zero weights
  const int64_t chunks = in_channels / kStep;
  return {block / (3 * chunks), (block / chunks) % 3, (block % chunks) * kStep + k};
}
int64_t block_count(int64_t in_channels) {
  return in_channels == 16 ? 6 : 9 * (in_channels / kStep);
}

struct AmxConvImages {
  int64_t batch = 0, height = 0, width = 0, in_channels = 0, out_channels = 0, out_height = 0, out_width = 0;
  // The input with a zero border: a row above and below, a column left, and right one (two over 16 channels).
  int64_t padded_height = 0, padded_width = 0;
  std::vector<int64_t> block_offsets;  // per K block: values from a position's top-left tap to its A row
  const uint16_t* images = nullptr;    // [N, H, W, Cin] bf16 (the forward over 16 or more channels)
  // [K blocks][Cout / 16] B tiles, row r column c: (B[2 r][c], B[2 r + 1][c]).
  const uint16_t* packed = nullptr;
  const float* bias = nullptr;  // [Cout] rounded to bf16, or null
  uint16_t* output = nullptr;   // [N, out_height, out_width, Cout] bf16
  uint8_t* argmax = nullptr;    // a byte per output value, or null (the BatchNorm's epilogue writes none)
  const BatchNormReluEpilogue* batch_norm = nullptr;  // or null: the pooled maps as they are
};

AmxConvImages describe(const torch::Tensor& input, int64_t out_channels) {
  AmxConvImages p;
  p.batch = input.size(0);
  p.in_channels = input.size(1);
  p.height = input.size(2);
  p.width = input.size(3);
  p.out_channels = out_channels;
  p.out_height = p.height / 2;
  p.out_width = p.width / 2;
  p.padded_height = p.height + 2;
  // Over 16 channels the last pair of taps reads one column past the right border's.
  p.padded_width = p.width + (p.in_channels == 16 ? 3 : 2);
  if (p.in_channels == 1) return p;  // the one-channel path reads the images unpadded (below)
  for (int64_t b = 0; b < block_count(p.in_channels); ++b) {
    const Tap first = tap_of(p.in_channels, b, 0);
    p.block_offsets.push_back((first.dy * p.padded_width + first.dx) * p.in_channels + first.channel);
  }
  return p;
}

// bf16 values in a block that starts on a cache line, not initialised (every value a tile reads is written
// before it): an image's A or B, built in it just before its tiles load them.
class LineAlignedValues {
 public:
  explicit LineAlignedValues(int64_t count)
      : count_(static_cast<std::size_t>(count)), values_(CacheLineAllocator<uint16_t>().allocate(count_)) {}
  ~LineAlignedValues() { CacheLineAllocator<uint16_t>().deallocate(values_, count_); }
  LineAlignedValues(const LineAlignedValues&) = delete;
  LineAlignedValues& operator=(const LineAlignedValues&) = delete;
  uint16_t* data() { return values_; }

 private:
  std::size_t count_;
  uint16_t* values_;
};

// The weight [Cout, Cin, 3, 3] rounded to bf16 as B tiles: tile (b, t) row r, column c holds the weights of
// output channel 16 t + c for K values 2 r and 2 r + 1 of block b.
torch::Tensor pack_weight(const torch::Tensor& weight, const AmxConvImages& p) {
  const torch::Tensor w = weight.detach().to(torch::kBFloat16).contiguous();
  const auto* values = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const int64_t blocks = block_count(p.in_channels), tiles = p.out_channels / kChannelTile;
  torch::Tensor packed = torch::empty({blocks * tiles * kTileValues}, torch::kBFloat16);
  auto* out = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t k = 0; k < kStep; ++k) {
      const Tap tap = tap_of(p.in_channels, b, k);
      for (int64_t co = 0; co < p.out_channels; ++co) {
        const int64_t at =
            ((b * tiles + co / kChannelTile) * 16 + k / 2) * kStep + (co % kChannelTile) * 2 + k % 2;
        out[at] = tap.dx > 2 ? 0 : values[((co * p.in_channels + tap.channel) * 3 + tap.dy) * 3 + tap.dx];
      }
    }
  }
  return packed;
}

// ---- One input channel: a pooling window per tile row ----
//   A's row for window (oh, ow) is the 4x4 input patch under it, x-major: 16 bf16 q[(2 ow + i) * 4 + j] =
//   x[2 oh - 1 + j, 2 ow - 1 + i] (zero outside the image), read from a pooled row's patch rows, in which
//   consecutive windows are 8 values apart.
//   B_k [16 (i, j), Cout] for window position k = 2 dy + dx: w[co, j - dy, i - dx], zero off the kernel.
//   conv[k] of each window = A . B_k: four accumulators, one per position, which the epilogue pools.
// A K of 16 where the tiles take 32, but a direct conv over one channel spends a multiply-add on 16
// channels per tap and position, and the tiles' one instruction covers 16 windows' 9 taps.
constexpr int64_t kPatchValues = 16;                                // 4 x 4, a tile row of A
constexpr int64_t kWindowTileValues = kPatchValues * kChannelTile;  // a packed B_k: 8 rows of 16 pairs

// The weight [Cout, 1, 3, 3] rounded to bf16 as the B_k tiles, [Cout / 16][4 positions][8 rows][16 pairs].
torch::Tensor pack_window_weight(const torch::Tensor& weight, int64_t out_channels) {
  const torch::Tensor w = weight.detach().to(torch::kBFloat16).contiguous();
  const auto* values = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  torch::Tensor packed =
      torch::zeros({out_channels / kChannelTile * 4 * kWindowTileValues}, torch::kBFloat16);
  auto* out = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  for (int64_t co = 0; co < out_channels; ++co) {
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t dy = k / 2, dx = k % 2;
      for (int64_t v = 0; v < kPatchValues; ++v) {  // v = 4 i + j: column 2 ow - 1 + i, row 2 oh - 1 + j
        const int64_t ky = v % 4 - dy, kx = v / 4 - dx;
        if (ky < 0 || ky > 2 || kx < 0 || kx > 2) continue;
        const int64_t tile = co / kChannelTile * 4 + k;
        out[tile * kWindowTileValues + v / 2 * 2 * kChannelTile + co % kChannelTile * 2 + v % 2] =
            values[co * 9 + ky * 3 + kx];
      }
    }
  }
  return packed;
}

#if FASTTRAIN_AMX_BUILD

// Tiles 0-3 accumulate (fp32) and 4-5 hold A's rows, `rows` each; 6-7 hold B's 16 rows of pairs.
FASTTRAIN_AMX_CODE void configure_tiles(int rows) {
  load_tile_config({rows, rows, rows, rows, rows, rows, 16, 16}, {64, 64, 64, 64, 64, 64, 64, 64});
}

// 16 channels' conv outputs: their sums plus the bias (none where null), rounded to bf16 as a bf16 conv's
// output is (AVX-512 BF16's conversion, as oneDNN's bf16 conv rounds: to nearest even, a NaN stays NaN; it
// flushes values under 2^-126 to zero, where c10's rounding keeps bf16's subnormals), as fp32.
FASTTRAIN_AVX512_BF16_CODE __m512 conv_output(const float* sums, const float* bias) {
  const __m512 v = _mm512_loadu_ps(sums);
  return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(bias != nullptr ? _mm512_add_ps(v, _mm512_loadu_ps(bias)) : v));
}

// 16 fp32 values rounded to bf16 (AVX-512 BF16's conversion) and stored.
FASTTRAIN_AVX512_BF16_CODE void store_bf16(__m512 values, uint16_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(values)));
}

// 16 channels' max(0, (x - mean) * scale + shift) from `first_channel`, computed, rounded to bf16 and stored
// as batch_norm_relu's kernel computes, rounds and stores them (at::vec's maximum gives a NaN where y is one;
// c10's rounding, a NaN written as 0x7FC0), so that the epilogue's maps are its bit for bit.
FASTTRAIN_AVX512_CODE void store_batch_norm_relu(__m512 x, const BatchNormReluEpilogue& norm,
                                                 int64_t first_channel, uint16_t* out) {
  const __m512 centred = _mm512_sub_ps(x, _mm512_loadu_ps(norm.mean + first_channel));
  const __m512 y = _mm512_fmadd_ps(centred, _mm512_loadu_ps(norm.scale + first_channel),
                                   _mm512_loadu_ps(norm.shift + first_channel));
  const __m512 relu =
      _mm512_mask_mov_ps(_mm512_max_ps(y, _mm512_setzero_ps()), _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), y);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(round_to_bf16_lanes(relu)));
}

// A scratch of conv sums as pool_windows reads them: [2 conv rows][x][channel] fp32, x from a chunk's first.
struct WindowSums {
  const float* values;
  int64_t x_stride, row_stride;  // in floats
  const float* at(int64_t conv_row, int64_t x, int64_t channel) const {
    return values + conv_row * row_stride + x * x_stride + channel;
  }
};

// The conv's sums of a window's two rows, sums[row][x][channel] (x from the chunk's first), for `windows`
// windows from `first_window` of pooled row `row` and `channels` channels from `first_channel`: each plus
// the bias and rounded to bf16, then pooled by max_pool_kernel.h's rule (a later value wins where it is
// greater or a NaN).
FASTTRAIN_AVX512_BF16_CODE void pool_windows(const AmxConvImages& p, const WindowSums& sums, int64_t row,
                                             int64_t first_window, int64_t windows, int64_t first_channel,
                                             int64_t channels) {
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t at = (row * p.out_width + first_window + w) * p.out_channels + first_channel;
    for (int64_t c = 0; c < channels; c += 16) {
      const float* window[4] = {sums.at(0, 2 * w, c), sums.at(0, 2 * w + 1, c), sums.at(1, 2 * w, c),
                                sums.at(1, 2 * w + 1, c)};
      const float* bias = p.bias != nullptr ? p.bias + first_channel + c : nullptr;
      __m512 best = conv_output(window[0], bias);
      __m128i which = _mm_setzero_si128();
      for (int k = 1; k < 4; ++k) {
        const __m512 value = conv_output(window[k], bias);
        const __mmask16 wins =
            _mm512_cmp_ps_mask(value, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
        best = _mm512_mask_mov_ps(best, wins, value);
        which = _mm_mask_mov_epi8(which, wins, _mm_set1_epi8(static_cast<char>(k)));
      }
      if (p.batch_norm != nullptr) {
        store_batch_norm_relu(best, *p.batch_norm, first_channel + c, p.output + at + c);
        continue;
      }
      // best holds bf16 values: converting it again is exact.
      store_bf16(best, p.output + at + c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p.argmax + at + c), which);
    }
  }
}

// Whether none of `count` bf16 values is a NaN or an infinity (all exponent bits set).
FASTTRAIN_AVX512_CODE bool all_finite(const uint16_t* values, int64_t count) {
  const __m512i exponent = _mm512_set1_epi16(0x7F80);
  __mmask32 any = 0;
  int64_t i = 0;
  for (; i + 32 <= count; i += 32)
    any |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(values + i), exponent), exponent);
  for (; i < count; ++i) any |= (values[i] & 0x7F80) == 0x7F80;
  return any == 0;
}

// Padded rows [first, last) of image n: the channels_last bf16 images with a zero border, as
// [padded_height][padded_width][Cin] holds them (a row above and below, a column left and one (two over 16
// channels) right). Returns whether the pixels of those rows are all finite.
FASTTRAIN_AVX512_CODE bool pad_rows(const AmxConvImages& p, int64_t n, int64_t first, int64_t last,
                                    uint16_t* padded) {
  const int64_t channels = p.in_channels, row_values = p.padded_width * channels;
  const int64_t image_values = p.width * channels;
  bool finite = true;
  for (int64_t row = first; row < last; ++row) {
    uint16_t* out = padded + row * row_values;
    const int64_t y = row - 1;
    if (y < 0 || y >= p.height) {
      std::memset(out, 0, row_values * sizeof(uint16_t));
      continue;
    }
    const uint16_t* in = p.images + (n * p.height + y) * image_values;
    std::memset(out, 0, channels * sizeof(uint16_t));
    std::memcpy(out + channels, in, image_values * sizeof(uint16_t));
    std::memset(out + channels + image_values, 0, (row_values - channels - image_values) * sizeof(uint16_t));
    if (finite) finite = all_finite(in, image_values);
  }
  return finite;
}

// Pooled rows [begin, end) of the batch * out_height: a window row's two conv rows, 16 x's at a time, 32
// output channels at a time (the last 16 alone where Cout is an odd multiple of 16). Each image's padded rows
// that these pooled rows read are built in the call's scratch as it reaches the image (so that the tiles load
// them from the cache); returns whether all of their pixels are finite.
FASTTRAIN_AMX_CODE bool forward_rows(const AmxConvImages& p, int64_t begin, int64_t end) {
  alignas(64) float sums[2][kTileRows][2 * kChannelTile];
  const int64_t row_values = p.padded_width * p.in_channels, stride = p.in_channels * 2;
  const int64_t blocks = static_cast<int64_t>(p.block_offsets.size()), tiles = p.out_channels / kChannelTile;
  LineAlignedValues padded(p.padded_height * row_values);
  bool finite = true;
  int configured = 0;
  for (int64_t r = begin, padded_image = -1; r < end; ++r) {
    const int64_t n = r / p.out_height, oh = r % p.out_height;
    if (n != padded_image) {  // pooled rows oh..last of image n read its padded rows 2 oh..2 last + 3
      const int64_t last = std::min(end, (n + 1) * p.out_height) - 1 - n * p.out_height;
      if (!pad_rows(p, padded_image = n, 2 * oh, 2 * last + 4, padded.data())) finite = false;
    }
    const uint16_t* top = padded.data() + 2 * oh * row_values;
    for (int64_t x0 = 0; x0 < 2 * p.out_width; x0 += kTileRows) {
      const int m = static_cast<int>(std::min(kTileRows, 2 * p.out_width - x0));  // even
      if (m != configured) configure_tiles(configured = m);
      for (int64_t t = 0; t < tiles; t += 2) {
        const bool both = t + 1 < tiles;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t b = 0; b < blocks; ++b) {
          const uint16_t* a = top + x0 * p.in_channels + p.block_offsets[b];
          const uint16_t* weights = p.packed + (b * tiles + t) * kTileValues;
          _tile_loadd(4, a, stride);
          _tile_loadd(6, weights, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(5, a + row_values, stride);
          _tile_dpbf16ps(2, 5, 6);
          if (both) {
            _tile_loadd(7, weights + kTileValues, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, &sums[0][0][0], sizeof(sums[0][0]));
        _tile_stored(2, &sums[1][0][0], sizeof(sums[0][0]));
        if (both) {
          _tile_stored(1, &sums[0][0][kChannelTile], sizeof(sums[0][0]));
          _tile_stored(3, &sums[1][0][kChannelTile], sizeof(sums[0][0]));
        }
        pool_windows(p, {&sums[0][0][0], 2 * kChannelTile, kTileRows * 2 * kChannelTile}, r, x0 / 2, m / 2,
                     kChannelTile * t, both ? 2 * kChannelTile : kChannelTile);
      }
    }
  }
  _tile_release();
  return finite;
}

// Tiles 0-3 accumulate the four window positions and 4 holds A, `windows` rows each; 5-7 hold B_k's 8 rows.
FASTTRAIN_AMX_CODE void configure_window_tiles(int windows) {
  constexpr int b_rows = kPatchValues / 2, a_bytes = kPatchValues * 2;
  load_tile_config({windows, windows, windows, windows, windows, b_rows, b_rows, b_rows},
                   {64, 64, 64, 64, a_bytes, 64, 64, 64});
}

// Pooled row `row`'s patch rows: q[x * 4 + j] = x[2 oh - 1 + j, x - 1] for x in [0, W + 2), zero outside the
// image; 32 columns at a time (four rows' masked loads, interleaved in registers).
FASTTRAIN_AVX512_CODE void patch_rows(const AmxConvImages& p, const uint16_t* images, int64_t row,
                                      uint16_t* q) {
  const int64_t n = row / p.out_height, oh = row % p.out_height;
  const __m512i pairs_low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39,
                                             7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i pairs_high = _mm512_add_epi16(pairs_low, _mm512_set1_epi16(16));
  const __m512i quads_low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i quads_high = _mm512_add_epi32(quads_low, _mm512_set1_epi32(8));
  // Lane l of the first chunk is pixel l - 1: loaded from the row's start and moved up a lane.
  const __m512i up_one = _mm512_set_epi16(30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                          13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0);
  for (int64_t x0 = 0; x0 < p.width + 2; x0 += 32) {
    // Lanes x0 + l with 1 <= x0 + l <= W hold pixel x0 + l - 1.
    const int64_t first = std::max<int64_t>(1, x0), last = std::min<int64_t>(p.width, x0 + 31);
    const int64_t count = std::max<int64_t>(0, last - first + 1),
                  from = first - 1;  // pixels [from, from + count)
    const __mmask32 loaded = static_cast<__mmask32>((uint64_t{1} << count) - 1);
    __m512i rows[4];
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t y = 2 * oh - 1 + j;
      if (y < 0 || y >= p.height) {
        rows[j] = _mm512_setzero_si512();
        continue;
      }
      const __m512i pixels = _mm512_maskz_loadu_epi16(loaded, images + (n * p.height + y) * p.width + from);
      rows[j] = x0 == 0 ? _mm512_maskz_permutexvar_epi16(~__mmask32{1}, up_one, pixels) : pixels;
    }
    const __m512i top[2] = {_mm512_permutex2var_epi16(rows[0], pairs_low, rows[1]),
                            _mm512_permutex2var_epi16(rows[0], pairs_high, rows[1])};
    const __m512i bottom[2] = {_mm512_permutex2var_epi16(rows[2], pairs_low, rows[3]),
                               _mm512_permutex2var_epi16(rows[2], pairs_high, rows[3])};
    for (int h = 0; h < 2; ++h) {
      _mm512_storeu_si512(q + (x0 + 16 * h) * 4, _mm512_permutex2var_epi32(top[h], quads_low, bottom[h]));
      _mm512_storeu_si512(q + (x0 + 16 * h + 8) * 4,
                          _mm512_permutex2var_epi32(top[h], quads_high, bottom[h]));
    }
  }
}

// Pooled rows [begin, end) of the batch * out_height over one input channel: up to 16 windows a tile, the
// last chunk of a row overlapping the one before it where out_width is past 16 (the same sums again).
FASTTRAIN_AMX_CODE void one_channel_rows(const AmxConvImages& p, const uint16_t* images, int64_t begin,
                                         int64_t end) {
  const int64_t windows = std::min(kTileRows, p.out_width), tiles = p.out_channels / kChannelTile;
  alignas(64) float sums[2][2 * kTileRows][kChannelTile];
  std::vector<uint16_t> q(static_cast<size_t>((p.width + 2 + 31) / 32 * 32 * 4));
  configure_window_tiles(static_cast<int>(windows));
  for (int64_t r = begin; r < end; ++r) {
    patch_rows(p, images, r, q.data());
    for (int64_t w0 = 0;; w0 += windows) {
      w0 = std::min(w0, p.out_width - windows);
      // A stays in tile 4 over the channel tiles (the epilogue between them touches no tile).
      _tile_loadd(4, q.data() + 2 * w0 * 4, 2 * 4 * sizeof(uint16_t));
      for (int64_t t = 0; t < tiles; ++t) {
        const uint16_t* b = p.packed + t * 4 * kWindowTileValues;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(5, b, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, b + kWindowTileValues, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, b + 2 * kWindowTileValues, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, b + 3 * kWindowTileValues, 64);
        _tile_dpbf16ps(3, 4, 5);
        // Position (dy, dx) of window m is x 2 m + dx of conv row dy.
        constexpr int64_t x_stride = kChannelTile * sizeof(float), row_bytes = 2 * x_stride;
        _tile_stored(0, &sums[0][0][0], row_bytes);
        _tile_stored(1, &sums[0][1][0], row_bytes);
        _tile_stored(2, &sums[1][0][0], row_bytes);
        _tile_stored(3, &sums[1][1][0], row_bytes);
        pool_windows(p, {&sums[0][0][0], kChannelTile, 2 * kTileRows * kChannelTile}, r, w0, windows,
                     kChannelTile * t, kChannelTile);
      }
      if (w0 + windows >= p.out_width) break;
    }
  }
  _tile_release();
}

#else

// Never called in a build without AMX code (amx_tiles_granted() is false there).
bool forward_rows(const AmxConvImages&, int64_t, int64_t) {
  return false;
}
void one_channel_rows(const AmxConvImages&, const uint16_t*, int64_t, int64_t) {}
bool all_finite(const uint16_t*, int64_t) {
  return true;
}

#endif

// all_finite over a whole tensor's values, in pieces on the pool's threads.
bool all_finite_in_parallel(const uint16_t* values, int64_t count) {
  std::atomic<bool> finite{true};
  parallel_pieces(0, count, 1 << 16, [&](int64_t begin, int64_t end) {
    if (!all_finite(values + begin, end - begin)) finite = false;
  });
  return finite;
}

// The bias rounded to bf16, as fp32 (undefined where there is none).
torch::Tensor rounded_bias(const torch::Tensor& bias) {
  return bias.defined() ? bias.detach().to(torch::kBFloat16).to(torch::kFloat).contiguous() : torch::Tensor();
}

// Whether the packed weights and the bias hold no NaN or infinity: the zero border (and over one channel, the
// patch's pixels off a position's kernel) times an infinite weight would be a NaN where conv2d gives none.
bool finite_parameters(const torch::Tensor& packed, const torch::Tensor& bias_values) {
  return all_finite(reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()), packed.numel()) &&
         (!bias_values.defined() || torch::isfinite(bias_values).all().item<bool>());
}

// The pooled maps, and their argmax bytes unless the BatchNorm's epilogue writes the maps (it keeps none).
Pooled pooled_maps(AmxConvImages& p, const torch::Tensor& input) {
  Pooled pooled;
  pooled.output = torch::empty({p.batch, p.out_channels, p.out_height, p.out_width},
                               input.options().dtype(torch::kBFloat16).memory_format(kChannelsLast));
  p.output = reinterpret_cast<uint16_t*>(pooled.output.data_ptr<at::BFloat16>());
  if (p.batch_norm == nullptr) {
    pooled.argmax = torch::empty({pooled.output.numel()}, input.options().dtype(torch::kByte));
    p.argmax = pooled.argmax.data_ptr<uint8_t>();
  }
  return pooled;
}

// A pooled row's cost for the pieces' grain: two conv rows of 2 * out_width x's, 9 * Cin * Cout
// multiply-adds each, 16 to a tile's column.
int64_t pooled_row_cost(const AmxConvImages& p) {
  return 2 * 2 * p.out_width * 9 * p.in_channels * p.out_channels / 16;
}

// The one-channel path: the images unpadded as bf16, a pooled row's patch rows built where it runs. A NaN
// or an infinity anywhere in a window's 4x4 patch reaches all four of its sums (times zero weights off each
// position's kernel), so such images are declined.
std::optional<Pooled> one_channel_max_pool(AmxConvImages& p, const torch::Tensor& input,
                                           const torch::Tensor& weight, const torch::Tensor& bias) {
  const torch::Tensor images = input.detach().to(torch::kBFloat16).contiguous(kChannelsLast);
  const auto* pixels = reinterpret_cast<const uint16_t*>(images.data_ptr<at::BFloat16>());
  if (!all_finite_in_parallel(pixels, images.numel())) return std::nullopt;
  const torch::Tensor packed = pack_window_weight(weight, p.out_channels), bias_values = rounded_bias(bias);
  if (!finite_parameters(packed, bias_values)) return std::nullopt;
  Pooled pooled = pooled_maps(p, input);
  p.packed = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  p.bias = bias_values.defined() ? bias_values.data_ptr<float>() : nullptr;
  parallel_pieces(0, p.batch * p.out_height, rows_per_task(pooled_row_cost(p)),
                  [&](int64_t begin, int64_t end) { one_channel_rows(p, pixels, begin, end); });
  return pooled;
}

}  // namespace

bool amx_conv_max_pool_takes(int64_t in_channels, int64_t out_channels) {
  return amx_tiles_granted() &&
         (in_channels == 1 || in_channels == 16 || (in_channels > 0 && in_channels % kStep == 0)) &&
         out_channels > 0 && out_channels % kChannelTile == 0;
}

std::optional<Pooled> amx_conv_max_pool(const torch::Tensor& input, const torch::Tensor& weight,
                                        const torch::Tensor& bias, const BatchNormReluEpilogue* batch_norm) {
  AmxConvImages p = describe(input, weight.size(0));
  p.batch_norm = batch_norm;
  FT_CHECK(
      amx_conv_max_pool_takes(p.in_channels, p.out_channels),
      "the AMX conv takes 1 or 16 input channels or a multiple of 32 and a multiple of 16 output channels "
      "on a CPU whose AMX tiles this process may use; got {} -> {}",
      p.in_channels, p.out_channels);
  if (p.in_channels == 1) return one_channel_max_pool(p, input, weight, bias);
  // channels_last [N, C, H, W] is [N, H, W, C] in memory.
  const torch::Tensor images = input.detach().to(torch::kBFloat16).contiguous(kChannelsLast);
  const torch::Tensor packed = pack_weight(weight, p), bias_values = rounded_bias(bias);
  if (!finite_parameters(packed, bias_values)) return std::nullopt;
  Pooled pooled = pooled_maps(p, input);
  p.images = reinterpret_cast<const uint16_t*>(images.data_ptr<at::BFloat16>());
  p.packed = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  p.bias = bias_values.defined() ? bias_values.data_ptr<float>() : nullptr;
  // Each task pads its images in its own scratch as it reaches them (in L1 for the tiles); a NaN or an
  // infinity in any declines the images after the pass.
  std::atomic<bool> finite{true};
  parallel_pieces(0, p.batch * p.out_height, rows_per_task(pooled_row_cost(p)),
                  [&](int64_t begin, int64_t end) {
                    if (!forward_rows(p, begin, end)) finite = false;
                  });
  if (!finite) return std::nullopt;
  return pooled;
}

// ---- The weight's gradient on the tiles ----
//   dW[co, ci, dy, dx] = sum over positions p of x[p + (dy, dx), ci] g[p, co]       C [9 Cin, Cout] fp32
// with g the winners' gradient (zero where a window's output lost). K runs over each image's positions on a
// grid Wp = W + 2 wide (rounded up to even): p = y Wp + x, the columns x >= 2 out_width and the rows y >= 2
// out_height holding g = 0. A: the input channel-major and zero-padded, x_t[ci, plane] (a tap's 32 positions
// are then one contiguous row of a tile, at offset dy Wp + dx); B: g in (p, p + 1) pairs, g_pairs[p / 2, co,
// 2], written straight from the pooled gradient and the argmax bytes. Both are built an image at a time in
// the call's scratch just before that image's sums, so that they are written and read in the cache (across
// the main job's batch they would be 1.1 and 1.8 MB, written to memory and read back). Four accumulators (2 M
// tiles of 16 (tap, ci) rows x 2 of 16 co) a pass, (9 Cin / 16 + 1) / 2 x Cout / 32 passes an image, loaded
// from and stored to the chunk's own fp32 sums between passes (from zero tiles for the chunk's first image).

namespace {

struct WeightGradientImages {
  int64_t batch = 0, height = 0, width = 0, in_channels = 0, out_channels = 0, out_height = 0, out_width = 0;
  int64_t grid_width = 0;            // Wp
  int64_t positions = 0;             // K per image: height * Wp rounded up to a multiple of 32
  int64_t plane = 0;                 // values per channel of x_t: (positions / Wp rounded up + 3) * Wp
  const uint16_t* images = nullptr;  // the input [N, H, W, Cin] bf16
  const uint16_t* grad = nullptr;    // the pooled maps' gradient [N, out_height, out_width, Cout] bf16
  const uint8_t* argmax = nullptr;   // its winners' bytes
};

WeightGradientImages describe_weight_gradient(c10::IntArrayRef input_sizes, int64_t out_channels) {
  WeightGradientImages w;
  w.batch = input_sizes[0];
  w.in_channels = input_sizes[1];
  w.height = input_sizes[2];
  w.width = input_sizes[3];
  w.out_channels = out_channels;
  w.out_height = w.height / 2;
  w.out_width = w.width / 2;
  w.grid_width = (w.width + 3) / 2 * 2;
  w.positions = (w.height * w.grid_width + kStep - 1) / kStep * kStep;
  w.plane = ((w.positions + w.grid_width - 1) / w.grid_width + 3) * w.grid_width;
  return w;
}

#if FASTTRAIN_AMX_BUILD

// The parts of x_t and g_pairs that no image writes, zero: x_t's plane rows above the image's first row
// and from below its last to the plane's end; g_pairs' columns right of the last window (x >= 2 out_width)
// and its positions after the last window row.
FASTTRAIN_AVX512_CODE void zero_borders(const WeightGradientImages& w, uint16_t* input_t,
                                        uint16_t* grad_pairs) {
  for (int64_t c = 0; c < w.in_channels; ++c) {
    uint16_t* plane = input_t + c * w.plane;
    std::fill(plane, plane + w.grid_width, uint16_t{0});
    std::fill(plane + (w.height + 1) * w.grid_width, plane + w.plane, uint16_t{0});
  }
  const int64_t channels = w.out_channels, right = w.grid_width - 2 * w.out_width;
  for (int64_t y = 0; y < 2 * w.out_height; ++y)
    std::fill_n(grad_pairs + (y * w.grid_width + 2 * w.out_width) * channels, right * channels, uint16_t{0});
  const int64_t from = 2 * w.out_height * w.grid_width;
  std::fill(grad_pairs + from * channels, grad_pairs + w.positions * channels, uint16_t{0});
}

// Image n's pooled gradient into g_pairs: a window's top pair of positions (k 0, 1) and its bottom pair
// (k 2, 3), each channel's gradient at its winner and zero at the other three.
FASTTRAIN_AVX512_CODE void scatter_pairs(const WeightGradientImages& w, int64_t n, uint16_t* grad_pairs) {
  const int64_t channels = w.out_channels;
  for (int64_t oh = 0; oh < w.out_height; ++oh) {
    for (int64_t ow = 0; ow < w.out_width; ++ow) {
      const int64_t at = ((n * w.out_height + oh) * w.out_width + ow) * channels;
      const int64_t top = (2 * oh * w.grid_width + 2 * ow) / 2, bottom = top + w.grid_width / 2;
      for (int64_t c = 0; c < channels; c += 32) {
        const __m512i values = _mm512_loadu_si512(w.grad + at + c);
        const __m256i which = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.argmax + at + c));
        __m512i won[4];
        for (int k = 0; k < 4; ++k) {
          won[k] = _mm512_maskz_mov_epi16(
              _mm256_cmpeq_epi8_mask(which, _mm256_set1_epi8(static_cast<char>(k))), values);
        }
        uint16_t* top_row = grad_pairs + (top * channels + c) * 2;
        uint16_t* bottom_row = grad_pairs + (bottom * channels + c) * 2;
        interleave_rows(won[0], won[1], top_row, top_row + 32);
        interleave_rows(won[2], won[3], bottom_row, bottom_row + 32);
      }
    }
  }
}

// 16 rows of 16 bf16 transposed in registers: unpacks of 16-, 32- and 64-bit pairs within 128-bit lanes, then
// the lanes' halves exchanged.
FASTTRAIN_AVX512_CODE void transpose16x16(__m256i (&r)[16]) {
  __m256i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm256_unpacklo_epi16(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi16(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm256_unpacklo_epi32(t[i], t[i + 2]);
    r[i + 1] = _mm256_unpackhi_epi32(t[i], t[i + 2]);
    r[i + 2] = _mm256_unpacklo_epi32(t[i + 1], t[i + 3]);
    r[i + 3] = _mm256_unpackhi_epi32(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8) {
    for (int k = 0; k < 4; ++k) {
      t[i + 2 * k] = _mm256_unpacklo_epi64(r[i + k], r[i + 4 + k]);
      t[i + 2 * k + 1] = _mm256_unpackhi_epi64(r[i + k], r[i + 4 + k]);
    }
  }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm256_permute2x128_si256(t[k], t[8 + k], 0x20);
    r[8 + k] = _mm256_permute2x128_si256(t[k], t[8 + k], 0x31);
  }
}

// Image n's rows into x_t, 16 grid columns by 16 channels at a time: grid column X holds pixel X - 1, so each
// row's first column and its last ones get their zeros in the same stores.
FASTTRAIN_AVX512_CODE void transpose_image(const WeightGradientImages& w, int64_t n, uint16_t* input_t) {
  for (int64_t y = 0; y < w.height; ++y) {
    const uint16_t* row = w.images + (n * w.height + y) * w.width * w.in_channels;
    for (int64_t x0 = 0; x0 < w.grid_width; x0 += 16) {
      const int64_t count = std::min<int64_t>(16, w.grid_width - x0);
      const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1);
      for (int64_t c0 = 0; c0 < w.in_channels; c0 += 16) {
        __m256i rows[16];
        for (int64_t i = 0; i < 16; ++i) {
          const int64_t x = x0 + i - 1;
          rows[i] = x >= 0 && x < w.width
                        ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + x * w.in_channels + c0))
                        : _mm256_setzero_si256();
        }
        transpose16x16(rows);
        for (int64_t c = 0; c < 16; ++c)
          _mm256_mask_storeu_epi16(input_t + (c0 + c) * w.plane + (y + 1) * w.grid_width + x0, valid,
                                   rows[c]);
      }
    }
  }
}

// Images [begin, end): their sums into sums [9 Cin, Cout] (row tap * Cin + ci), fp32, zero where there are
// none. Each image's A and B are built in the call's scratch and stay in the cache over its passes; the
// accumulators go to and from sums between them (from zero for the first image).
FASTTRAIN_AMX_CODE void weight_gradient_images(const WeightGradientImages& w, int64_t begin, int64_t end,
                                               float* sums) {
  if (begin == end) {
    std::fill_n(sums, 9 * w.in_channels * w.out_channels, 0.0f);
    return;
  }
  LineAlignedValues input_values(w.in_channels * w.plane), grad_values(w.positions * w.out_channels);
  uint16_t* const input_t = input_values.data();
  uint16_t* const grad_pairs = grad_values.data();
  zero_borders(w, input_t, grad_pairs);
  configure_tiles(16);
  const int64_t ci_tiles = w.in_channels / kChannelTile, m_tiles = 9 * ci_tiles;
  const int64_t co_tiles = w.out_channels / kChannelTile, steps = w.positions / kStep;
  const int64_t a_stride = w.plane * 2, b_stride = w.out_channels * 4, c_stride = w.out_channels * 4;
  auto a_of = [&](int64_t tile) {
    const int64_t tap = tile / ci_tiles, ci = (tile % ci_tiles) * kChannelTile;
    return input_t + ci * w.plane + (tap / 3) * w.grid_width + tap % 3;
  };
  for (int64_t n = begin; n < end; ++n) {
    transpose_image(w, n, input_t);
    scatter_pairs(w, n, grad_pairs);
    const bool first = n == begin;
    for (int64_t m = 0; m < m_tiles; m += 2) {
      const bool both_m = m + 1 < m_tiles;
      for (int64_t j = 0; j < co_tiles; j += 2) {
        const bool both_j = j + 1 < co_tiles;
        float* c0 = sums + m * kChannelTile * w.out_channels + j * kChannelTile;
        float* c1 = c0 + kChannelTile * w.out_channels;  // the next M tile's rows
        if (first) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        } else {
          _tile_loadd(0, c0, c_stride);
          if (both_j) _tile_loadd(1, c0 + kChannelTile, c_stride);
          if (both_m) {
            _tile_loadd(2, c1, c_stride);
            if (both_j) _tile_loadd(3, c1 + kChannelTile, c_stride);
          }
        }
        const uint16_t* a0 = a_of(m);
        const uint16_t* a1 = both_m ? a_of(m + 1) : a0;
        const uint16_t* b = grad_pairs + j * kChannelTile * 2;
        for (int64_t s = 0; s < steps; ++s, a0 += kStep, a1 += kStep, b += 16 * w.out_channels * 2) {
          _tile_loadd(4, a0, a_stride);
          _tile_loadd(6, b, b_stride);
          _tile_dpbf16ps(0, 4, 6);
          if (both_j) {
            _tile_loadd(7, b + 2 * kChannelTile, b_stride);
            _tile_dpbf16ps(1, 4, 7);
          }
          if (both_m) {
            _tile_loadd(5, a1, a_stride);
            _tile_dpbf16ps(2, 5, 6);
            if (both_j) _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, c0, c_stride);
        if (both_j) _tile_stored(1, c0 + kChannelTile, c_stride);
        if (both_m) {
          _tile_stored(2, c1, c_stride);
          if (both_j) _tile_stored(3, c1 + kChannelTile, c_stride);
        }
      }
    }
  }
  _tile_release();
}

#else

void weight_gradient_images(const WeightGradientImages&, int64_t, int64_t, float*) {}

#endif

}  // namespace

bool amx_conv_weight_gradient_takes(int64_t in_channels, int64_t out_channels) {
  return amx_tiles_granted() && in_channels > 0 && in_channels % kChannelTile == 0 && out_channels > 0 &&
         out_channels % kStep == 0;
}

std::optional<torch::Tensor> amx_conv_weight_gradient(const torch::Tensor& input,
                                                      const torch::Tensor& grad_output,
                                                      const torch::Tensor& argmax, int64_t out_channels) {
  WeightGradientImages w = describe_weight_gradient(input.sizes(), out_channels);
  FT_CHECK(
      amx_conv_weight_gradient_takes(w.in_channels, w.out_channels),
      "the AMX conv's weight gradient takes a multiple of 16 input channels and of 32 output channels on "
      "a CPU whose AMX tiles this process may use; got {} -> {}",
      w.in_channels, w.out_channels);
  const torch::Tensor images = input.detach().to(torch::kBFloat16).contiguous(kChannelsLast);
  const torch::Tensor grad = grad_output.to(torch::kBFloat16).contiguous(kChannelsLast);
  w.images = reinterpret_cast<const uint16_t*>(images.data_ptr<at::BFloat16>());
  w.grad = reinterpret_cast<const uint16_t*>(grad.data_ptr<at::BFloat16>());
  w.argmax = argmax.data_ptr<uint8_t>();
  if (!all_finite_in_parallel(w.grad, grad.numel())) return std::nullopt;
  const RowChunks chunks = row_chunks(w.batch, kPiecesPerThread);
  torch::Tensor sums = torch::empty({chunks.count, 9 * w.in_channels, w.out_channels}, torch::kFloat);
  for_each_row_chunk(w.batch, chunks, [&](int64_t begin, int64_t end, int64_t chunk) {
    weight_gradient_images(w, begin, end, sums[chunk].data_ptr<float>());
  });
  // [9 Cin, Cout] (tap, ci) rows -> [Cout, Cin, 3, 3], rounded to bf16 as a bf16 conv's backward gives it.
  return sums.sum(0)
      .view({3, 3, w.in_channels, w.out_channels})
      .permute({3, 2, 0, 1})
      .to(torch::kBFloat16)
      .to(torch::kFloat);
}

// ---- The input's gradient on the tiles ----
//   dx[n, y, x, ci] = sum over taps (ky, kx) and co of g_p[n, y + 2 - ky, x + 2 - kx, co] w[co, ci, ky, kx]
// with g_p the winners' gradient (zero where a window's output lost) inside a zero border of one row and
// column, written in one pass from the pooled gradient and the argmax bytes, each position once (oneDNN's
// path unpools the same values and then runs its conv backward). An implicit GEMM as the forward's: A's rows
// are 32 co of g_p at consecutive x, one stride apart; B a tap's [32 co, 16 ci] in (co, co + 1) pairs; four
// accumulators are four rows of dx, which share each B tile.

namespace {

struct InputGradientImages {
  int64_t batch = 0, height = 0, width = 0, in_channels = 0, out_channels = 0, out_height = 0, out_width = 0;
  const uint16_t* grad = nullptr;    // the pooled maps' gradient [N, out_height, out_width, Cout] bf16
  const uint8_t* argmax = nullptr;   // its winners' bytes
  const uint16_t* packed = nullptr;  // [9 taps][Cout / 32][Cin / 16] B tiles
  uint16_t* grad_input = nullptr;    // [N, H, W, Cin] bf16
  int64_t padded_width() const { return width + 2; }
  int64_t padded_height() const { return height + 2; }
};

// The weight [Cout, Cin, 3, 3] rounded to bf16 as B tiles: tile (tap, b, j) row r, column c holds
// w[32 b + 2 r, 16 j + c, tap] and w[32 b + 2 r + 1, 16 j + c, tap].
torch::Tensor pack_transposed_weight(const torch::Tensor& weight) {
  const torch::Tensor w = weight.detach().to(torch::kBFloat16).contiguous();
  const auto* values = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const int64_t cout = weight.size(0), cin = weight.size(1), blocks = cout / kStep,
                tiles = cin / kChannelTile;
  torch::Tensor packed = torch::empty({9 * blocks * tiles * kTileValues}, torch::kBFloat16);
  auto* out = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  for (int64_t tap = 0; tap < 9; ++tap)
    for (int64_t co = 0; co < cout; ++co)
      for (int64_t ci = 0; ci < cin; ++ci) {
        const int64_t tile = (tap * blocks + co / kStep) * tiles + ci / kChannelTile;
        out[tile * kTileValues + (co % kStep) / 2 * kStep + (ci % kChannelTile) * 2 + co % 2] =
            values[(co * cin + ci) * 9 + tap];
      }
  return packed;
}

#if FASTTRAIN_AMX_BUILD

// Image n's g_p: the border and an odd last row or column zero, elsewhere each channel's pooled gradient
// where its window's winner is this position and zero where it lost.
FASTTRAIN_AVX512_CODE void winner_rows(const InputGradientImages& g, int64_t n, uint16_t* winners) {
  const int64_t channels = g.out_channels, row_values = g.padded_width() * channels;
  for (int64_t r = 0; r < g.padded_height(); ++r) {
    const int64_t y = r - 1;
    uint16_t* out = winners + r * row_values;
    if (y < 0 || y >= 2 * g.out_height) {
      std::memset(out, 0, row_values * sizeof(uint16_t));
      continue;
    }
    std::memset(out, 0, channels * sizeof(uint16_t));  // the left border
    const int64_t pooled_row = (n * g.out_height + y / 2) * g.out_width;
    for (int64_t ow = 0; ow < g.out_width; ++ow) {
      for (int64_t c = 0; c < channels; c += 32) {
        const int64_t at = (pooled_row + ow) * channels + c;
        const __m512i values = _mm512_loadu_si512(g.grad + at);
        const __m256i which = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.argmax + at));
        for (int64_t dx = 0; dx < 2; ++dx) {
          const __mmask32 won =
              _mm256_cmpeq_epi8_mask(which, _mm256_set1_epi8(static_cast<char>(2 * (y % 2) + dx)));
          _mm512_storeu_si512(out + (2 * ow + dx + 1) * channels + c, _mm512_maskz_mov_epi16(won, values));
        }
      }
    }
    const int64_t right = g.padded_width() - 2 * g.out_width - 1;  // the right border and an odd last column
    std::memset(out + (2 * g.out_width + 1) * channels, 0, right * channels * sizeof(uint16_t));
  }
}

// Tiles 0-3 accumulate and 4 holds A's rows, `rows` each (x's); 5-7 hold B's 16 rows of pairs.
FASTTRAIN_AMX_CODE void configure_gradient_tiles(int rows) {
  load_tile_config({rows, rows, rows, rows, rows, 16, 16, 16}, {64, 64, 64, 64, 64, 64, 64, 64});
}

// Images [begin, end): each image's g_p built in the call's scratch (in the cache for its tile loads), then
// four rows of dx at a time (the last four overlapping the ones before where H is not a multiple of four), up
// to 16 x's at a time (likewise), 16 input channels at a time.
FASTTRAIN_AMX_CODE void input_gradient_images(const InputGradientImages& g, int64_t begin, int64_t end) {
  const int64_t x_count = std::min(kTileRows, g.width), group = std::min<int64_t>(4, g.height);
  const int64_t blocks = g.out_channels / kStep, tiles = g.in_channels / kChannelTile;
  const int64_t stride = g.out_channels * sizeof(uint16_t), row_values = g.padded_width() * g.out_channels;
  alignas(64) float sums[4][kTileRows][kChannelTile];
  LineAlignedValues winners(g.padded_height() * row_values);
  const uint16_t* const image = winners.data();
  configure_gradient_tiles(static_cast<int>(x_count));
  for (int64_t n = begin; n < end; ++n) {
    winner_rows(g, n, winners.data());
    for (int64_t y0 = 0;; y0 += group) {
      y0 = std::min(y0, g.height - group);
      for (int64_t x0 = 0;; x0 += x_count) {
        x0 = std::min(x0, g.width - x_count);
        for (int64_t j = 0; j < tiles; ++j) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          // dx row y0 + i takes tap (ky, kx) from g_p row y0 + i + 2 - ky: each of the group's g_p rows
          // (relative row i + 2 - ky) is loaded once per kx and block and multiplies a B tile of each ky it
          // meets.
          for (int64_t kx = 0; kx < 3; ++kx) {
            const uint16_t* a = image + y0 * row_values + (x0 + 2 - kx) * g.out_channels;
            for (int64_t b = 0; b < blocks; ++b, a += kStep) {
              const auto weights = [&](int64_t ky) {
                return g.packed + (((ky * 3 + kx) * blocks + b) * tiles + j) * kTileValues;
              };
              _tile_loadd(5, weights(0), 64);
              _tile_loadd(6, weights(1), 64);
              _tile_loadd(7, weights(2), 64);
              _tile_loadd(4, a, stride);  // relative row 0: (i, ky) = (0, 2)
              _tile_dpbf16ps(0, 4, 7);
              _tile_loadd(4, a + row_values, stride);  // 1: (0, 1), (1, 2)
              _tile_dpbf16ps(0, 4, 6);
              if (group > 1) _tile_dpbf16ps(1, 4, 7);
              _tile_loadd(4, a + 2 * row_values, stride);  // 2: (0, 0), (1, 1), (2, 2)
              _tile_dpbf16ps(0, 4, 5);
              if (group > 1) _tile_dpbf16ps(1, 4, 6);
              if (group > 2) _tile_dpbf16ps(2, 4, 7);
              if (group > 1) {  // 3: (1, 0), (2, 1), (3, 2)
                _tile_loadd(4, a + 3 * row_values, stride);
                _tile_dpbf16ps(1, 4, 5);
                if (group > 2) _tile_dpbf16ps(2, 4, 6);
                if (group > 3) _tile_dpbf16ps(3, 4, 7);
              }
              if (group > 2) {  // 4: (2, 0), (3, 1)
                _tile_loadd(4, a + 4 * row_values, stride);
                _tile_dpbf16ps(2, 4, 5);
                if (group > 3) _tile_dpbf16ps(3, 4, 6);
              }
              if (group > 3) {  // 5: (3, 0)
                _tile_loadd(4, a + 5 * row_values, stride);
                _tile_dpbf16ps(3, 4, 5);
              }
            }
          }
          constexpr int64_t row_bytes = kChannelTile * sizeof(float);
          _tile_stored(0, &sums[0][0][0], row_bytes);
          _tile_stored(1, &sums[1][0][0], row_bytes);
          _tile_stored(2, &sums[2][0][0], row_bytes);
          _tile_stored(3, &sums[3][0][0], row_bytes);
          for (int64_t i = 0; i < group; ++i)
            for (int64_t x = 0; x < x_count; ++x)
              store_bf16(_mm512_loadu_ps(&sums[i][x][0]),
                         g.grad_input + ((n * g.height + y0 + i) * g.width + x0 + x) * g.in_channels +
                             j * kChannelTile);
        }
        if (x0 + x_count >= g.width) break;
      }
      if (y0 + group >= g.height) break;
    }
  }
  _tile_release();
}

#else

void input_gradient_images(const InputGradientImages&, int64_t, int64_t) {}

#endif

}  // namespace

bool amx_conv_input_gradient_takes(int64_t in_channels, int64_t out_channels) {
  return amx_conv_weight_gradient_takes(in_channels, out_channels);
}

std::optional<torch::Tensor> amx_conv_input_gradient(const torch::Tensor& grad_output,
                                                     const torch::Tensor& argmax, const torch::Tensor& weight,
                                                     c10::IntArrayRef input_sizes) {
  InputGradientImages g;
  g.batch = input_sizes[0];
  g.in_channels = input_sizes[1];
  g.height = input_sizes[2];
  g.width = input_sizes[3];
  g.out_channels = weight.size(0);
  g.out_height = g.height / 2;
  g.out_width = g.width / 2;
  FT_CHECK(
      amx_conv_input_gradient_takes(g.in_channels, g.out_channels),
      "the AMX conv's input gradient takes a multiple of 16 input channels and of 32 output channels on a "
      "CPU whose AMX tiles this process may use; got {} -> {}",
      g.in_channels, g.out_channels);
  const torch::Tensor packed = pack_transposed_weight(weight);
  // The zero border times an infinite weight would be a NaN where conv2d's backward gives none.
  if (!all_finite(reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()), packed.numel()))
    return std::nullopt;
  const torch::Tensor grad = grad_output.to(torch::kBFloat16).contiguous(kChannelsLast);
  torch::Tensor grad_input =
      torch::empty({g.batch, g.in_channels, g.height, g.width}, grad.options().memory_format(kChannelsLast));
  g.grad = reinterpret_cast<const uint16_t*>(grad.data_ptr<at::BFloat16>());
  g.argmax = argmax.data_ptr<uint8_t>();
  g.packed = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  g.grad_input = reinterpret_cast<uint16_t*>(grad_input.data_ptr<at::BFloat16>());
  parallel_pieces(0, g.batch, 1, [&](int64_t begin, int64_t end) { input_gradient_images(g, begin, end); });
  return grad_input;
}

}  // namespace fasttrain::kernels::detail
