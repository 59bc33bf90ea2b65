// The fp32 Linear + ReLU's backward over the ReLU's survivors only. A trained hidden layer passes few of its
// outputs (the main job's 1568 -> 256: 15-30% after the first 150 steps), and a dense matmul multiplies every
// zero of dz: here each gradient row is a sum of the rows of x (or of the weight) that a nonzero of dz names,
// kBlock vectors of inputs at a time held in registers while the nonzeros stream past. Compiled once per CPU
// capability (CMakeLists.txt), as narrow_linear_kernel.cpp is.
#include <algorithm>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

// A run's vectors of inputs. Two sets of sums, over alternate nonzeros, keep 2 x kBlock independent sums in
// flight (two multiply-adds a cycle at a latency of four cycles need eight), while a run of every target's
// source rows stays in L1 (256 rows x 4 AVX2 vectors: 32 KB).
constexpr int64_t kBlock = 4;

// out[t, begin .. end) = sum over e in [starts[t], starts[t + 1]) of values[e] source[index[e], begin .. end)
// for every target t in [0, targets): for each run of kBlock vectors of inputs, every target in turn, so the
// run's columns of `source` stay in cache across targets.
void gather_sums(const int64_t* starts, const int32_t* index, const float* values, int64_t targets,
                 const float* source, int64_t inputs, float* out, int64_t begin, int64_t end) {
  constexpr int64_t kRun = kBlock * kLanes;
  int64_t column = begin;
  for (; column + kRun <= end; column += kRun) {
    for (int64_t t = 0; t < targets; ++t) {
      Vec even[kBlock], odd[kBlock];
      for (int64_t v = 0; v < kBlock; ++v) even[v] = odd[v] = Vec(0.f);
      int64_t e = starts[t];
      for (; e + 2 <= starts[t + 1]; e += 2) {
        const Vec first(values[e]), second(values[e + 1]);
        const float* a = source + index[e] * inputs + column;
        const float* b = source + index[e + 1] * inputs + column;
#pragma GCC unroll 4
        for (int64_t v = 0; v < kBlock; ++v) {
          even[v] = at::vec::fmadd(first, Vec::loadu(a + v * kLanes), even[v]);
          odd[v] = at::vec::fmadd(second, Vec::loadu(b + v * kLanes), odd[v]);
        }
      }
      if (e < starts[t + 1]) {
        const Vec last(values[e]);
        const float* a = source + index[e] * inputs + column;
        for (int64_t v = 0; v < kBlock; ++v)
          even[v] = at::vec::fmadd(last, Vec::loadu(a + v * kLanes), even[v]);
      }
      float* target = out + t * inputs + column;
      for (int64_t v = 0; v < kBlock; ++v) (even[v] + odd[v]).store(target + v * kLanes);
    }
  }
  if (column == end) return;
  for (int64_t t = 0; t < targets; ++t) {  // the last, shorter run: a vector (or part of one) at a time
    float* target = out + t * inputs;
    by_vectors(end - column, [&](int64_t i, int64_t count) {
      Vec sum(0.f);
      for (int64_t e = starts[t]; e < starts[t + 1]; ++e)
        sum = at::vec::fmadd(Vec(values[e]), Vec::loadu(source + index[e] * inputs + column + i, count), sum);
      sum.store(target + column + i, count);
    });
  }
}

void input_gradient(const detail::LinearReluMaps& m, int64_t begin, int64_t end) {
  gather_sums(m.by_row, m.row_outputs, m.row_values, m.rows, m.weight, m.inputs, m.grad_x, begin, end);
}

void weight_gradient(const detail::LinearReluMaps& m, int64_t begin, int64_t end) {
  gather_sums(m.by_output, m.output_rows, m.output_values, m.outputs, m.x, m.inputs, m.grad_weight, begin,
              end);
}

}  // namespace

detail::LinearReluKernels linear_relu_kernels() {
  return {&input_gradient, &weight_gradient};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
