#pragma once
// Trainer: the training loop of fasttrain, built only on public pieces (DataLoader, Model,
// optimizer, Schedule, Ema, clip_grad_norm) so it can be copied and adapted.
//
//   auto schedule = fasttrain::make_schedule(schedule_options, lr, momentum,
//                                            fasttrain::planned_steps(options, loader.batches_per_epoch()));
//   fasttrain::Trainer trainer(model, std::move(optimizer), std::move(schedule), options, device);
//   trainer.enable_ema(fasttrain::EmaOptions(0.999));
//   trainer.add_callback(std::make_shared<MyCallback>());
//   fasttrain::FitSummary summary = trainer.fit(train_loader, &test_loader);
//
// Precision: forward and loss run under an AutocastGuard of train.precision; with fp16 the loss is
// scaled by a GradScaler that skips steps whose gradients overflow (counted in skipped_steps).
//
// One optimizer step = `accumulation` micro-batches (fewer at the end of an epoch), each loss divided
// by the window size, so N micro-batches of B equal one batch of N x B.
#include <torch/optim/optimizer.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "fasttrain/data/loader.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/optim/ema.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/precision/grad_scaler.h"
#include "fasttrain/train/options.h"

namespace fasttrain {

// What a log interval measured.
struct StepRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0;  // mean training loss over the interval
  double lr = 0;
  double grad_norm = 0;           // last step's pre-clip global norm (0 when clipping is off)
  double samples_per_s = 0;       // over the interval
  double data_wait_fraction = 0;  // of the interval's wall time
  double elapsed_s = 0;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
};

struct EvalRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  EvalResult result;
  double elapsed_s = 0;
  bool ema = false;  // evaluated with the EMA weights
};

struct FitSummary {
  double test_accuracy = 0;
  double best_test_accuracy = 0;
  double wall_s = 0;
  std::optional<double> time_to_target_s;
  double train_samples_per_s = 0;
  int64_t steps = 0;
  int64_t skipped_steps = 0;
  double data_wait_fraction = 0;
  int64_t peak_memory_bytes = 0;
  nlohmann::json to_json() const;
};

class Trainer;

// Hooks into fit(); all default to nothing.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_fit_start(Trainer& trainer, int64_t total_steps) { (void)trainer, (void)total_steps; }
  virtual void on_log(Trainer& trainer, const StepRecord& record) { (void)trainer, (void)record; }
  virtual void on_evaluate(Trainer& trainer, const EvalRecord& record) { (void)trainer, (void)record; }
  virtual void on_fit_end(Trainer& trainer, const FitSummary& summary) { (void)trainer, (void)summary; }
};

// Optimizer steps of a run: max_steps when set, else epochs x ceil(batches / accumulation).
int64_t planned_steps(const TrainOptions& options, int64_t batches_per_epoch);

class Trainer {
 public:
  Trainer(std::shared_ptr<Model> model, std::unique_ptr<torch::optim::Optimizer> optimizer,
          std::unique_ptr<Schedule> schedule, TrainOptions options, torch::Device device);

  void enable_ema(const EmaOptions& options);
  void add_callback(std::shared_ptr<Callback> callback);
  // The log interval of on_log callbacks, in optimizer steps.
  void set_log_every(int64_t steps);

  // Trains on `train` until the planned steps (or the target, with stop_at_target); evaluates on
  // `test` (may be null) at each epoch end and every eval_every_steps.
  FitSummary fit(DataLoader& train, DataLoader* test);

  // Mean loss and accuracy on `loader`, in eval mode without gradients, with the EMA weights when
  // EMA is enabled. The model's mode and weights are as before afterwards.
  EvalResult evaluate(DataLoader& loader);

  // One optimizer step over `micro_batches` (the accumulation window) at `lr`: forward, loss,
  // backward, clip, step, gradients to None, EMA. Returns the window's mean loss (0-dim, no sync).
  torch::Tensor train_step(const std::vector<Batch>& micro_batches, double lr);

  Model& model() { return *model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  GradScaler& scaler() { return scaler_; }
  int64_t step() const { return step_; }
  const TrainOptions& options() const { return options_; }

 private:
  torch::Tensor loss_of(const Batch& batch);
  EvalRecord evaluate_and_record(DataLoader& test, int64_t epoch, double elapsed_s);

  std::shared_ptr<Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<Schedule> schedule_;
  TrainOptions options_;
  torch::Device device_;
  torch::ScalarType precision_;  // autocast dtype; kFloat = off
  GradScaler scaler_;            // enabled for fp16 only: bf16 has fp32's exponent range
  std::unique_ptr<Ema> ema_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<torch::Tensor> parameters_;
  torch::Tensor last_grad_norm_;
  int64_t log_every_ = 50;
  int64_t step_ = 0;
};

}  // namespace fasttrain
