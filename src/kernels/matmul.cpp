#include "matmul.h"

#include <ATen/Parallel.h>
#include <torch/types.h>

#include "fasttrain/detail/compat.h"
#include "fasttrain/kernels/cpu.h"
#include "runnable.h"

// oneDNN's fp32 matmul through ATen's entry (aten/src/ATen/native/mkldnn/Matmul.cpp, exported from
// libtorch_cpu, its header not shipped): result = alpha mat1 @ mat2 + beta result, mat1 and mat2 contiguous
// or transposed, beta != 0 as oneDNN's sum post-op. Checked against LibTorch 2.11's source, where it takes
// fp32 on CPUs with AVX512 BW, VL and DQ (mkldnn_bf16_device_check) and computes in fp32 unless the fp32
// matmul precision allows bf16; 1.13's took bf16 only.
#if defined(__x86_64__) && FASTTRAIN_TORCH_AT_LEAST(2, 4)
#define FASTTRAIN_HAS_ONEDNN_FP32_MATMUL 1
#else
#define FASTTRAIN_HAS_ONEDNN_FP32_MATMUL 0
#endif
#if FASTTRAIN_HAS_ONEDNN_FP32_MATMUL
namespace at::native {
TORCH_API void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& result,
                             float beta, float alpha);
}  // namespace at::native
#endif

namespace fasttrain::kernels::detail {

bool onednn_runs_fp32_matmul() {
#if FASTTRAIN_HAS_ONEDNN_FP32_MATMUL
  static const bool runs = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512dq");
  return runs;
#else
  return false;
#endif
}

void matmul_into(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, bool accumulate) {
#if FASTTRAIN_HAS_ONEDNN_FP32_MATMUL
  if (onednn_runs_fp32_matmul()) {
    at::native::mkldnn_matmul(a, b, c, accumulate ? 1.f : 0.f, 1.f);
    return;
  }
#endif
  torch::Tensor out = c;  // a view of the caller's tensor: written in place, never resized
  if (accumulate) {
    out.addmm_(a, b);
  } else {
    at::mm_out(out, a, b);
  }
}

MatmulKernels matmul_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(matmul_kernels, capability);
}

torch::Tensor packed_panels(const MatmulKernels& bodies, const torch::Tensor& b, bool transposed) {
  const int64_t depth = b.size(transposed ? 1 : 0), width = b.size(transposed ? 0 : 1);
  const int64_t panels = (width + bodies.panel_width - 1) / bodies.panel_width;
  torch::Tensor out = torch::empty({panels, depth, bodies.panel_width}, b.options());
  const torch::Tensor source = b.contiguous();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    bodies.pack(source.data_ptr<float>(), depth, width, transposed, out.data_ptr<float>(), begin, end);
  });
  return out;
}

TiledMatmul tiled_product(const torch::Tensor& a, const torch::Tensor& panels, int64_t width) {
  TiledMatmul m;
  m.rows = a.size(0), m.depth = a.size(1), m.width = width;
  m.a = a.data_ptr<float>();
  m.b_panels = panels.data_ptr<float>();
  return m;
}

bool tiled_matmul_wins(int64_t depth, int64_t width) {
  return depth <= 128 && width >= 32 && tiled_matmul_pays_here();
}

void tiled_matmul_into(const torch::Tensor& a, const torch::Tensor& b, bool transposed,
                       const torch::Tensor& out, CpuCapability capability) {
  TORCH_INTERNAL_ASSERT(a.is_contiguous() && out.is_contiguous() && a.size(1) == b.size(transposed ? 1 : 0) &&
                        out.size(0) == a.size(0) && out.size(1) == b.size(transposed ? 0 : 1));
  const MatmulKernels bodies = matmul_bodies(capability);
  const torch::Tensor panels = packed_panels(bodies, b, transposed);
  TiledMatmul m = tiled_product(a, panels, out.size(1));
  m.out = out.data_ptr<float>();
  at::parallel_for(0, m.rows, rows_per_task(m.width),
                   [&](int64_t begin, int64_t end) { bodies.product(m, begin, end); });
}

}  // namespace fasttrain::kernels::detail

namespace fasttrain::kernels {

bool tiled_matmul_pays_here() {
  return cpu_capability() != CpuCapability::scalar;
}

torch::Tensor tiled_matmul(const torch::Tensor& a, const torch::Tensor& b, bool transposed,
                           CpuCapability capability) {
  FT_CHECK(detail::fp32_cpu(a) && detail::fp32_cpu(b) && a.dim() == 2 && b.dim() == 2 &&
               a.size(1) == b.size(transposed ? 1 : 0),
           "tiled_matmul takes a [M, K] and b [K, N] (or, transposed, [N, K]), both fp32 on the CPU; got a "
           "{}, b {}"
           "{}",
           detail::describe_tensor(a), detail::describe_tensor(b), transposed ? " transposed" : "");
  detail::check_runnable(capability, "tiled_matmul");
  torch::Tensor out = torch::empty({a.size(0), b.size(transposed ? 0 : 1)}, a.options());
  if (out.numel() == 0) return out;
  if (a.size(1) == 0) return out.zero_();
  detail::tiled_matmul_into(a.contiguous(), b, transposed, out, capability);
  return out;
}

}  // namespace fasttrain::kernels
