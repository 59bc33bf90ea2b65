#include "fit_session.h"

#include <torch/torch.h>

#include <algorithm>

#include "fasttrain/detail/loss_tracker.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

FitSession::FitSession(Trainer& trainer, DataLoader& train, DataLoader* test, int64_t total_steps)
    : trainer_(trainer),
      train_(train),
      test_(test),
      total_steps_(total_steps),
      at_(trainer.progress_),
      elapsed_before_(trainer.progress_.elapsed_s),
      wait_at_start_(train.wait_seconds()),
      copy_at_start_(train.copy_seconds()),
      eval_s_before_(trainer.progress_.eval_s),
      phases_at_start_(trainer.phases_),
      step_at_start_(trainer.step_),
      bytes_at_start_(trainer.parallel_ ? trainer.parallel_->group().bytes_sent() : 0),
      retries_at_start_(memory_stats(trainer.device_).alloc_retries),
      interval_start_(elapsed_before_),
      interval_wait_start_(wait_at_start_) {
  const torch::Device device = trainer.device_;
  if (device.is_cpu()) track_cpu_allocations();  // LibTorch's CPU allocator keeps no statistics
  reset_peak_memory(device);
  if (trainer.options_.detect_anomaly()) detect_anomaly_.emplace();
  summary_.step_engine = trainer.engine_name();
}

double FitSession::seconds_since_start() const {
  return seconds_since(start_);
}

double FitSession::elapsed() const {
  return elapsed_before_ + seconds_since_start();
}

StepPhases FitSession::session_phases() const {
  StepPhases session = trainer_.phases_ - phases_at_start_;
  session.add(Phase::kDataWait, train_.wait_seconds() - wait_at_start_);
  session.add(Phase::kHostToDevice, train_.copy_seconds() - copy_at_start_);
  const double training_s = seconds_since_start() - (at_.eval_s - eval_s_before_) - checkpoint_s_;
  session.add(Phase::kOther, std::max(0.0, training_s - session.total()));
  return session;
}

void FitSession::count_batch(const Batch& batch) {
  target_slots_ += static_cast<double>(batch.targets.numel());
  real_targets_ += static_cast<double>(batch.count);
  at_.samples_seen += batch.count;
  interval_samples_ += batch.count;
}

void FitSession::after_step() {
  ++interval_steps_;
  trainer_.fit_phases_ = session_phases();
  for (auto& callback : trainer_.callbacks_) callback->on_step(trainer_);
  const int64_t step = trainer_.step_;
  if (step % trainer_.log_every_ == 0 || step == total_steps_) log_interval();
}

void FitSession::log_interval() {
  trainer_.check_losses_finite();
  const double now = elapsed();
  StepRecord record;
  record.step = trainer_.step_;
  record.epoch = at_.epoch;
  record.loss = trainer_.mean_over_ranks(trainer_.losses_->take_sum()) / interval_steps_;
  record.lr = trainer_.schedule_->lr(trainer_.step_ - 1);
  if (trainer_.last_grad_norm_.defined()) record.grad_norm = trainer_.last_grad_norm_.item<double>();
  const double interval_s = std::max(now - interval_start_, 1e-9);
  record.samples_per_s = interval_samples_ * trainer_.world_size() / interval_s;  // every rank's
  record.data_wait_fraction = (train_.wait_seconds() - interval_wait_start_) / interval_s;
  record.elapsed_s = now;
  record.phases = trainer_.fit_phases_ - interval_phases_start_;  // as of this step's end
  interval_phases_start_ = trainer_.fit_phases_;
  for (auto& callback : trainer_.callbacks_) callback->on_log(trainer_, record);
  interval_steps_ = interval_samples_ = 0;
  interval_start_ = now;
  interval_wait_start_ = train_.wait_seconds();
}

// ---- evaluation ----

bool FitSession::periodic_eval_due() const {
  const TrainOptions& o = trainer_.options_;
  const int64_t step = trainer_.step_;
  return test_ && o.eval_every_steps() > 0 && step >= o.eval_from_step() && step % o.eval_every_steps() == 0;
}

bool FitSession::epoch_end_eval_due() const {
  const bool run_ends = trainer_.step_ >= total_steps_;
  return test_ && !at_.target_stop && !periodic_eval_due() &&
         (trainer_.step_ >= trainer_.options_.eval_from_step() || run_ends);
}

