// regression and reconstruction: values against values.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>

#include "fasttrain/task/tasks.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

namespace F = torch::nn::functional;

// Checks that `prediction` and `target` agree in shape, naming the task and both.
void check_same_shape(const std::string& task, const ModelOutput& output, const torch::Tensor& target,
                      const std::string& target_name) {
  const torch::Tensor& prediction = output.tensor();
  FT_CHECK(torch::isFloatingType(prediction.scalar_type()) && prediction.sizes() == target.sizes(),
           "task '{}': the model's output {} does not match the {} [{}] {} (they need the same shape)", task,
           output.describe(), target_name, fmt::join(target.sizes(), ", "),
           c10::toString(target.scalar_type()));
}

// [numel] as a float64 tensor beside `like`.
torch::Tensor count_of(const torch::Tensor& like, int64_t numel) {
  return torch::full({1}, static_cast<double>(numel), like.options().dtype(torch::kDouble));
}

}  // namespace

RegressionTask::RegressionTask(RegressionOptions options, int64_t outputs)
    : options_(std::move(options)), outputs_(outputs) {
  check_keys(options_, "task");
  FT_CHECK(outputs_ >= 1, "a regression needs at least one value per sample, got {}", outputs_);
}

std::pair<torch::Tensor, torch::Tensor> RegressionTask::prediction_and_targets(const ModelOutput& output,
                                                                               const Batch& batch) const {
  FT_CHECK(batch.targets.defined(),
           "task 'regression' needs the batch's targets, and it has none (it has: {})",
           fmt::join(batch.names(), ", "));
  FT_CHECK(torch::isFloatingType(batch.targets.scalar_type()),
           "task 'regression' takes value targets (floating point), but the batch's targets are {} [{}]: for "
           "class ids use task.name = \"classification\"",
           c10::toString(batch.targets.scalar_type()), fmt::join(batch.targets.sizes(), ", "));
  check_same_shape("regression", output, batch.targets, "targets");
  const int64_t rows = batch.targets.dim() == 0 ? 1 : batch.targets.size(0);
  FT_CHECK(batch.targets.numel() == rows * outputs_,
           "task 'regression' was built for {} value(s) per sample, but the targets are [{}]", outputs_,
           fmt::join(batch.targets.sizes(), ", "));
  return {output.tensor().to(torch::kFloat).reshape({rows, outputs_}),
          batch.targets.to(torch::kFloat).reshape({rows, outputs_})};
}

torch::Tensor RegressionTask::loss(const ModelOutput& output, const Batch& batch) {
  const auto [prediction, targets] = prediction_and_targets(output, batch);
  if (options_.loss() == "l1") return F::l1_loss(prediction, targets);
  if (options_.loss() == "huber")
    return F::huber_loss(prediction, targets, F::HuberLossFuncOptions().delta(options_.huber_delta()));
  return F::mse_loss(prediction, targets);
}

std::vector<std::string> RegressionTask::sum_names() const {
  std::vector<std::string> names = {"loss_sum", "values", "squared_error", "absolute_error"};
  for (const char* per_output : {"target_sum", "target_square_sum", "squared_error"}) {
    for (int64_t k = 0; k < outputs_; ++k) names.push_back(fmt::format("{}_{}", per_output, k));
  }
  return names;
}

torch::Tensor RegressionTask::evaluation_sums(const ModelOutput& output, const Batch& batch) {
  const auto [prediction, targets] = prediction_and_targets(output, batch);  // [B, K]
  const torch::Tensor p = prediction.to(torch::kDouble), y = targets.to(torch::kDouble);
  const torch::Tensor error = p - y;
  const torch::Tensor loss_sum = loss(output, batch).to(torch::kDouble) * static_cast<double>(p.numel());
  return torch::cat({loss_sum.reshape({1}), count_of(p, p.numel()), error.square().sum().reshape({1}),
                     error.abs().sum().reshape({1}), y.sum(0), y.square().sum(0), error.square().sum(0)});
}

Metrics RegressionTask::metrics(const std::vector<double>& totals) const {
  const double values = totals.at(1);
  FT_CHECK(values > 0, "the evaluation set is empty");
  Metrics metrics;
  metrics.set("loss", totals.at(0) / values);
  metrics.set("rmse", std::sqrt(totals.at(2) / values));
  metrics.set("mae", totals.at(3) / values);
  const double rows = values / static_cast<double>(outputs_);
  double r2 = 0;
  for (int64_t k = 0; k < outputs_; ++k) {
    const double sum = totals.at(4 + k), square_sum = totals.at(4 + outputs_ + k);
    const double squared_error = totals.at(4 + 2 * outputs_ + k);
    const double total = square_sum - sum * sum / rows;  // the targets' sum of squares about their mean
    // A constant target: 1 when predicted exactly, else 0 (scikit-learn's convention).
    r2 += total > 0 ? 1 - squared_error / total : (squared_error == 0 ? 1.0 : 0.0);
  }
  metrics.set("r2", r2 / static_cast<double>(outputs_));
  return metrics;
}

// ---- reconstruction ----

torch::Tensor ReconstructionTask::reconstruction(const ModelOutput& output, const Batch& batch) const {
  FT_CHECK(batch.inputs.defined() && torch::isFloatingType(batch.inputs.scalar_type()),
           "task 'reconstruction' reconstructs the batch's inputs, which must be floating point (it has: {})",
           fmt::join(batch.names(), ", "));
  check_same_shape("reconstruction", output, batch.inputs, "inputs");
  return output.tensor().to(torch::kFloat);
}

torch::Tensor ReconstructionTask::loss(const ModelOutput& output, const Batch& batch) {
  return F::mse_loss(reconstruction(output, batch), batch.inputs.to(torch::kFloat));
}

std::vector<std::string> ReconstructionTask::sum_names() const {
  return {"squared_error", "absolute_error", "values"};
}

torch::Tensor ReconstructionTask::evaluation_sums(const ModelOutput& output, const Batch& batch) {
  const torch::Tensor error =
      reconstruction(output, batch).to(torch::kDouble) - batch.inputs.to(torch::kDouble);
  return torch::cat(
      {error.square().sum().reshape({1}), error.abs().sum().reshape({1}), count_of(error, error.numel())});
}

Metrics ReconstructionTask::metrics(const std::vector<double>& totals) const {
  const double values = totals.at(2);
  FT_CHECK(values > 0, "the evaluation set is empty");
  Metrics metrics;
  metrics.set("loss", totals.at(0) / values);
  metrics.set("rmse", std::sqrt(totals.at(0) / values));
  metrics.set("mae", totals.at(1) / values);
  return metrics;
}

}  // namespace fasttrain
