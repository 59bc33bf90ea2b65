#include "fasttrain/optim/clip.h"

#include <torch/torch.h>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) grads.push_back(parameter.grad());
  }
  return grads;
}

torch::Tensor total_norm(const std::vector<torch::Tensor>& grads, const SquaredNormReducer& reduce) {
  // One multi-tensor kernel for every gradient's norm (torch.nn.utils.clip_grad_norm_'s foreach path).
  torch::Tensor total =
      grads.empty() ? torch::zeros({}) : torch::stack(torch::_foreach_norm(grads, 2)).norm(2);
  if (!reduce) return total;
  torch::Tensor squared = total * total;
  reduce(squared);
  return squared.sqrt();
}

}  // namespace

torch::Tensor grad_norm(const std::vector<torch::Tensor>& parameters, const SquaredNormReducer& reduce) {
  torch::NoGradGuard no_grad;
  return total_norm(gradients_of(parameters), reduce);
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                             const SquaredNormReducer& reduce) {
  FT_CHECK(max_norm > 0, "train.clip_norm must be > 0 to clip, got {}", max_norm);
  torch::NoGradGuard no_grad;
  const auto grads = gradients_of(parameters);
  auto total = total_norm(grads, reduce);
  if (grads.empty()) return total;
  auto scale = (max_norm / (total + 1e-6)).clamp_max(1.0);  // 0-dim
  compat::foreach_mul_(grads, scale.to(grads.front().device(), grads.front().scalar_type()));
  return total;
}

}  // namespace fasttrain
