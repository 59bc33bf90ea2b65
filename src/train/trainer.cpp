#include "fasttrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "fasttrain/detail/loss_tracker.h"
#include "fasttrain/detail/tensor_guard.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/optim/clip.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/optimizer_state.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/train/guards.h"
#include "fasttrain/train/signals.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/rng.h"
#include "fit_session.h"

namespace fasttrain {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The mean of the model's outputs on a batch of images and on their mirror images (train.eval_flip):
// fp32, each output of a named forward alike.
ModelOutput forward_with_mirror(const Model& model, const Batch& batch) {
  Trainer::check_mirrorable(batch);
  Batch mirrored = batch;
  mirrored.inputs = batch.inputs.flip({3});  // [N, C, H, W] left-right
  const ModelOutput plain = model.forward(batch), flipped = model.forward(mirrored);
  auto mean = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.is_floating_point() ? (a.to(torch::kFloat) + b.to(torch::kFloat)) * 0.5 : a;
  };
  if (!plain.named()) return mean(plain.tensor(), flipped.tensor());
  std::map<std::string, torch::Tensor> named;
  for (const auto& name : plain.names()) named[name] = mean(plain.at(name), flipped.at(name));
  return named;
}

// The optimizer's state as a checkpoint holds it (each stepped parameter's fields and step count),
// copied: optimizer_state's tensors are the live ones, which the steps that follow change in place.
OptimizerStateTensors copy_of_state(const Optimizer& optimizer) {
  OptimizerStateTensors state = optimizer_state(optimizer);
  for (auto& [name, tensor] : state.tensors) tensor = tensor.clone();
  return state;
}

// Puts `state` back: each parameter's as it was, and none where it had none.
void restore_state(Optimizer& optimizer, const OptimizerStateTensors& state, const char* before_what) {
  load_optimizer_state(optimizer, SafetensorsFile(state.tensors, state.metadata, before_what));
}

// The optimizer's state put back in the tensors it holds when the guard ends, for a captured graph that
// keeps them: the values from before, and state the steps in between created as creating it gives
// (zeros, step 0; SGD's first momentum step on a zero buffer is the gradient, as on a fresh one).
class OptimizerValuesGuard {
 public:
  explicit OptimizerValuesGuard(const Optimizer& optimizer) : optimizer_(optimizer) {
    for_each_parameter([&](size_t group, size_t index) {
      std::vector<torch::Tensor> values;
      if (optimizer_.has_state(group, index)) {
        for (size_t field = 0; field < optimizer_.state_fields(group).size(); ++field)
          values.push_back(optimizer_.state(group, field, index).clone());
        const torch::Tensor& count = optimizer_.step_count(group, index);
        values.push_back(count.defined() ? count.clone() : count);
      }
      saved_.push_back(std::move(values));
    });
  }
  // Best effort while an error unwinds (a destructor must not throw): the error that stopped the steps
  // is the one to report, and the run ends with it.
  ~OptimizerValuesGuard() {
    try {
      put_back();
    } catch (const std::exception&) {
    }
  }
  OptimizerValuesGuard(const OptimizerValuesGuard&) = delete;
  OptimizerValuesGuard& operator=(const OptimizerValuesGuard&) = delete;

 private:
  void put_back() {
    torch::NoGradGuard no_grad;
    size_t at = 0;
    for_each_parameter([&](size_t group, size_t index) {
      const std::vector<torch::Tensor>& values = saved_[at++];
      if (!optimizer_.has_state(group, index)) return;
      std::vector<torch::Tensor> live;
      for (size_t field = 0; field < optimizer_.state_fields(group).size(); ++field)
        live.push_back(optimizer_.state(group, field, index));
      live.push_back(optimizer_.step_count(group, index));
      for (size_t i = 0; i < live.size(); ++i) {
        if (!live[i].defined()) continue;
        values.empty() ? live[i].zero_() : live[i].copy_(values[i]);
      }
    });
  }

  template <typename Visit>
  void for_each_parameter(Visit&& visit) const {
    for (size_t group = 0; group < optimizer_.groups().size(); ++group)
      for (size_t index = 0; index < optimizer_.groups()[group].params.size(); ++index) visit(group, index);
  }

