#pragma once
// Trainer: the training loop of fasttrain, built only on public pieces (DataLoader, Model, Task,
// optimizer, Schedule, Ema, clip_grad_norm) so it can be copied and adapted. It trains any module on
// any batch with any loss: the Model says how a batch enters the module, the Task what the loss of its
// output is and how evaluation scores it.
//
//   fasttrain::Model model(MyNet());                                // on the device it trains on
//   auto task = std::make_shared<fasttrain::RegressionTask>();
//   auto optimizer = fasttrain::make_optimizer(model.module().named_parameters(),
//                                              fasttrain::OptimizerOptions("adamw").lr(1e-3));
//   auto options = fasttrain::TrainOptions().epochs(3).precision(torch::kBFloat16).target("rmse <= 0.5");
//   auto schedule = fasttrain::make_schedule(fasttrain::ScheduleOptions("one-cycle"), 1e-3, 0.9,
//                                            fasttrain::planned_steps(options, loader.batches_per_epoch()));
//   fasttrain::Trainer trainer(model, task, std::move(optimizer), std::move(schedule), options);
//   trainer.enable_ema(fasttrain::EmaOptions(0.999));
//   trainer.add_callback(std::make_shared<fasttrain::RunLogger>("runs/mine"));
//   fasttrain::FitSummary summary = trainer.fit(train_loader, &test_loader);
//
// The trainer runs where the model's parameters are. Precision: forward and loss run under an
// AutocastGuard of options.precision(); with fp16 the loss is scaled by a GradScaler that skips steps
// whose gradients overflow (counted in skipped_steps).
//
// Steps (train/step_engine.h): eager, or captured once in a CUDA graph and replayed
// (options.cuda_graphs()). Either way a step reads nothing back to the host: the LR comes from the
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
#include "fasttrain/models/model.h"
#include "fasttrain/optim/ema.h"
#include "fasttrain/optim/lr_finder.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/precision/grad_scaler.h"
#include "fasttrain/task/task.h"
#include "fasttrain/train/options.h"
#include "fasttrain/train/phases.h"
#include "fasttrain/train/step_engine.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

class CheckpointWriter;
class FitSession;
class LossTracker;
class SafetensorsFile;

// What a log interval measured.
struct StepRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0;  // mean training loss over the interval
  double lr = 0;
  std::optional<double> grad_norm;  // last step's pre-clip global norm (measured only with clipping)
  double samples_per_s = 0;         // over the interval
  double data_wait_fraction = 0;    // of the interval's wall time
  double elapsed_s = 0;
  StepPhases phases;  // the interval's training time by phase (evaluation and checkpoints excluded)
};

struct EvalResult {
  Metrics metrics;      // the task's: loss, accuracy, rmse, bits_per_byte, ...
  int64_t samples = 0;  // what the batches count (Batch::count): images, rows, tokens that are not padding
};

struct EvalRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  EvalResult result;
  double elapsed_s = 0;
  bool ema = false;  // evaluated with the EMA weights
};

