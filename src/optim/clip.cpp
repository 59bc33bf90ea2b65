#include "fasttrain/optim/clip.h"

#include <torch/torch.h>

#include "fasttrain/util/check.h"

namespace fasttrain {

torch::Tensor grad_norm(const std::vector<torch::Tensor>& parameters, const SquaredNormReducer& reduce) {
  std::vector<torch::Tensor> norms;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) norms.push_back(parameter.grad().detach().norm(2));
  }
  torch::Tensor total = norms.empty() ? torch::zeros({}) : torch::stack(norms).norm(2);
  if (!reduce) return total;
  torch::Tensor squared = total * total;
  reduce(squared);
  return squared.sqrt();
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                             const SquaredNormReducer& reduce) {
  FT_CHECK(max_norm > 0, "train.clip_norm must be > 0 to clip, got {}", max_norm);
  torch::NoGradGuard no_grad;
  auto total = grad_norm(parameters, reduce);
  auto scale = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) parameter.grad().mul_(scale.to(parameter.grad().device()));
  }
  return total;
}

}  // namespace fasttrain
