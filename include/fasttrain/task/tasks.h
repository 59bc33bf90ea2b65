#pragma once
// The built-in tasks (task/task.h): classification, language_modeling, regression, reconstruction.
//
//   auto task = std::make_shared<fasttrain::RegressionTask>(fasttrain::RegressionOptions().loss("huber"));
//   torch::Tensor loss = task->loss(model.forward(batch), batch);     // 0-dim, no host reads
#include <torch/types.h>

#include <string>
#include <vector>

#include "fasttrain/task/task.h"
#include "fasttrain/util/key.h"

namespace fasttrain {

// logits [N, C] (any float dtype; computed in fp32), targets [N] int64 -> 0-dim fp32 mean loss:
// (1 - e) * nll + e * mean over classes of -log p, with e = label_smoothing. `padded`: some targets are
// kIgnoreTarget (data/batch_source.h); the mean is over the others. Written with log_softmax and gather
// only: LibTorch 1.13's own cross_entropy(label_smoothing > 0) sizes its outputs on the host (index_put_,
// masked_select), three device synchronisations per step (found by `fasttrain doctor`).
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, double label_smoothing,
                            bool padded = false);

// [task] keys of classification and language_modeling.
struct ClassificationOptions {
  FT_KEYS(ClassificationOptions);
  FT_KEY(double, label_smoothing,
         "Cross-entropy label smoothing (training loss only; evaluation reports the plain loss)",
         below_one()) = 0.0;
  FT_KEY(std::string, kernels,
         "CPU kernel for the training loss: fasttrain (the cross-entropy, label smoothing and padding in one "
         "pass over each row of logits forward and one backward, reading bf16 logits as they are) or aten "
         "(log_softmax, gather and mean on an fp32 copy); GPUs run aten",
         one_of({"fasttrain", "aten"})) = "fasttrain";
};

// Class ids from logits: output [N, C] (or [B, T, C]) against targets [N] (or [B, T]) int64.
// Metrics: loss (the plain cross-entropy), accuracy (of the argmax).
class ClassificationTask : public Task {
 public:
  // `classes`: how many the data has (DataShape::classes; 0: not known), which the model's logits must match.
  explicit ClassificationTask(ClassificationOptions options = ClassificationOptions(), int64_t classes = 0);
  std::string name() const override { return "classification"; }
  torch::Tensor loss(const ModelOutput& output, const Batch& batch) override;
  std::vector<std::string> sum_names() const override;
  torch::Tensor evaluation_sums(const ModelOutput& output, const Batch& batch) override;
  Metrics metrics(const std::vector<double>& totals) const override;
  bool higher_is_better(const std::string& metric) const override;

 protected:
  // The output's logits [N, C] and the targets [N], checked against each other.
  std::pair<torch::Tensor, torch::Tensor> logits_and_targets(const ModelOutput& output,
                                                             const Batch& batch) const;

 private:
  ClassificationOptions options_;
  int64_t classes_;
};

// Next-token prediction over sequences (padding targets skipped): classification's loss and accuracy
// per target token, and bits per byte of raw text (loss / ln 2 / bytes per target), the
// tokenizer-independent figure language models are compared by.
class LanguageModelTask : public ClassificationTask {
 public:
  // `bytes_per_target`: raw text bytes per target token (1 for byte-level text).
  LanguageModelTask(ClassificationOptions options, double bytes_per_target, int64_t classes = 0);
  std::string name() const override { return "language_modeling"; }
  Metrics metrics(const std::vector<double>& totals) const override;

 private:
  double bytes_per_target_;
};

// [task] keys of regression.
struct RegressionOptions {
  FT_KEYS(RegressionOptions);
  FT_KEY(std::string, loss, "Training loss: mse, l1 or huber (smooth L1 with huber_delta)",
         one_of({"mse", "l1", "huber"})) = "mse";
  FT_KEY(double, huber_delta, "huber: where the loss turns from quadratic to linear", above(0)) = 1.0;
};

// Values from values: output and targets of the same shape [B, K] (or [B]), float. Metrics: loss (the
// training loss's mean over values), rmse, mae and r2 (the coefficient of determination, averaged over
// the K outputs as scikit-learn's r2_score does).
class RegressionTask : public Task {
 public:
  // `outputs`: K, the values per sample (R² is kept per output).
  explicit RegressionTask(RegressionOptions options = RegressionOptions(), int64_t outputs = 1);
  std::string name() const override { return "regression"; }
  torch::Tensor loss(const ModelOutput& output, const Batch& batch) override;
  std::vector<std::string> sum_names() const override;
  torch::Tensor evaluation_sums(const ModelOutput& output, const Batch& batch) override;
  Metrics metrics(const std::vector<double>& totals) const override;
  bool higher_is_better(const std::string& metric) const override { return metric == "r2"; }

 private:
  // The prediction and the targets [B, K], float32, checked against each other and K.
  std::pair<torch::Tensor, torch::Tensor> prediction_and_targets(const ModelOutput& output,
                                                                 const Batch& batch) const;
  RegressionOptions options_;
  int64_t outputs_;
};

// An autoencoder: the output reconstructs the batch's inputs (same shape). Metrics: loss (MSE), rmse, mae.
class ReconstructionTask : public Task {
 public:
  std::string name() const override { return "reconstruction"; }
  torch::Tensor loss(const ModelOutput& output, const Batch& batch) override;
  std::vector<std::string> sum_names() const override;
  torch::Tensor evaluation_sums(const ModelOutput& output, const Batch& batch) override;
  Metrics metrics(const std::vector<double>& totals) const override;

 private:
  torch::Tensor reconstruction(const ModelOutput& output, const Batch& batch) const;
};

}  // namespace fasttrain
