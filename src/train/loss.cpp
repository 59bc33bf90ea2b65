#include "fasttrain/train/loss.h"

#include <torch/torch.h>

namespace fasttrain {

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                            double label_smoothing) {
  if (label_smoothing == 0) return torch::nn::functional::cross_entropy(logits, targets);
  torch::Tensor log_probs = torch::log_softmax(logits.to(torch::kFloat), 1);  // [B, C]
  torch::Tensor nll = -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1);  // [B]
  torch::Tensor uniform = -log_probs.mean(1);                                 // [B]
  return ((1 - label_smoothing) * nll + label_smoothing * uniform).mean();
}

}  // namespace fasttrain
