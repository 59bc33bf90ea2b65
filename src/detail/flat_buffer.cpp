#include "fasttrain/detail/flat_buffer.h"

#include <torch/torch.h>

#include <algorithm>

#include "fasttrain/util/check.h"

namespace fasttrain {

FlatBuffer FlatBuffer::lay_out(std::vector<torch::Tensor> parameters, int64_t world) {
  FT_CHECK(!parameters.empty(), "FlatBuffer::lay_out needs at least one parameter");
  torch::NoGradGuard no_grad;
  FlatBuffer flat;
  int64_t total = 0;
  for (const auto& parameter : parameters) {
    FT_CHECK(parameter.is_non_overlapping_and_dense(),
             "ZeRO needs dense parameters; one of shape {} has strides {}", parameter.sizes(),
             parameter.strides());
    flat.offsets.push_back(total);
    total += parameter.numel();
  }
  flat.parameters = std::move(parameters);
  flat.part = std::max<int64_t>(1, (total + world - 1) / world);
  flat.world = world;
  flat.whole = torch::zeros({flat.part * world}, flat.parameters.front().options().requires_grad(false));
  for (size_t i = 0; i < flat.parameters.size(); ++i) {
    torch::Tensor& parameter = flat.parameters[i];
    torch::Tensor view = flat.whole.as_strided(parameter.sizes(), parameter.strides(), flat.offsets[i]);
    view.copy_(parameter);
    parameter.set_data(view);
  }
  return flat;
}

std::vector<torch::Tensor> FlatBuffer::parts() const {
  std::vector<torch::Tensor> all;
  for (int64_t r = 0; r < world; ++r) all.push_back(part_of(r));
  return all;
}

torch::Tensor FlatBuffer::take_gradients() const {
  torch::NoGradGuard no_grad;
  bool any = false;
  for (const auto& parameter : parameters) any |= parameter.grad().defined();
  if (!any) return {};
  torch::Tensor grads = torch::zeros({whole.numel()}, parameters.front().options().requires_grad(false));
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::Tensor parameter = parameters[i];
    if (!parameter.grad().defined()) continue;
    grads.as_strided(parameter.sizes(), parameter.strides(), offsets[i]).copy_(parameter.grad());
    parameter.mutable_grad() = torch::Tensor();
  }
  return grads.mul_(1.0 / static_cast<double>(world));
}

}  // namespace fasttrain
