#include "fasttrain/train/loss.h"

#include <torch/torch.h>

#include "fasttrain/data/batch_source.h"

namespace fasttrain {

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, double label_smoothing,
                            bool padded) {
  // torch's ignore_index defaults to kIgnoreTarget: padding is skipped without a mask here.
  if (label_smoothing == 0) return torch::nn::functional::cross_entropy(logits, targets);
  torch::Tensor valid = padded ? targets.ne(kIgnoreTarget) : torch::Tensor();      // [B]
  torch::Tensor log_probs = torch::log_softmax(logits.to(torch::kFloat), 1);       // [B, C]
  torch::Tensor safe_targets = padded ? targets.clamp_min(0) : targets;            // [B]
  torch::Tensor nll = -log_probs.gather(1, safe_targets.unsqueeze(1)).squeeze(1);  // [B]
  torch::Tensor uniform = -log_probs.mean(1);                                      // [B]
  torch::Tensor losses = (1 - label_smoothing) * nll + label_smoothing * uniform;  // [B]
  if (!padded) return losses.mean();
  return (losses * valid).sum() / valid.sum().clamp_min(1);  // mean over the real targets, on device
}

}  // namespace fasttrain
