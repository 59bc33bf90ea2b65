#include "fasttrain/util/rng.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

#include <mutex>

namespace fasttrain {

std::vector<torch::Device> generator_devices() {
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available()) {
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
      devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
    }
  }
  return devices;
}

torch::Tensor generator_state(const torch::Device& device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(const torch::Device& device, const torch::Tensor& state) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RngStateGuard::RngStateGuard() : devices_(generator_devices()) {
  for (const auto& device : devices_) states_.push_back(generator_state(device));
}

RngStateGuard::~RngStateGuard() {
  for (size_t i = 0; i < devices_.size(); ++i) set_generator_state(devices_[i], states_[i]);
}

}  // namespace fasttrain