struct FitSummary {
  Metrics test;       // the run's last evaluation (none when it evaluated nothing)
  Metrics best_test;  // each metric's best value over the run's evaluations (Task::higher_is_better)
  double wall_s = 0;
  std::optional<Target> target;
  std::optional<double> time_to_target_s;  // the first crossing of the target, and its step
  std::optional<int64_t> step_at_target;
  double train_samples_per_s = 0;
  int64_t steps = 0;
  int64_t skipped_steps = 0;
  double data_wait_fraction = 0;
  // Of the target slots trained on this session, the fraction that were padding (text documents
  // batched by token count; 0 for images and windows).
  double padding_fraction = 0;
  // The most tensor bytes alive at once during this fit() (the device allocator's peak: the
  // counting CPU allocator fit() installs, or CUDA's caching allocator), and the process's peak
  // resident set (everything: LibTorch, the dataset, the loader's queue).
  int64_t peak_memory_bytes = 0;
  int64_t peak_resident_bytes = 0;
  int64_t alloc_retries = 0;  // CUDA: this fit's allocations that had to flush the cache first
  // This session's training time by phase (step_phases_s in JSON; evaluation and checkpoints excluded).
  StepPhases step_phases;
  // fit() returned early because a stop was requested (SIGINT/SIGTERM or request_stop()).
  bool interrupted = false;
  // The newest checkpoint this fit() wrote ("" = none).
  std::string checkpoint;
  // How the steps ran: "eager" or "cuda_graph" (train.cuda_graphs), and the seconds the capture took.
  std::string step_engine;
  double graph_capture_s = 0;
  // Data parallel runs: world_size, backend, zero, bytes_sent_per_step (this rank, this session),
  // optimizer_state_bytes (this rank), ddp_timings_ns (DDP's sampled backward compute and
  // communication times and their overlap). Null in one process.
  nlohmann::json dist;
  // summary.json: the metrics as test_<metric> and best_test_<metric>, the rest by field name.
  nlohmann::json to_json() const;
  // The closing statement of a run: the target reached or not (step, time), the last metrics.
  std::string describe() const;
};

// [checkpoint] keys, and where the checkpoints go.
struct RunCheckpointOptions {
  FT_KEYS(RunCheckpointOptions);
  explicit RunCheckpointOptions(std::string root = "") : root_(std::move(root)) {}
  // The directory of step-N checkpoints (a run's <run dir>/checkpoints).
  FT_ARG(std::string, root);
  FT_KEY(int64_t, every_steps,
         "Save the run state every N optimizer steps (0 = only at the end and on SIGINT/SIGTERM)",
         at_least(0), KeyTrait::kNeutral) = 0;
  FT_KEY(int, keep, "Newest checkpoints kept (>= 2: if the newest is damaged, the one before it resumes)",
         at_least(2), KeyTrait::kNeutral) = 3;
  FT_KEY(std::string, preempt_signal,
         "A signal that, like SIGINT and SIGTERM, stops the run with a checkpoint at the same step on every "
         "rank; the process then exits with 128 + the signal (USR1: 138), which a Slurm job script "
         "requeues on (sbatch --signal=USR1@90): USR1, USR2, HUP or none (fasttrain train reads it)",
         one_of({"USR1", "USR2", "HUP", "none"}), KeyTrait::kNeutral) = "USR1";
  // Stored in each checkpoint: the effective config (config.toml) and its training_fingerprint; a
  // checkpoint with another fingerprint does not load.
  FT_ARG(std::string, config_toml) = "";
  FT_ARG(std::string, fingerprint) = "";
  // The fingerprint a resumed checkpoint must carry where it is not `fingerprint` ("" = the same):
  // a resume at another world size changes data.batch_size per rank, not the training.
  FT_ARG(std::string, resumed_fingerprint) = "";
};

// Where fit() stands: with the tensors, what a checkpoint restores.
struct TrainProgress {
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;  // micro-batches of `epoch` consumed (the place in its permutation)
  int64_t window_done = 0;     // micro-batches of the current accumulation window backpropagated
  int64_t samples_seen = 0;
  double elapsed_s = 0;  // wall time of fit() so far, earlier sessions included
  double eval_s = 0;     // of which evaluation
  Metrics metrics;       // the last evaluation's
  Metrics best;          // each metric's best so far
  std::optional<double> time_to_target_s;
  std::optional<int64_t> step_at_target;
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

class Trainer : private StepFunctions {
 public:
  // `task`: the loss and metrics (task/tasks.h has the built-in ones). `schedule` may be null: a
  // constant LR, the optimizer's optim.lr. The options' rules are checked here (ConfigError).
  Trainer(Model model, std::shared_ptr<Task> task, std::unique_ptr<Optimizer> optimizer,
          std::unique_ptr<Schedule> schedule, TrainOptions options);
  ~Trainer() override;

