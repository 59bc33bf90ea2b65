#include "fasttrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "fasttrain/memory/stats.h"
#include "fasttrain/optim/clip.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/train/guards.h"
#include "fasttrain/train/loss.h"
#include "fasttrain/train/signals.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/rng.h"
#include "fasttrain/util/tensor_guard.h"
#include "fit_session.h"

namespace fasttrain {

namespace {

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
      {"step_engine", step_engine},
      {"dist", dist},
  };
}

int64_t planned_steps(const TrainOptions& options, int64_t batches_per_epoch) {
  if (options.max_steps() > 0) return options.max_steps();
  return options.epochs() * ceil_div(batches_per_epoch, options.accumulation());
}

Trainer::Trainer(std::shared_ptr<Model> model, std::unique_ptr<Optimizer> optimizer,
                 std::unique_ptr<Schedule> schedule, TrainOptions options, torch::Device device)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      schedule_(std::move(schedule)),
      options_(std::move(options)),
      device_(device),
      precision_(parse_precision(options_.precision(), device)),
      scaler_(GradScalerOptions().enabled(precision_ == torch::kHalf)),
      parameters_(model_->parameters()),
      clip_parameters_(parameters_),
      losses_(device) {
  FT_CONFIG_CHECK(options_.accumulation() >= 1, "train.accumulation must be >= 1, got {}",
                  options_.accumulation());
  FT_CONFIG_CHECK(options_.clip_norm() >= 0, "train.clip_norm must be >= 0, got {}", options_.clip_norm());
  check_cuda_graphs(options_.cuda_graphs());
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
  check_ema_with_zero3(parallel_ && parallel_->zero() == 3);
  ema_ = std::make_unique<Ema>(*model_, options);
}

void Trainer::enable_data_parallel(std::shared_ptr<ProcessGroup> group, const DistOptions& options) {
  FT_CHECK(!parallel_, "enable_data_parallel was already called");
  FT_CHECK(step_ == 0 && optimizer_->state_bytes() == 0,
           "enable_data_parallel must come before any optimizer step or checkpoint load");
  check_ema_with_zero3(ema_ && options.zero() == 3);
  parallel_ = std::make_unique<DataParallel>(std::move(group), model_, options);
  optimizer_ = parallel_->shard_optimizer(std::move(optimizer_));
  clip_parameters_ = optimizer_->parameters();
  scaler_.set_found_inf_reducer(parallel_->found_inf_reducer());
}

void Trainer::add_callback(std::shared_ptr<Callback> callback) {
  callbacks_.push_back(std::move(callback));
}

void Trainer::set_log_every(int64_t steps) {
  FT_CONFIG_CHECK(steps >= 1, "log.every_steps must be >= 1, got {}", steps);
  log_every_ = steps;
}

// ---------------------------------------------------------------------------------------------
// The training step: forward, backward and the update, as both engines and find-lr run it.
// ---------------------------------------------------------------------------------------------

torch::Tensor Trainer::loss_of(const Batch& batch) {
  AutocastGuard autocast(device_, precision_);  // a no-op for fp32
  auto logits = model_->forward(batch.inputs);  // [B, classes], in the autocast dtype
  return cross_entropy(logits, batch.targets, options_.label_smoothing(), batch.padded);  // no host reads
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
  loss = loss.detach();
  window_loss_.add_(loss);
  return loss;
}

void Trainer::optimizer_step(const torch::Tensor& lr, bool keep_gradients) {
  PhaseScope scope(phases_, Phase::kOptimizer);
  if (auto momentum = schedule_ ? schedule_->momentum(step_) : std::nullopt)
    optimizer_->set_momentum(*momentum);

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
  losses_.add(window_loss_, device_step_);
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
  optimizer_step(lr);
  return loss;
}

void Trainer::plan_steps(int64_t total_steps) {
  FT_CHECK(schedule_, "the trainer has no schedule to plan the LR of its steps");
  lr_table_ = std::make_unique<LrTable>(*schedule_, total_steps, device_);
}

torch::Tensor Trainer::scheduled_lr(int64_t step) const {
  FT_CHECK(lr_table_, "scheduled_lr before plan_steps (fit() plans its steps)");
  return lr_table_->at(step);
}

void Trainer::count_replayed_step() {
  if (ema_) ema_->record_update();
  ++step_;
}

void Trainer::warm_up(const Batch& batch) {
  for (const auto& parameter : parameters_) {
    FT_CHECK(!parameter.grad().defined(),
             "warm_up runs between optimizer steps, but gradients of an accumulation window are pending");
  }
  RngStateGuard keep_random_streams;                      // dropout draws
  TensorValuesGuard keep_buffers(model_->buffers());      // BatchNorm statistics
  backward_micro_batch(batch, 1, /*ends_window=*/false);  // nothing communicated
  window_loss_.zero_();
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
  if (scaler_.enabled()) return;  // fp16: the scaler skips overflowing steps
  losses_.check_finite(fmt::format(
      "lower optim.lr, set train.clip_norm, or check the data (no checkpoint of this state was written{})",
      last_checkpoint_.empty() ? "" : "; the last one is " + last_checkpoint_));
}

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

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
  plan_steps(total_steps);
  choose_engine(train);
  device_step_.fill_(step_);
  losses_.reset();
  TrainProgress& at = progress_;
  for (auto& callback : callbacks_) callback->on_fit_start(*this, total_steps);
  FitSession session(*this, train, test, total_steps);

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

CaptureFacts Trainer::capture_facts(const DataLoader& loader) const {
  CaptureFacts facts;
  facts.cuda_device = device_.is_cuda();
#ifdef FASTTRAIN_CUDA
  facts.cuda_build = true;
#endif
  facts.distributed = parallel_ != nullptr;
  facts.fixed_shapes = loader.fixed_batch_shape();
  facts.whole_windows = loader.batches_per_epoch() % options_.accumulation() == 0;
  facts.momentum_cycles = schedule_ && schedule_->momentum(0).has_value();
  facts.fused_optimizer = optimizer_->fused();
  facts.ema_every_step = !ema_ || ema_->options().every() == 1;
  facts.detect_anomaly = options_.detect_anomaly();
  return facts;
}

void Trainer::choose_engine(const DataLoader& loader) {
  const EngineChoice choice = fasttrain::choose_engine(options_.cuda_graphs(), capture_facts(loader));
  engine_reason_ = choice.reason;
  engine_ = choice.capture ? make_cuda_graph_engine(*this) : make_eager_engine(*this);
}

}  // namespace fasttrain
