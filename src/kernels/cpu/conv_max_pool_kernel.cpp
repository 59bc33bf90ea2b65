// A 3x3 conv (padding 1) over a few input channels and the 2x2 max-pool after it, in one pass over
// channels_last images, vectorised over the output channels (contiguous in NHWC):
//   forward   the four conv outputs of each pooling window from the 4x4 input patch under it
//             (conv[k] = bias + sum over ci, ky, kx of x[2 oh + dy - 1 + ky, 2 ow + dx - 1 + kx, ci] w[ci,
//             ky, kx], k = 2 dy + dx); y = their maximum, argmax = which (the max-pool kernel's rule: the
//             first in row order, replaced by a greater value or a NaN)
//   backward  grad w[ci, ky, kx] += grad_y x[the winner's position + (ky - 1, kx - 1), ci];
//             grad bias += grad_y
// Only the pooled maps are written (a quarter of the conv's), and only the winners are summed in backward:
// a conv followed by a max-pool writes and reads the whole conv output in each direction. Over more input
// channels winograd_forward computes each window's four outputs by Winograd's F(2x2, 3x3) (or the dispatcher
// runs oneDNN's conv and the max-pool kernel), and winner_backward sums both the weight's and the input's
// gradients at the winners only, vectorised over the input channels:
//   grad w[co, ky, kx, ci] += grad_y[co] x[winner(co) + (ky - 1, kx - 1), ci]
//   grad x[winner(co) + (ky - 1, kx - 1), ci] += grad_y[co] w[co, ky, kx, ci]
// a quarter of a dense conv backward's multiply-adds.
// Compiled once per CPU capability (CMakeLists.txt), as attention_kernel.cpp is.
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

constexpr int kTaps = 9;   // 3 x 3
constexpr int kPatch = 4;  // the rows and columns of input under a 2x2 window of 3x3 convs

// Input row h of image n (W * Cin values) as fp32 into `values`, rounded to bf16 where the conv runs in bf16.
void load_input_row(const detail::ConvMaxPoolImages& p, int64_t n, int64_t h, float* values) {
  const int64_t width = p.width * p.in_channels, offset = (n * p.height + h) * width;
  if (p.bf16 && !p.input_bf16) {  // rounded on the way in: a copy and then a reload would stall the load
    const float* input = static_cast<const float*>(p.input) + offset;
    by_vectors(width, [&](int64_t j, int64_t count) {
      round_to_bf16(Vec::loadu(input + j, count)).store(values + j, count);
    });
  } else {
    load_row(p.input, p.input_bf16, offset, width, values);
  }
}

// The kPatch input rows under output row `row` (input rows 2 oh - 1 .. 2 oh + 2) as fp32, each with a zero
// column on either side: patch[i * padded_width + (w + 1) * Cin + ci] = x[2 oh - 1 + i, w, ci], zero outside
// the image; rounded to bf16 where the conv runs in bf16.
void load_patch(const detail::ConvMaxPoolImages& p, int64_t row, AlignedFloats& patch) {
  const int64_t image = row / p.out_height, out_row = row % p.out_height;
  const int64_t cin = p.in_channels, padded_width = (p.width + 2) * cin;
  std::fill(patch.begin(), patch.end(), 0.f);
  for (int i = 0; i < kPatch; ++i) {
    const int64_t h = 2 * out_row - 1 + i;
    if (h < 0 || h >= p.height) continue;
    load_input_row(p, image, h, patch.data() + i * padded_width + cin);
  }
}

