#pragma once
// The tanh GELU's backward with its bias gradient (gelu.cu), for kernels::gpu_mlp (cuda/mlp.cpp). Free of
// torch headers so that nvcc compiles gelu.cu alone; `stream` is a cudaStream_t. A launch that fails throws
// std::runtime_error with CUDA's message.
#include <cstdint>

namespace fasttrain::kernels::detail {

// How many partial rows of the bias gradient gelu_backward_cuda writes (each [width], fp32).
int64_t gelu_backward_partials(int64_t rows, int64_t width);

// grad_pre = grad_out * gelu_tanh'(pre) over [rows, width] bf16 (width a multiple of 8 and each pointer
// 16-byte aligned, else std::invalid_argument; grad_pre may be grad_out itself), and partial row p of the
// bias gradient the sum of grad_pre over the p-th range of rows (each written whole).
void gelu_backward_cuda(const void* grad_out, const void* pre, void* grad_pre, float* bias_partials,
                        int64_t rows, int64_t width, int64_t partials, void* stream);

}  // namespace fasttrain::kernels::detail
