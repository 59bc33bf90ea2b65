#include "fasttrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "fasttrain/memory/stats.h"
#include "fasttrain/optim/clip.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/train/guards.h"
#include "fasttrain/train/loss.h"
#include "fasttrain/train/signals.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/compat.h"
#include "fasttrain/util/rng.h"
#include "fasttrain/util/tensor_guard.h"

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
      {"padding_fraction", padding_fraction},
      {"test_loss", last_eval ? nlohmann::json(last_eval->loss) : nlohmann::json(nullptr)},
      {"test_bits_per_byte", last_eval && last_eval->bits_per_byte ? nlohmann::json(*last_eval->bits_per_byte)
                                                                   : nlohmann::json(nullptr)},
      {"peak_memory_bytes", peak_memory_bytes},
      {"peak_resident_bytes", peak_resident_bytes},
      {"step_phases_s", step_phases.to_json()},
      {"alloc_retries", alloc_retries},
      {"interrupted", interrupted},
      {"checkpoint", checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(checkpoint)},
      {"dist", dist},
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
      parameters_(model_->parameters()),
      clip_parameters_(parameters_) {
  FT_CONFIG_CHECK(options_.accumulation() >= 1, "train.accumulation must be >= 1, got {}",
                  options_.accumulation());
  FT_CONFIG_CHECK(options_.clip_norm() >= 0, "train.clip_norm must be >= 0, got {}", options_.clip_norm());
}

void Trainer::enable_ema(const EmaOptions& options) {
  ema_ = std::make_unique<Ema>(*model_, options);
}

void Trainer::enable_data_parallel(std::shared_ptr<ProcessGroup> group, const DistOptions& options) {
  FT_CHECK(!parallel_, "enable_data_parallel was already called");
  FT_CHECK(step_ == 0 && optimizer_->state().empty(),
           "enable_data_parallel must come before any optimizer step or checkpoint load");
  parallel_ = std::make_unique<DataParallel>(std::move(group), model_, options);
  optimizer_ = parallel_->shard_optimizer(std::move(optimizer_));
  clip_parameters_.clear();
  for (const auto& item : parallel_->optimizer_parameters()) clip_parameters_.push_back(item.value());
  scaler_.set_found_inf_reducer(parallel_->found_inf_reducer());
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
  return cross_entropy(logits, batch.targets, options_.label_smoothing(), batch.padded);  // no host reads
}

torch::Tensor Trainer::train_step(const std::vector<Batch>& micro_batches, double lr) {
  FT_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  const auto window = static_cast<int64_t>(micro_batches.size());
  torch::Tensor window_loss = torch::zeros({}, torch::TensorOptions().device(device_));
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    window_loss += backward_micro_batch(micro_batches[i], window, i + 1 == micro_batches.size());
  }
  optimizer_step(lr);
  return window_loss;
}

torch::Tensor Trainer::backward_micro_batch(const Batch& batch, int64_t window_size, bool ends_window) {
  // Each micro-batch loss is divided by the window size, so the summed gradients are those of
  // the mean loss over the whole window: N micro-batches of B equal one batch of N x B.
  torch::Tensor loss;
  {
    PhaseScope forward(phases_, Phase::kForward);
    if (parallel_) parallel_->before_forward(ends_window);
    loss = loss_of(batch) / static_cast<double>(window_size);  // 0-dim fp32
  }
  PhaseScope backward(phases_, Phase::kBackward);
  if (parallel_) {
    parallel_->backward(scaler_.scale(loss), ends_window);  // DDP: buckets all-reduced during backward
  } else {
    scaler_.scale(loss).backward();
  }
  return loss.detach();
}

void Trainer::optimizer_step(double lr) {
  PhaseScope scope(phases_, Phase::kOptimizer);
  set_learning_rate(*optimizer_, lr);
  if (auto momentum = schedule_ ? schedule_->momentum(step_) : std::nullopt)
    set_momentum(*optimizer_, *momentum);

  // ---- unscale, clip, step (skipped on inf/NaN gradients), update the scale, gradients to None ----
  if (options_.clip_norm() > 0) {
    scaler_.unscale_(*optimizer_);  // clip the true gradients, not the scaled ones
    last_grad_norm_ = clip_grad_norm(clip_parameters_, options_.clip_norm(),
                                     parallel_ ? parallel_->grad_norm_reducer() : nullptr);
  }
  scaler_.step(*optimizer_);
  scaler_.update();
  compat::zero_grad_to_none(*optimizer_);
  if (parallel_) parallel_->after_optimizer_step();  // ZeRO: every rank's updated part to all
  ++step_;

  // ---- EMA of the weights ----
  if (ema_) ema_->update();
}