// op(w, k, tap, value) for each of kWindows side by side pooling windows w (output columns ow, ow + 1, ...),
// each position k of its 2x2 window, each of its taps (ci * 9 + ky * 3 + kx) and the patch value that tap
// multiplies. The loops have constant bounds, so the compiler unrolls them and drops the pairs that fall
// outside the 3x3 kernel; the windows are innermost, so their sums are independent chains in flight at
// once (one window's four would wait on the multiply-add's latency).
template <int kCin, int kWindows, typename Op>
inline void for_each_tap(const float* patch, int64_t padded_width, int64_t ow, const Op& op) {
#pragma GCC unroll 4
  for (int ci = 0; ci < kCin; ++ci) {
#pragma GCC unroll 4
    for (int pr = 0; pr < kPatch; ++pr) {
#pragma GCC unroll 4
      for (int pc = 0; pc < kPatch; ++pc) {
#pragma GCC unroll 2
        for (int dy = 0; dy < 2; ++dy) {
#pragma GCC unroll 2
          for (int dx = 0; dx < 2; ++dx) {
            const int ky = pr - dy, kx = pc - dx;
            if (ky < 0 || ky >= 3 || kx < 0 || kx >= 3) continue;
#pragma GCC unroll 4
            for (int w = 0; w < kWindows; ++w) {
              const float value = patch[pr * padded_width + (2 * (ow + w) + pc) * kCin + ci];
              op(w, 2 * dy + dx, ci * kTaps + ky * 3 + kx, Vec(value));
            }
          }
        }
      }
    }
  }
}

// The max-pool's rule over a window's four conv outputs: its maximum and which of the four (as a float).
inline void pool_window(const Vec (&conv)[kWindow], Vec& best, Vec& which) {
  best = conv[0];
  which = Vec(0.f);
  for (int k = 1; k < kWindow; ++k) {
    const Vec wins = (conv[k] > best) | is_nan(conv[k]);
    best = Vec::blendv(best, conv[k], wins);
    which = Vec::blendv(which, Vec(static_cast<float>(k)), wins);
  }
}

// A window's four conv outputs (for `count` output channels from c, of column ow) rounded to bf16 where the
// conv runs in it, pooled, and the maximum and which won stored in the row's outputs and argmax; or, with
// p.batch_norm (fp32 only: the dispatcher's rule), the maximum's max(0, (x - mean) * scale + shift) as
// batch_norm_relu's normalize computes it (at::vec's maximum keeps a NaN), and which won not kept.
inline void pool_and_store(const detail::ConvMaxPoolImages& p, Vec (&conv)[kWindow], int64_t ow, int64_t c,
                           int64_t count, float* out, float* argmax_row) {
  const int64_t at = ow * p.out_channels + c;
  if (p.bf16) {
    for (Vec& value : conv) value = round_to_bf16(value);
  }
  Vec best, which;
  pool_window(conv, best, which);
  if (p.batch_norm != nullptr) {
    const detail::BatchNormReluEpilogue& norm = *p.batch_norm;
    const Vec y = at::vec::fmadd(best - Vec::loadu(norm.mean + c, count), Vec::loadu(norm.scale + c, count),
                                 Vec::loadu(norm.shift + c, count));
    at::vec::maximum(y, Vec(0.f)).store(out + at, count);
    return;
  }
  best.store(out + at, count);
  which.store(argmax_row + at, count);
}

// Output columns [ow, ow + kWindows) of one row for output channels [c, c + count): their conv outputs,
// maxima and argmax.
template <int kCin, int kWindows>
inline void forward_windows(const detail::ConvMaxPoolImages& p, const float* patch, int64_t padded_width,
                            const Vec* taps, const Vec& bias, int64_t ow, int64_t c, int64_t count,
                            float* out, float* argmax_row) {
  Vec conv[kWindows][kWindow];
  for (auto& window : conv)
    for (Vec& v : window) v = bias;
  for_each_tap<kCin, kWindows>(patch, padded_width, ow, [&](int w, int k, int64_t tap, const Vec& value) {
    conv[w][k] = at::vec::fmadd(value, taps[tap], conv[w][k]);
  });
  for (int w = 0; w < kWindows; ++w) pool_and_store(p, conv[w], ow + w, c, count, out, argmax_row);
}