  const Optimizer& optimizer_;
  std::vector<std::vector<torch::Tensor>> saved_;  // per parameter: fields and step count; none: no state
};

}  // namespace

nlohmann::json FitSummary::to_json() const {
  auto optional = [](const auto& value) { return value ? nlohmann::json(*value) : nlohmann::json(nullptr); };
  nlohmann::json json;
  for (const auto& [name, value] : test.items()) json["test_" + name] = value;
  for (const auto& [name, value] : best_test.items()) json["best_test_" + name] = value;
  json.update({
      {"wall_s", wall_s},
      {"target", target ? nlohmann::json(target->describe()) : nlohmann::json(nullptr)},
      {"time_to_target_s", optional(time_to_target_s)},
      {"step_at_target", optional(step_at_target)},
      {"train_samples_per_s", train_samples_per_s},
      {"steps", steps},
      {"skipped_steps", skipped_steps},
      {"data_wait_fraction", data_wait_fraction},
      {"padding_fraction", padding_fraction},
      {"peak_memory_bytes", peak_memory_bytes},
      {"peak_resident_bytes", peak_resident_bytes},
      {"step_phases_s", step_phases.to_json()},
      {"alloc_retries", alloc_retries},
      {"interrupted", interrupted},
      {"checkpoint", checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(checkpoint)},
      {"step_engine", step_engine},
      {"graph_capture_s", graph_capture_s},
      {"dist", dist},
  });
  return json;
}

std::string FitSummary::describe() const {
  std::vector<std::string> metrics;
  for (const auto& [name, value] : test.items()) metrics.push_back(fmt::format("{} {:.4g}", name, value));
  const std::string last =
      metrics.empty() ? "no evaluation" : fmt::format("test {}", fmt::join(metrics, ", "));
  std::string reached;
  if (target) {
    reached = time_to_target_s ? fmt::format("reached {} at step {} ({:.2f} s); ", target->describe(),
                                             step_at_target.value_or(steps), *time_to_target_s)
                               : fmt::format("did not reach {}; ", target->describe());
  }
  return fmt::format("{}{} after {} steps in {:.2f} s ({:.0f} samples/s)", reached, last, steps, wall_s,
                     train_samples_per_s);
}

int64_t planned_steps(const TrainOptions& options, int64_t batches_per_epoch) {
  if (options.max_steps() > 0) return options.max_steps();
  return options.epochs() * ceil_div(batches_per_epoch, options.accumulation());
}

namespace {

torch::Device device_of(const Model& model) {
  FT_CHECK(model, "the Trainer needs a model");
  const auto parameters = model.module().parameters();
  FT_CHECK(!parameters.empty(), "the model ({}) has no parameters to train", model.module().name());
  return parameters.front().device();
}

}  // namespace

Trainer::Trainer(Model model, std::shared_ptr<Task> task, std::unique_ptr<Optimizer> optimizer,
                 std::unique_ptr<Schedule> schedule, TrainOptions options)
    : model_(std::move(model)),
      task_(std::move(task)),
      optimizer_(std::move(optimizer)),
      schedule_(std::move(schedule)),
      options_(std::move(options)),
      device_(device_of(model_)),
      scaler_(GradScalerOptions().enabled(options_.precision() == torch::kHalf)),
      parameters_(model_.module().parameters()),
      clip_parameters_(parameters_),
      losses_(std::make_unique<LossTracker>(device_)) {
  check_keys(options_, "train");
  FT_CHECK(task_,
           "the Trainer needs a task: what the loss of a batch is (task/tasks.h has the built-in ones)");
  FT_CHECK(optimizer_, "the Trainer needs an optimizer (make_optimizer)");
  check_precision(options_.precision(), device_);
  target_ = options_.resolved_target();
  if (!schedule_) {
    schedule_ =
        make_schedule(ScheduleOptions("constant"), optimizer_->options().lr(), optimizer_->momentum(), 1);
  }
  const auto on_device = torch::TensorOptions().device(device_);
  device_step_ = torch::zeros({}, on_device.dtype(torch::kLong));
  window_loss_ = torch::zeros({}, on_device.dtype(torch::kFloat));
}

