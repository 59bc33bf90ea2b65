#pragma once
// FT_KEY declares an option that is also a config key, once: the option with its chained setter and
// getter (as FT_ARG), its default, its rule (what values are allowed), its help and its trait (whether
// it changes what a run computes). Everything else reads the key from there: the config schema
// (config/config.h: parsing, docs/CONFIG.md, the effective config, the resume fingerprint) and the
// component that takes the options, which checks every rule in its constructor (check_keys), so a
// library caller and a config file meet the same rule, written once:
//
//   struct EmaOptions {
//     FT_KEYS(EmaOptions);
//     FT_KEY(double, decay, "EMA decay per update", in_unit_interval()) = 0.999;
//     FT_KEY(int64_t, every, "Update every N optimizer steps", at_least(1), KeyTrait::kNeutral) = 1;
//   };
//   auto ema = EmaOptions().decay(0.99);            // an options struct as any other
//   fasttrain::check_keys(ema, "ema");              // ConfigError "ema.decay must be in [0, 1], got 2"
//   fasttrain::for_each_key<EmaOptions>([](const auto& key) { std::puts(key.name); });
//
// A component whose keys depend on a name (model.name, task.name, data.dataset) is held as AnyOptions:
// its options struct by value, behind the same keys.
//
// How: FT_KEYS notes the line it is on; each FT_KEY adds a static function `ft_key(KeyLine<__LINE__>)`
// that returns the key (name, help, rule, the member it sets). for_each_key calls every such function
// of the kMaxKeyLines lines after FT_KEYS, in line order. So: one key per line (two on one line do not
// compile), FT_KEYS above the first key, and a section shorter than kMaxKeyLines (checked). FT_KEY
// leaves the struct's access `private:`: write `public:` before plain members that follow one.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/check.h"

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

namespace fasttrain {

// What a key's value does to a run, for the fingerprint a resume compares (config/config.h).
enum class KeyTrait {
  kShapesTraining,  // the default: another value trains other weights; a resume must keep it
  kNeutral,         // how fast or how visibly a run trains, never what it computes beyond rounding
  kRunLength,       // how long the run is (train.epochs, train.max_steps): a resume may extend it
};

// What values a key takes beyond its type, and its trait. An empty rule allows every value of the type.
template <typename T>
struct KeyRule {
  KeyRule() = default;
  // `check(name, value)` throws ConfigError naming the key, the value and what is allowed.
  explicit KeyRule(std::function<void(const std::string& name, const T& value)> check)
      : check(std::move(check)) {}
  KeyRule(KeyTrait trait) : trait(trait) {}  // NOLINT: FT_KEY(..., KeyTrait::kNeutral)
  template <typename Rule>
  KeyRule(const Rule& rule, KeyTrait trait) : KeyRule(static_cast<KeyRule<T>>(rule)) {
    this->trait = trait;
  }

