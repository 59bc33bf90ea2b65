#include "fasttrain/optim/ema.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

Ema::Ema(torch::nn::Module& model, EmaOptions options, Count count) : options_(std::move(options)) {
  check_keys(options_, "ema");
  torch::NoGradGuard no_grad;
  for (const auto& p : model.parameters()) live_.push_back(p);
  parameter_count_ = live_.size();
  for (const auto& b : model.buffers()) live_.push_back(b);
  shadow_.reserve(live_.size());
  for (const auto& t : live_) shadow_.push_back(t.detach().clone());
  const torch::Device device = live_.empty() ? torch::Device(torch::kCPU) : live_.front().device();
  device_updates_ = torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kDouble));
  count_on_host_ =
      count == Count::kByDevice &&
      std::all_of(live_.begin(), live_.end(), [](const torch::Tensor& t) { return t.device().is_cpu(); });
}

void Ema::update() {
  if (record_update()) apply_update();
}

bool Ema::record_update() {
  FT_CHECK(!swapped_, "Ema::update() inside an Ema::SwapGuard would average the EMA weights into themselves");
  ++steps_;
  if (steps_ % options_.every() != 0) return false;
  ++updates_;  // counted through ema.after_step too: decay_t's t runs from the first step
  return true;
}

void Ema::apply_update() {
  if (count_on_host_ && !averaging()) return;  // the device count runs these updates with decay_t = 0
  for (size_t i = 0; i < live_.size(); ++i) {
    FT_CHECK(live_[i].device() == shadow_[i].device() && live_[i].scalar_type() == shadow_[i].scalar_type() &&
                 live_[i].sizes() == shadow_[i].sizes(),
             "EMA tensor {} changed from {} {} {} to {} {} {} after the Ema was made; create the Ema after "
             "moving the model to its device and dtype",
             i, shadow_[i].device().str(), c10::toString(shadow_[i].scalar_type()), shadow_[i].sizes(),
             live_[i].device().str(), c10::toString(live_[i].scalar_type()), live_[i].sizes());
  }
  torch::NoGradGuard no_grad;
  if (count_on_host_) {
    if (options_.after_step() > 0 && updates_ == skipped_updates() + 1) {
      // The first update after ema.after_step: the average starts at the weights, t at the updates skipped.
      for (size_t i = 0; i < parameter_count_; ++i) shadow_[i].copy_(live_[i]);
      device_updates_.fill_(static_cast<double>(updates_ - 1));
    }
    average_on_host();
  } else {
    average_on_device();
  }
  if (options_.lookahead()) {
    for (size_t i = 0; i < parameter_count_; ++i) live_[i].copy_(shadow_[i]);
  }
  for (size_t i = parameter_count_; i < live_.size(); ++i) shadow_[i].copy_(live_[i]);
  device_updates_.add_(1);
}

// average = decay_t average + (1 - decay_t) parameter, decay_t in double on the device, as the host would
// compute it, then in the weights' dtype: nothing read on the host, so a CUDA graph can capture it. Up to
// and including the first update after ema.after_step, decay_t = 0: the average is the weights, where the
// host's count starts it.
void Ema::average_on_device() {
  if (parameter_count_ == 0) return;
  torch::Tensor decay = torch::full({}, options_.decay(), device_updates_.options());
  if (options_.warmup()) decay = torch::minimum(decay, (1 + device_updates_) / (10 + device_updates_));
  if (options_.after_step() > 0) {
    const auto zeroed_through = static_cast<double>(skipped_updates());
    decay = torch::where(device_updates_ <= zeroed_through, torch::zeros_like(decay), decay);
  }
  decay = decay.pow(static_cast<double>(options_.every()));
  const auto parameters = torch::TensorList(live_).slice(0, parameter_count_);
  const auto averages = torch::TensorList(shadow_).slice(0, parameter_count_);
  const auto dtype = averages.front().scalar_type();
  // One multi-tensor op per term instead of a kernel launch per parameter.
  compat::foreach_mul_(averages, decay.to(dtype));
  torch::_foreach_add_(averages, compat::foreach_mul(parameters, (1 - decay).to(dtype)));
}

// On the CPU the count is read without a synchronisation, so decay_t is computed on the host and each
// average takes one lerp: the device path's dozen small operators (decay_t as tensors, a multiply, a
// product and an add per parameter) cost the main job 0.27 ms a step, 4.5% of it.
void Ema::average_on_host() {
  const double t = device_updates_.item<double>();
  double decay = options_.decay();
  if (options_.warmup()) decay = std::min(decay, (1 + t) / (10 + t));
  decay = std::pow(decay, static_cast<double>(options_.every()));
  for (size_t i = 0; i < parameter_count_; ++i) shadow_[i].lerp_(live_[i], 1 - decay);
}

void Ema::load_state(const std::vector<torch::Tensor>& shadow, int64_t calls, int64_t updates) {
  FT_CHECK(!swapped_, "Ema::load_state() inside an Ema::SwapGuard");
  FT_CHECK(shadow.size() == shadow_.size(), "EMA state has {} tensors, the model {}", shadow.size(),
           shadow_.size());
  FT_CHECK(calls >= 0 && updates >= 0 && updates <= calls,
           "EMA counters are inconsistent: {} updates in {} calls", updates, calls);
  for (size_t i = 0; i < shadow.size(); ++i) {
    FT_CHECK(shadow[i].sizes() == shadow_[i].sizes(), "EMA tensor {} has shape {}, the model's {}", i,
             shadow[i].sizes(), shadow_[i].sizes());
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < shadow.size(); ++i) shadow_[i].copy_(shadow[i]);
  steps_ = calls;
  updates_ = updates;
  device_updates_.fill_(static_cast<double>(updates));
}

void Ema::swap() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < live_.size(); ++i) {
    // Copy values rather than swap storages: the model's tensors keep their addresses.
    torch::Tensor model_values = live_[i].clone();
    live_[i].copy_(shadow_[i]);
    shadow_[i].copy_(model_values);
  }
}

Ema::SwapGuard::SwapGuard(Ema& ema) : ema_(ema) {
  FT_CHECK(!ema_.swapped_,
           "Ema::SwapGuard inside another SwapGuard of the same Ema would swap the weights back");
  if (!ema_.averaging()) return;
  ema_.swap();
  ema_.swapped_ = swapped_ = true;
}

Ema::SwapGuard::~SwapGuard() {
  if (!swapped_) return;
  ema_.swap();
  ema_.swapped_ = false;
}

}  // namespace fasttrain
