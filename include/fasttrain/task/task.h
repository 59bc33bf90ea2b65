#pragma once
// Task: what a run optimises and how it is scored. The trainer asks the task for the loss of each
// batch from the model's output, and for the evaluation metrics; nothing else in the trainer knows
// what the model predicts. Built in (task/tasks.h): classification (cross-entropy with label
// smoothing; loss, accuracy), language_modeling (next-token cross-entropy; loss, accuracy, bits per
// byte), regression (MSE, L1 or Huber; loss, rmse, mae, r2) and reconstruction (an autoencoder's MSE
// on its own input; loss, rmse, mae). A task of one's own is a few lines:
//
//   class Contrastive : public fasttrain::Task {
//    public:
//     std::string name() const override { return "contrastive"; }
//     torch::Tensor loss(const fasttrain::ModelOutput& out, const fasttrain::Batch& batch) override {
//       auto logits = out.at("a").matmul(out.at("b").t()) / 0.07;               // [B, B]
//       auto labels = torch::arange(logits.size(0), logits.options().dtype(torch::kLong));
//       return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), labels);
//     }
//   };                                 // evaluation reports its mean loss; override the three below for more
//
// Metrics never read the device per batch: evaluation_sums returns sums kept on the device, which
// the trainer adds up over the evaluation set and over the ranks and reads once; metrics() turns the
// totals into values.
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/models/model.h"
#include "fasttrain/util/key.h"
#include "fasttrain/util/registry.h"

namespace fasttrain {

// Named values in the order a task lists them.
class Metrics {
 public:
  void set(const std::string& name, double value);
  bool has(const std::string& name) const;
  // The value of `name`; an Error naming the metrics there are.
  double at(const std::string& name) const;
  std::optional<double> get(const std::string& name) const;
  const std::vector<std::pair<std::string, double>>& items() const { return items_; }
  bool empty() const { return items_.empty(); }
  std::vector<std::string> names() const;

 private:
  std::vector<std::pair<std::string, double>> items_;
};

class Task {
 public:
  virtual ~Task() = default;
  // The registered name ("classification"), or the user's.
  virtual std::string name() const = 0;
  // The training loss of `batch`: 0-dim, floating point, on the batch's device, the mean over what the
  // batch counts. It must read nothing back to the host (no .item(), no nonzero): the step runs ahead of
  // the host and may be captured in a CUDA graph. A model output or batch that does not fit the task is
  // an Error naming both.
  virtual torch::Tensor loss(const ModelOutput& output, const Batch& batch) = 0;

  // ---- evaluation ----
  // The sums evaluation_sums returns, by name. Default: {"loss_sum", "count"}.
  virtual std::vector<std::string> sum_names() const;
  // One batch's sums: [sum_names().size()] float64 on the batch's device. Default: the loss times
  // batch.count, and batch.count.
  virtual torch::Tensor evaluation_sums(const ModelOutput& output, const Batch& batch);
  // The metrics from the sums' totals over the evaluation set (same order). Default: {"loss"}.
  virtual Metrics metrics(const std::vector<double>& totals) const;
  // Whether a larger `metric` is better: the best value a run reports, and a target's crossing.
  // Default: false (losses and errors).
  virtual bool higher_is_better(const std::string& metric) const;
};

// A registered task: its [task] keys with their defaults, and how it is built for data of a shape.
struct TaskRecipe {
  AnyOptions options;
  std::function<std::shared_ptr<Task>(const AnyOptions& options, const DataShape& shape)> build;
};

// The registry behind task.name, with the built-in tasks. task.name = "auto" is the data's own
// (DataShape::task), resolved when a run is built.
Registry<TaskRecipe>& task_registry();

template <typename Options>
TaskRecipe task_recipe(std::function<std::shared_ptr<Task>(const Options&, const DataShape&)> build) {
  return {AnyOptions::of(Options()), [build](const AnyOptions& options, const DataShape& shape) {
            options.check("task");
            return build(options.as<Options>(), shape);
          }};
}

// The registered task `name` with `options` (null: its defaults) for data of `shape`.
std::shared_ptr<Task> make_task(const std::string& name, const DataShape& shape,
                                const AnyOptions* options = nullptr);

}  // namespace fasttrain
