#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

detail::TransposeKernels transpose_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(transpose_kernels, capability);
}

// dst [N, cols, rows] from src [N, rows, cols] (both contiguous in that order), in parallel over samples.
void transpose_samples(const torch::Tensor& src, torch::Tensor& dst, int64_t rows, int64_t cols,
                       CpuCapability capability) {
  detail::TransposeBatch b;
  b.rows = rows;
  b.cols = cols;
  b.bf16 = src.scalar_type() == torch::kBFloat16;
  b.src = src.data_ptr();
  b.dst = dst.data_ptr();
  const auto kernel = transpose_bodies(capability).run;
  detail::parallel_pieces(0, src.size(0), detail::rows_per_task(rows * cols),
                          [&](int64_t begin, int64_t end) { kernel(b, begin, end); });
}

class FlattenChannelsLastFunction : public torch::autograd::Function<FlattenChannelsLastFunction> {
 public:
  // maps [N, C, H, W] (NHWC in memory) -> [N, C * H * W] in NCHW order.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& maps,
                               int64_t capability) {
    ctx->saved_data["sizes"] = maps.sizes();
    ctx->saved_data["capability"] = capability;
    const int64_t channels = maps.size(1), positions = maps.size(2) * maps.size(3);
    torch::Tensor flat = torch::empty({maps.size(0), channels * positions}, maps.options());
    transpose_samples(maps, flat, positions, channels, static_cast<CpuCapability>(capability));
    return flat;
  }

  // grad [N, C * H * W] (NCHW order) -> [N, C, H, W] channels_last.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("flatten_channels_last");
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto capability = static_cast<CpuCapability>(ctx->saved_data["capability"].toInt());
    const torch::Tensor grad = grads[0].contiguous();
    torch::Tensor grad_maps =
        torch::empty(sizes, grad.options().memory_format(torch::MemoryFormat::ChannelsLast));
    transpose_samples(grad, grad_maps, sizes[1], sizes[2] * sizes[3], capability);
    return {grad_maps, torch::Tensor()};
  }
};

}  // namespace

bool flatten_channels_last_takes(const torch::Tensor& maps) {
  return detail::cpu_float_or_bf16(maps) && maps.dim() == 4 && maps.size(0) > 0 &&
         maps.is_contiguous(torch::MemoryFormat::ChannelsLast) && !maps.is_contiguous();
}

torch::Tensor flatten_channels_last(const torch::Tensor& maps, CpuCapability capability) {
  FT_CHECK(
      flatten_channels_last_takes(maps),
      "flatten_channels_last takes maps [N, C, H, W] laid out channels_last (and not also contiguous) on "
      "the CPU in fp32 or bf16; got {} {}{}",
      maps.defined() ? maps.sizes() : c10::IntArrayRef{},
      maps.defined() ? c10::toString(maps.scalar_type()) : "none",
      maps.defined() && maps.dim() == 4 && !maps.is_contiguous(torch::MemoryFormat::ChannelsLast)
          ? " not in channels_last"
          : "");
  detail::check_runnable(capability, "flatten_channels_last");
  return FlattenChannelsLastFunction::apply(maps, static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