// The input channels are a template argument: the tap arrays hold exactly the taps, and the loops over
// them unroll.
template <int kCin>
void forward_rows(const detail::ConvMaxPoolImages& p, int64_t begin, int64_t end) {
  const int64_t cout = p.out_channels, padded_width = (p.width + 2) * kCin;
  const int64_t out_width = p.out_width * cout;
  AlignedFloats patch(kPatch * padded_width), out_row(p.bf16 ? out_width : 0), argmax_row(out_width);
  for (int64_t r = begin; r < end; ++r) {
    load_patch(p, r, patch);
    float* out = row_out(p.output, p.bf16, r * out_width, out_row);
    by_vectors(cout, [&](int64_t c, int64_t count) {
      Vec taps[kCin * kTaps];
      for (int t = 0; t < kCin * kTaps; ++t) taps[t] = Vec::loadu(p.taps + t * cout + c, count);
      const Vec bias = p.bias ? Vec::loadu(p.bias + c, count) : Vec(0.f);
      int64_t ow = 0;
      for (; ow + 2 <= p.out_width; ow += 2)
        forward_windows<kCin, 2>(p, patch.data(), padded_width, taps, bias, ow, c, count, out,
                                 argmax_row.data());
      if (ow < p.out_width)
        forward_windows<kCin, 1>(p, patch.data(), padded_width, taps, bias, ow, c, count, out,
                                 argmax_row.data());
    });
    if (p.bf16) store_bf16_row(out, p.output, r * out_width, out_width);  // rounded already
    if (p.argmax != nullptr) store_bytes(argmax_row.data(), p.argmax + r * out_width, out_width);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// One input channel, a whole vector of output channels: each window's 4x4 patch is one 16-lane vector, and
// tap (ky, kx) of the winner at (dy, dx) is its lane (ky + dy) * 4 + kx + dx, so each lane (output
// channel) picks its own winner's value with one permute: 9 multiply-adds a window where the masked form
// takes 36, three in four of them by 0.
inline void add_winner_taps_one_channel(const float* patch, int64_t padded_width, int64_t ow, const Vec& grad,
                                        const Vec& which, Vec (&grad_taps)[kTaps]) {
  const float* at = patch + 2 * ow;  // kCin = 1: column 2 ow of each of the four rows
  const __m512 block = _mm512_insertf32x4(
      _mm512_insertf32x4(
          _mm512_insertf32x4(_mm512_castps128_ps512(_mm_loadu_ps(at)), _mm_loadu_ps(at + padded_width), 1),
          _mm_loadu_ps(at + 2 * padded_width), 2),
      _mm_loadu_ps(at + 3 * padded_width), 3);
  const __m512i k = _mm512_cvtps_epi32(which);  // 0 top left, 1 top right, 2 bottom left, 3 bottom right
  const __m512i corner = _mm512_add_epi32(k, _mm512_and_si512(k, _mm512_set1_epi32(2)));  // dy * 4 + dx
  for (int ky = 0; ky < 3; ++ky)
    for (int kx = 0; kx < 3; ++kx) {
      const __m512 value =
          _mm512_permutexvar_ps(_mm512_add_epi32(corner, _mm512_set1_epi32(ky * kPatch + kx)), block);
      grad_taps[ky * 3 + kx] = at::vec::fmadd(grad, Vec(value), grad_taps[ky * 3 + kx]);
    }
}
#endif

template <int kCin>
void weight_backward_rows(const detail::ConvMaxPoolImages& p, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t cout = p.out_channels, padded_width = (p.width + 2) * kCin;
  const int64_t out_width = p.out_width * cout, bias_row = kCin * kTaps;
  float* sums = p.grad_taps + chunk * (bias_row + 1) * cout;
  AlignedFloats patch(kPatch * padded_width), dy_row(p.bf16 ? out_width : 0), argmax_row(out_width);
  for (int64_t r = begin; r < end; ++r) {
    load_patch(p, r, patch);
    const float* dy = row_in(p.grad_output, p.bf16, r * out_width, out_width, dy_row);
    const uint8_t* argmax = p.argmax + r * out_width;
    for (int64_t i = 0; i < out_width; ++i) argmax_row[i] = static_cast<float>(argmax[i]);
    by_vectors(cout, [&](int64_t c, int64_t count) {
      Vec grad_taps[kCin * kTaps];
      for (int t = 0; t < bias_row; ++t) grad_taps[t] = Vec::loadu(sums + t * cout + c, count);
      Vec grad_bias = Vec::loadu(sums + bias_row * cout + c, count);
      for (int64_t ow = 0; ow < p.out_width; ++ow) {
        const Vec grad = Vec::loadu(dy + ow * cout + c, count);
        const Vec which = Vec::loadu(argmax_row.data() + ow * cout + c, count);
        grad_bias = grad_bias + grad;
#if defined(CPU_CAPABILITY_AVX512)
        if constexpr (kCin == 1) {
          if (count == kLanes) {
            add_winner_taps_one_channel(patch.data(), padded_width, ow, grad, which, grad_taps);
            continue;
          }
        }
#endif
        Vec grad_at[kWindow];  // grad where position k won, else 0
        for (int k = 0; k < kWindow; ++k)
          grad_at[k] = Vec::blendv(Vec(0.f), grad, which == Vec(static_cast<float>(k)));
        for_each_tap<kCin, 1>(patch.data(), padded_width, ow, [&](int, int k, int64_t tap, const Vec& value) {
          grad_taps[tap] = at::vec::fmadd(grad_at[k], value, grad_taps[tap]);
        });
      }
      for (int t = 0; t < bias_row; ++t) grad_taps[t].store(sums + t * cout + c, count);
      grad_bias.store(sums + bias_row * cout + c, count);
    });
  }
}

// Image n as fp32 rows of (W + 2) * Cin with a zero ring: padded[((h + 1) * (W + 2) + w + 1) * Cin + ci] =
// x[n, h, w, ci], rounded to bf16 where the conv runs in bf16 (as load_patch rounds).
void load_padded_image(const detail::ConvMaxPoolImages& p, int64_t n, float* padded) {
  const int64_t padded_row = (p.width + 2) * p.in_channels;
  std::fill(padded, padded + (p.height + 2) * padded_row, 0.f);
  for (int64_t h = 0; h < p.height; ++h)
    load_input_row(p, n, h, padded + (h + 1) * padded_row + p.in_channels);
}

// The index in an image padded by load_padded_image of the top left of the 3x3 neighbourhood of window (oh,
// ow)'s position k (0 top left, 1 top right, 2 bottom left, 3 bottom right): its tap (ky, kx) is row ky,
// column kx from there.
inline int64_t winner_neighbourhood(const detail::ConvMaxPoolImages& p, int64_t cin, int64_t oh, int64_t ow,
                                    int k) {
  return ((2 * oh + (k >> 1)) * (p.width + 2) + 2 * ow + (k & 1)) * cin;
}

// The input channels as the winners' loops see them: kCin where it is a template argument (not 0), so that
// each tap's offset is a constant in its load's address (perf under AVX2 had an address add or lea beside
// every multiply-add where it was not), else the images'.
template <int kCin>
inline int64_t input_channels(const detail::ConvMaxPoolImages& p) {
  return kCin > 0 ? kCin : p.in_channels;
}

// For each window and output channel of one image (at = window * Cout + co), where in an image padded by
// load_padded_image the 3x3 neighbourhood of that channel's winner starts (winner_neighbourhood; the
// dispatcher keeps a padded image within int32's range): computed
// once an image, so that the weight's loops below read one offset a window instead of recomputing it from
// the winner's byte, and keep their pointers in registers.
void winner_offsets(const detail::ConvMaxPoolImages& p, int64_t cin, const uint8_t* argmax,
                    int32_t* offsets) {
  const int64_t cout = p.out_channels;
  for (int64_t oh = 0; oh < p.out_height; ++oh) {
    for (int64_t ow = 0; ow < p.out_width; ++ow) {
      int64_t corner[kWindow];
      for (int k = 0; k < kWindow; ++k) corner[k] = winner_neighbourhood(p, cin, oh, ow, k);
      const int64_t at = (oh * p.out_width + ow) * cout;
      for (int64_t co = 0; co < cout; ++co) offsets[at + co] = static_cast<int32_t>(corner[argmax[at + co]]);
    }
  }
}

// One output channel's windows of one image, for input channels [c, c + count): grad_w[t] += g x over the 3x3
// neighbourhood of each window's winner (t = ky * 3 + kx; `offsets` from winner_offsets). Output channel
// outermost, so its nine sums stay in registers (kWhole: see load_lanes); the three rows' pointers too, so
// each multiply-add's load is one address mode, and the windows in order, as the sums were always taken.
template <int kCin, bool kWhole>
inline void winner_weight_windows(const detail::ConvMaxPoolImages& p, const float* padded, const float* dy,
                                  const int32_t* offsets, int64_t co, int64_t c, int64_t count,
                                  float* grad_row) {
  const int64_t cin = input_channels<kCin>(p), cout = p.out_channels, windows = p.out_height * p.out_width;
  const int64_t padded_row = (p.width + 2) * cin;
  Vec grad_w[kTaps];
  for (int t = 0; t < kTaps; ++t) grad_w[t] = Vec::loadu(grad_row + t * cin + c, count);
  const float* rows[3] = {padded + c, padded + c + padded_row, padded + c + 2 * padded_row};
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t at = w * cout + co, offset = offsets[at];
    const Vec grad(dy[at]);
#pragma GCC unroll 3
    for (int ky = 0; ky < 3; ++ky) {
#pragma GCC unroll 3
      for (int kx = 0; kx < 3; ++kx) {
        const int t = ky * 3 + kx;
        grad_w[t] = at::vec::fmadd(grad, load_lanes<kWhole>(rows[ky] + offset + kx * cin, count), grad_w[t]);
      }
    }
  }
  for (int t = 0; t < kTaps; ++t) grad_w[t].store(grad_row + t * cin + c, count);
}

// Which of a window's four positions won each of `count` (at most 64) output channels, as bit sets: bit i of
// won[k] is set where position k won channel i. Compares of 32 bytes at a time where there are vector
// registers: a counting sort of the channels by position kept its four counters in memory, and each
// increment waited on the store before it (a quarter of the input gradient's time).
inline void winners_of(const uint8_t* argmax, int64_t count, uint64_t (&won)[kWindow]) {
  for (uint64_t& bits : won) bits = 0;
  int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  for (; i + 32 <= count; i += 32) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(argmax + i));
    for (int k = 0; k < kWindow; ++k) {
      const auto equal =
          _mm256_movemask_epi8(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi8(static_cast<char>(k))));
      won[k] |= static_cast<uint64_t>(static_cast<uint32_t>(equal)) << i;
    }
  }
