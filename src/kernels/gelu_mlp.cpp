#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <string>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "matmul.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

// The GELU matmul of a and the packed b, whose epilogue adds fc's bias to pre (written or read).
detail::TiledMatmul gelu_product(const torch::Tensor& a, const torch::Tensor& panels, int64_t width,
                                 const torch::Tensor& bias, const torch::Tensor& pre) {
  detail::TiledMatmul m = detail::tiled_product(a, panels, width);
  m.bias = bias.data_ptr<float>();
  m.pre = pre.data_ptr<float>();
  return m;
}

// y = residual + proj(gelu_tanh(fc(x))). Saves x, the weights, fc's bias, pre = x fc^T (before its bias) and
// h = gelu(pre + bias): what the unfused ops keep (bias_gelu's pre, the projection's input h).
//   forward   pre, h = [M, C] @ fc^T [C, H] in the GELU matmul;  y = residual + proj_b + h proj^T
//   backward  grad_pre, grad_fc_b = grad_y [M, C] @ proj [C, H] in the GELU matmul's backward epilogue;
//             grad_x = grad_pre fc,  grad_fc = grad_pre^T x,  grad_proj = grad_y^T h,  grad_proj_b = sum
//             grad_y
class GeluMlpFunction : public torch::autograd::Function<GeluMlpFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& fc_weight, const torch::Tensor& fc_bias_in,
                               const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                               const torch::Tensor& residual, int64_t capability) {
    const detail::MatmulKernels bodies = detail::matmul_bodies(static_cast<CpuCapability>(capability));
    const int64_t channels = x.size(-1), hidden = fc_weight.size(0);
    const torch::Tensor rows = x.reshape({-1, channels}).contiguous(), fc_bias = fc_bias_in.contiguous();
    const torch::Tensor panels = detail::packed_panels(bodies, fc_weight, /*transposed=*/true);
    torch::Tensor pre = torch::empty({rows.size(0), hidden}, x.options()), h = torch::empty_like(pre);
    detail::TiledMatmul m = gelu_product(rows, panels, hidden, fc_bias, pre);
    m.y = h.data_ptr<float>();
    at::parallel_for(0, m.rows, detail::rows_per_task(hidden),
                     [&](int64_t begin, int64_t end) { bodies.gelu_forward(m, begin, end); });
    torch::Tensor y =
        torch::empty(x.sizes(), x.options());  // [..., C], contiguous whatever residual's strides
    at::add_out(y, residual, proj_bias);
    detail::matmul_into(h, proj_weight.t(), y.view({m.rows, channels}), /*accumulate=*/true);
    ctx->save_for_backward({rows, fc_weight, fc_bias, proj_weight, pre, h});
    ctx->saved_data["capability"] = capability;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("gelu_mlp");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &rows = saved[0], &fc_weight = saved[1], &fc_bias = saved[2], &proj_weight = saved[3],
                        &pre = saved[4], &h = saved[5];
    const torch::Tensor grad_y = grads[0].reshape({-1, rows.size(1)}).contiguous();  // [M, C]
    torch::autograd::variable_list out(7);
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const detail::MatmulKernels bodies =
          detail::matmul_bodies(static_cast<CpuCapability>(ctx->saved_data["capability"].toInt()));
      const torch::Tensor panels = detail::packed_panels(bodies, proj_weight, /*transposed=*/false);
      torch::Tensor grad_pre = torch::empty_like(pre);
      const detail::RowChunks chunks = detail::row_chunks(grad_y.size(0));
      torch::Tensor bias_partial = torch::zeros({chunks.count, pre.size(1)}, pre.options());
      detail::TiledMatmul m = gelu_product(grad_y, panels, pre.size(1), fc_bias, pre);
      m.grad_pre = grad_pre.data_ptr<float>();
      m.grad_bias_partial = bias_partial.data_ptr<float>();
      detail::for_each_row_chunk(m.rows, chunks, [&](int64_t begin, int64_t end, int64_t chunk) {
        bodies.gelu_backward(m, begin, end, chunk);
      });
      if (ctx->needs_input_grad(0)) {
        torch::Tensor grad_x = torch::empty(grads[0].sizes(), rows.options());
        detail::matmul_into(grad_pre, fc_weight, grad_x.view(rows.sizes()), /*accumulate=*/false);
        out[0] = grad_x;
      }
      if (ctx->needs_input_grad(1)) out[1] = grad_pre.t().mm(rows);
      if (ctx->needs_input_grad(2)) out[2] = bias_partial.sum(0);
    }
    if (ctx->needs_input_grad(3)) out[3] = grad_y.t().mm(h);
    if (ctx->needs_input_grad(4)) out[4] = grad_y.sum(0);
    if (ctx->needs_input_grad(5)) out[5] = grads[0];
    return out;  // and none for the capability
  }
};

bool vector_of(const torch::Tensor& t, int64_t size) {
  return detail::fp32_cpu(t) && t.dim() == 1 && t.size(0) == size;
}

}  // namespace

bool gelu_mlp_takes(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                    const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                    const torch::Tensor& residual) {
  if (!detail::fp32_cpu(x) || cpu_compute_dtype(x) != torch::kFloat || x.dim() < 1 || x.numel() == 0)
    return false;
  const int64_t channels = x.size(-1);
  if (!detail::fp32_cpu(fc_weight) || fc_weight.dim() != 2 || fc_weight.size(0) == 0 ||
      fc_weight.size(1) != channels)
    return false;
  const int64_t hidden = fc_weight.size(0);
  return vector_of(fc_bias, hidden) && detail::fp32_cpu(proj_weight) && proj_weight.dim() == 2 &&
         proj_weight.size(0) == channels && proj_weight.size(1) == hidden && vector_of(proj_bias, channels) &&
         detail::fp32_cpu(residual) && residual.sizes() == x.sizes();
}

torch::Tensor gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                       const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                       const torch::Tensor& residual, CpuCapability capability) {
  FT_CHECK(gelu_mlp_takes(x, fc_weight, fc_bias, proj_weight, proj_bias, residual),
           "gelu_mlp takes x [..., C], fc_weight [H, C], fc_bias [H], proj_weight [C, H], proj_bias [C] and "
           "residual of x's shape, all fp32 on the CPU outside autocast; got x {}, fc_weight {}, fc_bias {}, "
           "proj_weight {}, proj_bias {}, residual {}",
           detail::describe_tensor(x), detail::describe_tensor(fc_weight), detail::describe_tensor(fc_bias),
           detail::describe_tensor(proj_weight), detail::describe_tensor(proj_bias),
           detail::describe_tensor(residual));
  detail::check_runnable(capability, "gelu_mlp");
  return GeluMlpFunction::apply(x, fc_weight, fc_bias, proj_weight, proj_bias, residual,
                                static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
