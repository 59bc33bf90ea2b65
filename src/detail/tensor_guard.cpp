#include "fasttrain/detail/tensor_guard.h"

#include <fmt/core.h>
#include <torch/torch.h>

#include <exception>

namespace fasttrain {

TensorValuesGuard::TensorValuesGuard(std::vector<torch::Tensor> tensors)
    : tensors_(std::move(tensors)), unwinding_at_start_(std::uncaught_exceptions()) {
  torch::NoGradGuard no_grad;
  saved_.reserve(tensors_.size());
  for (const torch::Tensor& tensor : tensors_) saved_.push_back(tensor.clone());
}

TensorValuesGuard::~TensorValuesGuard() noexcept(false) {
  torch::NoGradGuard no_grad;
  std::exception_ptr first_failure;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    try {
      tensors_[i].copy_(saved_[i]);
    } catch (...) {
      if (!first_failure) first_failure = std::current_exception();
    }
  }
  if (!first_failure) return;
  if (std::uncaught_exceptions() == unwinding_at_start_) std::rethrow_exception(first_failure);
  try {
    std::rethrow_exception(first_failure);
  } catch (const std::exception& error) {
    const std::string what = error.what();
    fmt::print(stderr, "fasttrain: warning: after an error, tensors could not be put back as they were: {}\n",
               what.substr(0, what.find('\n')));
  } catch (...) {
    fmt::print(stderr, "fasttrain: warning: after an error, tensors could not be put back as they were\n");
  }
}

}  // namespace fasttrain
