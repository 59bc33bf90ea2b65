#pragma once
// Puts tensors back to the values they had when the guard was made, in place and outside autograd,
// when it goes out of scope: for state a computation updates on the side, such as BatchNorm's
// running statistics during a recompute or a warm-up pass.
//
//   {
//     fasttrain::TensorValuesGuard keep(model->buffers());
//     model->forward(x);          // training-mode BatchNorm updates its running statistics
//   }                             // the statistics as they were
#include <torch/types.h>

#include <vector>

namespace fasttrain {

class TensorValuesGuard {
 public:
  explicit TensorValuesGuard(std::vector<torch::Tensor> tensors);
  ~TensorValuesGuard();
  TensorValuesGuard(const TensorValuesGuard&) = delete;
  TensorValuesGuard& operator=(const TensorValuesGuard&) = delete;

 private:
  std::vector<torch::Tensor> tensors_;
  std::vector<torch::Tensor> saved_;
};

}  // namespace fasttrain
