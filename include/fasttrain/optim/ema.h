#pragma once
// Exponential moving average of a model's parameters and buffers.
//   ema = decay_t * ema + (1 - decay_t) * param, decay_t = min(decay, (1 + t) / (10 + t)) with warmup.
// Buffers (BatchNorm running stats) are copied, not averaged.
//
//   fasttrain::Ema ema(*model, fasttrain::EmaOptions(0.999));
//   ... after each optimizer step: ema.update();
//   { fasttrain::Ema::SwapGuard guard(ema); evaluate(model); }   // evaluates with the EMA weights
#include <torch/nn/module.h>

#include <cstdint>
#include <vector>

#include "fasttrain/util/arg.h"

namespace fasttrain {

struct EmaOptions {
  explicit EmaOptions(double decay) : decay_(decay) {}
  FT_ARG(double, decay);
  FT_ARG(bool, warmup) = true;
  // Update every N optimizer steps (decay applied as decay^N).
  FT_ARG(int64_t, every) = 1;
};

class Ema {
 public:
  Ema(torch::nn::Module& model, EmaOptions options);
  void update();
  int64_t updates() const { return updates_; }
  const std::vector<torch::Tensor>& shadow() const { return shadow_; }

  // Swaps the model's tensors with the EMA's for the guard's lifetime; swaps back on exit.
  class SwapGuard {
   public:
    explicit SwapGuard(Ema& ema);
    ~SwapGuard();
    SwapGuard(const SwapGuard&) = delete;
    SwapGuard& operator=(const SwapGuard&) = delete;

   private:
    Ema& ema_;
  };

 private:
  void swap();
  std::vector<torch::Tensor> live_;    // the model's parameters then buffers
  std::vector<torch::Tensor> shadow_;  // their averages, same order
  size_t parameter_count_ = 0;
  EmaOptions options_;
  int64_t steps_ = 0;
  int64_t updates_ = 0;
};

}  // namespace fasttrain
