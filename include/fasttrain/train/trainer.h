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
// Steps (train/step_engine.h): eager, or captured once in a CUDA graph and replayed
// (train.cuda_graphs). Either way a step reads nothing back to the host: the LR comes from the
// schedule's table on the device, the optimizer and the GradScaler keep their counts there, and the
// loss is summed there (train/loss_tracker.h) until a log step reads it.
//
// One optimizer step = `accumulation` micro-batches (fewer at the end of an epoch), each loss divided
// by the window size, so N micro-batches of B equal one batch of N x B.
//
// Run state (enable_checkpoints): fit() writes <root>/step-N every checkpoint.every_steps steps, at
// the end, and when asked to stop (request_stop(), or SIGINT/SIGTERM under a StopSignals guard).
// A stop takes effect after the micro-batch in flight; inside an accumulation window the checkpoint
// holds the window's gradients, so no work is lost. load_checkpoint() restores everything fit()
// needs to continue bit-exactly: weights, optimizer moments, EMA, scaler, RNG, the loader position
// (epoch, batch of the epoch's permutation), the window, counters. Before a checkpoint is written
// the losses since the last check and the weights must be finite: a diverged state is never saved.
//
// Data parallel (enable_data_parallel): each rank runs fit() on its shard of the data (the
// loaders' rank and world_size) and the step calls DataParallel around forward, backward and the
// optimizer. The ranks agree on everything that decides control flow: a stop request takes effect
// at the next optimizer step on every rank (one tiny all-reduce per step), evaluation sums are
// all-reduced, and the logged loss and throughput are those of all ranks together. Checkpoints are
// written by rank 0 (with every rank's ZeRO shard and random state) into one step-N directory.
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "fasttrain/data/loader.h"
#include "fasttrain/dist/data_parallel.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/optim/ema.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/precision/grad_scaler.h"
#include "fasttrain/profile/phases.h"
#include "fasttrain/train/loss_tracker.h"
#include "fasttrain/train/options.h"
#include "fasttrain/train/step_engine.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

class CheckpointWriter;
class FitSession;
class SafetensorsFile;

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
  StepPhases phases;  // the interval's training time by phase (evaluation and checkpoints excluded)
};

struct EvalResult {
  double loss = 0;      // mean over the counted targets (images, or real tokens)
  double accuracy = 0;  // of the argmax (text: the next byte)
  int64_t samples = 0;  // targets counted: images, or tokens that are not padding
  // Text: the loss in bits per byte of raw text (loss / ln 2 / bytes per token), the
  // tokenizer-independent figure language models are compared by.
  std::optional<double> bits_per_byte;
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
  // Of the target slots trained on this session, the fraction that were padding (text documents
  // batched by token count; 0 for images and windows).
  double padding_fraction = 0;
  // This session's last evaluation (test_loss, test_bits_per_byte in JSON; null if none ran).
  std::optional<EvalResult> last_eval;
  // The most tensor bytes alive at once during this fit() (the device allocator's peak: the
  // counting CPU allocator fit() installs, or CUDA's caching allocator), and the process's peak
  // resident set (everything: LibTorch, the dataset, the loader's queue).
  int64_t peak_memory_bytes = 0;
  int64_t peak_resident_bytes = 0;
  int64_t alloc_retries = 0;  // CUDA: allocations that had to flush the cache first
  // This session's training time by phase (step_phases_s in JSON; evaluation and checkpoints excluded).
  StepPhases step_phases;
  // fit() returned early because a stop was requested (SIGINT/SIGTERM or request_stop()).
  bool interrupted = false;
  // The newest checkpoint this fit() wrote ("" = none).
  std::string checkpoint;
  // How the steps ran: "eager" or "cuda_graph" (train.cuda_graphs).
  std::string step_engine;
  // Data parallel runs: world_size, backend, zero, bytes_sent_per_step (this rank, this session),
  // optimizer_state_bytes (this rank), ddp_timings_ns (DDP's sampled backward compute and
  // communication times and their overlap). Null in one process.
  nlohmann::json dist;
  nlohmann::json to_json() const;
};

struct RunCheckpointOptions {
  explicit RunCheckpointOptions(std::string root) : root_(std::move(root)) {}
  // The directory of step-N checkpoints (a run's <run dir>/checkpoints).
  FT_ARG(std::string, root);
  // Optimizer steps between checkpoints; 0 = only at the end of fit() and on a stop.
  FT_ARG(int64_t, every_steps) = 0;
  // Newest checkpoints kept, >= 2.
  FT_ARG(int, keep) = 3;
  // Stored in each checkpoint: the effective config (config.toml) and its training_fingerprint; a
  // checkpoint with another fingerprint does not load.
  FT_ARG(std::string, config_toml) = "";
  FT_ARG(std::string, fingerprint) = "";
};

