// classification and language_modeling: cross-entropy over class ids (tokens are classes too).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/util/check.h"

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

ClassificationTask::ClassificationTask(ClassificationOptions options, int64_t classes)
    : options_(std::move(options)), classes_(classes) {
  check_keys(options_, "task");
}

std::pair<torch::Tensor, torch::Tensor> ClassificationTask::logits_and_targets(const ModelOutput& output,
                                                                               const Batch& batch) const {
  const torch::Tensor& logits = output.tensor();
  const torch::Tensor& targets = batch.targets;
  FT_CHECK(targets.defined(), "task '{}' needs the batch's targets, and it has none (it has: {})", name(),
           fmt::join(batch.names(), ", "));
  FT_CHECK(!torch::isFloatingType(targets.scalar_type()),
           "task '{}' takes class ids (int64 targets), but the batch's targets are {} [{}]: for values use "
           "task.name = \"regression\"",
           name(), c10::toString(targets.scalar_type()), fmt::join(targets.sizes(), ", "));
  FT_CHECK(torch::isFloatingType(logits.scalar_type()) && logits.dim() >= 2,
           "task '{}' takes logits [N, classes] from the model, but its output is {}", name(),
           output.describe());
  FT_CHECK(classes_ == 0 || logits.size(-1) == classes_,
           "task '{}': the model's output {} has {} logits per prediction, and the data has {} classes: its "
           "output layer needs one logit per class",
           name(), output.describe(), logits.size(-1), classes_);
  if (logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0)) return {logits, targets};
  // Sequences: [B, T, C] against [B, T] or [B * T].
  const int64_t classes = logits.size(-1);
  FT_CHECK(logits.numel() / classes == targets.numel(),
           "task '{}': the model's output {} does not fit the targets [{}]: it needs logits [N, classes] for "
           "targets [N] (or [B, T, classes] for [B, T])",
           name(), output.describe(), fmt::join(targets.sizes(), ", "));
  return {logits.reshape({-1, classes}), targets.reshape({-1})};
}

torch::Tensor ClassificationTask::loss(const ModelOutput& output, const Batch& batch) {
  const auto [logits, targets] = logits_and_targets(output, batch);
  if (options_.kernels() == "fasttrain" && kernels::cross_entropy_takes(logits, targets))
    return kernels::cross_entropy(logits, targets, options_.label_smoothing(), kIgnoreTarget);
  return cross_entropy(logits, targets, options_.label_smoothing(), batch.padded);  // no host reads
}

std::vector<std::string> ClassificationTask::sum_names() const {
  return {"loss_sum", "correct", "count"};
}

torch::Tensor ClassificationTask::evaluation_sums(const ModelOutput& output, const Batch& batch) {
  const auto [raw_logits, targets] = logits_and_targets(output, batch);
  const torch::Tensor logits = raw_logits.to(torch::kFloat);  // [N, classes]
  // Padding targets (kIgnoreTarget) add nothing to either sum: cross_entropy ignores them, and no argmax
  // equals them; batch.count counts the others.
  const torch::Tensor loss_sum = torch::nn::functional::cross_entropy(
      logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  const torch::Tensor correct = logits.argmax(1).eq(targets).sum();
  const auto options = loss_sum.options().dtype(torch::kDouble);
  return torch::stack({loss_sum.to(torch::kDouble), correct.to(torch::kDouble),
                       torch::full({}, static_cast<double>(batch.count), options)});
}

Metrics ClassificationTask::metrics(const std::vector<double>& totals) const {
  const double count = totals.at(2);
  FT_CHECK(count > 0, "the evaluation set is empty");
  Metrics metrics;
  metrics.set("loss", totals.at(0) / count);
  metrics.set("accuracy", totals.at(1) / count);
  return metrics;
}

bool ClassificationTask::higher_is_better(const std::string& metric) const {
  return metric == "accuracy";
}

LanguageModelTask::LanguageModelTask(ClassificationOptions options, double bytes_per_target, int64_t classes)
    : ClassificationTask(std::move(options), classes), bytes_per_target_(bytes_per_target) {
  FT_CONFIG_CHECK(bytes_per_target_ > 0,
                  "task.name = \"language_modeling\" scores text in bits per byte, but the data is not text "
                  "(its samples say no bytes per target): use task.name = \"classification\"");
}

Metrics LanguageModelTask::metrics(const std::vector<double>& totals) const {
  Metrics metrics = ClassificationTask::metrics(totals);
  metrics.set("bits_per_byte", metrics.at("loss") / std::log(2.0) / bytes_per_target_);
  return metrics;
}

}  // namespace fasttrain
