#pragma once
// The bookkeeping of one Trainer::fit() call, so that fit() reads as the loop itself:
//   - the clock: wall time of this session (earlier sessions' added from the checkpoint), and its
//     split into the six step phases, evaluation and checkpoint saves excluded;
//   - the metrics interval: the loss (summed on the device, or on the host for the CPU, by the trainer's
//     LossTracker until a log step reads it), samples and time of each log.every_steps steps, for on_log;
//   - the evaluation schedule: every eval_every_steps from eval_from_step, at epoch ends, at the end;
//     the best metrics, the target (a metric reaching a value) and stop_at_target;
//   - the checkpoint policy: every checkpoint.every_steps, on a stop, at the end;
//   - the stop agreement: one process stops where asked; ranks agree at each step's end (one tiny
//     all-reduce), so that they stop together.
#include <chrono>
#include <optional>

#include "fasttrain/train/trainer.h"

namespace fasttrain {

class FitSession {
 public:
  FitSession(Trainer& trainer, DataLoader& train, DataLoader* test, int64_t total_steps);

  // A micro-batch of the window was fed: its samples and padding.
  void count_batch(const Batch& batch);
  // After each optimizer step: the phases so far, on_step, and at log steps the interval's record.
  void after_step();

  bool periodic_eval_due() const;
  // At an epoch's end: unless the target stopped the run, an evaluation was just done, or it is too
  // early (before eval_from_step, unless the run ends).
  bool epoch_end_eval_due() const;
  // Evaluates on the test loader, records it (on_evaluate) and the target crossing.
  void evaluate();

  // After a step: a checkpoint when one is due, or when a stop was requested (agreed by every rank),
  // which ends the run.
  void checkpoint_or_stop();
  // A stop requested inside an accumulation window: a checkpoint holds the window so far.
  void stop_inside_window();
  bool interrupted() const { return summary_.interrupted; }
  // The checkpoint at the end of a run that was not interrupted (unless this step has one).
  void final_checkpoint();

  // The summary of the session (the run's totals, this session's rates).
  FitSummary finish();

 private:
  // The last evaluation's metrics, and each one's best so far (Task::higher_is_better).
  void record_metrics(const Metrics& metrics);
  double elapsed() const;  // the run's wall time, earlier sessions included
  double seconds_since_start() const;
  // This session's training time by phase: the trainer's forward / backward / optimizer, the
  // loader's data wait and copies, and "other" for the rest.
  StepPhases session_phases() const;
  void log_interval();
  void save();

  Trainer& trainer_;
  DataLoader& train_;
  DataLoader* test_;
  int64_t total_steps_;
  TrainProgress& at_;
  FitSummary summary_;
  std::optional<torch::autograd::DetectAnomalyGuard> detect_anomaly_;

  // ---- the clock ----
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const double elapsed_before_;
  const double wait_at_start_;
  const double copy_at_start_;
  const double eval_s_before_;
  const StepPhases phases_at_start_;
  const int64_t step_at_start_;
  const int64_t bytes_at_start_;
  const int64_t retries_at_start_;  // the allocator counts over the process (a batch search's probes too)
  double checkpoint_s_ = 0;         // this session's saves: not step time

  // ---- the metrics interval ----
  int64_t interval_steps_ = 0, interval_samples_ = 0;
  double interval_start_, interval_wait_start_;
  StepPhases interval_phases_start_;
  double target_slots_ = 0, real_targets_ = 0;  // this session's, for padding_fraction
};

}  // namespace fasttrain
