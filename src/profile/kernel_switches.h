#pragma once
// What the tuner and the doctor know of the switches between fasttrain's own kernels and ATen's: on the
// CPU the selected model's and task's `kernels` keys (the gpt's and the cnn's, classification's and
// language_modeling's; any whose options have one, without naming it) and, under muon,
// optim.muon_newton_schulz; on a GPU the model's `gpu_kernels` key (the gpt's).
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"

namespace fasttrain::detail {

// One switch: its key ("model.kernels") and its value in the config ("fasttrain" or "aten").
struct KernelSwitch {
  std::string key, value;
};

// A selected component's `kernels` (or other `name`) value, or none where its options have no such key.
template <typename Selection>
std::optional<std::string> kernels_of(const Selection& selection, const std::string& name = "kernels") {
  for (const KeyInfo& key : selection.options().keys()) {
    if (key.name != name) continue;
    const std::string literal = key.write(selection.options().data());  // "\"fasttrain\""
    return literal.size() >= 2 ? literal.substr(1, literal.size() - 2) : literal;
  }
  return std::nullopt;
}

inline std::optional<std::string> model_kernels(const Config& config) {
  return kernels_of(config.model);
}

// Every kernel switch this config has for a run on the CPU or, where `cuda`, on a GPU.
inline std::vector<KernelSwitch> kernel_switches(const Config& config, bool cuda) {
  std::vector<KernelSwitch> switches;
  if (cuda) {
    if (const auto kernels = kernels_of(config.model, "gpu_kernels"))
      switches.push_back({"model.gpu_kernels", *kernels});
    return switches;
  }
  if (const auto kernels = model_kernels(config)) switches.push_back({"model.kernels", *kernels});
  if (const auto kernels = kernels_of(config.task)) switches.push_back({"task.kernels", *kernels});
  if (config.optim.name() == "muon")
    switches.push_back({"optim.muon_newton_schulz", config.optim.muon_newton_schulz()});
  return switches;
}

// The other choice of a switch ("fasttrain" <-> "aten").
inline std::string other_kernels(const std::string& kernels) {
  return kernels == "fasttrain" ? "aten" : "fasttrain";
}

}  // namespace fasttrain::detail
