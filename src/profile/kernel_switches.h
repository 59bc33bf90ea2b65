#pragma once
// What the tuner and the doctor know of the switches between fasttrain's own CPU kernels and ATen's:
// the selected model's `kernels` key (the gpt's and the cnn's; any model whose options have one, without
// naming the model) and, under muon, optim.muon_newton_schulz.
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"

namespace fasttrain::detail {

// One switch: its key ("model.kernels") and its value in the config ("fasttrain" or "aten").
struct KernelSwitch {
  std::string key, value;
};

// The selected model's `kernels` value, or none where its options have no such key.
inline std::optional<std::string> model_kernels(const Config& config) {
  for (const KeyInfo& key : config.model.options().keys()) {
    if (key.name != "kernels") continue;
    const std::string literal = key.write(config.model.options().data());  // "\"fasttrain\""
    return literal.size() >= 2 ? literal.substr(1, literal.size() - 2) : literal;
  }
  return std::nullopt;
}

// Every kernel switch this config has.
inline std::vector<KernelSwitch> kernel_switches(const Config& config) {
  std::vector<KernelSwitch> switches;
  if (const auto kernels = model_kernels(config)) switches.push_back({"model.kernels", *kernels});
  if (config.optim.name() == "muon")
    switches.push_back({"optim.muon_newton_schulz", config.optim.muon_newton_schulz()});
  return switches;
}

// The other choice of a switch ("fasttrain" <-> "aten").
inline std::string other_kernels(const std::string& kernels) {
  return kernels == "fasttrain" ? "aten" : "fasttrain";
}

}  // namespace fasttrain::detail