#endif
  for (; i < count; ++i) {
    for (int k = 0; k < kWindow; ++k) won[k] |= static_cast<uint64_t>(argmax[i] == k) << i;
  }
}

// One image's input gradient, window by window: grad_x[winner(co) + (ky - 1, kx - 1)] += g[co] w[co, ky, kx].
// For each of the window's four positions, the sum over the output channels it won is kept in nine
// registers and added once into that position's 3x3 neighbourhood: 36 stores a window, where a scatter per
// output channel stores 9 * Cout and each store waits on the one before it. The channels are taken 64 at a
// time (a position's sum is added once per 64), each 64 in increasing order.
template <int kCin>
void winner_input_windows(const detail::ConvMaxPoolImages& p, const float* dy, const uint8_t* argmax,
                          float* grad_padded) {
  const int64_t cin = input_channels<kCin>(p), cout = p.out_channels, padded_width = p.width + 2;
  for (int64_t oh = 0; oh < p.out_height; ++oh) {
    for (int64_t ow = 0; ow < p.out_width; ++ow) {
      const int64_t at = (oh * p.out_width + ow) * cout;
      for (int64_t first = 0; first < cout; first += 64) {
        uint64_t won[kWindow];
        winners_of(argmax + at + first, std::min<int64_t>(64, cout - first), won);
        for (int k = 0; k < kWindow; ++k) {
          if (won[k] == 0) continue;
          const int64_t winner = winner_neighbourhood(p, cin, oh, ow, k);
          by_vectors(cin, [&](int64_t c, int64_t count) {
            whole_or_partial(count, [&](auto whole) {
              Vec sums[kTaps];
              for (Vec& sum : sums) sum = Vec(0.f);
              for (uint64_t bits = won[k]; bits != 0; bits &= bits - 1) {
                const int64_t co = first + __builtin_ctzll(bits);
                const Vec grad(dy[at + co]);
                const float* weight_row = p.weight_rows + co * kTaps * cin + c;
#pragma GCC unroll 9
                for (int t = 0; t < kTaps; ++t)
                  sums[t] = at::vec::fmadd(grad, load_lanes<whole>(weight_row + t * cin, count), sums[t]);
              }
#pragma GCC unroll 3
              for (int ky = 0; ky < 3; ++ky) {
#pragma GCC unroll 3
                for (int kx = 0; kx < 3; ++kx) {
                  float* at_tap = grad_padded + winner + (ky * padded_width + kx) * cin + c;
                  (sums[ky * 3 + kx] + Vec::loadu(at_tap, count)).store(at_tap, count);
                }
              }
            });
          });
        }
      }
    }
  }
}