// Where fit() stands: with the tensors, what a checkpoint restores.
struct TrainProgress {
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;  // micro-batches of `epoch` consumed (the place in its permutation)
  int64_t window_done = 0;     // micro-batches of the current accumulation window backpropagated
  int64_t samples_seen = 0;
  double elapsed_s = 0;  // wall time of fit() so far, earlier sessions included
  double eval_s = 0;     // of which evaluation
  double test_accuracy = 0;
  double best_test_accuracy = 0;
  std::optional<double> time_to_target_s;
  bool target_stop = false;  // stop_at_target fired
  nlohmann::json to_json() const;
  static TrainProgress from_json(const nlohmann::json& json);
};

class Trainer;

// Hooks into fit(); all default to nothing.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_fit_start(Trainer& trainer, int64_t total_steps) { (void)trainer, (void)total_steps; }
  // After each micro-batch's backward (progress() says where in the window); no host sync.
  virtual void on_micro_batch(Trainer& trainer) { (void)trainer; }
  // After each optimizer step (step() counts it); no host sync.
  virtual void on_step(Trainer& trainer) { (void)trainer; }
  virtual void on_log(Trainer& trainer, const StepRecord& record) { (void)trainer, (void)record; }
  virtual void on_evaluate(Trainer& trainer, const EvalRecord& record) { (void)trainer, (void)record; }
  virtual void on_checkpoint(Trainer& trainer, const std::string& dir) { (void)trainer, (void)dir; }
  virtual void on_fit_end(Trainer& trainer, const FitSummary& summary) { (void)trainer, (void)summary; }
};

// Optimizer steps of a run: max_steps when set, else epochs x ceil(batches / accumulation).
int64_t planned_steps(const TrainOptions& options, int64_t batches_per_epoch);

class Trainer {
 public:
  Trainer(std::shared_ptr<Model> model, std::unique_ptr<Optimizer> optimizer, std::unique_ptr<Schedule> schedule,
          TrainOptions options, torch::Device device);
  ~Trainer();

  void enable_ema(const EmaOptions& options);
  // Trains as one rank of `group` (see the top of this file). Before fit(), load_checkpoint() and
  // any step: under ZeRO the optimizer is rebuilt over this rank's part of the parameters.
  void enable_data_parallel(std::shared_ptr<ProcessGroup> group, const DistOptions& options);
  DataParallel* data_parallel() { return parallel_.get(); }  // null without enable_data_parallel
  int world_size() const { return parallel_ ? parallel_->world_size() : 1; }
  int rank() const { return parallel_ ? parallel_->rank() : 0; }
  void add_callback(std::shared_ptr<Callback> callback);
  // The log interval of on_log callbacks, in optimizer steps.
  void set_log_every(int64_t steps);

  // Trains on `train` until the planned steps (or the target, with stop_at_target, or a stop
  // request); evaluates on `test` (may be null) at each epoch end and every eval_every_steps.
  // Continues from progress() (a loaded checkpoint).
  FitSummary fit(DataLoader& train, DataLoader* test);

  // ---- run state ----
  void enable_checkpoints(RunCheckpointOptions options);
  // Writes <root>/step-<step()> now (the losses and weights checked finite first) and prunes to
  // `keep`; returns its directory. Needs enable_checkpoints().
  std::string save_checkpoint();
  // Verifies `dir` (a step-N directory) against its manifest, then restores the run state; an error
  // names the file and what is wrong, and a failed load must not be trained on. `train_batches`
  // (the loader's batches_per_epoch) must equal the checkpointed run's.
  void load_checkpoint(const std::string& dir, int64_t train_batches);
  // Asks fit() to stop after the micro-batch in flight, checkpoint (when enabled) and return with
  // summary.interrupted. Async-signal-safe.
  void request_stop() { stop_requested_.store(true); }
  bool stop_requested() const;
  const TrainProgress& progress() const { return progress_; }
  // Wall seconds the last save_checkpoint() took (checks, files, fsyncs, commit, prune).
  double last_checkpoint_seconds() const { return last_checkpoint_seconds_; }

  // Mean loss and accuracy on `loader`, in eval mode without gradients, with the EMA weights when
  // EMA is enabled. The model's mode and weights are as before afterwards.
  EvalResult evaluate(DataLoader& loader);

