#pragma once
// The fp32 matmuls fasttrain's CPU kernels run: oneDNN's where this LibTorch and CPU run it in fp32, else
// ATen's (MKL's sgemm); and fasttrain's own (cpu/matmul_kernel.cpp), where it wins, and with the epilogues
// gelu_mlp fuses into it. Defined in matmul.cpp.
#include <torch/types.h>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"

namespace fasttrain::kernels::detail {

// Whether oneDNN runs fp32 matmuls here: LibTorch 2.4 or later, a CPU with AVX512 BW, VL and DQ.
bool onednn_runs_fp32_matmul();

// c [M, N] (+)= a [M, K] @ b [K, N]: `accumulate` adds to what c holds. a and b contiguous or transposed,
// c contiguous.
void matmul_into(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, bool accumulate);

// fasttrain's own matmul's bodies for `capability`.
MatmulKernels matmul_bodies(CpuCapability capability);

// b [depth, width], or with `transposed` a weight [width, depth] (b = weight^T), in the bodies' panels.
torch::Tensor packed_panels(const MatmulKernels& bodies, const torch::Tensor& b, bool transposed);

// The product a [rows, depth] (contiguous fp32) @ the packed b of `width` columns, its outputs and epilogue's
// operands left for the caller to point at.
TiledMatmul tiled_product(const torch::Tensor& a, const torch::Tensor& panels, int64_t width);

// Whether a product of this depth and width runs as tiled_matmul_into rather than matmul_into: depths of at
// most 128 on a CPU with AVX2 or AVX512 (x [4096, 128] @ w^T 8-28% faster than oneDNN's for w of 128-512 rows
// on an AMX Xeon, packing w included; about even at depths of 256 and more), and at least half a panel of
// outputs (a narrower product would compute a panel of zeros for a few columns).
bool tiled_matmul_wins(int64_t depth, int64_t width);

// out [M, N] = a [M, K] @ b, b [K, N] or with `transposed` a weight [N, K]; a and out contiguous fp32, out of
// those sizes (asserted), K > 0.
void tiled_matmul_into(const torch::Tensor& a, const torch::Tensor& b, bool transposed,
                       const torch::Tensor& out, CpuCapability capability = cpu_capability());

}  // namespace fasttrain::kernels::detail