Trainer::~Trainer() = default;

namespace {

void check_ema_with_zero3(bool both) {
  FT_CONFIG_CHECK(!both,
                  "ema.enabled = true needs every weight on every rank after each step, and dist.zero = 3 "
                  "keeps a shard of them: use dist.zero = 2 with EMA, or turn EMA off");
}

}  // namespace

void Trainer::enable_ema(const EmaOptions& options) {
  check_not_captured_ahead("enable_ema");
  check_ema_with_zero3(parallel_ && parallel_->zero() == 3);
  ema_ = std::make_unique<Ema>(model_.module(), options);
}

void Trainer::enable_data_parallel(std::shared_ptr<ProcessGroup> group, const DistOptions& options) {
  FT_CHECK(!parallel_, "enable_data_parallel was already called");
  check_not_captured_ahead("enable_data_parallel");
  FT_CHECK(step_ == 0 && optimizer_->state_bytes() == 0,
           "enable_data_parallel must come before any optimizer step or checkpoint load");
  check_ema_with_zero3(ema_ && options.zero() == 3);
  if (options.zero() == 3) model_.require_blocks("dist.zero = 3", "dist.zero = 2");
  parallel_ = std::make_unique<DataParallel>(std::move(group), model_.module_ptr(), options);
  optimizer_ = parallel_->shard_optimizer(std::move(optimizer_));
  clip_parameters_ = optimizer_->parameters();
  scaler_.set_found_inf_reducer(parallel_->found_inf_reducer());
}

void Trainer::add_callback(std::shared_ptr<Callback> callback) {
  callbacks_.push_back(std::move(callback));
}

void Trainer::set_logging(const LogOptions& options) {
  check_keys(options, "log");
  log_every_ = options.every_steps();
}

// ---------------------------------------------------------------------------------------------
// The training step: forward, backward and the update, as both engines and find-lr run it.
// ---------------------------------------------------------------------------------------------

torch::Tensor Trainer::loss_of(const Batch& batch) {
  AutocastGuard autocast(device_, options_.precision());  // a no-op for fp32
  const ModelOutput output = model_.forward(batch);       // in the autocast dtype
  torch::Tensor loss = task_->loss(output, batch);        // no host reads
  FT_CHECK(loss.dim() == 0 && torch::isFloatingType(loss.scalar_type()),
           "task '{}' returned a loss of shape {} and type {}: a loss is one floating-point value (0-dim)",
           task_->name(), loss.sizes(), c10::toString(loss.scalar_type()));
  return loss;
}

torch::Tensor Trainer::backward_micro_batch(const Batch& batch, int64_t window_size, bool ends_window) {
  // Each micro-batch loss is divided by the window size (when it is more than 1), so the summed
  // gradients are those of the mean loss over the whole window: N micro-batches of B equal one batch of
  // N x B.
  torch::Tensor loss;
  {
    PhaseScope forward(phases_, Phase::kForward);
    if (parallel_) parallel_->before_forward(ends_window);
    loss = loss_of(batch);  // 0-dim
    // Dividing by 1 changes no bit, and cost a division and its backward node every step.
    if (window_size > 1) loss = loss / static_cast<double>(window_size);
  }
  PhaseScope backward(phases_, Phase::kBackward);
  if (parallel_) {
    parallel_->backward(scaler_.scale(loss), ends_window);  // DDP: buckets all-reduced during backward
  } else {
    scaler_.scale(loss).backward();
  }
  loss = loss.detach();
  window_loss_.add_(loss);
  return loss;
}

void Trainer::optimizer_step(const torch::Tensor& lr, bool keep_gradients) {
  PhaseScope scope(phases_, Phase::kOptimizer);
  if (auto momentum = schedule_->momentum(step_)) optimizer_->set_momentum(*momentum);

  // ---- unscale, clip, step (skipped on inf/NaN gradients), update the scale ----
  if (options_.clip_norm() > 0) {
    scaler_.unscale_(*optimizer_);  // clip the true gradients, not the scaled ones
    last_grad_norm_ = clip_grad_norm(clip_parameters_, options_.clip_norm(),
                                     parallel_ ? parallel_->grad_norm_reducer() : nullptr);
  }
  scaler_.step(*optimizer_, lr);
  scaler_.update();
  if (!keep_gradients) optimizer_->zero_grad();
  if (parallel_) parallel_->after_optimizer_step();  // ZeRO: every rank's updated part to all

  // ---- EMA of the weights, the step's loss and count ----
  if (ema_) ema_->update();
  device_step_.add_(1);
  losses_->add(window_loss_, device_step_);
  window_loss_.zero_();
  ++step_;
}