  void enable_ema(const EmaOptions& options);
  // Trains as one rank of `group` (see the top of this file). Before fit(), load_checkpoint() and
  // any step: under ZeRO the optimizer is rebuilt over this rank's part of the parameters.
  void enable_data_parallel(std::shared_ptr<ProcessGroup> group, const DistOptions& options);
  DataParallel* data_parallel() { return parallel_.get(); }  // null without enable_data_parallel
  int world_size() const { return parallel_ ? parallel_->world_size() : 1; }
  int rank() const { return parallel_ ? parallel_->rank() : 0; }
  void add_callback(std::shared_ptr<Callback> callback);
  // [log]: the interval of on_log callbacks, in optimizer steps.
  void set_logging(const LogOptions& options);

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
  // (the loader's batches_per_epoch) must equal the checkpointed run's. A checkpoint of another
  // number of ranks (the same dist.zero, at the end of an accumulation window) is resharded: the
  // weights are whole in it, ZeRO's flat optimizer shards are joined and cut anew, and rank r takes
  // the random state of saved rank r mod N. Keeping the global batch is the caller's part
  // (train_run adjusts data.batch_size).
  void load_checkpoint(const std::string& dir, int64_t train_batches);
  // Asks fit() to stop after the micro-batch in flight, checkpoint (when enabled) and return with
  // summary.interrupted. Async-signal-safe.
  void request_stop() { stop_requested_.store(true); }
  bool stop_requested() const;
  const TrainProgress& progress() const { return progress_; }
  // Wall seconds the last save_checkpoint() took (checks, files, fsyncs, commit, prune).
  double last_checkpoint_seconds() const { return last_checkpoint_seconds_; }

  // The task's metrics on `loader`, in eval mode without gradients, with the EMA weights when EMA is
  // enabled (and, with train.eval_flip, on the mean of each image's and its mirror image's outputs);
  // one host read. The model's mode and weights are as before afterwards.
  EvalResult evaluate(DataLoader& loader);
  // A ConfigError naming train.eval_flip unless `batch` holds images it can mirror (what evaluate
  // checks; the run layer checks it before training).
  static void check_mirrorable(const Batch& batch);

  // LR range test (optim/lr_finder.h): optimizer steps on `loader` at rising LRs, then everything the
  // sweep changed put back (weights, buffers, optimizer state, EMA, the scaler, step counts, progress,
  // random generators): a fit() afterwards trains as if the sweep had not run.
  LrFinderResult find_lr(DataLoader& loader, const LrFinderOptions& options);

  // Allocator and kernel warm-up (memory.warmup): one forward and backward on `batch`, the largest
  // shape the run will see, and (single-process runs) one optimizer update; then the gradients back
  // to None and the parameters, the optimizer's state, the buffers (BatchNorm statistics) and random
  // generators as they were. Training afterwards is bit-identical to training without it, but the
  // allocator has already held the peak (CUDA's caching allocator keeps those blocks and serves the
  // smaller shapes that follow from them instead of fragmenting) and every kernel of the step, the
  // optimizer's included, has run once. With `evaluation`, one evaluation on it too, whose result is
  // dropped: its shapes' kernels and cuDNN's algorithm search (66-70 ms of the main job's first
  // evaluation on an H100) come before the clock as well. With `train` (the loader fit() will take)
  // and a captured step (train.cuda_graphs), the engine's eager warm-up steps and the capture also run
  // here, on `batch` (which then must have the training batches' shape), and everything they changed is
  // put back in the tensors the graph holds: fit() replays from its first step (41-74 ms of the main
  // job's capture on an H100 leave the clock). Only between optimizer steps.
  void warm_up(const Batch& batch, DataLoader* evaluation = nullptr, const DataLoader* train = nullptr);

