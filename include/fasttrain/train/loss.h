#pragma once
// Cross-entropy with label smoothing that never reads a value back on the host.
//
//   torch::Tensor loss = fasttrain::cross_entropy(logits, targets, 0.1);   // 0-dim, mean over the batch
//
// LibTorch 1.13's cross_entropy(label_smoothing > 0) goes through index_put_ and masked_select for
// its ignore_index handling, which size their outputs on the host: three device synchronisations
// per step (found by `fasttrain doctor` on the default config). This is the same function,
// (1 - e) * nll + e * mean over classes of -log p (padding targets skipped, no class weights), written with
// log_softmax and gather only.
#include <torch/types.h>

namespace fasttrain {

// logits [B, C] (any float dtype; computed in fp32), targets [B] int64 -> 0-dim fp32 mean loss.
// `padded`: some targets are kIgnoreTarget (data/batch_source.h); the mean is over the others.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, double label_smoothing,
                            bool padded = false);

}  // namespace fasttrain
