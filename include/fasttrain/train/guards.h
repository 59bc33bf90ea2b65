#pragma once
// EvalGuard: puts a module in eval mode (dropout off, BatchNorm uses running stats) and restores
// its previous mode on exit. Pair it with torch::NoGradGuard (thread-local) for evaluation.
//
//   { fasttrain::EvalGuard eval(*model); torch::NoGradGuard no_grad; logits = model->forward(x); }
#include <torch/nn/module.h>

namespace fasttrain {

class EvalGuard {
 public:
  explicit EvalGuard(torch::nn::Module& module) : module_(module), was_training_(module.is_training()) {
    module_.eval();
  }
  ~EvalGuard() { module_.train(was_training_); }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

}  // namespace fasttrain