  const Model& model() const { return model_; }
  Task& task() { return *task_; }
  Optimizer& optimizer() { return *optimizer_; }
  GradScaler& scaler() { return scaler_; }
  Ema* ema() { return ema_.get(); }  // null without enable_ema
  int64_t step() const { return step_; }
  const TrainOptions& options() const { return options_; }
  torch::Device device() const override { return device_; }
  // The engine fit() runs: "eager" or "cuda_graph" (set before the on_fit_start callbacks run).
  const char* engine_name() const { return engine_ ? engine_->name() : "eager"; }
  double engine_capture_seconds() const { return engine_ ? engine_->capture_seconds() : 0; }
  // The time the step functions spent in forward, backward and optimizer so far; fit()'s records
  // and summary add data wait, host-to-device copies and "other" from the loader and its clock.
  const StepPhases& phases() const { return phases_; }
  // This fit()'s training time by phase, all six, as of the last optimizer step.
  const StepPhases& fit_phases() const { return fit_phases_; }

 private:
  friend class FitSession;
  struct Snapshot;

  // ---- the step (StepFunctions): what both engines run ----
  torch::Tensor backward_micro_batch(const Batch& batch, int64_t window_size, bool ends_window) override;
  void optimizer_step(const torch::Tensor& lr, bool keep_gradients) override;
  torch::Tensor next_lr() const override;
  torch::Tensor next_lr_on_device() const override;
  void count_replayed_step() override;
  void drop_gradients() override { optimizer_->zero_grad(); }

  // The autocast forward and the task's loss (0-dim fp32, no host reads).
  torch::Tensor loss_of(const Batch& batch);
  // One optimizer step over `micro_batches` at `lr` (0-dim on the device); the window's mean loss.
  torch::Tensor train_step(const std::vector<Batch>& micro_batches, const torch::Tensor& lr);
  // Builds the LR table for a run of `total_steps` (fit() does it).
  void plan_steps(int64_t total_steps);
  // `value` averaged over the ranks (one all-reduce; `value` itself in one process).
  double mean_over_ranks(double value);
  // The tensors the optimizer steps, by the names its checkpoint uses: the model's parameters, or
  // under ZeRO this rank's parts.
  torch::OrderedDict<std::string, torch::Tensor> optimizer_parameters() const;
  // The engine options.cuda_graphs() asks for, for `loader` (an Error where a capture is blocked).
  void choose_engine(const DataLoader& loader);
  // warm_up's part for a captured step: its warm-up steps and capture on `batch`, then the state back.
  void capture_ahead(const Batch& batch, const DataLoader& train);
  // An Error when warm_up captured the step already: `what` would replace tensors the graph holds.
  void check_not_captured_ahead(const char* what) const;
  // Feeds the micro-batches of the current window to the engine; false when a stop was requested
  // inside the window (one process, eager: the gradients so far are kept for the checkpoint).
  bool feed_window(DataLoader& train, int64_t batches_per_epoch, FitSession& session);
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
  // The optimizer state `saved_world` ZeRO ranks wrote to `dir`, as this rank's part of it here.
  SafetensorsFile resharded_optimizer_state(const std::string& dir, int saved_world) const;
  // No gradients and no window loss, or those of the accumulation window a checkpoint stopped inside.
  void restore_window(const std::optional<SafetensorsFile>& window_file);

  Model model_;
  std::shared_ptr<Task> task_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Schedule> schedule_;
  TrainOptions options_;
  std::optional<Target> target_;
  torch::Device device_;
  GradScaler scaler_;  // enabled for fp16 only: bf16 has fp32's exponent range
  std::unique_ptr<Ema> ema_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<DataParallel> parallel_;
  std::vector<torch::Tensor> clip_parameters_;  // what the optimizer steps: parameters_, or ZeRO's part
  torch::Tensor last_grad_norm_;
  int64_t log_every_ = LogOptions().every_steps();
  int64_t step_ = 0;

  // ---- the step's device state ----
  std::unique_ptr<LrTable> lr_table_;
  torch::Tensor device_step_;  // 0-dim int64: step_ on the device (a captured step's LR index)
  torch::Tensor window_loss_;  // 0-dim fp32: the current window's loss so far
  std::unique_ptr<LossTracker> losses_;
  std::unique_ptr<StepEngine> engine_;
  std::optional<int64_t> engine_ready_for_;  // capture_ahead's planned steps, until fit() takes the engine

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
