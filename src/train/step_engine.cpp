#include "fasttrain/train/step_engine.h"

#include <torch/torch.h>

#include <algorithm>

#include "fasttrain/train/trainer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// Each micro-batch's forward and backward as it arrives, then the update.
class EagerEngine : public StepEngine {
 public:
  explicit EagerEngine(Trainer& trainer) : trainer_(trainer) {}
  const char* name() const override { return "eager"; }
  void add_micro_batch(const Batch& batch, int64_t index, int64_t size) override {
    trainer_.backward_micro_batch(batch, size, /*ends_window=*/index + 1 == size);
  }
  void step() override { trainer_.optimizer_step(trainer_.scheduled_lr(trainer_.step())); }
  bool stops_inside_windows() const override { return true; }

 private:
  Trainer& trainer_;
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

void check_cuda_graphs(const std::string& cuda_graphs) {
  static const std::vector<std::string> values = {"auto", "true", "false"};
  FT_CONFIG_CHECK(std::find(values.begin(), values.end(), cuda_graphs) != values.end(),
                  "train.cuda_graphs '{}' is not allowed; valid: auto, true, false", cuda_graphs);
}

EngineChoice choose_engine(const std::string& cuda_graphs, const CaptureFacts& facts) {
  check_cuda_graphs(cuda_graphs);
  if (cuda_graphs == "false") return {};
  const auto blocker = capture_blocker(facts);
  FT_CONFIG_CHECK(cuda_graphs != "true" || !blocker,
                  "train.cuda_graphs = true, but the step cannot be captured: {}", blocker.value_or(""));
  if (blocker) return {false, *blocker};
  return {true, ""};
}

std::unique_ptr<StepEngine> make_eager_engine(Trainer& trainer) {
  return std::make_unique<EagerEngine>(trainer);
}

#ifndef FASTTRAIN_CUDA
std::unique_ptr<StepEngine> make_cuda_graph_engine(Trainer& trainer, int warmup_steps) {
  (void)trainer, (void)warmup_steps;
  FT_FAIL("the CUDA-graph step needs a fasttrain built against a LibTorch with CUDA");
}
#endif

}  // namespace fasttrain