template <int kCin>
void winner_backward_images(const detail::ConvMaxPoolImages& p, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t cin = input_channels<kCin>(p), cout = p.out_channels, row_width = kTaps * cin + 1;
  const int64_t padded_size = (p.height + 2) * (p.width + 2) * cin, windows = p.out_height * p.out_width;
  float* sums = p.grad_rows + chunk * cout * row_width;
  AlignedFloats padded(padded_size), grad_padded(p.grad_input ? padded_size : 0), dy(windows * cout);
  std::vector<int32_t> offsets(windows * cout);
  for (int64_t n = begin; n < end; ++n) {
    load_padded_image(p, n, padded.data());
    load_row(p.grad_output, p.bf16, n * windows * cout, windows * cout, dy.data());
    const uint8_t* argmax = p.argmax + n * windows * cout;
    winner_offsets(p, cin, argmax, offsets.data());
    std::fill(grad_padded.begin(), grad_padded.end(), 0.f);
    for (int64_t co = 0; co < cout; ++co) {
      float* grad_row = sums + co * row_width;
      by_vectors(cin, [&](int64_t c, int64_t count) {
        whole_or_partial(count, [&](auto whole) {
          winner_weight_windows<kCin, whole>(p, padded.data(), dy.data(), offsets.data(), co, c, count,
                                             grad_row);
        });
      });
    }
    // The bias's gradient, every output channel at once: the sum of each one's gradients over the windows.
    by_vectors(cout, [&](int64_t co, int64_t count) {
      Vec sum(0.f);
      for (int64_t w = 0; w < windows; ++w) sum = sum + Vec::loadu(dy.data() + w * cout + co, count);
      float lanes[kLanes];
      sum.store(lanes);
      for (int64_t l = 0; l < count; ++l) sums[(co + l) * row_width + kTaps * cin] += lanes[l];
    });
    if (!p.grad_input) continue;
    winner_input_windows<kCin>(p, dy.data(), argmax, grad_padded.data());
    // The interior in input's dtype, rounded to bf16 where either the conv or the input is (a bf16 conv's
    // input gradient is bf16).
    const int64_t row = p.width * cin, padded_row = (p.width + 2) * cin;
    for (int64_t h = 0; h < p.height; ++h) {
      float* values = grad_padded.data() + (h + 1) * padded_row + cin;
      if (p.bf16 || p.input_bf16) {
        by_vectors(row, [&](int64_t j, int64_t count) {
          round_to_bf16(Vec::loadu(values + j, count)).store(values + j, count);
        });
      }
      const int64_t offset = (n * p.height + h) * row;
      if (p.input_bf16) {
        store_bf16_row(values, p.grad_input, offset, row);  // rounded already
      } else {
        store_row(values, p.grad_input, false, offset, row);
      }
    }
  }
}

