#include "fasttrain/train/step_engine.h"

#include <torch/torch.h>

#include <algorithm>

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// Each micro-batch's forward and backward as it arrives, then the update.
class EagerEngine : public StepEngine {
 public:
  explicit EagerEngine(StepFunctions& step) : step_(step) {}
  const char* name() const override { return "eager"; }
  void add_micro_batch(const Batch& batch, int64_t index, int64_t size) override {
    step_.backward_micro_batch(batch, size, /*ends_window=*/index + 1 == size);
  }
  void step() override { step_.optimizer_step(step_.next_lr(), /*keep_gradients=*/false); }
  bool stops_inside_windows() const override { return true; }

 private:
  StepFunctions& step_;
};

}  // namespace

std::optional<std::string> capture_blocker(const CaptureFacts& facts) {
  if (!facts.cuda_device) return "the model does not train on a CUDA device";
  if (!facts.cuda_build) return "this fasttrain was built against a LibTorch without CUDA";
  if (facts.distributed) return "distributed steps (DDP / ZeRO collectives) are not captured";
  if (!facts.fixed_shapes) return "the training batches change shape (token buckets, or a last short batch)";
  if (!facts.whole_windows)
    return "an epoch's batches do not split into whole accumulation windows (the last one is shorter)";
  if (facts.momentum_cycles)
    return "the schedule cycles momentum, which the fused optimizer takes from the host";
  if (!facts.fused_optimizer)
    return "the optimizer runs the foreach kernels (optim.kernel), not the fused ones";
  if (!facts.ema_every_step) return "ema.every > 1 updates the EMA on some steps only";
  if (facts.detect_anomaly) return "train.detect_anomaly checks every backward op on the host";
  return std::nullopt;
}

CaptureFacts capture_facts(const torch::Device& device, bool distributed, const DataLoader& train,
                           int64_t accumulation, const Schedule* schedule, const Optimizer& optimizer,
                           const EmaOptions* ema, bool detect_anomaly) {
  CaptureFacts facts;
  facts.cuda_device = device.is_cuda();
#ifdef FASTTRAIN_CUDA
  facts.cuda_build = true;
#endif
  facts.distributed = distributed;
  facts.fixed_shapes = train.fixed_batch_shape();
  facts.whole_windows = train.batches_per_epoch() % accumulation == 0;
  facts.momentum_cycles = schedule && schedule->momentum(0).has_value();
  facts.fused_optimizer = optimizer.fused();
  facts.ema_every_step = !ema || ema->every() == 1;  // ema.after_step: decay_t = 0 on the device until then
  facts.detect_anomaly = detect_anomaly;
  return facts;
}

std::unique_ptr<StepEngine> make_eager_engine(StepFunctions& step) {
  return std::make_unique<EagerEngine>(step);
}

#ifndef FASTTRAIN_CUDA
std::unique_ptr<StepEngine> make_cuda_graph_engine(StepFunctions& step, int warmup_steps) {
  (void)step, (void)warmup_steps;
  FT_FAIL("the CUDA-graph step needs a fasttrain built against a LibTorch with CUDA");
}
#endif

}  // namespace fasttrain
