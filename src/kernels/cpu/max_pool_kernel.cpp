// 2x2 max-pool at stride 2 over channels_last images, one output row at a time in fp32 (bf16 values
// converted in registers, exactly), vectorised over the channels (contiguous in NHWC):
//   forward   y = the window's maximum, argmax = which of the four (a byte, not ATen's int64 index)
//   backward  grad_input = grad_y at the argmax, 0 at the window's other three values
// ATen's rule for the winner: the first of the window in row order, replaced only by a greater value
// or a NaN (so NaN propagates), which makes both directions equal to ATen's bit for bit. Backward
// writes every grad_input value once, where ATen zero-fills the whole tensor and then scatters.
// Compiled once per CPU capability (CMakeLists.txt), as attention_kernel.cpp is.
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

struct RowPosition {
  int64_t image, out_row;
};

RowPosition position(const detail::MaxPoolImages& p, int64_t row) {
  return {row / p.out_height, row % p.out_height};
}

// Element offset of input row `h` of `image`.
int64_t input_row_offset(const detail::MaxPoolImages& p, int64_t image, int64_t h) {
  return (image * p.height + h) * p.width * p.channels;
}

template <typename Values>
void forward_as(const detail::MaxPoolImages& p, int64_t begin, int64_t end) {
  const int64_t channels = p.channels, in_width = p.width * channels, out_width = p.out_width * channels;
  std::vector<float> argmax_row(out_width);
  for (int64_t r = begin; r < end; ++r) {
    const RowPosition at = position(p, r);
    const int64_t top = input_row_offset(p, at.image, 2 * at.out_row), bottom = top + in_width;
    for (int64_t ow = 0; ow < p.out_width; ++ow) {
      const int64_t left = 2 * ow * channels, right = left + channels;
      const int64_t window[kWindow] = {top + left, top + right, bottom + left, bottom + right};
      by_vectors(channels, [&](int64_t c, int64_t count) {
        Vec best = Values::load(p.input, window[0] + c, count), which(0.f);
        for (int k = 1; k < kWindow; ++k) {
          const Vec value = Values::load(p.input, window[k] + c, count);
          const Vec wins = (value > best) | is_nan(value);
          best = Vec::blendv(best, value, wins);
          which = Vec::blendv(which, Vec(static_cast<float>(k)), wins);
        }
        Values::store(best, p.output, r * out_width + ow * channels + c, count);
        which.store(argmax_row.data() + ow * channels + c, count);
      });
    }
    store_bytes(argmax_row.data(), p.argmax + r * out_width, out_width);
  }
}

template <typename Values>
void backward_as(const detail::MaxPoolImages& p, int64_t begin, int64_t end) {
  const int64_t channels = p.channels, in_width = p.width * channels, out_width = p.out_width * channels;
  std::vector<float> argmax_row(out_width);
  for (int64_t r = begin; r < end; ++r) {
    const RowPosition at = position(p, r);
    const uint8_t* argmax = p.argmax + r * out_width;
    for (int64_t i = 0; i < out_width; ++i) argmax_row[i] = static_cast<float>(argmax[i]);
    const int64_t top = input_row_offset(p, at.image, 2 * at.out_row), bottom = top + in_width;
    for (int64_t ow = 0; ow < p.out_width; ++ow) {
      const int64_t left = 2 * ow * channels, right = left + channels;
      const int64_t window[kWindow] = {top + left, top + right, bottom + left, bottom + right};
      by_vectors(channels, [&](int64_t c, int64_t count) {
        const Vec grad = Values::load(p.grad_output, r * out_width + ow * channels + c, count);
        const Vec which = Vec::loadu(argmax_row.data() + ow * channels + c, count);
        for (int k = 0; k < kWindow; ++k)
          Values::store(Vec::blendv(Vec(0.f), grad, which == Vec(static_cast<float>(k))), p.grad_input,
                        window[k] + c, count);
      });
    }
    // An odd last column is outside every window.
    zero_elements<Values>(p.grad_input, top + 2 * out_width, in_width - 2 * out_width);
    zero_elements<Values>(p.grad_input, bottom + 2 * out_width, in_width - 2 * out_width);
    // So is an odd last row: the image's last output row writes it.
    if (p.height % 2 == 1 && at.out_row == p.out_height - 1)
      zero_elements<Values>(p.grad_input, input_row_offset(p, at.image, p.height - 1), in_width);
  }
}

void forward(const detail::MaxPoolImages& p, int64_t begin, int64_t end) {
  p.bf16 ? forward_as<Bf16Values>(p, begin, end) : forward_as<Fp32Values>(p, begin, end);
}

void backward(const detail::MaxPoolImages& p, int64_t begin, int64_t end) {
  p.bf16 ? backward_as<Bf16Values>(p, begin, end) : backward_as<Fp32Values>(p, begin, end);
}

}  // namespace

detail::MaxPoolKernels max_pool_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