// The common channel counts of a conv net's later stages as constants, any other count at run time.
void winner_backward(const detail::ConvMaxPoolImages& p, int64_t begin, int64_t end, int64_t chunk) {
  switch (p.in_channels) {
    case 8:
      return winner_backward_images<8>(p, begin, end, chunk);
    case 16:
      return winner_backward_images<16>(p, begin, end, chunk);
    case 32:
      return winner_backward_images<32>(p, begin, end, chunk);
    case 64:
      return winner_backward_images<64>(p, begin, end, chunk);
    default:
      return winner_backward_images<0>(p, begin, end, chunk);
  }
}

// Winograd's F(2x2, 3x3) (Lavin and Gray, 2015), one pooling window per output tile. For the 4x4 input patch
// d under a window and each input channel, V = B^T d B; for each input and output channel, U = G g G^T (the
// dispatcher's winograd_taps); per position xi of the 4x4, M[xi] = sum over ci of V[xi, ci] U[xi, ci, co], 16
// GEMMs of [windows, Cin] x [Cin, Cout]; the window's conv outputs are A^T M A + bias, pooled in registers.
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  A^T = [1 1 1 0; 0 1 -1 -1]
constexpr int kTransformed = kPatch * kPatch;

// V of window ow's patch for input channels [c, c + count): v[xi * Cin + c], xi = 4 i + j.
template <bool kWhole>
inline void transform_patch(const float* patch, int64_t padded_width, int64_t cin, int64_t ow, int64_t c,
                            int64_t count, float* v) {
  Vec rows[kPatch][kPatch];  // B^T d
  for (int j = 0; j < kPatch; ++j) {
    Vec d[kPatch];
    for (int i = 0; i < kPatch; ++i)
      d[i] = load_lanes<kWhole>(patch + i * padded_width + (2 * ow + j) * cin + c, count);
    rows[0][j] = d[0] - d[2];
    rows[1][j] = d[1] + d[2];
    rows[2][j] = d[2] - d[1];
    rows[3][j] = d[1] - d[3];
  }
  for (int i = 0; i < kPatch; ++i) {
    const Vec* t = rows[i];
    const Vec transformed[kPatch] = {t[0] - t[2], t[1] + t[2], t[2] - t[1], t[1] - t[3]};
    for (int j = 0; j < kPatch; ++j) transformed[j].store(v + (i * kPatch + j) * cin + c, count);
  }
}