  // ---- the training step: what both engines run, and find-lr ----
  // One optimizer step over `micro_batches` (the accumulation window) at learning rate `lr` (0-dim
  // on the device). Returns the window's mean loss (0-dim, no sync).
  torch::Tensor train_step(const std::vector<Batch>& micro_batches, const torch::Tensor& lr);
  // Forward, loss / window_size, scaled backward (gradients accumulate); the loss is added to the
  // window's (window_loss()). Returns the loss divided by window_size (0-dim, detached, no sync).
  // `ends_window`: data parallel runs communicate the gradients in this backward (the others of
  // the window accumulate locally, DDP's no_sync).
  torch::Tensor backward_micro_batch(const Batch& batch, int64_t window_size, bool ends_window = true);
  // Unscale, clip, the optimizer at `lr` (skipped on inf/NaN), the scale's update, gradients to None
  // unless `keep_gradients` (a captured step keeps the graph's gradient buffers), EMA, the
  // window's loss into the loss tracker; step() + 1 and the device's step counter + 1.
  void optimizer_step(const torch::Tensor& lr, bool keep_gradients = false);
  // The LR of the optimizer step that follows `step` completed steps, from the schedule's table
  // (0-dim view on the device). Before fit() the table covers `total_steps` given to plan_steps.
  torch::Tensor scheduled_lr(int64_t step) const;
  // Builds the LR table for a run of `total_steps` (fit() does it; find-lr needs none).
  void plan_steps(int64_t total_steps);
  // Allocator warm-up (memory.warmup): one forward and backward on `batch`, the largest shape the run
  // will see, then the gradients back to None and the buffers (BatchNorm statistics) and random
  // generators as they were. Training afterwards is bit-identical to training without it, but the
  // allocator has already held the peak: CUDA's caching allocator keeps those blocks and serves the
  // smaller shapes that follow from them instead of fragmenting. Only between optimizer steps.
  void warm_up(const Batch& batch);

  Model& model() { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }
  GradScaler& scaler() { return scaler_; }
  Ema* ema() { return ema_.get(); }  // null without enable_ema
  int64_t step() const { return step_; }
  const TrainOptions& options() const { return options_; }
  torch::Device device() const { return device_; }
  // The engine fit() runs ("eager" or "cuda_graph") and, where train.cuda_graphs = "auto" fell back
  // to eager, why; both are set before the on_fit_start callbacks run, which report them.
  const char* engine_name() const { return engine_ ? engine_->name() : "eager"; }
  const std::string& engine_reason() const { return engine_reason_; }
  // What decides whether this trainer's step can be captured, for `loader` (train.cuda_graphs).
  CaptureFacts capture_facts(const DataLoader& loader) const;
  // The time the step functions spent in forward, backward and optimizer so far; fit()'s records
  // and summary add data wait, host-to-device copies and "other" from the loader and its clock.
  const StepPhases& phases() const { return phases_; }
  // This fit()'s training time by phase, all six, as of the last optimizer step.
  const StepPhases& fit_phases() const { return fit_phases_; }

 private:
  friend class FitSession;
  friend class CudaGraphEngine;

  torch::Tensor loss_of(const Batch& batch);
  // `value` averaged over the ranks (one all-reduce; `value` itself in one process).
  double mean_over_ranks(double value);
  // The tensors the optimizer steps, by the names its checkpoint uses: the model's parameters, or
  // under ZeRO this rank's parts.
  torch::OrderedDict<std::string, torch::Tensor> optimizer_parameters() const;
  // The engine train.cuda_graphs asks for, for `loader`.
  void choose_engine(const DataLoader& loader);
  // Feeds the micro-batches of the current window to the engine; false when a stop was requested
  // inside the window (one process, eager: the gradients so far are kept for the checkpoint).
  bool feed_window(DataLoader& train, int64_t batches_per_epoch, FitSession& session);
  // The host's side of a step replayed by a CUDA graph: step() + 1, the EMA's counters.
  void count_replayed_step();
  // Host check of the losses since the last one (one sync): an error naming the first non-finite
  // step. With fp16 a GradScaler skips such steps instead.
  void check_losses_finite();
  // Rank 0's part of save_checkpoint: the state every rank holds alike (model, EMA, window, config,
  // state.json), then the commit and the prune. Returns the committed directory.
  std::string commit_replicated_state(CheckpointWriter& writer);
  // Checkpoint files that differ between ranks.
  bool sharded_optimizer() const;
  std::string optimizer_file_name() const;
  std::string rng_file_name() const;
  // No gradients and no window loss, or those of the accumulation window a checkpoint stopped inside.
  void restore_window(const std::optional<SafetensorsFile>& window_file);

  std::shared_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Schedule> schedule_;
  TrainOptions options_;
  torch::Device device_;
  torch::ScalarType precision_;  // autocast dtype; kFloat = off
  GradScaler scaler_;            // enabled for fp16 only: bf16 has fp32's exponent range
  std::unique_ptr<Ema> ema_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<DataParallel> parallel_;
  std::vector<torch::Tensor> clip_parameters_;  // what the optimizer steps: parameters_, or ZeRO's part
  torch::Tensor last_grad_norm_;
  int64_t log_every_ = 50;
  int64_t step_ = 0;

  // ---- the step's device state ----
  std::unique_ptr<LrTable> lr_table_;
  torch::Tensor device_step_;  // 0-dim int64: step_ on the device (a captured step's LR index)
  torch::Tensor window_loss_;  // 0-dim fp32: the current window's loss so far
  LossTracker losses_;
  std::unique_ptr<StepEngine> engine_;
  std::string engine_reason_;

  TrainProgress progress_;
  StepPhases phases_;
  StepPhases fit_phases_;
  std::optional<RunCheckpointOptions> checkpoints_;
  int64_t last_checkpoint_step_ = -1;
  std::string last_checkpoint_;
  double last_checkpoint_seconds_ = 0;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace fasttrain