void Trainer::warm_up(const Batch& batch) {
  for (const auto& parameter : parameters_) {
    FT_CHECK(!parameter.grad().defined(),
             "warm_up runs between optimizer steps, but gradients of an accumulation window are pending");
  }
  RngStateGuard keep_random_streams;                      // dropout draws
  TensorValuesGuard keep_buffers(model_->buffers());      // BatchNorm statistics
  backward_micro_batch(batch, 1, /*ends_window=*/false);  // nothing communicated
  // The model's gradients, not the optimizer's: under ZeRO the optimizer steps other tensors.
  for (const auto& parameter : parameters_) parameter.mutable_grad() = torch::Tensor();
}

double Trainer::mean_over_ranks(double value) {
  if (!parallel_) return value;
  torch::Tensor total = torch::full({1}, value, torch::kDouble);
  parallel_->all_reduce_sum(total);
  return total.item<double>() / world_size();
}

torch::OrderedDict<std::string, torch::Tensor> Trainer::optimizer_parameters() const {
  return parallel_ ? parallel_->optimizer_parameters() : model_->named_parameters();
}

bool Trainer::stop_requested() const {
  return stop_requested_.load() || StopSignals::received() != 0;
}

void Trainer::check_losses_finite() {
  if (unchecked_losses_.empty()) return;
  const int64_t first_step = step_ - static_cast<int64_t>(unchecked_losses_.size()) + 1;
  torch::Tensor losses = torch::stack(unchecked_losses_);  // [steps]
  unchecked_losses_.clear();
  if (scaler_.enabled()) return;  // fp16: the scaler skips overflowing steps
  torch::Tensor bad = (~torch::isfinite(losses)).nonzero();
  if (bad.size(0) == 0) return;
  const int64_t index = bad[0][0].item<int64_t>();
  FT_FAIL(
      "training loss became {} at step {}: lower optim.lr, set train.clip_norm, or check the data (no "
      "checkpoint of this state was written{})",
      losses[index].item<double>(), first_step + index,
      last_checkpoint_.empty() ? "" : "; the last one is " + last_checkpoint_);
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
  double samples = 0;
  loader.start_epoch(0);
  AutocastGuard autocast(device_, precision_);
  while (auto batch = loader.next()) {
    auto logits = model_->forward(batch->inputs).to(torch::kFloat);  // [B, classes]
    loss_sum += torch::nn::functional::cross_entropy(
        logits, batch->targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    correct += logits.argmax(1).eq(batch->targets).sum();
    samples += static_cast<double>(batch->count);  // padding targets add 0 to loss_sum and correct
  }
  // [loss sum, correct, samples]: summed over the ranks' shards of the evaluation set.
  torch::Tensor totals =
      torch::stack({loss_sum, correct.to(torch::kDouble), torch::full({}, samples, loss_sum.options())})
          .cpu();
  if (parallel_) parallel_->all_reduce_sum(totals);
  const auto total_samples = static_cast<int64_t>(totals[2].item<double>());
  FT_CHECK(total_samples > 0, "evaluation set is empty");
  EvalResult result;
  result.loss = totals[0].item<double>() / total_samples;
  result.accuracy = totals[1].item<double>() / total_samples;
  result.samples = total_samples;
  if (const double bytes = loader.source().bytes_per_target(); bytes > 0)
    result.bits_per_byte = result.loss / std::log(2.0) / bytes;
  return result;
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
  // ---- plan: from the start, or from where a loaded checkpoint left off ----
  const int64_t batches_per_epoch = train.batches_per_epoch();
  FT_CHECK(batches_per_epoch > 0, "the training loader yields no batches: lower data.batch_size");
  const int64_t total_steps = planned_steps(options_, batches_per_epoch);
  const int64_t accumulation = options_.accumulation();
  TrainProgress& at = progress_;
  for (auto& callback : callbacks_) callback->on_fit_start(*this, total_steps);

  FitSummary summary;
  const auto start = std::chrono::steady_clock::now();
  const double elapsed_before = at.elapsed_s;
  auto elapsed = [&] { return elapsed_before + seconds_since(start); };
  const double wait_at_start = train.wait_seconds();
  const double eval_s_before = at.eval_s;
  double checkpoint_s = 0;  // this session's saves: not step time
  // ---- step phases: the step functions time forward, backward and optimizer; the loader's
  // clocks give data wait and copies; "other" is the rest of the training time ----
  const StepPhases phases_at_start = phases_;
  const int64_t step_at_start = step_;
  const int64_t bytes_at_start = parallel_ ? parallel_->group().bytes_sent() : 0;
  const double copy_at_start = train.copy_seconds();
  auto session_phases = [&] {
    StepPhases session = phases_ - phases_at_start;
    session.add(Phase::kDataWait, train.wait_seconds() - wait_at_start);
    session.add(Phase::kHostToDevice, train.copy_seconds() - copy_at_start);
    const double training_s = seconds_since(start) - (at.eval_s - eval_s_before) - checkpoint_s;
    session.add(Phase::kOther, std::max(0.0, training_s - session.total()));
    return session;
  };

  if (device_.is_cpu()) track_cpu_allocations();  // LibTorch's CPU allocator keeps no statistics
  reset_peak_memory(device_);
  if (!window_loss_.defined()) window_loss_ = torch::zeros({}, torch::TensorOptions().device(device_));
  std::optional<torch::autograd::DetectAnomalyGuard> detect_anomaly;
  if (options_.detect_anomaly()) detect_anomaly.emplace();

  // Interval accounting for on_log: losses stay on the device until a log step reads them.
  torch::Tensor interval_loss = torch::zeros({}, torch::TensorOptions().device(device_));
  int64_t interval_steps = 0, interval_samples = 0;
  double target_slots = 0, real_targets = 0;  // this session's, for padding_fraction
  double interval_start = elapsed(), interval_wait_start = wait_at_start;
  StepPhases interval_phases_start;

  auto periodic_eval_due = [&] {
    return options_.eval_every_steps() > 0 && step_ >= options_.eval_from_step() &&
           step_ % options_.eval_every_steps() == 0;
  };
  auto record_eval = [&] {
    const double eval_start = elapsed();
    EvalRecord record = evaluate_and_record(*test, at.epoch, eval_start);
    at.eval_s += record.elapsed_s - eval_start;
    interval_start += record.elapsed_s - eval_start;
    summary.last_eval = record.result;
    at.test_accuracy = record.result.accuracy;
    at.best_test_accuracy = std::max(at.best_test_accuracy, record.result.accuracy);
    if (options_.target_accuracy() > 0 && !at.time_to_target_s &&
        record.result.accuracy >= options_.target_accuracy()) {
      at.time_to_target_s = record.elapsed_s;
      at.target_stop = options_.stop_at_target();
    }
  };
  auto save = [&] {
    at.elapsed_s = elapsed();
    const auto save_start = std::chrono::steady_clock::now();
    summary.checkpoint = save_checkpoint();
    checkpoint_s += seconds_since(save_start);
  };

  while (step_ < total_steps && !at.target_stop && !summary.interrupted) {
    train.start_epoch(at.epoch, at.batch_in_epoch);
    while (step_ < total_steps && at.batch_in_epoch < batches_per_epoch) {
      // ---- the accumulation window: micro-batches already prefetched to the device ----
      const int64_t window_start = at.batch_in_epoch - at.window_done;
      const int64_t window_size = std::min(accumulation, batches_per_epoch - window_start);
      while (at.window_done < window_size) {
        auto batch = train.next();
        FT_CHECK(batch.has_value(), "the training loader ended at batch {} of {} in epoch {}",
                 at.batch_in_epoch, batches_per_epoch, at.epoch);
        const int64_t samples = batch->count;
        target_slots += static_cast<double>(batch->targets.numel());
        real_targets += static_cast<double>(samples);
        window_loss_ += backward_micro_batch(*batch, window_size, at.window_done + 1 == window_size);
        ++at.window_done, ++at.batch_in_epoch;
        at.samples_seen += samples, interval_samples += samples;
        for (auto& callback : callbacks_) callback->on_micro_batch(*this);
        // One process may checkpoint inside the window; ranks stop together at a step boundary.
        if (!parallel_ && stop_requested() && at.window_done < window_size) break;
      }
      if (at.window_done < window_size) {
        summary.interrupted = true;
        if (checkpoints_) save();
        break;
      }

      // ---- one optimizer step at the scheduled learning rate ----
      const double lr = schedule_->lr(step_);
      optimizer_step(lr);
      unchecked_losses_.push_back(window_loss_);
      interval_loss += window_loss_;
      window_loss_ = torch::zeros({}, torch::TensorOptions().device(device_));
      at.window_done = 0;
      ++interval_steps;
      fit_phases_ = session_phases();
      for (auto& callback : callbacks_) callback->on_step(*this);

      // ---- metrics: the only host reads of the training loss ----
      if (step_ % log_every_ == 0 || step_ == total_steps) {
        check_losses_finite();
        const double now = elapsed();
        StepRecord record;
        record.step = step_;
        record.epoch = at.epoch;
        record.loss = mean_over_ranks(interval_loss.item<double>()) / interval_steps;
        record.lr = lr;
        record.grad_norm = last_grad_norm_.defined() ? last_grad_norm_.item<double>() : 0.0;
        const double interval_s = std::max(now - interval_start, 1e-9);
        record.samples_per_s = interval_samples * world_size() / interval_s;  // every rank's
        record.data_wait_fraction = (train.wait_seconds() - interval_wait_start) / interval_s;
        record.elapsed_s = now;
        record.phases = fit_phases_ - interval_phases_start;  // as of this step's end
        interval_phases_start = fit_phases_;
        for (auto& callback : callbacks_) callback->on_log(*this, record);
        interval_loss.zero_();
        interval_steps = interval_samples = 0;
        interval_start = now;
        interval_wait_start = train.wait_seconds();
      }

      // ---- evaluation every eval_every_steps ----
      if (test && periodic_eval_due()) record_eval();

      // ---- run state: periodic checkpoint, or a requested stop ----
      const bool checkpoint_due =
          checkpoints_ && checkpoints_->every_steps() > 0 && step_ % checkpoints_->every_steps() == 0;
      if (parallel_ ? parallel_->any(stop_requested()) : stop_requested()) summary.interrupted = true;
      if (checkpoints_ && (checkpoint_due || summary.interrupted)) save();
      if (summary.interrupted || at.target_stop) break;
    }
    if (summary.interrupted) break;
    // ---- evaluation at the end of each epoch (unless just done or too early) and of the run ----
    const bool run_ends = step_ >= total_steps;
    if (test && !at.target_stop && !periodic_eval_due() && (step_ >= options_.eval_from_step() || run_ends)) {
      record_eval();
    }
    // A run that ends inside an epoch keeps its place there: a longer resume continues from it.
    if (at.batch_in_epoch < batches_per_epoch) break;
    ++at.epoch;
    at.batch_in_epoch = 0;
  }

  // ---- the final checkpoint and the summary ----
  if (checkpoints_ && !summary.interrupted && last_checkpoint_step_ != step_) save();
  check_losses_finite();
  at.elapsed_s = elapsed();
  summary.test_accuracy = at.test_accuracy;
  summary.best_test_accuracy = at.best_test_accuracy;
  summary.time_to_target_s = at.time_to_target_s;
  summary.wall_s = at.elapsed_s;
  summary.steps = step_;
  summary.skipped_steps = scaler_.skipped_steps();
  // Throughput over the whole run, data wait over this session (the loader's clock is per process).
  // (This session's checkpoint saves are not training time either; earlier sessions' are not known.)
  summary.train_samples_per_s =
      at.samples_seen * world_size() / std::max(at.elapsed_s - at.eval_s - checkpoint_s, 1e-9);
  const double session_train_s = seconds_since(start) - (at.eval_s - eval_s_before);
  summary.data_wait_fraction = (train.wait_seconds() - wait_at_start) / std::max(session_train_s, 1e-9);
  summary.step_phases = session_phases();
  summary.padding_fraction = target_slots > 0 ? 1.0 - real_targets / target_slots : 0.0;
  const MemoryStats memory = memory_stats(device_);
  summary.peak_memory_bytes = memory.peak_allocated_bytes;
  summary.alloc_retries = memory.alloc_retries;
  summary.peak_resident_bytes = fasttrain::peak_resident_bytes();
  if (parallel_) summary.dist = parallel_->describe(*optimizer_, step_ - step_at_start, bytes_at_start);
  stop_requested_.store(false);
  for (auto& callback : callbacks_) callback->on_fit_end(*this, summary);
  return summary;
}

}  // namespace fasttrain
