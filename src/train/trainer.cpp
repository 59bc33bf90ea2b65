#include "fasttrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "fasttrain/memory/stats.h"
#include "fasttrain/optim/clip.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/train/guards.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/compat.h"

namespace fasttrain {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

nlohmann::json FitSummary::to_json() const {
  return {
      {"test_accuracy", test_accuracy},
      {"best_test_accuracy", best_test_accuracy},
      {"wall_s", wall_s},
      {"time_to_target_s", time_to_target_s ? nlohmann::json(*time_to_target_s) : nlohmann::json(nullptr)},
      {"train_samples_per_s", train_samples_per_s},
      {"steps", steps},
      {"skipped_steps", skipped_steps},
      {"data_wait_fraction", data_wait_fraction},
      {"peak_memory_bytes", peak_memory_bytes},
  };
}

int64_t planned_steps(const TrainOptions& options, int64_t batches_per_epoch) {
  if (options.max_steps() > 0) return options.max_steps();
  return options.epochs() * ceil_div(batches_per_epoch, options.accumulation());
}

Trainer::Trainer(std::shared_ptr<Model> model, std::unique_ptr<torch::optim::Optimizer> optimizer,
                 std::unique_ptr<Schedule> schedule, TrainOptions options, torch::Device device)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      schedule_(std::move(schedule)),
      options_(std::move(options)),
      device_(device),
      precision_(parse_precision(options_.precision(), device)),
      scaler_(GradScalerOptions().enabled(precision_ == torch::kHalf)),
      parameters_(model_->parameters()) {
  FT_CONFIG_CHECK(options_.accumulation() >= 1, "train.accumulation must be >= 1, got {}",
                  options_.accumulation());
  FT_CONFIG_CHECK(options_.clip_norm() >= 0, "train.clip_norm must be >= 0, got {}", options_.clip_norm());
}

void Trainer::enable_ema(const EmaOptions& options) {
  ema_ = std::make_unique<Ema>(*model_, options);
}

void Trainer::add_callback(std::shared_ptr<Callback> callback) {
  callbacks_.push_back(std::move(callback));
}

void Trainer::set_log_every(int64_t steps) {
  FT_CONFIG_CHECK(steps >= 1, "log.every_steps must be >= 1, got {}", steps);
  log_every_ = steps;
}

torch::Tensor Trainer::loss_of(const Batch& batch) {
  AutocastGuard autocast(device_, precision_);  // a no-op for fp32
  auto logits = model_->forward(batch.inputs);  // [B, classes], in the autocast dtype
  return torch::nn::functional::cross_entropy(
      logits, batch.targets,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(options_.label_smoothing()));
}

torch::Tensor Trainer::train_step(const std::vector<Batch>& micro_batches, double lr) {
  FT_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  set_learning_rate(*optimizer_, lr);
  if (auto momentum = schedule_ ? schedule_->momentum(step_) : std::nullopt)
    set_momentum(*optimizer_, *momentum);

  // ---- forward and backward over the accumulation window ----
  // Each micro-batch loss is divided by the window size, so the summed gradients are those of
  // the mean loss over the whole window: N micro-batches of B equal one batch of N x B.
  const double window = static_cast<double>(micro_batches.size());
  torch::Tensor window_loss = torch::zeros({}, torch::TensorOptions().device(device_));
  for (const Batch& batch : micro_batches) {
    torch::Tensor loss = loss_of(batch);  // 0-dim fp32, mean over the micro-batch
    scaler_.scale(loss / window).backward();
    window_loss += loss.detach() / window;
  }

  // ---- unscale, clip, step (skipped on inf/NaN gradients), update the scale, gradients to None ----
  if (options_.clip_norm() > 0) {
    scaler_.unscale_(*optimizer_);  // clip the true gradients, not the scaled ones
    last_grad_norm_ = clip_grad_norm(parameters_, options_.clip_norm());
  }
  scaler_.step(*optimizer_);
  scaler_.update();
  compat::zero_grad_to_none(*optimizer_);
  ++step_;

  // ---- EMA of the weights ----
  if (ema_) ema_->update();
  return window_loss;
}

EvalResult Trainer::evaluate(DataLoader& loader) {
  EvalGuard eval(*model_);
  torch::NoGradGuard no_grad;
  std::optional<Ema::SwapGuard> ema_weights;
  if (ema_) ema_weights.emplace(*ema_);

  // Sums stay on the device; one synchronisation at the end.
  auto options = torch::TensorOptions().device(device_);
  torch::Tensor loss_sum = torch::zeros({}, options.dtype(torch::kDouble));
  torch::Tensor correct = torch::zeros({}, options.dtype(torch::kLong));
  int64_t samples = 0;
  loader.start_epoch(0);
  AutocastGuard autocast(device_, precision_);
  while (auto batch = loader.next()) {
    auto logits = model_->forward(batch->inputs).to(torch::kFloat);  // [B, classes]
    loss_sum += torch::nn::functional::cross_entropy(
        logits, batch->targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    correct += logits.argmax(1).eq(batch->targets).sum();
    samples += batch->targets.size(0);
  }
  FT_CHECK(samples > 0, "evaluation set is empty");
  return {loss_sum.item<double>() / samples, static_cast<double>(correct.item<int64_t>()) / samples, samples};
}

EvalRecord Trainer::evaluate_and_record(DataLoader& test, int64_t epoch, double elapsed_s) {
  EvalRecord record;
  record.step = step_;
  record.epoch = epoch;
  record.ema = ema_ != nullptr;
  auto start = std::chrono::steady_clock::now();
  record.result = evaluate(test);
  record.elapsed_s = elapsed_s + seconds_since(start);
  for (auto& callback : callbacks_) callback->on_evaluate(*this, record);
  return record;
}

FitSummary Trainer::fit(DataLoader& train, DataLoader* test) {
  // ---- plan ----
  const int64_t batches_per_epoch = train.batches_per_epoch();
  FT_CHECK(batches_per_epoch > 0, "the training loader yields no batches: lower data.batch_size");
  const int64_t total_steps = planned_steps(options_, batches_per_epoch);
  const int64_t accumulation = options_.accumulation();
  for (auto& callback : callbacks_) callback->on_fit_start(*this, total_steps);

  FitSummary summary;
  const auto start = std::chrono::steady_clock::now();
  const double wait_at_start = train.wait_seconds();
  int64_t samples_seen = 0;
  bool stop = false;

  // Interval accounting for on_log: losses stay on the device until a log step reads them.
  torch::Tensor interval_loss = torch::zeros({}, torch::TensorOptions().device(device_));
  int64_t interval_steps = 0, interval_samples = 0;
  double interval_start = 0, interval_wait_start = wait_at_start;

  auto periodic_eval_due = [&] {
    return options_.eval_every_steps() > 0 && step_ >= options_.eval_from_step() &&
           step_ % options_.eval_every_steps() == 0;
  };
  double eval_s = 0;  // evaluation time, excluded from training throughput
  auto record_eval = [&](int64_t epoch) {
    double eval_start = seconds_since(start);
    EvalRecord record = evaluate_and_record(*test, epoch, eval_start);
    eval_s += record.elapsed_s - eval_start;
    interval_start += record.elapsed_s - eval_start;
    summary.test_accuracy = record.result.accuracy;
    summary.best_test_accuracy = std::max(summary.best_test_accuracy, record.result.accuracy);
    if (options_.target_accuracy() > 0 && !summary.time_to_target_s &&
        record.result.accuracy >= options_.target_accuracy()) {
      summary.time_to_target_s = record.elapsed_s;
      stop = options_.stop_at_target();
    }
  };

  for (int64_t epoch = 0; step_ < total_steps && !stop; ++epoch) {
    train.start_epoch(epoch);
    int64_t batch_in_epoch = 0;
    while (step_ < total_steps && batch_in_epoch < batches_per_epoch && !stop) {
      // ---- the accumulation window: micro-batches already prefetched to the device ----
      std::vector<Batch> window;
      const int64_t window_size = std::min(accumulation, batches_per_epoch - batch_in_epoch);
      for (int64_t i = 0; i < window_size; ++i) {
        auto batch = train.next();
        FT_CHECK(batch.has_value(), "the training loader ended at batch {} of {} in epoch {}", batch_in_epoch,
                 batches_per_epoch, epoch);
        samples_seen += batch->targets.size(0);
        interval_samples += batch->targets.size(0);
        window.push_back(std::move(*batch));
        ++batch_in_epoch;
      }

      // ---- one optimizer step at the scheduled learning rate ----
      const double lr = schedule_->lr(step_);
      interval_loss += train_step(window, lr);
      ++interval_steps;

      // ---- metrics: the only host reads of the training loss ----
      if (step_ % log_every_ == 0 || step_ == total_steps) {
        double now = seconds_since(start);
        StepRecord record;
        record.step = step_;
        record.epoch = epoch;
        record.loss = interval_loss.item<double>() / interval_steps;
        FT_CHECK(
            std::isfinite(record.loss),
            "training loss became {} between steps {} and {}: lower optim.lr, set train.clip_norm, or check "
            "the data",
            record.loss, step_ - interval_steps + 1, step_);
        record.lr = lr;
        record.grad_norm = last_grad_norm_.defined() ? last_grad_norm_.item<double>() : 0.0;
        double interval_s = std::max(now - interval_start, 1e-9);
        record.samples_per_s = interval_samples / interval_s;
        record.data_wait_fraction = (train.wait_seconds() - interval_wait_start) / interval_s;
        record.elapsed_s = now;
        for (auto& callback : callbacks_) callback->on_log(*this, record);
        interval_loss.zero_();
        interval_steps = interval_samples = 0;
        interval_start = now;
        interval_wait_start = train.wait_seconds();
      }

      // ---- evaluation every eval_every_steps ----
      if (test && periodic_eval_due()) record_eval(epoch);
    }
    // ---- evaluation at the end of each epoch (unless just done or too early) and of the run ----
    bool run_ends = step_ >= total_steps;
    if (test && !stop && !periodic_eval_due() && (step_ >= options_.eval_from_step() || run_ends)) {
      record_eval(epoch);
    }
  }

  // ---- summary ----
  summary.wall_s = seconds_since(start);
  summary.steps = step_;
  summary.skipped_steps = scaler_.skipped_steps();
  const double train_s = std::max(summary.wall_s - eval_s, 1e-9);
  summary.train_samples_per_s = samples_seen / train_s;
  summary.data_wait_fraction = (train.wait_seconds() - wait_at_start) / train_s;
  summary.peak_memory_bytes = peak_resident_bytes();
  for (auto& callback : callbacks_) callback->on_fit_end(*this, summary);
  return summary;
}

}  // namespace fasttrain
