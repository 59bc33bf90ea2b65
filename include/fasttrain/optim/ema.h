#pragma once
// Exponential moving average of a model's parameters and buffers.
//   ema = decay_t * ema + (1 - decay_t) * param, decay_t = min(decay, (1 + t) / (10 + t)) with warmup,
// t = the EMA updates made before this one (0 for the first). With every = N the update runs on
// every Nth call of update() and uses decay_t^N, so the averaging horizon in optimizer steps does
// not depend on N. With after_step = S the first S calls average nothing (t still counts them) and the
// average starts at the weights of the first update after them: the CPU skips those updates; the device
// count (below) runs them with decay_t = 0, which leaves the average at the weights, so a captured step
// needs no host decision and gives the same averages. Buffers (BatchNorm running stats) are copied,
// not averaged. With lookahead, each update also copies the averaged weights back into the model (Zhang et
// al.'s Lookahead with an EMA as the slow weights, as airbench trains). Create the Ema after moving the model
// to its device and dtype: the averages live next to the weights. On a GPU the update reads nothing from the
// host: decay_t comes from a count of updates kept on the device, so the update can be captured in a CUDA
// graph (record_update then counts each replay on the host). On the CPU, where that count is read for free,
// decay_t is computed on the host.
//
//   fasttrain::Ema ema(*model, fasttrain::EmaOptions(0.999));
//   ... after each optimizer step: ema.update();
//   { fasttrain::Ema::SwapGuard guard(ema); evaluate(model); }   // evaluates with the EMA weights
#include <torch/nn/module.h>

#include <cstdint>
#include <vector>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"

namespace fasttrain {

// [ema] keys (config/config.h adds ema.enabled).
struct EmaOptions {
  FT_KEYS(EmaOptions);
  EmaOptions() = default;
  explicit EmaOptions(double decay) : decay_(decay) {}
  FT_KEY(double, decay, "EMA decay per update", in_unit_interval()) = 0.999;
  FT_KEY(bool, warmup,
         "Use decay min(decay, (1 + t) / (10 + t)) so early averages are not stuck at init") = true;
  FT_KEY(int64_t, every, "Update the average every N optimizer steps (decay applied as decay^N)",
         at_least(1)) = 1;
  FT_KEY(int64_t, after_step,
         "Start averaging after this many optimizer steps, at the weights of the next, with the decay the "
         "average would have had by then (the warm-up counts every step); until then evaluations use the "
         "weights themselves. A run that evaluates late skips the updates whose weight in its average has "
         "decayed to nothing (decay^(steps between)); on a GPU those updates run with decay 0 (the same "
         "averages; the captured step replays every update)",
         at_least(0)) = 0;
  FT_KEY(bool, lookahead,
         "After each update, the model's weights become the average and training continues from there "
         "(Lookahead: airbench's form of EMA; pair with every > 1)") = false;
};

class Ema {
 public:
  // Where decay_t's count of updates lives: on the device unless every tensor is on the CPU (kByDevice),
  // or on the device wherever the model is (kDevice: what a CUDA graph replays, which tests check on the
  // CPU).
  enum class Count { kByDevice, kDevice };
  // Invalid options (decay outside [0, 1], every < 1) throw ConfigError naming ema.<key>.
  Ema(torch::nn::Module& model, EmaOptions options, Count count = Count::kByDevice);
  // Call once after each optimizer step: record_update(), and apply_update() when it is an update step.
  void update();
  // The two halves, for a CUDA graph that captures apply_update() once and replays it every step
  // (every = 1 only): the host's counters of one call, and the averaging itself on the device (with the
  // host's count, nothing until the first update after ema.after_step).
  bool record_update();  // returns whether this call is an update step
  void apply_update();
  const EmaOptions& options() const { return options_; }
  int64_t updates() const { return updates_; }
  // Whether the average has started (its first update after ema.after_step calls made); before, SwapGuard
  // leaves the weights.
  bool averaging() const { return updates_ > skipped_updates(); }
  // update() calls so far (with every = N, updates() = calls() / N).
  int64_t calls() const { return steps_; }
  // The averages, in the order of the model's parameters() then buffers().
  const std::vector<torch::Tensor>& shadow() const { return shadow_; }

  // Restores a checkpoint: averages (same order, shapes as the model's; copied to its devices)
  // and counters. An error names the first mismatch and changes nothing.
  void load_state(const std::vector<torch::Tensor>& shadow, int64_t calls, int64_t updates);

  // Swaps the model's tensors with the EMA's for the guard's lifetime; swaps back on exit. Before the
  // average has started (averaging() false) it leaves the model's weights as they are.
  // The values are copied in place, so the model's Parameters keep their identity and storage
  // (optimizer state, DDP buckets and CUDA-graph addresses stay valid). Guards do not nest, and
  // update() inside a guard is an error.
  class SwapGuard {
   public:
    explicit SwapGuard(Ema& ema);
    ~SwapGuard();
    SwapGuard(const SwapGuard&) = delete;
    SwapGuard& operator=(const SwapGuard&) = delete;

   private:
    Ema& ema_;
    bool swapped_ = false;
  };

 private:
  void swap();
  // The update slots ema.after_step covers: the average starts at update skipped_updates() + 1.
  int64_t skipped_updates() const { return options_.after_step() / options_.every(); }
  // The averaging step of apply_update: on the CPU (decay_t from the host) or on the device.
  void average_on_host();
  void average_on_device();
  std::vector<torch::Tensor> live_;    // the model's parameters then buffers
  std::vector<torch::Tensor> shadow_;  // their averages, same order
  size_t parameter_count_ = 0;
  EmaOptions options_;
  int64_t steps_ = 0;
  int64_t updates_ = 0;
  torch::Tensor device_updates_;  // updates_ on the averages' device (fp64 0-dim): decay_t's t
  bool swapped_ = false;
  bool count_on_host_ = false;  // every tensor on the CPU (and Count::kByDevice): decay_t from the host, one
                                // lerp per average, no update before after_step
};

}  // namespace fasttrain
