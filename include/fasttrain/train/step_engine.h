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
// train.cuda_graphs = "auto" captures where it applies and otherwise runs eager, saying why once;
// "true" is then an error naming the reason; "false" is eager. capture_blocker() names the reason.
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>

#include "fasttrain/data/batch_source.h"

namespace fasttrain {

class Trainer;

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
};

// What decides whether the step can be captured (see capture_blocker).
struct CaptureFacts {
  bool cuda_device = false;            // the model trains on a CUDA device
  bool cuda_build = false;             // the LibTorch (and fasttrain) were built with CUDA
  bool distributed = false;            // DDP / ZeRO over a process group
  bool fixed_shapes = true;            // every training batch has the same shape
  bool whole_windows = true;           // every epoch's batches split into full accumulation windows
  bool momentum_cycles = false;        // the schedule moves momentum / beta1 each step
  bool fused_optimizer = true;         // the optimizer steps through ATen's fused kernels
  bool ema_every_step = true;          // EMA is off or updates every step (ema.every = 1)
  bool detect_anomaly = false;         // train.detect_anomaly
};

// Why the step cannot be captured under `facts` (nullopt: it can).
std::optional<std::string> capture_blocker(const CaptureFacts& facts);

// train.cuda_graphs ("auto" | "true" | "false") for `facts`: whether to capture, and the reason
// when "auto" runs eager (empty when it captures or the setting is "false"). "true" where a
// blocker applies is a ConfigError naming it.
struct EngineChoice {
  bool capture = false;
  std::string reason;
};
EngineChoice choose_engine(const std::string& cuda_graphs, const CaptureFacts& facts);
// A ConfigError unless `cuda_graphs` is "auto", "true" or "false".
void check_cuda_graphs(const std::string& cuda_graphs);

std::unique_ptr<StepEngine> make_eager_engine(Trainer& trainer);
// The captured engine (CUDA builds only; elsewhere an Error): captures at its first window.
// `warmup_steps` eager steps run first on a side stream, as CUDA graph capture requires.
std::unique_ptr<StepEngine> make_cuda_graph_engine(Trainer& trainer, int warmup_steps = 3);

}  // namespace fasttrain
