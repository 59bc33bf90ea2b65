#pragma once
// FT_KEY declares an option that is also a config key, once: the option with its chained setter and
// getter (as FT_ARG), its default, its rule (what values are allowed) and its help. The config schema
// (config/config.h) reads a section's keys from its struct, in declaration order, so docs/CONFIG.md,
// parsing, validation and the effective config all come from this one line per key:
//
//   struct EmaConfig {
//     FT_KEYS(EmaConfig);
//     FT_KEY(bool, enabled, "Keep an exponential moving average of the weights") = false;
//     FT_KEY(double, decay, "EMA decay per update", in_unit_interval()) = 0.999;
//   };
//   auto ema = EmaConfig().decay(0.99);                  // an options struct as any other
//   fasttrain::for_each_key<EmaConfig>([](const auto& key) { std::puts(key.name); });
//
// How: FT_KEYS notes the line it is on; each FT_KEY adds a static function `ft_key(KeyLine<__LINE__>)`
// that returns the key (name, help, rule, the member it sets). for_each_key calls every such function
// of the kMaxKeyLines lines after FT_KEYS, in line order. So: one key per line (two on one line do not
// compile), FT_KEYS above the first key, and a section shorter than kMaxKeyLines (checked).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

// What values a key takes beyond its type. An empty rule allows every value of the type.
template <typename T>
struct KeyRule {
  KeyRule() = default;
  // `check(name, value)` throws ConfigError naming the key, the value and what is allowed.
  explicit KeyRule(std::function<void(const std::string& name, const T& value)> check)
      : check(std::move(check)) {}

  std::function<void(const std::string& name, const T& value)> check;
  // An integer key that also takes "auto", stored as this value; `expected` says what is allowed.
  std::optional<T> auto_value;
  std::string expected;
  // A std::string key holding "true", "false" or "auto" that takes TOML booleans too.
  bool switch_or_auto = false;
};

// Rules, usable for any numeric key type: `FT_KEY(int64_t, steps, "...", at_least(1))`.
struct AtLeast {
  double minimum;
  template <typename T>
  operator KeyRule<T>() const {  // NOLINT: converts to the key's own rule type
    const T bound = static_cast<T>(minimum);
    return KeyRule<T>([bound](const std::string& name, const T& value) {
      FT_CONFIG_CHECK(value >= bound, "{} must be >= {}, got {}", name, bound, value);
    });
  }
};
struct Above {
  double minimum;
  template <typename T>
  operator KeyRule<T>() const {  // NOLINT
    const T bound = static_cast<T>(minimum);
    return KeyRule<T>([bound](const std::string& name, const T& value) {
      FT_CONFIG_CHECK(value > bound, "{} must be > {}, got {}", name, bound, value);
    });
  }
};
inline AtLeast at_least(double minimum) {
  return {minimum};
}
inline Above above(double minimum) {
  return {minimum};
}

inline KeyRule<double> in_unit_interval() {
  return KeyRule<double>([](const std::string& name, const double& value) {
    FT_CONFIG_CHECK(value >= 0 && value <= 1, "{} must be in [0, 1], got {}", name, value);
  });
}
inline KeyRule<double> in_open_unit_interval() {
  return KeyRule<double>([](const std::string& name, const double& value) {
    FT_CONFIG_CHECK(value > 0 && value < 1, "{} must be in (0, 1), got {}", name, value);
  });
}
inline KeyRule<std::string> one_of(std::vector<std::string> choices) {
  return KeyRule<std::string>([choices](const std::string& name, const std::string& value) {
    FT_CONFIG_CHECK(std::find(choices.begin(), choices.end(), value) != choices.end(),
                    "{} '{}' is not allowed; valid: {}", name, value, fmt::join(choices, ", "));
  });
}
// An integer >= `minimum`, or "auto", stored as `auto_value` (data.workers = "auto" is -1).
template <typename T>
KeyRule<T> integer_or_auto(T auto_value, T minimum) {
  const std::string expected = fmt::format("an integer >= {} or \"auto\"", minimum);
  KeyRule<T> rule([minimum, expected](const std::string& name, const T& value) {
    FT_CONFIG_CHECK(value >= minimum, "{} must be {}, got {}", name, expected, value);
  });
  rule.auto_value = auto_value;
  rule.expected = expected;
  return rule;
}
// true, false or "auto" (a switch whose default depends on the machine).
inline KeyRule<std::string> switch_or_auto() {
  KeyRule<std::string> rule;
  rule.switch_or_auto = true;
  return rule;
}

// One key of a section: what the schema reads of it.
template <typename Section, typename T>
struct Key {
  using Type = T;
  const char* name;
  const char* help;
  T Section::*member;
  KeyRule<T> rule;
};

template <int Line>
using KeyLine = std::integral_constant<int, Line>;
inline constexpr int kMaxKeyLines = 400;

namespace detail {
template <typename Section, int Line, typename = void>
struct HasKeyAt : std::false_type {};
template <typename Section, int Line>
struct HasKeyAt<Section, Line, std::void_t<decltype(Section::ft_key(KeyLine<Line>{}))>> : std::true_type {};

template <typename Section, typename Visit, int... Offsets>
void visit_keys(Visit&& visit, std::integer_sequence<int, Offsets...>) {
  auto at = [&](auto line) {
    if constexpr (HasKeyAt<Section, decltype(line)::value>::value) visit(Section::ft_key(line));
  };
  (at(KeyLine<Section::ft_first_key_line + Offsets>{}), ...);
}
}  // namespace detail

// Calls visit(Key<Section, T>) for each FT_KEY of Section, in declaration order.
template <typename Section, typename Visit>
void for_each_key(Visit&& visit) {
  detail::visit_keys<Section>(visit, std::make_integer_sequence<int, kMaxKeyLines>{});
}

}  // namespace fasttrain

#define FT_KEYS(Section)      \
 public:                      \
  using ft_section = Section; \
  static constexpr int ft_first_key_line = __LINE__

#define FT_KEY(T, name, help, ...)                                                     \
 public:                                                                               \
  static_assert(__LINE__ - ft_first_key_line < ::fasttrain::kMaxKeyLines,              \
                "a section's keys must lie within kMaxKeyLines lines of its FT_KEYS"); \
  static ::fasttrain::Key<ft_section, T> ft_key(::fasttrain::KeyLine<__LINE__>) {      \
    return {#name, help, &ft_section::name##_, ::fasttrain::KeyRule<T>(__VA_ARGS__)};  \
  }                                                                                    \
  FT_ARG(T, name)
