#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <vector>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "matmul.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

std::vector<int64_t> output_sizes(const torch::Tensor& x, const torch::Tensor& weight) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return sizes;
}

// What a call holds: {x, weight}, then bias and residual where given (a custom Function's tensor inputs
// must be defined, so the absent ones are left out of the list and flagged).
struct LinearInputs {
  torch::Tensor x, weight, bias, residual;

  LinearInputs(at::TensorList list, bool has_bias, bool has_residual) : x(list[0]), weight(list[1]) {
    size_t next = 2;
    if (has_bias) bias = list[next++];
    if (has_residual) residual = list[next++];
  }
};

// y = residual + x weight^T + bias. Without a residual and with a bias, ATen's linear (MKL's sgemm after a
// copy of the bias: faster here than oneDNN's); with a residual oneDNN's matmul, adding into residual + bias;
// with neither, fasttrain's tiled matmul where it wins (depth <= 128, matmul.h), else oneDNN's.
// Backward: the input's gradient grad_y weight by the same rule on its depth (oneDNN measured 10-25% faster
// than MKL on the gpt's shapes), the weight's and the bias's by ATen, the residual's grad_y itself.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList list, bool has_bias,
                               bool has_residual) {
    const LinearInputs in(list, has_bias, has_residual);
    ctx->save_for_backward({in.x, in.weight});
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["has_residual"] = has_residual;
    if (!has_residual && has_bias) return torch::linear(in.x, in.weight, in.bias);
    const torch::Tensor rows = in.x.reshape({-1, in.x.size(-1)});                   // [M, K]
    torch::Tensor y = torch::empty(output_sizes(in.x, in.weight), in.x.options());  // contiguous, whatever
    if (has_residual && has_bias) {                                                 // the residual's strides
      at::add_out(y, in.residual, in.bias);
    } else if (has_residual) {
      y.copy_(in.residual);
    }
    const torch::Tensor y_rows = y.view({rows.size(0), in.weight.size(0)});
    if (!has_residual && detail::tiled_matmul_wins(rows.size(1), in.weight.size(0))) {
      detail::tiled_matmul_into(rows.contiguous(), in.weight, /*transposed=*/true, y_rows);
    } else {
      detail::matmul_into(rows, in.weight.t(), y_rows, has_residual);
    }
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("linear");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool has_residual = ctx->saved_data["has_residual"].toBool();
    const torch::Tensor grad_y = grads[0].reshape({-1, weight.size(0)}).contiguous();  // [M, N]
    torch::autograd::variable_list out;
    if (ctx->needs_input_grad(0)) {
      torch::Tensor grad_x = torch::empty(x.sizes(), x.options());
      const torch::Tensor grad_x_rows = grad_x.view({grad_y.size(0), weight.size(1)});  // [M, N] @ [N, K]
      if (detail::tiled_matmul_wins(weight.size(0), weight.size(1))) {
        detail::tiled_matmul_into(grad_y, weight, /*transposed=*/false, grad_x_rows);
      } else {
        detail::matmul_into(grad_y, weight, grad_x_rows, false);
      }
      out.push_back(grad_x);
    } else {
      out.emplace_back();
    }
    out.push_back(ctx->needs_input_grad(1) ? grad_y.t().mm(x.reshape({-1, x.size(-1)})) : torch::Tensor());
    size_t next = 2;
    if (has_bias) out.push_back(ctx->needs_input_grad(next++) ? grad_y.sum(0) : torch::Tensor());
    if (has_residual) out.push_back(ctx->needs_input_grad(next++) ? grads[0] : torch::Tensor());
    out.resize(out.size() + 2);  // has_bias, has_residual
    return out;
  }
};

}  // namespace

bool linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                  const torch::Tensor& residual) {
  return detail::onednn_runs_fp32_matmul() && detail::fp32_cpu(x) && cpu_compute_dtype(x) == torch::kFloat &&
         x.dim() >= 1 && x.numel() > 0 && detail::fp32_cpu(weight) && weight.dim() == 2 &&
         weight.size(0) > 0 && weight.size(1) == x.size(-1) &&
         (!bias.defined() || (detail::fp32_cpu(bias) && bias.dim() == 1 && bias.size(0) == weight.size(0))) &&
         (!residual.defined() || (detail::fp32_cpu(residual) && residual.sizes() == output_sizes(x, weight)));
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     const torch::Tensor& residual) {
  FT_CHECK(
      linear_takes(x, weight, bias, residual),
      "linear takes x [..., K], weight [N, K], bias [N] or none and residual [..., N] or none, all fp32 on "
      "the CPU outside autocast, where oneDNN runs fp32 matmuls (LibTorch 2.4 or later, AVX512 BW/VL/DQ); "
      "got x {}, weight {}, bias {}, residual {}",
      detail::describe_tensor(x), detail::describe_tensor(weight), detail::describe_tensor(bias),
      detail::describe_tensor(residual));
  std::vector<torch::Tensor> list{x, weight};
  if (bias.defined()) list.push_back(bias);
  if (residual.defined()) list.push_back(residual);
  return LinearFunction::apply(at::TensorList(list), bias.defined(), residual.defined());
}

}  // namespace fasttrain::kernels
