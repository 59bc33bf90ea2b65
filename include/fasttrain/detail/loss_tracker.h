#pragma once
// The training loss, kept on the device: every optimizer step adds its window's loss to a running
// sum and remembers the first step whose loss was not finite, without a host read, so that it can
// run inside a captured CUDA graph. The host reads it at log steps (the interval's mean) and before
// checkpoints (a diverged state is never saved). On the CPU, where reading a value costs no
// synchronisation, the same bookkeeping runs on the host: no operators in the step (a dozen on the
// device, each dispatched).
//
//   fasttrain::LossTracker losses(device);
//   losses.add(window_loss, step_counter);   // in the step: 0-dim loss, 0-dim int64 step number
//   double sum = losses.take_sum();          // at a log step: one read, the sum restarts at 0
//   losses.check_finite(...);                // an Error naming the first non-finite step
#include <torch/types.h>

#include <string>

namespace fasttrain {

class LossTracker {
 public:
  enum class Bookkeeping { kHost, kDevice };
  // Bookkeeping on the host for the CPU, else on the device; tests pick each.
  explicit LossTracker(torch::Device device);
  LossTracker(torch::Device device, Bookkeeping bookkeeping);
  // Adds the window's loss (0-dim) of step `step` (0-dim int64, the step's number), on the device.
  void add(const torch::Tensor& loss, const torch::Tensor& step);
  // The sum of the losses added since the last call (one host read), then 0.
  double take_sum();
  // Whether any loss added since the last check was inf/NaN (one host read): if so, an Error naming
  // the first such step and its value, with `advice` appended; the check then starts over.
  void check_finite(const std::string& advice);
  // Forgets everything (a resumed run starts its interval and checks afresh).
  void reset();

 private:
  bool on_host_;
  // On the device:
  torch::Tensor sum_;        // 0-dim fp32
  torch::Tensor first_bad_;  // 0-dim int64: the first non-finite step since the last check, or -1
  torch::Tensor bad_value_;  // 0-dim fp32: its loss
  // On the host, the same three (the sum in fp32 too, as the device adds it):
  float host_sum_ = 0.f;
  int64_t host_first_bad_ = -1;
  float host_bad_value_ = 0.f;
};

}  // namespace fasttrain
