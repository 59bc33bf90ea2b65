#pragma once
// The record of a run in its directory, as a Trainer callback: metrics.jsonl (one JSON object per log
// interval, evaluation and checkpoint) and TensorBoard events; the same events go to a Reporter (the
// CLI's progress bar). train_run adds one on rank 0; a library user driving a Trainer adds its own:
//
//   trainer->add_callback(std::make_shared<fasttrain::RunLogger>("runs/a", reporter));
//   trainer->fit(train_loader, &test_loader);
//
// metrics.jsonl records: {"kind": "train", step, epoch, loss, lr, grad_norm (null when nothing
// measured it: no clipping), samples_per_s, data_wait_fraction, phases_s, elapsed_s}, {"kind": "eval",
// step, epoch, test_<metric> for each metric of the task (test_loss, test_accuracy, test_rmse, ...), ema,
// elapsed_s}, {"kind": "checkpoint", step, dir, save_s}: the marker a resume truncates the file to
// (truncate_metrics). TensorBoard gets train/loss, train/lr, [train/grad_norm], train/samples_per_s,
// train/data_wait_fraction and test/<metric>.
#include <memory>
#include <string>

#include "fasttrain/log/metrics.h"
#include "fasttrain/log/reporter.h"
#include "fasttrain/log/tensorboard.h"
#include "fasttrain/train/trainer.h"

namespace fasttrain {

class RunLogger : public Callback {
 public:
  // `reporter` null: the files only. `run_dir` is made when missing; a new run (a fit from step 0)
  // refuses a directory that holds an earlier run's records (run/run_dir.h: clear_run_dir).
  RunLogger(const std::string& run_dir, std::shared_ptr<Reporter> reporter = nullptr);

  void on_fit_start(Trainer& trainer, int64_t total_steps) override;
  void on_log(Trainer& trainer, const StepRecord& record) override;
  void on_evaluate(Trainer& trainer, const EvalRecord& record) override;
  void on_checkpoint(Trainer& trainer, const std::string& dir) override;
  void on_fit_end(Trainer& trainer, const FitSummary& summary) override;

 private:
  std::string metrics_path_;
  MetricsWriter metrics_;
  TensorBoardWriter events_;
  std::shared_ptr<Reporter> reporter_;
};

// Keeps the records of `path` (a metrics.jsonl) up to the marker of checkpoint `step`: those after it
// belong to steps the resumed run repeats. Without the marker (killed between the commit and the
// marker) the records of steps before `step` and the train record of `step` are kept.
void truncate_metrics(const std::string& path, int64_t step);

}  // namespace fasttrain
