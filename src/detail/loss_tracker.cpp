#include "fasttrain/detail/loss_tracker.h"

#include <torch/torch.h>

#include <cmath>
#include <utility>

#include "fasttrain/util/check.h"

namespace fasttrain {

LossTracker::LossTracker(torch::Device device)
    : LossTracker(device, device.is_cpu() ? Bookkeeping::kHost : Bookkeeping::kDevice) {}

LossTracker::LossTracker(torch::Device device, Bookkeeping bookkeeping)
    : on_host_(bookkeeping == Bookkeeping::kHost) {
  FT_CHECK(!on_host_ || device.is_cpu(), "LossTracker: host bookkeeping reads the losses, which live on {}",
           device.str());
  if (on_host_) return;
  const auto on_device = torch::TensorOptions().device(device);
  sum_ = torch::zeros({}, on_device.dtype(torch::kFloat));
  first_bad_ = torch::full({}, -1, on_device.dtype(torch::kLong));
  bad_value_ = torch::zeros({}, on_device.dtype(torch::kFloat));
}

void LossTracker::add(const torch::Tensor& loss, const torch::Tensor& step) {
  torch::NoGradGuard no_grad;
  const torch::Tensor value = loss.detach().to(torch::kFloat);
  if (on_host_) {
    // Read through the pointer: item() would be an operator, and one the doctor counts as a host read.
    const float v = *value.contiguous().data_ptr<float>();
    host_sum_ += v;
    if (host_first_bad_ < 0 && !std::isfinite(v)) {
      host_first_bad_ = *step.to(torch::kLong).contiguous().data_ptr<int64_t>();
      host_bad_value_ = v;
    }
    return;
  }
  sum_.add_(value);
  // The first bad step since the last check: later ones leave it as it is.
  const torch::Tensor first = torch::logical_and(first_bad_ < 0, torch::logical_not(torch::isfinite(value)));
  bad_value_.copy_(torch::where(first, value, bad_value_));
  first_bad_.copy_(torch::where(first, step.to(torch::kLong), first_bad_));
}

double LossTracker::take_sum() {
  if (on_host_) return std::exchange(host_sum_, 0.f);
  const double sum = sum_.item<double>();
  sum_.zero_();
  return sum;
}

void LossTracker::check_finite(const std::string& advice) {
  const int64_t step = on_host_ ? host_first_bad_ : first_bad_.item<int64_t>();
  if (step < 0) return;
  const double value = on_host_ ? host_bad_value_ : bad_value_.item<double>();
  if (on_host_) {
    host_first_bad_ = -1;
  } else {
    first_bad_.fill_(-1);
  }
  FT_FAIL("training loss became {} at step {}: {}", value, step, advice);
}

void LossTracker::reset() {
  if (on_host_) {
    host_sum_ = 0.f;
    host_first_bad_ = -1;
    host_bad_value_ = 0.f;
    return;
  }
  sum_.zero_();
  first_bad_.fill_(-1);
  bad_value_.zero_();
}

}  // namespace fasttrain
