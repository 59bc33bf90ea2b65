#include "fasttrain/train/options.h"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>

#include "fasttrain/util/check.h"

namespace fasttrain {

std::string Target::describe() const {
  return fmt::format("{} {} {}", metric, at_least ? ">=" : "<=", value);
}

Target Target::parse(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  Target target;
  std::string op, value, rest;
  in >> target.metric >> op >> value >> rest;
  char* end = nullptr;
  const double number = value.empty() ? 0 : std::strtod(value.c_str(), &end);
  const bool number_ok = !value.empty() && end && *end == '\0' && std::isfinite(number);
  FT_CONFIG_CHECK(!target.metric.empty() && (op == ">=" || op == "<=") && number_ok && rest.empty(),
                  "{} must be \"METRIC >= VALUE\" or \"METRIC <= VALUE\" (such as \"accuracy >= 0.91\" or "
                  "\"rmse <= 0.5\"), got '{}'",
                  key, text);
  target.at_least = op == ">=";
  target.value = number;
  return target;
}

std::optional<Target> TrainOptions::resolved_target() const {
  FT_CONFIG_CHECK(target_.empty() || target_accuracy_ == 0,
                  "train.target = \"{}\" and train.target_accuracy = {} both set a target: keep one", target_,
                  target_accuracy_);
  if (!target_.empty()) return Target::parse(target_, "train.target");
  if (target_accuracy_ > 0) return Target{"accuracy", true, target_accuracy_};
  return std::nullopt;
}

}  // namespace fasttrain
