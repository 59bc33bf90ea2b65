#pragma once
// Causal self-attention and the tanh GELU of GPT models.
//
//   torch::Tensor y = fasttrain::causal_attention(q, k, v);   // [B, H, T, D] each -> [B, H, T, D]
//   torch::Tensor h = fasttrain::gelu_tanh(x);                  // one fused ATen op
//
// causal_attention uses ATen's fused scaled_dot_product_attention (flash kernels on GPU) where the
// LibTorch build has it (2.x), and the math path below on 1.13; both compute
// softmax(q k^T / sqrt(D) + causal mask) v.
// They sit in kernels/, beside fasttrain's own kernel (cpu.h) that packed_causal_attention picks on the
// CPU, so that the kernels' tests have their ATen reference without models/ (scripts/sanitize builds
// kernels/ alone).
#include <torch/types.h>

namespace fasttrain {

// softmax(q k^T / sqrt(D), masked above the diagonal) v: position t attends to positions <= t.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);
// The math path alone (what 1.13 runs), for tests and comparisons.
torch::Tensor causal_attention_math(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// Causal self-attention of a Linear(C, 3C)'s output: qkv [B, T, 3C] (q, k, v of `heads` heads side by
// side; plus `bias` [3C] where defined, the Linear's bias left to this call) -> [B, T, C]. fasttrain's own
// kernel where it takes the input (the CPU, fp32 or bf16: fasttrain/kernels/cpu.h), else
// packed_causal_attention_aten.
torch::Tensor packed_causal_attention(const torch::Tensor& qkv, int64_t heads,
                                      const torch::Tensor& bias = {});
// The same through ATen: the bias added, q, k, v views of qkv, causal_attention, the heads put back side by
// side.
torch::Tensor packed_causal_attention_aten(const torch::Tensor& qkv, int64_t heads,
                                           const torch::Tensor& bias = {});

// GELU with the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as one fused
// ATen kernel (forward and backward) instead of the seven pointwise ops of the formula.
torch::Tensor gelu_tanh(const torch::Tensor& x);
// The formula as separate ops: the reference gelu_tanh is tested against.
torch::Tensor gelu_tanh_unfused(const torch::Tensor& x);

}  // namespace fasttrain
