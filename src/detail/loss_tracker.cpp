#include "fasttrain/detail/loss_tracker.h"

#include <torch/torch.h>

#include "fasttrain/util/check.h"

namespace fasttrain {

LossTracker::LossTracker(torch::Device device) {
  const auto on_device = torch::TensorOptions().device(device);
  sum_ = torch::zeros({}, on_device.dtype(torch::kFloat));
  first_bad_ = torch::full({}, -1, on_device.dtype(torch::kLong));
  bad_value_ = torch::zeros({}, on_device.dtype(torch::kFloat));
}

void LossTracker::add(const torch::Tensor& loss, const torch::Tensor& step) {
  torch::NoGradGuard no_grad;
  const torch::Tensor value = loss.detach().to(torch::kFloat);
  sum_.add_(value);
  // The first bad step since the last check: later ones leave it as it is.
  const torch::Tensor first = torch::logical_and(first_bad_ < 0, torch::logical_not(torch::isfinite(value)));
  bad_value_.copy_(torch::where(first, value, bad_value_));
  first_bad_.copy_(torch::where(first, step.to(torch::kLong), first_bad_));
}

double LossTracker::take_sum() {
  const double sum = sum_.item<double>();
  sum_.zero_();
  return sum;
}

void LossTracker::check_finite(const std::string& advice) {
  const int64_t step = first_bad_.item<int64_t>();
  if (step < 0) return;
  const double value = bad_value_.item<double>();
  first_bad_.fill_(-1);
  FT_FAIL("training loss became {} at step {}: {}", value, step, advice);
}

void LossTracker::reset() {
  sum_.zero_();
  first_bad_.fill_(-1);
  bad_value_.zero_();
}

}  // namespace fasttrain
