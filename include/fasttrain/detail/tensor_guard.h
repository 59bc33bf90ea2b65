#pragma once
// Puts tensors back to the values they had when the guard was made, in place and outside autograd,
// when it goes out of scope: for state a computation updates on the side, such as BatchNorm's
// running statistics during a recompute or a warm-up pass.
//
//   {
//     fasttrain::TensorValuesGuard keep(model->buffers());
//     model->forward(x);          // training-mode BatchNorm updates its running statistics
//   }                             // the statistics as they were
// A tensor that cannot be put back (resized meanwhile, or its device failed) is an error thrown from the
// destructor, after the others are put back; where an error is already unwinding the stack, the first
// error goes on and this one is printed as a warning (a second exception would end the process).
#include <torch/types.h>

#include <vector>

namespace fasttrain {

class TensorValuesGuard {
 public:
  explicit TensorValuesGuard(std::vector<torch::Tensor> tensors);
  ~TensorValuesGuard() noexcept(false);
  TensorValuesGuard(const TensorValuesGuard&) = delete;
  TensorValuesGuard& operator=(const TensorValuesGuard&) = delete;

 private:
  std::vector<torch::Tensor> tensors_;
  std::vector<torch::Tensor> saved_;
  int unwinding_at_start_;  // std::uncaught_exceptions() when the guard was made
};

}  // namespace fasttrain
