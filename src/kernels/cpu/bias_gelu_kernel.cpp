// The bias add and the tanh-GELU after it, one row at a time in fp32:
//   forward   u = pre + bias,  y = u/2 (1 + tanh(s)),  s = sqrt(2/pi) (u + 0.044715 u^3)
//   backward  grad_pre = grad_y (1/2 (1 + t) + u/2 (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 u^2)),  t = tanh(s)
//             grad_bias += grad_pre (fp32, before any rounding to bf16)
// GELU's vector math is gelu.h's. Compiled once per CPU capability (CMakeLists.txt), as attention_kernel.cpp
// is.
#include <vector>

#include "bodies.h"
#include "gelu.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

void forward(const detail::BiasGeluRows& g, int64_t begin, int64_t end) {
  const int64_t width = g.width;
  std::vector<float> pre_row(g.bf16 ? width : 0), y_row(g.bf16 ? width : 0);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    const float* pre = row_in(g.pre, g.bf16, offset, width, pre_row);
    float* y = row_out(g.y, g.bf16, offset, y_row);
    by_vectors(width, [&](int64_t i, int64_t count) {
      gelu(Vec::loadu(pre + i, count) + Vec::loadu(g.bias + i, count)).store(y + i, count);
    });
    finish_row(y, g.y, g.bf16, offset, width);
  }
}

void backward(const detail::BiasGeluRows& g, int64_t begin, int64_t end, int64_t chunk) {
  const int64_t width = g.width;
  std::vector<float> pre_row(g.bf16 ? width : 0), dy_row(g.bf16 ? width : 0), dpre_row(g.bf16 ? width : 0);
  float* grad_bias = g.grad_bias_partial + chunk * width;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * width;
    const float* pre = row_in(g.pre, g.bf16, offset, width, pre_row);
    const float* dy = row_in(g.grad_y, g.bf16, offset, width, dy_row);
    float* dpre = row_out(g.grad_pre, g.bf16, offset, dpre_row);
    by_vectors(width, [&](int64_t i, int64_t count) {
      const Vec u = Vec::loadu(pre + i, count) + Vec::loadu(g.bias + i, count);
      const Vec d = Vec::loadu(dy + i, count) * gelu_derivative(u);
      d.store(dpre + i, count);
      accumulate(grad_bias, i, count, d);
    });
    finish_row(dpre, g.grad_pre, g.bf16, offset, width);
  }
}

}  // namespace

detail::BiasGeluKernels bias_gelu_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