torch::Tensor Trainer::train_step(const std::vector<Batch>& micro_batches, const torch::Tensor& lr) {
  FT_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  const auto window = static_cast<int64_t>(micro_batches.size());
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(device_));
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    loss += backward_micro_batch(micro_batches[i], window, i + 1 == micro_batches.size());
  }
  optimizer_step(lr, /*keep_gradients=*/false);
  return loss;
}

void Trainer::plan_steps(int64_t total_steps) {
  lr_table_ = std::make_unique<LrTable>(*schedule_, total_steps, device_);
}

torch::Tensor Trainer::next_lr() const {
  FT_CHECK(lr_table_, "the LR table is planned by fit()");
  return lr_table_->at(step_);
}

torch::Tensor Trainer::next_lr_on_device() const {
  FT_CHECK(lr_table_, "the LR table is planned by fit()");
  return lr_table_->at(device_step_);
}

void Trainer::count_replayed_step() {
  if (ema_) ema_->record_update();
  ++step_;
}

void Trainer::warm_up(const Batch& batch, DataLoader* evaluation, const DataLoader* train) {
  check_not_captured_ahead("a second warm_up");
  for (const auto& parameter : parameters_) {
    FT_CHECK(!parameter.grad().defined(),
             "warm_up runs between optimizer steps, but gradients of an accumulation window are pending");
  }
  RngStateGuard keep_random_streams;                          // dropout draws
  TensorValuesGuard keep_buffers(model_.module().buffers());  // BatchNorm statistics
  // The window's size, so that its division (accumulation > 1) has run too; nothing communicated.
  backward_micro_batch(batch, options_.accumulation(), /*ends_window=*/false);
  window_loss_.zero_();
  // One update too, thrown away: the optimizer's kernels meet their shapes here, not in the first
  // timed step (on an H100, Muon's first Newton-Schulz matmuls took 0.06 s). Single-process runs:
  // under ZeRO the optimizer steps shards whose gradients only communication fills.
  if (!parallel_) {
    TensorValuesGuard keep_parameters(parameters_);
    const OptimizerStateTensors state = copy_of_state(*optimizer_);
    optimizer_->step(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_)));
    restore_state(*optimizer_, state, "the optimizer before the warm-up");
  }
  // And the step's loss bookkeeping, on a tracker of its own: its first kernels (isfinite, compares)
  // took 33 ms of an H100 run's first step, where everything else had run before.
  LossTracker scratch(device_);
  scratch.add(window_loss_, device_step_);
  scratch.take_sum();
  scratch.check_finite("");
  // The model's gradients, not the optimizer's: under ZeRO the optimizer steps other tensors.
  for (const auto& parameter : parameters_) parameter.mutable_grad() = torch::Tensor();
  if (evaluation) evaluate(*evaluation);  // eval mode, no gradients: nothing of the model changes
  if (train) capture_ahead(batch, *train);
}

void Trainer::check_not_captured_ahead(const char* what) const {
  FT_CHECK(!engine_ready_for_,
           "{} after warm_up captured the step (memory.warmup with train.cuda_graphs): it would replace "
           "tensors the CUDA graph holds; call it before warm_up",
           what);
}

