#pragma once
// How Trainer::fit runs each optimizer step: one interface, two engines.
//
//   eager       every micro-batch's forward and backward as it arrives, then the update
//               (Trainer::backward_micro_batch and Trainer::optimizer_step), launched op by op.
//   cuda_graph  the whole step of a fixed shape (every micro-batch's forward and backward, unscale,
//               clip, the optimizer, the scale's update, EMA, the loss bookkeeping) captured once in
//               a CUDA graph after a warm-up on a side stream, then replayed: between replays the
//               loop only copies the next batches into the graph's input buffers and keeps host-side
//               counts. The LR comes from the schedule's table on the device (optim/schedule.h
//               LrTable) at a step counter kept there, the optimizer's step counts and the
//               GradScaler's flag stay on the device (optim/optimizer.h), so nothing in the step
//               reads the host.
//
// TrainOptions::cuda_graphs chooses; where a blocker applies, capturing is an Error naming it
// (capture_blocker). train.cuda_graphs = "auto" (the run layer) captures where nothing blocks.
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/data/loader.h"
#include "fasttrain/optim/ema.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/optim/schedule.h"

namespace fasttrain {

// What an engine runs: the trainer's step, in the pieces a captured step needs (the Trainer
// implements it; nothing else needs it).
class StepFunctions {
 public:
  virtual ~StepFunctions() = default;
  virtual torch::Device device() const = 0;
  // Forward, the task's loss / window_size, scaled backward (gradients accumulate); the window's loss
  // adds it. `ends_window`: data parallel runs communicate the gradients in this backward.
  virtual torch::Tensor backward_micro_batch(const Batch& batch, int64_t window_size, bool ends_window) = 0;
  // Unscale, clip, the optimizer at `lr` (skipped on inf/NaN), the scale's update, gradients to None
  // unless `keep_gradients` (a captured step keeps the graph's buffers), EMA, the window's loss into the
  // loss tracker; the host's and the device's step counts + 1.
  virtual void optimizer_step(const torch::Tensor& lr, bool keep_gradients) = 0;
  // The LR of the next step from the schedule's table on the device: at the host's step count (a view),
  // or at the device's step counter (an index kernel a graph can capture).
  virtual torch::Tensor next_lr() const = 0;
  virtual torch::Tensor next_lr_on_device() const = 0;
  // The host's side of a step a graph replayed: the step count, the EMA's counters.
  virtual void count_replayed_step() = 0;
  // Every gradient to None (before a capture allocates them in the graph's memory pool).
  virtual void drop_gradients() = 0;
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  // "eager" or "cuda_graph".
  virtual const char* name() const = 0;
  // Micro-batch `index` (0-based) of an accumulation window of `size`: eager runs its forward and
  // backward now (the gradients accumulate); cuda_graph stages it in the graph's input buffers.
  virtual void add_micro_batch(const Batch& batch, int64_t index, int64_t size) = 0;
  // Ends the window with the optimizer step; the trainer's step() counts it.
  virtual void step() = 0;
  // Whether a stop may take effect between the micro-batches of a window (a checkpoint then holds
  // the gradients so far); otherwise stops wait for the window's end.
  virtual bool stops_inside_windows() const = 0;
  // Host seconds spent capturing the step (recording and instantiating the graph; 0 for eager): a
  // one-off cost inside the first timed steps, or before the clock when prepare() ran it.
  virtual double capture_seconds() const { return 0; }
  // Runs now, on `window` (one window's micro-batches, of the training batches' shape), the steps that
  // would otherwise come first in fit(): the captured engine's eager warm-up steps and the capture, so
  // that fit() replays from its first step. They train: the caller puts back, in place, every tensor
  // they changed (Trainer::warm_up). The eager engine has nothing to run ahead.
  virtual void prepare(const std::vector<Batch>& window) { (void)window; }
};

// What decides whether the step can be captured (see capture_blocker).
struct CaptureFacts {
  bool cuda_device = false;      // the model trains on a CUDA device
  bool cuda_build = false;       // the LibTorch (and fasttrain) were built with CUDA
  bool distributed = false;      // DDP / ZeRO over a process group
  bool fixed_shapes = true;      // every training batch has the same shape
  bool whole_windows = true;     // every epoch's batches split into full accumulation windows
  bool momentum_cycles = false;  // the schedule moves momentum / beta1 each step
  bool fused_optimizer = true;   // the optimizer steps through ATen's fused kernels
  bool ema_every_step = true;    // EMA is off or updates every step (ema.every = 1)
  bool detect_anomaly = false;   // train.detect_anomaly
};

// Why the step cannot be captured under `facts` (nullopt: it can).
std::optional<std::string> capture_blocker(const CaptureFacts& facts);

// The facts of a trainer's pieces: `ema` is the EMA's options (null without EMA).
CaptureFacts capture_facts(const torch::Device& device, bool distributed, const DataLoader& train,
                           int64_t accumulation, const Schedule* schedule, const Optimizer& optimizer,
                           const EmaOptions* ema, bool detect_anomaly);

std::unique_ptr<StepEngine> make_eager_engine(StepFunctions& step);
// The captured engine (CUDA builds only; elsewhere an Error): captures at its first window.
// `warmup_steps` eager steps run first on a side stream, as CUDA graph capture requires.
std::unique_ptr<StepEngine> make_cuda_graph_engine(StepFunctions& step, int warmup_steps = 3);

}  // namespace fasttrain
