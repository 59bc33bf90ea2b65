// BatchNorm over channels_last maps with the ReLU after it, in fp32 arithmetic whatever the dtype, a
// block of rows at a time (a block's values stay in L1), vectorised over the channels with each channel
// vector's sums kept in a register down the block's rows; bf16 values are converted in registers as they
// are read and written (converted blocks in scratch rows had cost bf16 maps more than fp32 ones):
//   statistics      each block's mean and squared deviations (two passes over it in L1), merged per chunk
//   normalize       y = max(0, (x - mean) * scale + shift): x - mean first, as a far mean would
//                   otherwise cost the result its low bits
//   backward_sums   g = grad_y masked by ReLU (recomputed from x: nothing of y is kept), sum g,
//                   sum g (x - mean)
//   backward_input  grad_x = g * scale + (x - mean) * grad_centered + grad_offset
// ATen runs the same as native_batch_norm, relu, threshold_backward and native_batch_norm_backward,
// each its own pass and allocation. Compiled once per CPU capability (CMakeLists.txt).
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

using Maps = detail::BatchNormReluMaps;

// Rows per block: 4096 values per operand (16 KiB in fp32, 8 KiB in bf16).
int64_t block_rows(int64_t channels) {
  return std::max<int64_t>(1, 4096 / channels);
}

// body(first_row, row_count) for each block of [begin, end).
template <typename Body>
void for_blocks(const Maps& m, int64_t begin, int64_t end, const Body& body) {
  const int64_t step = block_rows(m.channels);
  for (int64_t r = begin; r < end; r += step) body(r, std::min(step, end - r));
}

Vec load(const float* values, int64_t c, int64_t lanes) {
  return Vec::loadu(values + c, lanes);
}

Vec pre_activation(const Vec& x, const Vec& mean, const Vec& scale, const Vec& shift) {
  return at::vec::fmadd(x - mean, scale, shift);
}

// ReLU's gradient: zero where the pre-activation is at most 0, grad_y elsewhere, NaN included (as
// threshold_backward's `result <= 0 ? 0 : grad`).
Vec relu_grad(const Vec& x, const Vec& mean, const Vec& scale, const Vec& shift, const Vec& grad_y) {
  return Vec::blendv(grad_y, Vec(0.f), pre_activation(x, mean, scale, shift) <= Vec(0.f));
}

// A chunk's per-channel count, mean and sum of squared deviations, in double, merged a block at a time
// (Chan et al.'s pairwise update): a long chunk loses no more than a block's fp32 rounding.
class ChannelMoments {
 public:
  explicit ChannelMoments(int64_t channels) : mean_(channels, 0.0), squares_(channels, 0.0) {}

  // Joins a block of `rows` whose lanes [c, c + lanes) have these means and squared deviations.
  void join(const Vec& block_mean, const Vec& block_squares, int64_t c, int64_t lanes, int64_t rows) {
    float means[kLanes], squares[kLanes];
    block_mean.store(means, lanes);
    block_squares.store(squares, lanes);
    for (int64_t l = 0; l < lanes; ++l)
      detail::join_moments(count_, static_cast<double>(rows), means[l], squares[l], mean_[c + l],
                           squares_[c + l]);
  }
  // After every channel of a block has joined.
  void count_block(int64_t rows) { count_ += static_cast<double>(rows); }
  double mean(int64_t c) const { return mean_[c]; }
  double squares(int64_t c) const { return squares_[c]; }

 private:
  double count_ = 0;
  std::vector<double> mean_, squares_;
};

// Each block twice from L1 (bf16 converted in registers on each pass): its sum less the chunk's first row
// (values of the spread's size, not the mean's, so a mean far from zero costs no low bits), then squared
// deviations from its mean.
template <typename Values>
void statistics_as(const Maps& m, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t channels = m.channels;
  if (begin >= end) {  // an empty chunk (a map of no rows): nothing to read
    std::fill(m.partial_first + chunk * channels, m.partial_first + (chunk + 1) * channels, 0.f);
    std::fill(m.partial_second + chunk * channels, m.partial_second + (chunk + 1) * channels, 0.f);
    return;
  }
  std::vector<float> origin(channels);
  load_row(m.x, m.bf16, begin * channels, channels, origin.data());
  ChannelMoments moments(channels);
  for_blocks(m, begin, end, [&](int64_t first, int64_t count) {
    const int64_t offset = first * channels;
    const Vec inverse_count(1.f / static_cast<float>(count));
    by_vectors(channels, [&](int64_t c, int64_t lanes) {
      const Vec shift = load(origin.data(), c, lanes);
      Vec sum(0.f);
      for (int64_t r = 0; r < count; ++r)
        sum = sum + (Values::load(m.x, offset + r * channels + c, lanes) - shift);
      const Vec centre = at::vec::fmadd(sum, inverse_count, shift);
      Vec squares(0.f);
      for (int64_t r = 0; r < count; ++r) {
        const Vec deviation = Values::load(m.x, offset + r * channels + c, lanes) - centre;
        squares = at::vec::fmadd(deviation, deviation, squares);
      }
      moments.join(centre, squares, c, lanes, count);
    });
    moments.count_block(count);
  });
  for (int64_t c = 0; c < channels; ++c) {
    m.partial_first[chunk * channels + c] = static_cast<float>(moments.mean(c));
    m.partial_second[chunk * channels + c] = static_cast<float>(moments.squares(c));
  }
}