void Trainer::capture_ahead(const Batch& batch, const DataLoader& train) {
  if (!options_.cuda_graphs()) return;
  const int64_t total_steps = planned_steps(options_, train.batches_per_epoch());
  plan_steps(total_steps);  // the graph reads this table: fit() keeps it
  choose_engine(train);
  const int64_t step = step_;
  const GradScalerState scaler = scaler_.state();
  std::vector<torch::Tensor> ema_shadow;
  if (ema_) {
    for (const auto& tensor : ema_->shadow()) ema_shadow.push_back(tensor.clone());
  }
  const int64_t ema_calls = ema_ ? ema_->calls() : 0, ema_updates = ema_ ? ema_->updates() : 0;
  {
    RngStateGuard keep_random_streams;
    TensorValuesGuard keep_parameters(parameters_);
    TensorValuesGuard keep_buffers(model_.module().buffers());
    OptimizerValuesGuard keep_optimizer(*optimizer_);
    // [accumulation] x the batch: the graph's input buffers take each window's batches from here on.
    engine_->prepare(std::vector<Batch>(static_cast<size_t>(options_.accumulation()), batch));
  }
  // The gradients stay: they are the graph's, written by each replay's first backward.
  if (ema_) ema_->load_state(ema_shadow, ema_calls, ema_updates);
  scaler_.put_back(scaler);
  step_ = step;
  device_step_.fill_(step);
  window_loss_.zero_();
  losses_->reset();
  engine_ready_for_ = total_steps;
}

double Trainer::mean_over_ranks(double value) {
  if (!parallel_) return value;
  torch::Tensor total = torch::full({1}, value, torch::kDouble);
  parallel_->all_reduce_sum(total);
  return total.item<double>() / world_size();
}

torch::OrderedDict<std::string, torch::Tensor> Trainer::optimizer_parameters() const {
  return parallel_ ? parallel_->optimizer_parameters() : model_.module().named_parameters();
}

bool Trainer::stop_requested() const {
  return stop_requested_.load() || StopSignals::received() != 0;
}

void Trainer::check_losses_finite() {
  if (scaler_.enabled()) return;  // fp16: the scaler skips overflowing steps
  losses_->check_finite(fmt::format(
      "lower optim.lr, set train.clip_norm, or check the data (no checkpoint of this state was written{})",
      last_checkpoint_.empty() ? "" : "; the last one is " + last_checkpoint_));
}

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

