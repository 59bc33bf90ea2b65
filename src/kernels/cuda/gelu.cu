// The tanh GELU's backward and the bias gradient before it in one pass (gelu_cuda.h): ATen runs them as
// GeluBackward's kernel and then a reduction over the rows, reading the gradient twice. Threads across a
// block's 64 columns (two bf16 a thread) read each row coalesced, 8 of them down its range of rows.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gelu_cuda.h"
#include "launch.h"

namespace fasttrain::kernels::detail {

namespace {

constexpr int kPairs = 32;      // column pairs a block, one a thread across
constexpr int kRowThreads = 8;  // threads down the rows
constexpr int kBatch = 4;       // rows a thread reads before it writes

// d/du of 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))).
__device__ __forceinline__ float gelu_tanh_derivative(float u) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
  const float t = tanhf(kSqrt2OverPi * (u + kCubic * u * u * u));
  return 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * u * u);
}

__global__ void __launch_bounds__(kPairs* kRowThreads)
    gelu_backward_bias(const __nv_bfloat162* grad_out, const __nv_bfloat162* pre, __nv_bfloat162* grad_pre,
                       float* bias_partials, int64_t rows, int64_t pairs, int64_t rows_per_partial) {
  __shared__ float2 sums[kRowThreads][kPairs + 1];
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kPairs + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_partial;
  const int64_t last = first + rows_per_partial < rows ? first + rows_per_partial : rows;
  float2 sum = make_float2(0, 0);
  if (pair < pairs) {
    // kBatch rows' loads before their stores: grad_pre may be grad_out, and a store the compiler cannot tell
    // apart from the next load would make each load wait for the one before.
    for (int64_t r0 = first + threadIdx.y; r0 < last; r0 += kBatch * kRowThreads) {
      float2 g[kBatch], u[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t r = r0 + b * kRowThreads;
        if (r < last)
          g[b] = __bfloat1622float2(grad_out[r * pairs + pair]),
          u[b] = __bfloat1622float2(pre[r * pairs + pair]);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t r = r0 + b * kRowThreads;
        if (r >= last) continue;
        const __nv_bfloat162 d = __floats2bfloat162_rn(g[b].x * gelu_tanh_derivative(u[b].x),
                                                       g[b].y * gelu_tanh_derivative(u[b].y));
        grad_pre[r * pairs + pair] = d;
        const float2 rounded = __bfloat1622float2(d);  // the bias gradient of the values the matmuls read
        sum.x += rounded.x;
        sum.y += rounded.y;
      }
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || pair >= pairs) return;
  for (int i = 1; i < kRowThreads; ++i) sum.x += sums[i][threadIdx.x].x, sum.y += sums[i][threadIdx.x].y;
  float* partial = bias_partials + blockIdx.y * 2 * pairs + 2 * pair;
  partial[0] = sum.x;
  partial[1] = sum.y;
}

}  // namespace

int64_t gelu_backward_partials(int64_t rows, int64_t width) {
  return row_partials(rows, (width / 2 + kPairs - 1) / kPairs);
}

void gelu_backward_cuda(const void* grad_out, const void* pre, void* grad_pre, float* bias_partials,
                        int64_t rows, int64_t width, int64_t partials, void* stream) {
  if (rows == 0 || width == 0) return;
  const int64_t pairs = width / 2, rows_per_partial = (rows + partials - 1) / partials;
  const dim3 grid(static_cast<unsigned>((pairs + kPairs - 1) / kPairs), static_cast<unsigned>(partials));
  gelu_backward_bias<<<grid, dim3(kPairs, kRowThreads), 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat162*>(grad_out), static_cast<const __nv_bfloat162*>(pre),
      static_cast<__nv_bfloat162*>(grad_pre), bias_partials, rows, pairs, rows_per_partial);
  check_launch("GELU backward");
}

}  // namespace fasttrain::kernels::detail
