#include "fasttrain/models/attention.h"

#include <torch/torch.h>

#include <cmath>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

torch::Tensor causal_attention_math(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  FT_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(),
           "causal_attention needs q, k, v of one shape [B, H, T, D], got {}, {}, {}", q.sizes(), k.sizes(),
           v.sizes());
  const int64_t length = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;  // [B, H, T, T]
  torch::Tensor future = torch::ones({length, length}, q.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);  // [B, H, T, D]
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  torch::Tensor out;
  if (compat::fused_causal_attention(q, k, v, out)) return out;
  return causal_attention_math(q, k, v);
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return torch::gelu(x, "tanh");
}

torch::Tensor gelu_tanh_unfused(const torch::Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + torch::tanh(c * (x + 0.044715 * x * x * x)));
}

}  // namespace fasttrain