EvalResult Trainer::evaluate(DataLoader& loader) {
  EvalGuard eval(model_.module());
  torch::NoGradGuard no_grad;
  std::optional<Ema::SwapGuard> ema_weights;
  if (ema_) ema_weights.emplace(*ema_);

  // The task's sums stay on the device; one synchronisation at the end.
  const int64_t sums = static_cast<int64_t>(task_->sum_names().size());
  torch::Tensor totals = torch::zeros({sums}, torch::TensorOptions().device(device_).dtype(torch::kDouble));
  double samples = 0;
  loader.start_epoch(0);
  AutocastGuard autocast(device_, options_.precision());
  while (auto batch = loader.next()) {
    const ModelOutput output =
        options_.eval_flip() ? forward_with_mirror(model_, *batch) : model_.forward(*batch);
    const torch::Tensor batch_sums = task_->evaluation_sums(output, *batch);
    FT_CHECK(batch_sums.dim() == 1 && batch_sums.size(0) == sums,
             "task '{}' returned evaluation sums of shape {}, but names {} of them ({})", task_->name(),
             batch_sums.sizes(), sums, fmt::join(task_->sum_names(), ", "));
    totals += batch_sums;
    samples += static_cast<double>(batch->count);
  }
  // [the task's sums..., samples]: summed over the ranks' shards of the evaluation set.
  torch::Tensor all = torch::cat({totals.cpu(), torch::full({1}, samples, torch::kDouble)});
  if (parallel_) parallel_->all_reduce_sum(all);
  const std::vector<double> values(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  EvalResult result;
  result.samples = static_cast<int64_t>(values.back());
  FT_CHECK(result.samples > 0, "the evaluation set is empty");
  result.metrics = task_->metrics(std::vector<double>(values.begin(), values.end() - 1));
  return result;
}

void Trainer::check_mirrorable(const Batch& batch) {
  const torch::Tensor& inputs = batch.inputs;
  FT_CONFIG_CHECK(inputs.defined() && inputs.dim() == 4 && inputs.is_floating_point(),
                  "train.eval_flip = true mirrors images [N, C, H, W], but the batch's inputs are {}: set "
                  "train.eval_flip = false for this data",
                  inputs.defined() ? fmt::format("{} [{}]", c10::toString(inputs.scalar_type()),
                                                 fmt::join(inputs.sizes(), ", "))
                                   : std::string("absent"));
}

// ---- find-lr: steps at rising LRs, then everything put back ----

struct Trainer::Snapshot {
  explicit Snapshot(Trainer& trainer)
      : step(trainer.step_), progress(trainer.progress_), scaler(trainer.scaler_.state()) {
    torch::NoGradGuard no_grad;
    for (const auto& tensor : trainer.model_.module().parameters())
      weights.push_back(tensor.detach().clone());
    for (const auto& tensor : trainer.model_.module().buffers()) weights.push_back(tensor.detach().clone());
    optimizer = copy_of_state(*trainer.optimizer_);
    if (trainer.ema_) {
      for (const auto& tensor : trainer.ema_->shadow()) ema.push_back(tensor.clone());
      ema_calls = trainer.ema_->calls();
      ema_updates = trainer.ema_->updates();
    }
    for (const auto& device : generator_devices()) random.emplace_back(device, generator_state(device));
  }

  void restore(Trainer& trainer) const {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> live = trainer.model_.module().parameters();
    for (const auto& buffer : trainer.model_.module().buffers()) live.push_back(buffer);
    for (size_t i = 0; i < live.size(); ++i) live[i].copy_(weights[i]);
    trainer.optimizer_->zero_grad();
    restore_state(*trainer.optimizer_, optimizer, "the optimizer before find-lr");
    if (trainer.ema_) trainer.ema_->load_state(ema, ema_calls, ema_updates);
    if (trainer.scaler_.enabled()) trainer.scaler_.load_state(scaler);
    for (const auto& [device, state] : random) set_generator_state(device, state);
    trainer.step_ = step;
    trainer.device_step_.fill_(step);
    trainer.progress_ = progress;
    trainer.window_loss_.zero_();
    trainer.losses_->reset();
    trainer.last_grad_norm_ = torch::Tensor();
  }

  int64_t step;
  TrainProgress progress;
  GradScalerState scaler;
  std::vector<torch::Tensor> weights;  // parameters, then buffers
  OptimizerStateTensors optimizer;
  std::vector<torch::Tensor> ema;
  int64_t ema_calls = 0, ema_updates = 0;
  std::vector<std::pair<torch::Device, torch::Tensor>> random;
};

LrFinderResult Trainer::find_lr(DataLoader& loader, const LrFinderOptions& options) {
  check_not_captured_ahead("find_lr");
  const Snapshot before(*this);
  int64_t epoch = 0;
  auto step_at = [&](double lr) {
    std::vector<Batch> window;
    while (static_cast<int64_t>(window.size()) < options_.accumulation()) {
      auto batch = loader.next();
      if (!batch) {
        loader.start_epoch(++epoch);
        continue;
      }
      window.push_back(std::move(*batch));
    }
    const torch::Tensor lr_tensor =
        torch::full({}, lr, torch::TensorOptions().device(device_).dtype(torch::kDouble));
    return train_step(window, lr_tensor).item<double>();
  };
  LrFinderResult result;
  try {
    loader.start_epoch(epoch);
    result = fasttrain::find_lr(options, step_at);
  } catch (...) {
    before.restore(*this);
    throw;
  }
  before.restore(*this);
  return result;
}

// ---------------------------------------------------------------------------------------------
// fit(): the loop. The bookkeeping (clocks, metrics interval, evaluation and checkpoint schedule,
// the ranks' agreement to stop) lives in FitSession (train/fit_session.h).
// ---------------------------------------------------------------------------------------------

bool Trainer::feed_window(DataLoader& train, int64_t batches_per_epoch, FitSession& session) {
  TrainProgress& at = progress_;
  const int64_t window_start = at.batch_in_epoch - at.window_done;
  const int64_t window_size = std::min(options_.accumulation(), batches_per_epoch - window_start);
  while (at.window_done < window_size) {
    auto batch = train.next();
    FT_CHECK(batch.has_value(), "the training loader ended at batch {} of {} in epoch {}", at.batch_in_epoch,
             batches_per_epoch, at.epoch);
    session.count_batch(*batch);
    engine_->add_micro_batch(*batch, at.window_done, window_size);
    ++at.window_done, ++at.batch_in_epoch;
    for (auto& callback : callbacks_) callback->on_micro_batch(*this);
    // One process may checkpoint inside the window; ranks and captured steps stop at its end.
    const bool can_stop_here = !parallel_ && engine_->stops_inside_windows();
    if (can_stop_here && stop_requested() && at.window_done < window_size) return false;
  }
  return true;
}

FitSummary Trainer::fit(DataLoader& train, DataLoader* test) {
  // ---- plan: from the start, or from where a loaded checkpoint left off ----
  const int64_t batches_per_epoch = train.batches_per_epoch();
  FT_CHECK(batches_per_epoch > 0, "the training loader yields no batches: lower data.batch_size");
  const int64_t total_steps = planned_steps(options_, batches_per_epoch);
  if (checkpoints_ && step_ == 0) {
    const auto earlier = list_checkpoints(checkpoints_->root());
    FT_CHECK(
        earlier.empty(),
        "{} holds an earlier run's checkpoints (up to step {}): continue that run (load_checkpoint), clear "
        "the run directory first (fasttrain::clear_run_dir, what `fasttrain train --fresh` does), or "
        "choose another",
        checkpoints_->root(), earlier.empty() ? 0 : earlier.back().step);
  }
  if (engine_ready_for_ != total_steps) {  // else warm_up captured the step for this run
    plan_steps(total_steps);
    choose_engine(train);
  }
  engine_ready_for_.reset();
  device_step_.fill_(step_);
  losses_->reset();
  TrainProgress& at = progress_;
  for (auto& callback : callbacks_) callback->on_fit_start(*this, total_steps);
  FitSession session(*this, train, test, total_steps);
  StopSignals::arm();  // from here a stop signal ends the run with a checkpoint

  while (step_ < total_steps && !at.target_stop && !session.interrupted()) {
    train.start_epoch(at.epoch, at.batch_in_epoch);
    while (step_ < total_steps && at.batch_in_epoch < batches_per_epoch) {
      // ---- the accumulation window: micro-batches already prefetched to the device ----
      if (!feed_window(train, batches_per_epoch, session)) {
        session.stop_inside_window();  // checkpointed with the window's gradients
        break;
      }
      // ---- one optimizer step at the scheduled learning rate ----
      engine_->step();
      at.window_done = 0;
      session.after_step();  // on_step; metrics at log steps: the only host reads of the loss
      // ---- evaluation every eval_every_steps, checkpoints, a requested stop ----
      if (session.periodic_eval_due()) session.evaluate();
      session.checkpoint_or_stop();
      if (session.interrupted() || at.target_stop) break;
    }
    if (session.interrupted()) break;
    // ---- evaluation at the end of each epoch (unless just done or too early) and of the run ----
    if (session.epoch_end_eval_due()) session.evaluate();
    // A run that ends inside an epoch keeps its place there: a longer resume continues from it.
    if (at.batch_in_epoch < batches_per_epoch) break;
    ++at.epoch;
    at.batch_in_epoch = 0;
  }

  // ---- the final checkpoint and the summary ----
  if (!session.interrupted()) session.final_checkpoint();
  check_losses_finite();
  FitSummary summary = session.finish();
  stop_requested_.store(false);
  for (auto& callback : callbacks_) callback->on_fit_end(*this, summary);
  return summary;
}

// ---------------------------------------------------------------------------------------------
// The engine
// ---------------------------------------------------------------------------------------------

void Trainer::choose_engine(const DataLoader& loader) {
  if (!options_.cuda_graphs()) {
    engine_ = make_eager_engine(*this);
    return;
  }
  const auto blocker = capture_blocker(
      capture_facts(device_, parallel_ != nullptr, loader, options_.accumulation(), schedule_.get(),
                    *optimizer_, ema_ ? &ema_->options() : nullptr, options_.detect_anomaly()));
  FT_CONFIG_CHECK(!blocker, "train.cuda_graphs = true, but the step cannot be captured: {}",
                  blocker.value_or(""));
  engine_ = make_cuda_graph_engine(*this);
}

}  // namespace fasttrain