// For kWindows windows side by side and kVecs vectors of output channels from c, at one position xi:
// m[w][co] = sum over ci of v[w][ci] u[ci][co] (v, u and m already at xi; a window's values are kTransformed
// rows apart in v and m). The sums stay in registers: 8 of them for 4 windows of 2 vectors, with 2 weight
// vectors and a broadcast, within AVX2's 16.
template <int kWindows, int kVecs>
inline void multiply_windows(const float* v, const float* u, float* m, int64_t cin, int64_t padded_cout,
                             int64_t c) {
  Vec sums[kWindows][kVecs];
  for (auto& window : sums)
    for (Vec& sum : window) sum = Vec(0.f);
  for (int64_t ci = 0; ci < cin; ++ci) {
    Vec weights[kVecs];
    for (int k = 0; k < kVecs; ++k) weights[k] = Vec::loadu(u + ci * padded_cout + c + k * kLanes);
    for (int w = 0; w < kWindows; ++w) {
      const Vec value(v[w * kTransformed * cin + ci]);
      for (int k = 0; k < kVecs; ++k) sums[w][k] = at::vec::fmadd(value, weights[k], sums[w][k]);
    }
  }
  for (int w = 0; w < kWindows; ++w)
    for (int k = 0; k < kVecs; ++k) sums[w][k].store(m + w * kTransformed * padded_cout + c + k * kLanes);
}

template <int kWindows>
inline void multiply_windows(const float* v, const float* u, float* m, int64_t cin, int64_t padded_cout) {
  int64_t c = 0;
  for (; c + 2 * kLanes <= padded_cout; c += 2 * kLanes)
    multiply_windows<kWindows, 2>(v, u, m, cin, padded_cout, c);
  if (c < padded_cout) multiply_windows<kWindows, 1>(v, u, m, cin, padded_cout, c);
}

// M for every window of the row: the 16 GEMMs, 4 windows at a time.
void multiply_row(const detail::ConvMaxPoolImages& p, const float* v, float* m) {
  const int64_t cin = p.in_channels, padded_cout = p.winograd_out_channels;
  for (int xi = 0; xi < kTransformed; ++xi) {
    const float* u = p.winograd_taps + xi * cin * padded_cout;
    auto at = [&](int64_t ow) {
      return std::make_pair(v + (ow * kTransformed + xi) * cin, m + (ow * kTransformed + xi) * padded_cout);
    };
    int64_t ow = 0;
    for (; ow + 4 <= p.out_width; ow += 4)
      multiply_windows<4>(at(ow).first, u, at(ow).second, cin, padded_cout);
    switch (p.out_width - ow) {
      case 3:
        multiply_windows<3>(at(ow).first, u, at(ow).second, cin, padded_cout);
        break;
      case 2:
        multiply_windows<2>(at(ow).first, u, at(ow).second, cin, padded_cout);
        break;
      case 1:
        multiply_windows<1>(at(ow).first, u, at(ow).second, cin, padded_cout);
        break;
      default:
        break;
    }
  }
}