  std::function<void(const std::string& name, const T& value)> check;
  // An integer key that also takes "auto", stored as this value; `expected` says what is allowed.
  std::optional<T> auto_value;
  std::string expected;
  // A std::string key holding "true", "false" or "auto" that takes TOML booleans too.
  bool switch_or_auto = false;
  KeyTrait trait = KeyTrait::kShapesTraining;
};

// Whether `value` is a finite number (integers always are): numeric rules refuse inf and NaN.
template <typename T>
bool finite(const T& value) {
  if constexpr (std::is_floating_point_v<T>) return std::isfinite(value);
  return true;
}

// Rules, usable for any numeric key type: `FT_KEY(int64_t, steps, "...", at_least(1))`.
struct AtLeast {
  double minimum;
  template <typename T>
  operator KeyRule<T>() const {  // NOLINT: converts to the key's own rule type
    const T bound = static_cast<T>(minimum);
    return KeyRule<T>([bound](const std::string& name, const T& value) {
      FT_CONFIG_CHECK(finite(value) && value >= bound, "{} must be >= {}, got {}", name, bound, value);
    });
  }
};
struct Above {
  double minimum;
  template <typename T>
  operator KeyRule<T>() const {  // NOLINT
    const T bound = static_cast<T>(minimum);
    return KeyRule<T>([bound](const std::string& name, const T& value) {
      FT_CONFIG_CHECK(finite(value) && value > bound, "{} must be > {}, got {}", name, bound, value);
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
// [0, 1): a momentum, a beta, a dropout probability (1 would never forget, or drop everything).
inline KeyRule<double> below_one() {
  return KeyRule<double>([](const std::string& name, const double& value) {
    FT_CONFIG_CHECK(value >= 0 && value < 1, "{} must be in [0, 1), got {}", name, value);
  });
}
inline KeyRule<double> in_open_unit_interval() {
  return KeyRule<double>([](const std::string& name, const double& value) {
    FT_CONFIG_CHECK(value > 0 && value < 1, "{} must be in (0, 1), got {}", name, value);
  });
}
// One of `choices` ("is not allowed; valid: ..."), read when the rule runs: `choices` may be a
// registry's names, which user code can add to.
inline KeyRule<std::string> one_of(std::function<std::vector<std::string>()> choices) {
  return KeyRule<std::string>([choices](const std::string& name, const std::string& value) {
    const std::vector<std::string> valid = choices();
    FT_CONFIG_CHECK(std::find(valid.begin(), valid.end(), value) != valid.end(),
                    "{} '{}' is not allowed; valid: {}", name, value, fmt::join(valid, ", "));
  });
}
inline KeyRule<std::string> one_of(std::vector<std::string> choices) {
  return one_of([choices] { return choices; });
}
// A list each of whose entries is one of `choices`.
inline KeyRule<std::vector<std::string>> each_one_of(std::vector<std::string> choices) {
  return KeyRule<std::vector<std::string>>(
      [choices](const std::string& name, const std::vector<std::string>& values) {
        for (const auto& value : values)
          FT_CONFIG_CHECK(std::find(choices.begin(), choices.end(), value) != choices.end(),
                          "{}: '{}' is not allowed; valid: {}", name, value, fmt::join(choices, ", "));
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
  KeyRule<std::string> rule([](const std::string& name, const std::string& value) {
    FT_CONFIG_CHECK(value == "true" || value == "false" || value == "auto",
                    "{} must be true, false or \"auto\", got '{}'", name, value);
  });
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

// Runs the rule of every key of `options`, naming each "<section>.<key>": what a component's
// constructor calls, so that its options obey the config's rules whoever set them.
template <typename Options>
void check_keys(const Options& options, const std::string& section) {
  for_each_key<Options>([&](const auto& key) {
    const auto& value = options.*(key.member);
    if (key.rule.auto_value && value == *key.rule.auto_value) return;
    if (key.rule.check) key.rule.check(section + "." + key.name, value);
  });
}

// ---------------------------------------------------------------------------------------------
// Values as a config file writes them, and keys behind a type-erased face (AnyOptions, the schema).
// ---------------------------------------------------------------------------------------------

// A value as TOML gives it (config/config.h converts): what a key is read from.
struct KeyValue {
  enum class Kind { kBoolean, kInteger, kFloat, kString, kArray };
  Kind kind = Kind::kString;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string string;
  std::vector<KeyValue> array;

  // As a config error shows it: "3 (integer)", "\"x\" (string)", "[1, 2] (array)".
  std::string describe() const;
  std::string literal() const;  // the TOML text
};

// The TOML text of a value: what the effective config and docs/CONFIG.md show.
std::string key_literal(bool value);
std::string key_literal(int value);
std::string key_literal(int64_t value);
std::string key_literal(double value);
std::string key_literal(const std::string& value);
std::string key_literal(const std::vector<int64_t>& values);
std::string key_literal(const std::vector<double>& values);
std::string key_literal(const std::vector<std::string>& values);

// `value` as a key of type T named `name` (errors name it, the value and what is allowed).
void read_key_value(const KeyValue& value, const std::string& name, bool& out);
void read_key_value(const KeyValue& value, const std::string& name, int& out);
void read_key_value(const KeyValue& value, const std::string& name, int64_t& out);
void read_key_value(const KeyValue& value, const std::string& name, double& out);
void read_key_value(const KeyValue& value, const std::string& name, std::string& out);
void read_key_value(const KeyValue& value, const std::string& name, std::vector<int64_t>& out);
void read_key_value(const KeyValue& value, const std::string& name, std::vector<double>& out);
void read_key_value(const KeyValue& value, const std::string& name, std::vector<std::string>& out);

// A key given "auto" or a TOML boolean where its rule takes them; otherwise its type's reading and the
// rule's check.
template <typename T>
T read_key(const KeyValue& value, const std::string& name, const KeyRule<T>& rule) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (rule.auto_value) {
      if (value.kind == KeyValue::Kind::kString) {
        FT_CONFIG_CHECK(value.string == "auto", "{} must be {}, got {}", name, rule.expected,
                        value.describe());
        return *rule.auto_value;
      }
      FT_CONFIG_CHECK(value.kind == KeyValue::Kind::kInteger, "{} must be {}, got {}", name, rule.expected,
                      value.describe());
    }
  }
  if constexpr (std::is_same_v<T, std::string>) {
    if (rule.switch_or_auto) {
      if (value.kind == KeyValue::Kind::kBoolean) return value.boolean ? "true" : "false";
      const bool allowed = value.kind == KeyValue::Kind::kString &&
                           (value.string == "auto" || value.string == "true" || value.string == "false");
      FT_CONFIG_CHECK(allowed, "{} must be true, false or \"auto\", got {}", name, value.describe());
      return value.string;
    }
  }
  T out{};
  read_key_value(value, name, out);
  if (rule.check) rule.check(name, out);
  return out;
}

template <typename T>
std::string write_key(const T& value, const KeyRule<T>& rule) {
  if (rule.auto_value && value == *rule.auto_value) return key_literal(std::string("auto"));
  if constexpr (std::is_same_v<T, std::string>) {
    if (rule.switch_or_auto) return value == "auto" ? key_literal(value) : value;
  }
  return key_literal(value);
}

// One key of an options struct, without its type: what the schema and AnyOptions hold.
struct KeyInfo {
  std::string name;
  std::string help;
  KeyTrait trait = KeyTrait::kShapesTraining;
  // `options` points to the struct the key belongs to; `qualified` is "section.key" for messages.
  std::function<void(void* options, const KeyValue& value, const std::string& qualified)> read;
  std::function<std::string(const void* options)> write;
};

template <typename Options>
std::vector<KeyInfo> key_infos() {
  std::vector<KeyInfo> keys;
  for_each_key<Options>([&](const auto& key) {
    keys.push_back({key.name, key.help, key.rule.trait,
                    [key](void* options, const KeyValue& value, const std::string& qualified) {
                      static_cast<Options*>(options)->*(key.member) = read_key(value, qualified, key.rule);
                    },
                    [key](const void* options) {
                      return write_key(static_cast<const Options*>(options)->*(key.member), key.rule);
                    }});
  });
  return keys;
}

// The options struct of a component chosen by name (a model's, a task's, a dataset's), held by value
// with its keys. Copies copy the struct.
//
//   AnyOptions options = AnyOptions::of(CnnOptions());
//   options.as<CnnOptions>().widths({16, 32});
//   for (const KeyInfo& key : options.keys()) ...     // what config/config.h reads and writes
class AnyOptions {
 public:
  AnyOptions() = default;  // no keys
  template <typename Options>
  static AnyOptions of(Options options) {
    AnyOptions any;
    any.holder_ = std::make_unique<Holder<Options>>(std::move(options));
    return any;
  }
  AnyOptions(const AnyOptions& other) : holder_(other.holder_ ? other.holder_->clone() : nullptr) {}
  AnyOptions& operator=(const AnyOptions& other) {
    holder_ = other.holder_ ? other.holder_->clone() : nullptr;
    return *this;
  }
  AnyOptions(AnyOptions&&) noexcept = default;
  AnyOptions& operator=(AnyOptions&&) noexcept = default;

  // The struct, as the type it holds; an Error naming both types otherwise.
  template <typename Options>
  const Options& as() const {
    return *static_cast<const Options*>(checked(typeid(Options)));
  }
  template <typename Options>
  Options& as() {
    return *static_cast<Options*>(const_cast<void*>(checked(typeid(Options))));
  }
  template <typename Options>
  bool holds() const {
    return holder_ && holder_->type() == typeid(Options);
  }
  const std::vector<KeyInfo>& keys() const;
  void* data() { return holder_ ? holder_->data() : nullptr; }
  const void* data() const { return holder_ ? holder_->data() : nullptr; }
  // Runs every key's rule (check_keys), naming the keys "<section>.<key>".
  void check(const std::string& section) const {
    if (holder_) holder_->check(section);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual std::unique_ptr<Base> clone() const = 0;
    virtual const std::type_info& type() const = 0;
    virtual void* data() = 0;
    virtual const std::vector<KeyInfo>& keys() const = 0;
    virtual void check(const std::string& section) const = 0;
  };
  template <typename Options>
  struct Holder : Base {
    explicit Holder(Options value) : value(std::move(value)) {}
    std::unique_ptr<Base> clone() const override { return std::make_unique<Holder>(value); }
    const std::type_info& type() const override { return typeid(Options); }
    void* data() override { return &value; }
    const std::vector<KeyInfo>& keys() const override {
      static const std::vector<KeyInfo> infos = key_infos<Options>();
      return infos;
    }
    void check(const std::string& section) const override { check_keys(value, section); }
    Options value;
  };
  const void* checked(const std::type_info& wanted) const;

  std::unique_ptr<Base> holder_;
};

// The options of a component that has no keys of its own.
struct NoOptions {
  FT_KEYS(NoOptions);
};

}  // namespace fasttrain
