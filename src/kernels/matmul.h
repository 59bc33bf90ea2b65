#pragma once
// The fp32 matmul fasttrain's CPU kernels run around their own: oneDNN's where this LibTorch and CPU run it
// in fp32, else ATen's (MKL's sgemm). Defined in linear.cpp.
#include <torch/types.h>

namespace fasttrain::kernels::detail {

// Whether oneDNN runs fp32 matmuls here: LibTorch 2.4 or later, a CPU with AVX512 BW, VL and DQ.
bool onednn_runs_fp32_matmul();

// c [M, N] (+)= a [M, K] @ b [K, N]: `accumulate` adds to what c holds. a and b contiguous or transposed,
// c contiguous.
void matmul_into(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, bool accumulate);

}  // namespace fasttrain::kernels::detail