// A window's four conv outputs A^T M A + bias for the output channels [c, c + kLanes) (m at the window).
inline void transform_window(const float* m, int64_t padded_cout, int64_t c, const Vec& bias,
                             Vec (&conv)[kWindow]) {
  Vec rows[2][kPatch];  // A^T M
  for (int j = 0; j < kPatch; ++j) {
    Vec column[kPatch];
    for (int i = 0; i < kPatch; ++i) column[i] = Vec::loadu(m + (i * kPatch + j) * padded_cout + c);
    rows[0][j] = column[0] + column[1] + column[2];
    rows[1][j] = column[1] - column[2] - column[3];
  }
  for (int dy = 0; dy < 2; ++dy) {
    const Vec* t = rows[dy];
    conv[2 * dy] = t[0] + t[1] + t[2] + bias;
    conv[2 * dy + 1] = t[1] - t[2] - t[3] + bias;
  }
}

void winograd_forward(const detail::ConvMaxPoolImages& p, int64_t begin, int64_t end) {
  const int64_t cin = p.in_channels, cout = p.out_channels, padded_cout = p.winograd_out_channels;
  const int64_t padded_width = (p.width + 2) * cin, out_width = p.out_width * cout;
  AlignedFloats patch(kPatch * padded_width), v(p.out_width * kTransformed * cin),
      m(p.out_width * kTransformed * padded_cout), out_row(p.bf16 ? out_width : 0), argmax_row(out_width);
  for (int64_t r = begin; r < end; ++r) {
    load_patch(p, r, patch);
    for (int64_t ow = 0; ow < p.out_width; ++ow) {
      by_vectors(cin, [&](int64_t c, int64_t count) {
        whole_or_partial(count, [&](auto whole) {
          transform_patch<whole>(patch.data(), padded_width, cin, ow, c, count,
                                 v.data() + ow * kTransformed * cin);
        });
      });
    }
    multiply_row(p, v.data(), m.data());
    float* out = row_out(p.output, p.bf16, r * out_width, out_row);
    by_vectors(cout, [&](int64_t c, int64_t count) {
      const Vec bias = p.bias ? Vec::loadu(p.bias + c, count) : Vec(0.f);
      for (int64_t ow = 0; ow < p.out_width; ++ow) {
        Vec conv[kWindow];
        transform_window(m.data() + ow * kTransformed * padded_cout, padded_cout, c, bias, conv);
        pool_and_store(p, conv, ow, c, count, out, argmax_row.data());
      }
    });
    if (p.bf16) store_bf16_row(out, p.output, r * out_width, out_width);  // rounded already
    if (p.argmax != nullptr) store_bytes(argmax_row.data(), p.argmax + r * out_width, out_width);
  }
}

// body<kCin>(...) for the images' input channel count (1 to kConvMaxPoolInChannels).
#define FASTTRAIN_BY_IN_CHANNELS(body, p, ...) \
  switch ((p).in_channels) {                   \
    case 1:                                    \
      return body<1>((p), __VA_ARGS__);        \
    case 2:                                    \
      return body<2>((p), __VA_ARGS__);        \
    case 3:                                    \
      return body<3>((p), __VA_ARGS__);        \
    default:                                   \
      return body<4>((p), __VA_ARGS__);        \
  }
static_assert(detail::kConvMaxPoolInChannels == 4, "FASTTRAIN_BY_IN_CHANNELS covers 1 to 4 channels");

void forward(const detail::ConvMaxPoolImages& p, int64_t begin, int64_t end) {
  FASTTRAIN_BY_IN_CHANNELS(forward_rows, p, begin, end)
}

void weight_backward(const detail::ConvMaxPoolImages& p, int64_t begin, int64_t end, int64_t chunk) {
  FASTTRAIN_BY_IN_CHANNELS(weight_backward_rows, p, begin, end, chunk)
}
#undef FASTTRAIN_BY_IN_CHANNELS

}  // namespace

detail::ConvMaxPoolKernels conv_max_pool_kernels() {
  return {&forward, &winograd_forward, &weight_backward, &winner_backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
