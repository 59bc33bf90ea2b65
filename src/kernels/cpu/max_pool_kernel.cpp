// 2x2 max-pool at stride 2 over channels_last images, one output row at a time in fp32, vectorised over
// the channels (contiguous in NHWC):
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

void forward(const detail::MaxPoolImages& p, int64_t begin, int64_t end) {
  const int64_t channels = p.channels, in_width = p.width * channels, out_width = p.out_width * channels;
  std::vector<float> top_row(p.bf16 ? in_width : 0), bottom_row(p.bf16 ? in_width : 0);
  std::vector<float> out_row(p.bf16 ? out_width : 0), argmax_row(out_width);
  for (int64_t r = begin; r < end; ++r) {
    const RowPosition at = position(p, r);
    const int64_t top_offset = input_row_offset(p, at.image, 2 * at.out_row);
    const float* top = row_in(p.input, p.bf16, top_offset, in_width, top_row);
    const float* bottom = row_in(p.input, p.bf16, top_offset + in_width, in_width, bottom_row);
    float* out = row_out(p.output, p.bf16, r * out_width, out_row);
    for (int64_t ow = 0; ow < p.out_width; ++ow) {
      const float* window[kWindow] = {top + 2 * ow * channels, top + (2 * ow + 1) * channels,
                                      bottom + 2 * ow * channels, bottom + (2 * ow + 1) * channels};
      by_vectors(channels, [&](int64_t c, int64_t count) {
        Vec best = Vec::loadu(window[0] + c, count), which(0.f);
        for (int k = 1; k < kWindow; ++k) {
          const Vec value = Vec::loadu(window[k] + c, count);
          const Vec wins = (value > best) | is_nan(value);
          best = Vec::blendv(best, value, wins);
          which = Vec::blendv(which, Vec(static_cast<float>(k)), wins);
        }
        best.store(out + ow * channels + c, count);
        which.store(argmax_row.data() + ow * channels + c, count);
      });
    }
    finish_row(out, p.output, p.bf16, r * out_width, out_width);
    store_bytes(argmax_row.data(), p.argmax + r * out_width, out_width);
  }
}

void backward(const detail::MaxPoolImages& p, int64_t begin, int64_t end) {
  const int64_t channels = p.channels, in_width = p.width * channels, out_width = p.out_width * channels;
  std::vector<float> dy_row(p.bf16 ? out_width : 0), argmax_row(out_width);
  std::vector<float> top_row(p.bf16 ? in_width : 0), bottom_row(p.bf16 ? in_width : 0);
  for (int64_t r = begin; r < end; ++r) {
    const RowPosition at = position(p, r);
    const float* dy = row_in(p.grad_output, p.bf16, r * out_width, out_width, dy_row);
    const uint8_t* argmax = p.argmax + r * out_width;
    for (int64_t i = 0; i < out_width; ++i) argmax_row[i] = static_cast<float>(argmax[i]);
    const int64_t top_offset = input_row_offset(p, at.image, 2 * at.out_row);
    float* top = row_out(p.grad_input, p.bf16, top_offset, top_row);
    float* bottom = row_out(p.grad_input, p.bf16, top_offset + in_width, bottom_row);
    for (int64_t ow = 0; ow < p.out_width; ++ow) {
      float* window[kWindow] = {top + 2 * ow * channels, top + (2 * ow + 1) * channels,
                                bottom + 2 * ow * channels, bottom + (2 * ow + 1) * channels};
      by_vectors(channels, [&](int64_t c, int64_t count) {
        const Vec grad = Vec::loadu(dy + ow * channels + c, count);
        const Vec which = Vec::loadu(argmax_row.data() + ow * channels + c, count);
        for (int k = 0; k < kWindow; ++k)
          Vec::blendv(Vec(0.f), grad, which == Vec(static_cast<float>(k))).store(window[k] + c, count);
      });
    }
    // An odd last column is outside every window.
    std::fill(top + 2 * out_width, top + in_width, 0.f);
    std::fill(bottom + 2 * out_width, bottom + in_width, 0.f);
    finish_row(top, p.grad_input, p.bf16, top_offset, in_width);
    finish_row(bottom, p.grad_input, p.bf16, top_offset + in_width, in_width);
    // So is an odd last row: the image's last output row writes it.
    if (p.height % 2 == 1 && at.out_row == p.out_height - 1) {
      const std::vector<float> zeros(in_width, 0.f);
      store_row(zeros.data(), p.grad_input, p.bf16, input_row_offset(p, at.image, p.height - 1), in_width);
    }
  }
}

}  // namespace

detail::MaxPoolKernels max_pool_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