// Per-channel sums in double of fp32 block sums: a block's rows add up in a register, then the block's sum
// joins the chunk's in double, so a long chunk loses no more than a block's rounding.
class ChannelTotals {
 public:
  explicit ChannelTotals(int64_t channels) : totals_(channels, 0.0) {}
  void add(const Vec& block_sum, int64_t c, int64_t lanes) {
    float values[kLanes];
    block_sum.store(values, lanes);
    for (int64_t l = 0; l < lanes; ++l) totals_[c + l] += values[l];
  }
  double operator[](int64_t c) const { return totals_[c]; }

 private:
  std::vector<double> totals_;
};

template <typename Values>
// The conv epilogues of an evaluation (conv_max_pool_kernel.cpp's pool_and_store, amx_conv.cpp's
// store_batch_norm_relu) compute what this does, bit for bit: a change here is a change there.
void normalize_as(const Maps& m, int64_t begin, int64_t end) {
  const int64_t channels = m.channels;
  for_blocks(m, begin, end, [&](int64_t first, int64_t count) {
    const int64_t offset = first * channels;
    by_vectors(channels, [&](int64_t c, int64_t lanes) {
      const Vec scale = load(m.scale, c, lanes), shift = load(m.shift, c, lanes),
                mean = load(m.mean, c, lanes);
      for (int64_t r = 0; r < count; ++r) {
        const int64_t index = offset + r * channels + c;
        const Vec value = pre_activation(Values::load(m.x, index, lanes), mean, scale, shift);
        Values::store(at::vec::maximum(value, Vec(0.f)), m.y, index, lanes);
      }
    });
  });
}

template <typename Values>
void backward_sums_as(const Maps& m, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t channels = m.channels;
  ChannelTotals grad_sum(channels), grad_dot(channels);
  for_blocks(m, begin, end, [&](int64_t first, int64_t count) {
    const int64_t offset = first * channels;
    by_vectors(channels, [&](int64_t c, int64_t lanes) {
      const Vec scale = load(m.scale, c, lanes), shift = load(m.shift, c, lanes),
                mean = load(m.mean, c, lanes);
      Vec sum(0.f), dot(0.f);
      for (int64_t r = 0; r < count; ++r) {
        const int64_t index = offset + r * channels + c;
        const Vec value = Values::load(m.x, index, lanes);
        const Vec g = relu_grad(value, mean, scale, shift, Values::load(m.grad_y, index, lanes));
        sum = sum + g;
        dot = at::vec::fmadd(g, value - mean, dot);
      }
      grad_sum.add(sum, c, lanes);
      grad_dot.add(dot, c, lanes);
    });
  });
  for (int64_t c = 0; c < channels; ++c) {
    m.partial_first[chunk * channels + c] = static_cast<float>(grad_sum[c]);
    m.partial_second[chunk * channels + c] = static_cast<float>(grad_dot[c]);
  }
}

template <typename Values>
void backward_input_as(const Maps& m, int64_t begin, int64_t end) {
  const int64_t channels = m.channels;
  for_blocks(m, begin, end, [&](int64_t first, int64_t count) {
    const int64_t offset = first * channels;
    by_vectors(channels, [&](int64_t c, int64_t lanes) {
      const Vec scale = load(m.scale, c, lanes), shift = load(m.shift, c, lanes),
                mean = load(m.mean, c, lanes);
      const Vec centred = load(m.grad_centered, c, lanes), grad_offset = load(m.grad_offset, c, lanes);
      for (int64_t r = 0; r < count; ++r) {
        const int64_t index = offset + r * channels + c;
        const Vec value = Values::load(m.x, index, lanes);
        const Vec g = relu_grad(value, mean, scale, shift, Values::load(m.grad_y, index, lanes));
        // Evaluation leaves x out: a NaN input then keeps its gradient, as ATen's backward does.
        const Vec through_statistics =
            m.batch_statistics ? at::vec::fmadd(value - mean, centred, grad_offset) : Vec(0.f);
        Values::store(at::vec::fmadd(g, scale, through_statistics), m.grad_x, index, lanes);
      }
    });
  });
}

// Each body for the maps' dtype.
void statistics(const Maps& m, int64_t begin, int64_t end, int64_t chunk) {
  m.bf16 ? statistics_as<Bf16Values>(m, begin, end, chunk) : statistics_as<Fp32Values>(m, begin, end, chunk);
}
void normalize(const Maps& m, int64_t begin, int64_t end) {
  m.bf16 ? normalize_as<Bf16Values>(m, begin, end) : normalize_as<Fp32Values>(m, begin, end);
}
void backward_sums(const Maps& m, int64_t begin, int64_t end, int64_t chunk) {
  m.bf16 ? backward_sums_as<Bf16Values>(m, begin, end, chunk)
         : backward_sums_as<Fp32Values>(m, begin, end, chunk);
}
void backward_input(const Maps& m, int64_t begin, int64_t end) {
  m.bf16 ? backward_input_as<Bf16Values>(m, begin, end) : backward_input_as<Fp32Values>(m, begin, end);
}

}  // namespace

detail::BatchNormReluKernels batch_norm_relu_kernels() {
  return {&statistics, &normalize, &backward_sums, &backward_input};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
