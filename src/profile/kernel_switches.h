#pragma once
// What the tuner and the doctor know of the switches between fasttrain's own CPU kernels and ATen's:
// the selected model's and task's `kernels` keys (the gpt's and the cnn's, classification's and
// language_modeling's; any whose options have one, without naming it) and, under muon,
// optim.muon_newton_schulz.
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"

namespace fasttrain::detail {

// One switch: its key ("model.kernels") and its value in the config ("fasttrain" or "aten").
struct KernelSwitch {
  std::string key, value;
};

// A selected component's `kernels` value, or none where its options have no such key.
template <typename Selection>
std::optional<std::string> kernels_of(const Selection& selection) {
  for (const KeyInfo& key : selection.options().keys()) {
    if (key.name != "kernels") continue;
    const std::string literal = key.write(selection.options().data());  // "\"fasttrain\""
    return literal.size() >= 2 ? literal.substr(1, literal.size() - 2) : literal;
  }
  return std::nullopt;
}

inline std::optional<std::string> model_kernels(const Config& config) {
  return kernels_of(config.model);
}

// Every kernel switch this config has.
inline std::vector<KernelSwitch> kernel_switches(const Config& config) {
  std::vector<KernelSwitch> switches;
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
