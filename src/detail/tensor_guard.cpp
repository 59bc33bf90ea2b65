#include "fasttrain/detail/tensor_guard.h"

#include <torch/torch.h>

namespace fasttrain {

TensorValuesGuard::TensorValuesGuard(std::vector<torch::Tensor> tensors) : tensors_(std::move(tensors)) {
  torch::NoGradGuard no_grad;
  saved_.reserve(tensors_.size());
  for (const torch::Tensor& tensor : tensors_) saved_.push_back(tensor.clone());
}

TensorValuesGuard::~TensorValuesGuard() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].copy_(saved_[i]);
}

}  // namespace fasttrain
