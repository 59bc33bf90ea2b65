// The tanh GELU's backward and the bias gradient before it in one pass (gelu_cuda.h): ATen runs them as
// GeluBackward's kernel and then a reduction over the rows, reading the gradient twice. Each thread reads 8
// bf16 (16 bytes) of a row, 32 threads across a block's 256 columns and 8 down the rows, so that a warp's
// loads are 512 coalesced bytes and each thread keeps kBatch rows of both inputs in flight.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gelu_cuda.h"
#include "launch.h"

namespace fasttrain::kernels::detail {

namespace {

constexpr int kVector = 8;                  // bf16 values a thread reads at once: 16 bytes
constexpr int kLanes = 32;                  // threads across a block's columns
constexpr int kColumns = kLanes * kVector;  // columns a block
constexpr int kRowThreads = 8;              // threads down the rows
constexpr int kBatch = 4;                   // rows a thread reads before it writes

// tanh by the GPU's special-function unit (sm_75 and later), one instruction where tanhf takes a few dozen:
// at most 7.6e-6 off over [-8, 8] (measured on an H200), which the derivative's 1 - t^2 magnifies at most
// a few times, far below bf16's rounding of the gradient it writes.
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// d/du of 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))).
__device__ __forceinline__ float gelu_tanh_derivative(float u) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
  const float t = fast_tanh(kSqrt2OverPi * (u + kCubic * u * u * u));
  return 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * u * u);
}

union Vector {  // 8 bf16, one 16-byte load or store
  uint4 bits;
  __nv_bfloat162 pairs[kVector / 2];
};

__global__ void __launch_bounds__(kLanes* kRowThreads)
    gelu_backward_bias(const __nv_bfloat16* grad_out, const __nv_bfloat16* pre, __nv_bfloat16* grad_pre,
                       float* bias_partials, int64_t rows, int64_t width, int64_t rows_per_partial) {
  __shared__ float sums[kRowThreads][kColumns];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x * kVector;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_partial;
  const int64_t last = first + rows_per_partial < rows ? first + rows_per_partial : rows;
  float sum[kVector] = {};
  if (column < width) {
    // kBatch rows' loads before their stores: grad_pre may be grad_out, and a store the compiler cannot tell
    // apart from the next load would make each load wait for the one before.
    for (int64_t r0 = first + threadIdx.y; r0 < last; r0 += kBatch * kRowThreads) {
      Vector g[kBatch], u[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t r = r0 + b * kRowThreads;
        if (r < last) {
          g[b].bits = *reinterpret_cast<const uint4*>(grad_out + r * width + column);
          u[b].bits = *reinterpret_cast<const uint4*>(pre + r * width + column);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t r = r0 + b * kRowThreads;
        if (r >= last) continue;
        Vector d;
#pragma unroll
        for (int p = 0; p < kVector / 2; ++p) {
          const float2 gp = __bfloat1622float2(g[b].pairs[p]), up = __bfloat1622float2(u[b].pairs[p]);
          d.pairs[p] =
              __floats2bfloat162_rn(gp.x * gelu_tanh_derivative(up.x), gp.y * gelu_tanh_derivative(up.y));
          const float2 rounded =
              __bfloat1622float2(d.pairs[p]);  // the bias gradient of what the matmuls read
          sum[2 * p] += rounded.x;
          sum[2 * p + 1] += rounded.y;
        }
        *reinterpret_cast<uint4*>(grad_pre + r * width + column) = d.bits;
      }
    }
  }
#pragma unroll
  for (int v = 0; v < kVector; ++v) sums[threadIdx.y][threadIdx.x * kVector + v] = sum[v];
  __syncthreads();
  // Each of the block's 256 threads sums one column down the 8 row threads and writes it.
  const int local = threadIdx.y * kLanes + threadIdx.x;
  const int64_t out_column = static_cast<int64_t>(blockIdx.x) * kColumns + local;
  if (out_column >= width) return;
  float total = 0;
  for (int i = 0; i < kRowThreads; ++i) total += sums[i][local];
  bias_partials[blockIdx.y * width + out_column] = total;
}

}  // namespace

int64_t gelu_backward_partials(int64_t rows, int64_t width) {
  return row_partials(rows, (width + kColumns - 1) / kColumns);
}

void gelu_backward_cuda(const void* grad_out, const void* pre, void* grad_pre, float* bias_partials,
                        int64_t rows, int64_t width, int64_t partials, void* stream) {
  if (rows == 0 || width == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (width % kVector != 0 || !aligned(grad_out) || !aligned(pre) || !aligned(grad_pre))
    throw std::invalid_argument("fasttrain's GELU backward reads 16 bytes a lane: width " +
                                std::to_string(width) +
                                " must be a multiple of 8 and each tensor 16-byte aligned");
  const int64_t rows_per_partial = (rows + partials - 1) / partials;
  const dim3 grid(static_cast<unsigned>((width + kColumns - 1) / kColumns), static_cast<unsigned>(partials));
  gelu_backward_bias<<<grid, dim3(kLanes, kRowThreads), 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(grad_out), static_cast<const __nv_bfloat16*>(pre),
      static_cast<__nv_bfloat16*>(grad_pre), bias_partials, rows, width, rows_per_partial);
  check_launch("GELU backward");
}

}  // namespace fasttrain::kernels::detail
