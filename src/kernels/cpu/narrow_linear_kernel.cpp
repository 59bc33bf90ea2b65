// A Linear with few outputs (a classifier's last layer) in bf16, as CPU autocast's linear computes it, each
// output a dot product over the row's inputs in fp32 vectors: where oneDNN's bf16 matmul pays its call for
// a product of a few hundred thousand multiply-adds (the main job's 256 -> 10 costs more a step than its
// 1568 -> 256). Compiled once per CPU capability (CMakeLists.txt), as attention_kernel.cpp is.
#include <algorithm>
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

// Inputs [begin, begin + width) of row r as bf16 values in fp32.
const float* x_values(const detail::NarrowLinearMaps& m, int64_t r, int64_t begin, int64_t width,
                      std::vector<float>& scratch) {
  const int64_t offset = r * m.inputs + begin;
  if (m.x_bf16) return row_in(m.x, true, offset, width, scratch);
  const float* x = static_cast<const float*>(m.x) + offset;
  by_vectors(width, [&](int64_t i, int64_t count) {
    round_to_bf16(Vec::loadu(x + i, count)).store(scratch.data() + i, count);
  });
  return scratch.data();
}

void forward(const detail::NarrowLinearMaps& m, int64_t begin, int64_t end) {
  std::vector<float> x_scratch(m.inputs), out(m.outputs);
  for (int64_t r = begin; r < end; ++r) {
    const float* x = x_values(m, r, 0, m.inputs, x_scratch);
    for (int64_t o = 0; o < m.outputs; ++o)
      out[o] = row_dot(x, m.weight + o * m.inputs, m.inputs) + (m.bias != nullptr ? m.bias[o] : 0.f);
    store_row(out.data(), m.y, true, r * m.outputs, m.outputs);
  }
}

void input_gradient(const detail::NarrowLinearMaps& m, int64_t begin, int64_t end) {
  std::vector<float> dy_scratch(m.outputs), dx(m.inputs);
  for (int64_t r = begin; r < end; ++r) {
    const float* dy = row_in(m.grad_y, true, r * m.outputs, m.outputs, dy_scratch);
    std::fill(dx.begin(), dx.end(), 0.f);
    for (int64_t o = 0; o < m.outputs; ++o) {
      const Vec scale(dy[o]);
      const float* w = m.weight + o * m.inputs;
      by_vectors(m.inputs, [&](int64_t i, int64_t count) {
        at::vec::fmadd(scale, Vec::loadu(w + i, count), Vec::loadu(dx.data() + i, count))
            .store(dx.data() + i, count);
      });
    }
    // The bf16 matmul's rounded values; for an fp32 x as autocast's cast back gives them.
    float* grad = m.x_bf16 ? dx.data() : static_cast<float*>(m.grad_x) + r * m.inputs;
    by_vectors(m.inputs, [&](int64_t i, int64_t count) {
      round_to_bf16(Vec::loadu(dx.data() + i, count)).store(grad + i, count);
    });
    if (m.x_bf16) store_bf16_row(dx.data(), m.grad_x, r * m.inputs, m.inputs);
  }
}

// The weight gradient's accumulators a task keeps in registers: kGroup outputs x kColumnVectors vectors of
// inputs (16 of AVX512's 32 registers; 8 of AVX2's 16, which also hold the loaded inputs and a broadcast).
constexpr int64_t kGroup = kLanes >= 16 ? 8 : 4;
constexpr int64_t kColumnVectors = 2;

// Inputs [begin, end) of every output's weight gradient, summed over all rows: for each group of outputs
// and each run of columns, the sums stay in registers while the rows stream past.
void weight_gradient(const detail::NarrowLinearMaps& m, int64_t begin, int64_t end) {
  const int64_t width = end - begin;
  std::vector<float> x_scratch(width), dy(m.rows * kGroup);
  for (int64_t first = 0; first < m.outputs; first += kGroup) {
    const int64_t group = std::min(kGroup, m.outputs - first);
    // dy[r, first .. first + group) as fp32, zero past the group: the absent outputs add nothing.
    const c10::BFloat16* grad_y = static_cast<const c10::BFloat16*>(m.grad_y);
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t g = 0; g < kGroup; ++g)
        dy[r * kGroup + g] = g < group ? static_cast<float>(grad_y[r * m.outputs + first + g]) : 0.f;
    for (int64_t column = 0; column < width; column += kColumnVectors * kLanes) {
      const int64_t count = std::min(kColumnVectors * kLanes, width - column);
      Vec sums[kGroup][kColumnVectors];
      for (auto& row : sums)
        for (Vec& v : row) v = Vec(0.f);
      for (int64_t r = 0; r < m.rows; ++r) {
        const float* x = x_values(m, r, begin + column, count, x_scratch);
        Vec values[kColumnVectors];
        for (int64_t v = 0; v < kColumnVectors; ++v)  // lanes past the run: 0, adding nothing
          values[v] = v * kLanes < count ? Vec::loadu(x + v * kLanes, std::min(kLanes, count - v * kLanes))
                                         : Vec(0.f);
#pragma GCC unroll 8
        for (int64_t g = 0; g < kGroup; ++g) {
          const Vec scale(dy[r * kGroup + g]);
          for (int64_t v = 0; v < kColumnVectors; ++v)
            sums[g][v] = at::vec::fmadd(scale, values[v], sums[g][v]);
        }
      }
      for (int64_t g = 0; g < group; ++g)
        for (int64_t v = 0; v < kColumnVectors && v * kLanes < count; ++v)
          sums[g][v].store(m.grad_weight + (first + g) * m.inputs + begin + column + v * kLanes,
                           std::min(kLanes, count - v * kLanes));
    }
  }
}

}  // namespace

detail::NarrowLinearKernels narrow_linear_kernels() {
  return {&forward, &input_gradient, &weight_gradient};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
