#pragma once
// What the tuner and the doctor know of a model's `kernels` key (the gpt's model.kernels: fasttrain's
// own CPU kernels or ATen's), without naming the model: any model whose options have the key.
#include <optional>
#include <string>

#include "fasttrain/config/config.h"

namespace fasttrain::detail {

// The selected model's `kernels` value ("fasttrain", "aten"), or none where its options have no such key.
inline std::optional<std::string> model_kernels(const Config& config) {
  for (const KeyInfo& key : config.model.options().keys()) {
    if (key.name != "kernels") continue;
    const std::string literal = key.write(config.model.options().data());  // "\"fasttrain\""
    return literal.size() >= 2 ? literal.substr(1, literal.size() - 2) : literal;
  }
  return std::nullopt;
}

// The other choice of model.kernels ("fasttrain" <-> "aten").
inline std::string other_kernels(const std::string& kernels) {
  return kernels == "fasttrain" ? "aten" : "fasttrain";
}

}  // namespace fasttrain::detail
