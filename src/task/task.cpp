#include "fasttrain/task/task.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "fasttrain/task/tasks.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

// ---- Metrics ----

void Metrics::set(const std::string& name, double value) {
  for (auto& item : items_) {
    if (item.first == name) {
      item.second = value;
      return;
    }
  }
  items_.emplace_back(name, value);
}

bool Metrics::has(const std::string& name) const {
  return get(name).has_value();
}

std::optional<double> Metrics::get(const std::string& name) const {
  for (const auto& item : items_) {
    if (item.first == name) return item.second;
  }
  return std::nullopt;
}

double Metrics::at(const std::string& name) const {
  const auto value = get(name);
  FT_CHECK(value.has_value(), "no metric '{}'; the task reports: {}", name, fmt::join(names(), ", "));
  return *value;
}

std::vector<std::string> Metrics::names() const {
  std::vector<std::string> result;
  for (const auto& item : items_) result.push_back(item.first);
  return result;
}

// ---- Task: a mean loss, unless the task says more ----

std::vector<std::string> Task::sum_names() const {
  return {"loss_sum", "count"};
}

torch::Tensor Task::evaluation_sums(const ModelOutput& output, const Batch& batch) {
  const torch::Tensor mean = loss(output, batch).to(torch::kDouble);
  const double count = static_cast<double>(batch.count);
  return torch::stack({mean * count, torch::full({}, count, mean.options())});
}

Metrics Task::metrics(const std::vector<double>& totals) const {
  Metrics metrics;
  metrics.set("loss", totals.at(0) / std::max(totals.at(1), 1.0));
  return metrics;
}

bool Task::higher_is_better(const std::string&) const {
  return false;
}

// ---- the registry ----

Registry<TaskRecipe>& task_registry() {
  static Registry<TaskRecipe> registry = [] {
    Registry<TaskRecipe> tasks("task.name");
    tasks.add(
        "classification", "class ids from logits: cross-entropy with label smoothing; loss, accuracy",
        task_recipe<ClassificationOptions>([](const ClassificationOptions& options, const DataShape& shape) {
          return std::make_shared<ClassificationTask>(options, shape.classes);
        }));
    tasks.add(
        "language_modeling", "next-token cross-entropy over sequences; loss, accuracy, bits per byte",
        task_recipe<ClassificationOptions>([](const ClassificationOptions& options, const DataShape& shape) {
          return std::make_shared<LanguageModelTask>(options, shape.bytes_per_target, shape.classes);
        }));
    tasks.add("regression", "values: MSE, L1 or Huber loss; loss, rmse, mae, r2",
              task_recipe<RegressionOptions>([](const RegressionOptions& options, const DataShape& shape) {
                int64_t outputs = 1;
                for (int64_t size : shape.target) outputs *= size;
                return std::make_shared<RegressionTask>(options, outputs);
              }));
    tasks.add("reconstruction", "an autoencoder's MSE on its own input; loss, rmse, mae",
              task_recipe<NoOptions>(
                  [](const NoOptions&, const DataShape&) { return std::make_shared<ReconstructionTask>(); }));
    return tasks;
  }();
  return registry;
}

std::shared_ptr<Task> make_task(const std::string& name, const DataShape& shape, const AnyOptions* options) {
  const TaskRecipe& recipe = task_registry().at(name);
  return recipe.build(options ? *options : recipe.options, shape);
}

}  // namespace fasttrain
