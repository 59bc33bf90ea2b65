#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <algorithm>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

detail::BiasGeluKernels bias_gelu_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(bias_gelu_kernels, capability);
}

detail::BiasGeluRows describe(const torch::Tensor& pre, const torch::Tensor& bias) {
  detail::BiasGeluRows g;
  g.width = pre.size(-1);
  g.rows = pre.numel() / std::max<int64_t>(g.width, 1);
  g.bf16 = pre.scalar_type() == torch::kBFloat16;
  g.pre = pre.data_ptr();
  g.bias = bias.data_ptr<float>();
  return g;
}

// Saves pre and bias, not y: backward recomputes tanh from u = pre + bias, which costs less than
// keeping a second activation of the MLP's widest size.
class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& pre_in,
                               const torch::Tensor& bias_in, int64_t capability) {
    const torch::Tensor pre = pre_in.contiguous(), bias = bias_in.contiguous();
    torch::Tensor y = torch::empty_like(pre);
    detail::BiasGeluRows g = describe(pre, bias);
    g.y = y.data_ptr();
    const auto kernel = bias_gelu_bodies(static_cast<CpuCapability>(capability)).forward;
    at::parallel_for(0, g.rows, detail::rows_per_task(g.width),
                     [&](int64_t begin, int64_t end) { kernel(g, begin, end); });
    ctx->save_for_backward({pre, bias});
    ctx->saved_data["capability"] = capability;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("bias_gelu");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &pre = saved[0], &bias = saved[1];
    const torch::Tensor grad_y = grads[0].to(pre.scalar_type()).contiguous();
    torch::Tensor grad_pre = torch::empty_like(pre);
    detail::BiasGeluRows g = describe(pre, bias);
    const detail::RowChunks chunks = detail::row_chunks(g.rows);
    torch::Tensor bias_partial = torch::zeros({chunks.count, g.width}, bias.options());
    g.grad_y = grad_y.data_ptr();
    g.grad_pre = grad_pre.data_ptr();
    g.grad_bias_partial = bias_partial.data_ptr<float>();
    const auto kernel =
        bias_gelu_bodies(static_cast<CpuCapability>(ctx->saved_data["capability"].toInt())).backward;
    detail::for_each_row_chunk(
        g.rows, chunks, [&](int64_t begin, int64_t end, int64_t chunk) { kernel(g, begin, end, chunk); });
    return {grad_pre, bias_partial.sum(0), torch::Tensor()};
  }
};

}  // namespace

bool bias_gelu_takes(const torch::Tensor& pre, const torch::Tensor& bias) {
  return detail::cpu_float_or_bf16(pre) && pre.dim() >= 1 && pre.numel() > 0 && bias.defined() &&
         bias.device().is_cpu() && bias.scalar_type() == torch::kFloat && bias.dim() == 1 &&
         bias.size(0) == pre.size(-1);
}

torch::Tensor bias_gelu(const torch::Tensor& pre, const torch::Tensor& bias, CpuCapability capability) {
  FT_CHECK(bias_gelu_takes(pre, bias),
           "bias_gelu takes pre [..., N] on the CPU in fp32 or bf16 and an fp32 bias [N]; got pre {} {}, "
           "bias {} {}",
           pre.sizes(), c10::toString(pre.scalar_type()), bias.defined() ? bias.sizes() : c10::IntArrayRef{},
           bias.defined() ? c10::toString(bias.scalar_type()) : "none");
  detail::check_runnable(capability, "bias_gelu");
  return BiasGeluFunction::apply(pre, bias, static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
