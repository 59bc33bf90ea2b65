#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

detail::NarrowLinearKernels narrow_linear_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(narrow_linear_kernels, capability);
}

detail::NarrowLinearMaps describe(const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias) {
  detail::NarrowLinearMaps m;
  m.rows = x.size(0);
  m.inputs = x.size(1);
  m.outputs = weight.size(0);
  m.x = x.data_ptr();
  m.x_bf16 = x.scalar_type() == torch::kBFloat16;
  m.weight = weight.data_ptr<float>();
  m.bias = bias.defined() ? bias.data_ptr<float>() : nullptr;
  return m;
}

// Saves x and the rounded weight; y is not needed (no activation inside).
class NarrowLinearFunction : public torch::autograd::Function<NarrowLinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& weight_in, const torch::Tensor& bias_in,
                               int64_t capability) {
    const torch::Tensor x = x_in.contiguous(), weight = detail::bf16_rounded(weight_in);
    const torch::Tensor bias = detail::bf16_rounded(bias_in);
    detail::NarrowLinearMaps m = describe(x, weight, bias);
    torch::Tensor y = torch::empty({m.rows, m.outputs}, x.options().dtype(torch::kBFloat16));
    m.y = y.data_ptr();
    const auto kernel = narrow_linear_bodies(static_cast<CpuCapability>(capability)).forward;
    detail::parallel_pieces(0, m.rows, detail::rows_per_task(m.inputs * m.outputs / 16),
                            [&](int64_t begin, int64_t end) { kernel(m, begin, end); });
    ctx->save_for_backward({x, weight, bias});
    ctx->saved_data["capability"] = capability;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("narrow_linear");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &bias = saved[2];
    const torch::Tensor grad_y = grads[0].to(torch::kBFloat16).contiguous();  // a no-op for y's own gradient
    detail::NarrowLinearMaps m = describe(x, weight, bias);
    m.grad_y = grad_y.data_ptr();
    const auto kernels =
        narrow_linear_bodies(static_cast<CpuCapability>(ctx->saved_data["capability"].toInt()));
    torch::autograd::variable_list out(4);
    if (ctx->needs_input_grad(0)) {
      out[0] = torch::empty_like(x);
      m.grad_x = out[0].data_ptr();
      detail::parallel_pieces(0, m.rows, detail::rows_per_task(m.inputs * m.outputs / 16),
                              [&](int64_t begin, int64_t end) { kernels.input_gradient(m, begin, end); });
    }
    if (ctx->needs_input_grad(1)) {
      out[1] = torch::empty_like(weight);
      m.grad_weight = out[1].data_ptr<float>();
      detail::parallel_pieces(0, m.inputs, 64,
                              [&](int64_t begin, int64_t end) { kernels.weight_gradient(m, begin, end); });
    }
    if (ctx->needs_input_grad(2)) {  // fp32 sums of the bf16 gradient, row by row
      out[2] = torch::zeros({m.outputs}, weight.options());
      float* db = out[2].data_ptr<float>();
      const c10::BFloat16* dy = grad_y.data_ptr<c10::BFloat16>();
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t o = 0; o < m.outputs; ++o) db[o] += static_cast<float>(dy[r * m.outputs + o]);
    }
    return out;
  }
};

bool fp32_cpu(const torch::Tensor& t, int64_t dims) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.dim() == dims;
}

}  // namespace

bool narrow_linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return detail::cpu_float_or_bf16(x) && x.dim() == 2 && x.size(0) > 0 && x.size(1) > 0 &&
         cpu_compute_dtype(x) == torch::kBFloat16 && fp32_cpu(weight, 2) && weight.size(1) == x.size(1) &&
         weight.size(0) >= 1 && weight.size(0) <= kNarrowLinearMaxOutputs && fp32_cpu(bias, 1) &&
         bias.size(0) == weight.size(0);
}

torch::Tensor narrow_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            CpuCapability capability) {
  FT_CHECK(
      narrow_linear_takes(x, weight, bias),
      "narrow_linear takes x [M, K] on the CPU (bf16, or fp32 under CPU autocast in bf16), weight fp32 [N, "
      "K] with N from 1 to {} and bias fp32 [N]; got x {}, weight {}, bias {}",
      kNarrowLinearMaxOutputs, detail::describe_tensor(x), detail::describe_tensor(weight),
      detail::describe_tensor(bias));
  detail::check_runnable(capability, "narrow_linear");
  return NarrowLinearFunction::apply(x, weight, bias, static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
