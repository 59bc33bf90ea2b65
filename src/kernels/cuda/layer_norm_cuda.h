#pragma once
// The residual add + LayerNorm's CUDA launches (layer_norm.cu), for the dispatcher in
// src/kernels/layer_norm.cpp: the same LayerNormRows contract as the CPU bodies (cpu/layer_norm_kernel.h),
// its pointers on the GPU. Free of torch headers so that nvcc compiles layer_norm.cu alone; `stream` is a
// cudaStream_t. A launch that fails throws std::runtime_error with CUDA's message.
#include <cstdint>

#include "../cpu/layer_norm_kernel.h"

namespace fasttrain::kernels::detail {

// Whether the current CUDA device can run fasttrain's kernels: the library holds code for its architecture
// (TORCH_CUDA_ARCH_LIST at build time: machine code for each, PTX that later GPUs compile).
bool cuda_kernels_load_on_current_device();

// Forward: a warp per row writes sum, y, mean and rstd.
void layer_norm_forward_cuda(const LayerNormRows& rows, void* stream);

// How many partial rows of grad_weight and grad_bias layer_norm_backward_cuda writes (each [width], fp32):
// the row ranges its parameter-gradient pass splits the rows into.
int64_t layer_norm_backward_partials(int64_t rows, int64_t width);

// Backward: grad_x and grad_branch (a warp per row), then every partial row of the parameters' gradients
// (`partials` from layer_norm_backward_partials; each written whole, none needs zeroing).
void layer_norm_backward_cuda(const LayerNormRows& rows, int64_t partials, void* stream);

}  // namespace fasttrain::kernels::detail
