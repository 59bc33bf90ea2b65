#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <cmath>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

detail::AttentionKernels attention_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(attention_kernels, capability);
}

detail::PackedAttention describe(const torch::Tensor& qkv, const torch::Tensor& bias, int64_t heads) {
  FT_CHECK(packed_attention_takes(qkv, heads, bias),
           "packed_causal_attention takes qkv [B, T, 3C] on the CPU in fp32 or bf16 with C a multiple of "
           "heads ({}), and a bias fp32 [3C] or none; got qkv {} {} on {}, bias {}",
           heads, qkv.sizes(), c10::toString(qkv.scalar_type()), qkv.device().str(),
           bias.defined() ? fmt::format("{} {}", bias.sizes(), c10::toString(bias.scalar_type())) : "none");
  detail::PackedAttention attention;
  attention.batch = qkv.size(0);
  attention.length = qkv.size(1);
  attention.heads = heads;
  attention.head_dim = qkv.size(2) / 3 / heads;
  attention.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(attention.head_dim)));
  attention.bf16 = qkv.scalar_type() == torch::kBFloat16;
  attention.qkv = qkv.data_ptr();
  attention.qkv_bias = bias.defined() ? bias.data_ptr<float>() : nullptr;
  return attention;
}

// One (batch, head) pair is T^2 D work: every pair is worth a task of its own.
void run_pairs(detail::AttentionPairs kernel, const detail::PackedAttention& attention) {
  at::parallel_for(0, attention.batch * attention.heads, 1,
                   [&](int64_t begin, int64_t end) { kernel(attention, begin, end); });
}

// Its inputs as a list, {qkv} or {qkv, bias}: a custom Function's tensor inputs must be defined.
class PackedAttentionFunction : public torch::autograd::Function<PackedAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs, int64_t heads,
                               int64_t capability) {
    const torch::Tensor qkv = inputs[0].contiguous();
    const torch::Tensor bias = inputs.size() > 1 ? inputs[1].contiguous() : torch::Tensor();
    detail::PackedAttention attention = describe(qkv, bias, heads);
    torch::Tensor out = torch::empty({attention.batch, attention.length, qkv.size(2) / 3}, qkv.options());
    torch::Tensor lse =
        torch::empty({attention.batch, heads, attention.length}, qkv.options().dtype(torch::kFloat));
    attention.out_mut = out.data_ptr();
    attention.lse = lse.data_ptr<float>();
    run_pairs(attention_bodies(static_cast<CpuCapability>(capability)).forward, attention);
    std::vector<torch::Tensor> saved{qkv, out, lse};
    if (bias.defined()) saved.push_back(bias);
    ctx->save_for_backward(saved);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["capability"] = capability;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("packed_causal_attention");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &qkv = saved[0], &out = saved[1], &lse = saved[2];
    const torch::Tensor bias = saved.size() > 3 ? saved[3] : torch::Tensor();
    const torch::Tensor grad_out = grads[0].to(qkv.scalar_type()).contiguous();
    torch::Tensor grad_qkv = torch::empty_like(qkv);
    detail::PackedAttention attention = describe(qkv, bias, ctx->saved_data["heads"].toInt());
    attention.out = out.data_ptr();
    attention.lse = lse.data_ptr<float>();
    attention.grad_out = grad_out.data_ptr();
    attention.grad_qkv = grad_qkv.data_ptr();
    const bool bias_grad = bias.defined() && ctx->needs_input_grad(1);
    torch::Tensor grad_bias_pairs;  // [B, H, 3, D]
    if (bias_grad) {
      grad_bias_pairs = torch::empty({attention.batch, attention.heads, 3, attention.head_dim},
                                     qkv.options().dtype(torch::kFloat));
      attention.grad_bias_pairs = grad_bias_pairs.data_ptr<float>();
    }
    run_pairs(attention_bodies(static_cast<CpuCapability>(ctx->saved_data["capability"].toInt())).backward,
              attention);
    torch::autograd::variable_list result{grad_qkv};
    if (bias.defined()) {  // [3C] = [3, H, D]: the bias is added to every token row
      result.push_back(bias_grad ? grad_bias_pairs.sum(0).transpose(0, 1).reshape({-1}) : torch::Tensor());
    }
    result.resize(result.size() + 2);  // heads, capability
    return result;
  }
};

}  // namespace

bool packed_attention_takes(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& bias) {
  return detail::cpu_float_or_bf16(qkv) && qkv.dim() == 3 && heads > 0 && qkv.size(2) % 3 == 0 &&
         (qkv.size(2) / 3) % heads == 0 && qkv.size(1) > 0 &&
         (!bias.defined() || (bias.device().is_cpu() && bias.scalar_type() == torch::kFloat &&
                              bias.dim() == 1 && bias.size(0) == qkv.size(2)));
}

torch::Tensor packed_causal_attention(const torch::Tensor& qkv, int64_t heads, CpuCapability capability,
                                      const torch::Tensor& bias) {
  detail::check_runnable(capability, "packed_causal_attention");
  std::vector<torch::Tensor> inputs{qkv};
  if (bias.defined()) inputs.push_back(bias);
  return PackedAttentionFunction::apply(at::TensorList(inputs), heads, static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