void FitSession::evaluate() {
  const double eval_start = elapsed();
  EvalRecord record;
  record.step = trainer_.step_;
  record.epoch = at_.epoch;
  record.ema = trainer_.ema_ != nullptr && trainer_.ema_->averaging();
  record.result = trainer_.evaluate(*test_);
  record.elapsed_s = elapsed();
  for (auto& callback : trainer_.callbacks_) callback->on_evaluate(trainer_, record);
  const double eval_s = record.elapsed_s - eval_start;
  at_.eval_s += eval_s;
  interval_start_ += eval_s;  // the interval's rates are of training time
  record_metrics(record.result.metrics);
  const std::optional<Target>& target = trainer_.target_;
  if (!target || at_.time_to_target_s) return;
  const std::optional<double> value = record.result.metrics.get(target->metric);
  FT_CHECK(value.has_value(), "train.target is {}, but task '{}' reports no metric '{}'; it reports: {}",
           target->describe(), trainer_.task_->name(), target->metric,
           fmt::join(record.result.metrics.names(), ", "));
  if (target->reached(*value)) {
    at_.time_to_target_s = record.elapsed_s;
    at_.step_at_target = trainer_.step_;
    at_.target_stop = trainer_.options_.stop_at_target();
  }
}

void FitSession::record_metrics(const Metrics& metrics) {
  at_.metrics = metrics;
  for (const auto& [name, value] : metrics.items()) {
    const std::optional<double> best = at_.best.get(name);
    const bool better = trainer_.task_->higher_is_better(name) ? value > best.value_or(value - 1)
                                                               : value < best.value_or(value + 1);
    if (!best || better) at_.best.set(name, value);
  }
}

// ---- checkpoints and stops ----

void FitSession::save() {
  if (!trainer_.checkpoints_) return;
  at_.elapsed_s = elapsed();
  const auto save_start = std::chrono::steady_clock::now();
  summary_.checkpoint = trainer_.save_checkpoint();
  checkpoint_s_ += seconds_since(save_start);
}

void FitSession::checkpoint_or_stop() {
  const auto& checkpoints = trainer_.checkpoints_;
  const bool due =
      checkpoints && checkpoints->every_steps() > 0 && trainer_.step_ % checkpoints->every_steps() == 0;
  DataParallel* parallel = trainer_.parallel_.get();
  // Every rank learns of any rank's stop request: they stop together, at this step.
  if (parallel ? parallel->any(trainer_.stop_requested()) : trainer_.stop_requested())
    summary_.interrupted = true;
  if (due || summary_.interrupted) save();
}

void FitSession::stop_inside_window() {
  summary_.interrupted = true;
  save();
}

void FitSession::final_checkpoint() {
  if (trainer_.checkpoints_ && trainer_.last_checkpoint_step_ != trainer_.step_) save();
}

FitSummary FitSession::finish() {
  at_.elapsed_s = elapsed();
  summary_.test = at_.metrics;
  summary_.best_test = at_.best;
  summary_.target = trainer_.target_;
  summary_.time_to_target_s = at_.time_to_target_s;
  summary_.step_at_target = at_.step_at_target;
  summary_.wall_s = at_.elapsed_s;
  summary_.steps = trainer_.step_;
  summary_.skipped_steps = trainer_.scaler_.skipped_steps();
  // Throughput over the whole run, data wait over this session (the loader's clock is per process).
  // (This session's checkpoint saves are not training time either; earlier sessions' are not known.)
  summary_.train_samples_per_s =
      at_.samples_seen * trainer_.world_size() / std::max(at_.elapsed_s - at_.eval_s - checkpoint_s_, 1e-9);
  const double session_train_s = seconds_since_start() - (at_.eval_s - eval_s_before_);
  summary_.data_wait_fraction = (train_.wait_seconds() - wait_at_start_) / std::max(session_train_s, 1e-9);
  summary_.step_phases = session_phases();
  summary_.padding_fraction = target_slots_ > 0 ? 1.0 - real_targets_ / target_slots_ : 0.0;
  const MemoryStats memory = memory_stats(trainer_.device_);
  summary_.peak_memory_bytes = memory.peak_allocated_bytes;
  summary_.alloc_retries = memory.alloc_retries - retries_at_start_;
  summary_.graph_capture_s = trainer_.engine_capture_seconds();
  summary_.peak_resident_bytes = fasttrain::peak_resident_bytes();
  if (trainer_.parallel_) {
    summary_.dist =
        trainer_.parallel_->describe(*trainer_.optimizer_, trainer_.step_ - step_at_start_, bytes_at_start_);
  }
  return summary_;
}

}  // namespace fasttrain
