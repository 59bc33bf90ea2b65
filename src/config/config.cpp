#include "fasttrain/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "fasttrain/data/dataset.h"
#include "fasttrain/data/text.h"
#include "fasttrain/state/sha256.h"
#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

std::string DataConfig::resolved_path() const {
  return path_.empty() ? "/usr/share/datasets/" + dataset_ : path_;
}

std::vector<std::string> dataset_names() {
  std::vector<std::string> names = image_dataset_names();
  names.push_back("text");
  return names;
}

int64_t MemoryConfig::budget_bytes() const {
  return budget_.empty() ? 0 : parse_bytes(budget_, "memory.budget");
}

namespace {

// ---------------------------------------------------------------------------------------------
// Values: TOML node -> C++ value, C++ value -> TOML literal. Errors name the key and the value.
// ---------------------------------------------------------------------------------------------

std::string describe(const toml::node& node) {
  std::ostringstream out;
  node.visit([&out](auto&& value) { out << value; });
  out << " (" << node.type() << ")";
  return out.str();
}

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string literal(int64_t value) {
  return std::to_string(value);
}
std::string literal(int value) {
  return std::to_string(value);
}
std::string literal(bool value) {
  return value ? "true" : "false";
}
std::string literal(const std::string& value) {
  return quote(value);
}
std::string literal(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // keep it a TOML float
  return text;
}
std::string literal(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

void parse(const toml::node& node, const std::string& key, int64_t& out) {
  FT_CONFIG_CHECK(node.is_integer(), "{} must be an integer, got {}", key, describe(node));
  out = node.as_integer()->get();
}
void parse(const toml::node& node, const std::string& key, int& out) {
  int64_t value = 0;
  parse(node, key, value);
  FT_CONFIG_CHECK(value >= INT32_MIN && value <= INT32_MAX, "{} is out of range, got {}", key, value);
  out = static_cast<int>(value);
}
void parse(const toml::node& node, const std::string& key, double& out) {
  FT_CONFIG_CHECK(node.is_number(), "{} must be a number, got {}", key, describe(node));
  out = node.is_integer() ? static_cast<double>(node.as_integer()->get()) : node.as_floating_point()->get();
  FT_CONFIG_CHECK(std::isfinite(out), "{} must be finite, got {}", key, out);
}
void parse(const toml::node& node, const std::string& key, bool& out) {
  FT_CONFIG_CHECK(node.is_boolean(), "{} must be true or false, got {}", key, describe(node));
  out = node.as_boolean()->get();
}
void parse(const toml::node& node, const std::string& key, std::string& out) {
  FT_CONFIG_CHECK(node.is_string(), "{} must be a string, got {}", key, describe(node));
  out = node.as_string()->get();
}
void parse(const toml::node& node, const std::string& key, std::vector<int64_t>& out) {
  FT_CONFIG_CHECK(node.is_array(), "{} must be an array of integers, got {}", key, describe(node));
  std::vector<int64_t> values;
  for (const auto& element : *node.as_array()) {
    FT_CONFIG_CHECK(element.is_integer(), "{} must be an array of integers, got {}", key, describe(node));
    values.push_back(element.as_integer()->get());
  }
  out = std::move(values);
}

// ---------------------------------------------------------------------------------------------
// The schema: one Field per key, in the order they are printed and documented.
// ---------------------------------------------------------------------------------------------

struct Field {
  std::string section;
  std::string key;
  std::string help;
  std::function<void(Config&, const toml::node&)> read;
  std::function<std::string(const Config&)> write;

  std::string name() const { return section + "." + key; }
};

// A key given "auto" or a TOML boolean where its rule takes them; otherwise its type's parse and the
// rule's check.
template <typename T>
T read_value(const toml::node& node, const std::string& name, const KeyRule<T>& rule) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (rule.auto_value) {
      const std::string expected = fmt::format("{} must be {}, got ", name, rule.expected);
      if (node.is_string()) {
        FT_CONFIG_CHECK(node.as_string()->get() == "auto", "{}{}", expected, describe(node));
        return *rule.auto_value;
      }
      FT_CONFIG_CHECK(node.is_integer(), "{}{}", expected, describe(node));
    }
  }
  if constexpr (std::is_same_v<T, std::string>) {
    if (rule.switch_or_auto) {
      if (node.is_boolean()) return node.as_boolean()->get() ? "true" : "false";
      const bool allowed =
          node.is_string() && (node.as_string()->get() == "auto" || node.as_string()->get() == "true" ||
                               node.as_string()->get() == "false");
      FT_CONFIG_CHECK(allowed, "{} must be true, false or \"auto\", got {}", name, describe(node));
      return node.as_string()->get();
    }
  }
  T value{};
  parse(node, name, value);
  if (rule.check) rule.check(name, value);
  return value;
}

template <typename T>
std::string write_value(const T& value, const KeyRule<T>& rule) {
  if (rule.auto_value && value == *rule.auto_value) return quote("auto");
  if constexpr (std::is_same_v<T, std::string>) {
    if (rule.switch_or_auto) return value == "auto" ? quote("auto") : value;
  }
  return literal(value);
}

// The schema's entry for `key` of the section at `section_in_config`.
template <typename Section, typename T>
Field make_field(const std::string& section, Section Config::*section_in_config, const Key<Section, T>& key) {
  Field field{section, key.name, key.help, nullptr, nullptr};
  const std::string name = field.name();
  field.read = [=](Config& config, const toml::node& node) {
    (config.*section_in_config).*(key.member) = read_value(node, name, key.rule);
  };
  field.write = [=](const Config& config) {
    return write_value((config.*section_in_config).*(key.member), key.rule);
  };
  return field;
}

template <typename Section>
void add_section(std::vector<Field>& fields, const std::string& section, Section Config::*section_in_config) {
  for_each_key<Section>(
      [&](const auto& key) { fields.push_back(make_field(section, section_in_config, key)); });
}

// Every key of every section, in the order they are printed and documented: the sections as Config
// holds them, each section's keys as its struct declares them (FT_KEY).
const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> all;
    add_section(all, "data", &Config::data);
    add_section(all, "model", &Config::model);
    add_section(all, "optim", &Config::optim);
    add_section(all, "schedule", &Config::schedule);
    add_section(all, "train", &Config::train);
    add_section(all, "ema", &Config::ema);
    add_section(all, "memory", &Config::memory);
    add_section(all, "dist", &Config::dist);
    add_section(all, "log", &Config::log);
    add_section(all, "checkpoint", &Config::checkpoint);
    add_section(all, "run", &Config::run);
    return all;
  }();
  return fields;
}

std::vector<std::string> sections() {
  std::vector<std::string> result;
  for (const auto& f : schema()) {
    if (result.empty() || result.back() != f.section) result.push_back(f.section);
  }
  return result;
}

const Field& find_field(const std::string& section, const std::string& key) {
  auto all_sections = sections();
  FT_CONFIG_CHECK(std::find(all_sections.begin(), all_sections.end(), section) != all_sections.end(),
                  "unknown config section [{}]; valid: {}", section, fmt::join(all_sections, ", "));
  std::vector<std::string> keys;
  for (const auto& f : schema()) {
    if (f.section != section) continue;
    if (f.key == key) return f;
    keys.push_back(f.key);
  }
  throw ConfigError(fmt::format("unknown config key {}.{}; valid keys of [{}]: {}", section, key, section,
                                fmt::join(keys, ", ")));
}

void apply_table(Config& config, const toml::table& table, const std::string& source) {
  for (const auto& [section_key, section_node] : table) {
    std::string section(section_key.str());
    FT_CONFIG_CHECK(section_node.is_table(), "{}: '{}' must be a [section] table; valid sections: {}", source,
                    section, fmt::join(sections(), ", "));
    for (const auto& [key, node] : *section_node.as_table()) {
      try {
        find_field(section, std::string(key.str())).read(config, node);
      } catch (const ConfigError& error) {
        throw ConfigError(fmt::format("{}: {}", source, error.what()));
      }
    }
  }
}

}  // namespace

void apply_toml(Config& config, const std::string& text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& error) {
    throw ConfigError(fmt::format("{}:{}:{}: TOML syntax error: {}", source, error.source().begin.line,
                                  error.source().begin.column, error.description()));
  }
  apply_table(config, table, source);
}

Config load_config(const std::string& path) {
  FT_CONFIG_CHECK(std::filesystem::is_regular_file(path), "config file '{}' does not exist or is not a file",
                  path);
  std::ifstream in(path);
  FT_CONFIG_CHECK(in.good(), "config file '{}' cannot be read", path);
  std::stringstream text;
  text << in.rdbuf();
  Config config;
  apply_toml(config, text.str(), path);
  return config;
}

void apply_override(Config& config, const std::string& assignment) {
  auto equals = assignment.find('=');
  auto dot = assignment.find('.');
  FT_CONFIG_CHECK(equals != std::string::npos && dot != std::string::npos && dot < equals,
                  "--set expects section.key=value, got '{}'", assignment);
  std::string section = assignment.substr(0, dot);
  std::string key = assignment.substr(dot + 1, equals - dot - 1);
  std::string value = assignment.substr(equals + 1);
  const Field& target = find_field(section, key);
  toml::table parsed;
  try {
    parsed = toml::parse("value = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"value", value}};  // a bare word: model.name=resnet
  }
  target.read(config, *parsed.get("value"));
}

void validate(const Config& config) {
  validate(config.optim);
  // Building the schedule checks its options against a nominal length.
  make_schedule(config.schedule, config.optim.lr(), config.optim.momentum(), 1000);
  FT_CONFIG_CHECK(config.schedule.max_momentum() >= config.schedule.base_momentum(),
                  "schedule.max_momentum ({}) must be >= schedule.base_momentum ({})",
                  config.schedule.max_momentum(), config.schedule.base_momentum());
  const std::string& device = config.train.device();
  FT_CONFIG_CHECK(device == "auto" || device == "cpu" || device.rfind("cuda", 0) == 0,
                  "train.device must be auto, cpu, cuda or cuda:N, got '{}'", device);
  if (config.data.dataset() == "idx") {
    FT_CONFIG_CHECK(!config.data.path().empty(),
                    "data.path must name the IDX directory when data.dataset = \"idx\"");
  }
  FT_CONFIG_CHECK(
      config.train.init_from().empty() || std::filesystem::is_regular_file(config.train.init_from()),
      "train.init_from '{}' is not a file (a safetensors file of the model's weights)",
      config.train.init_from());
  // A text model on text data, an image model on images.
  const bool text = config.data.dataset() == "text";
  FT_CONFIG_CHECK(text == (config.model.name() == "gpt"),
                  "model.name = \"{}\" cannot train on data.dataset = \"{}\": gpt takes byte sequences "
                  "(data.dataset = \"text\"), the other models images",
                  config.model.name(), config.data.dataset());
  if (text) {
    FT_CONFIG_CHECK(
        !config.data.path().empty(),
        "data.path must name a directory of documents (or one file) when data.dataset = \"text\"");
    FT_CONFIG_CHECK(std::filesystem::exists(config.data.path()), "data.path '{}' does not exist",
                    config.data.path());
    FT_CONFIG_CHECK(config.data.batch_size() > 0,
                    "data.batch_size = \"auto\" searches image batches only: set the sequences per batch "
                    "(data.batching = \"windows\") or data.max_tokens (\"tokens\") for text");
    FT_CONFIG_CHECK(config.data.train_limit() == 0,
                    "data.train_limit = {} applies to images; for text narrow data.include or data.path",
                    config.data.train_limit());
    if (config.data.batching() == "tokens")
      check_token_budget(config.data.max_tokens(), config.model.context());
    return;
  }
  std::string path = config.data.resolved_path();
  FT_CONFIG_CHECK(std::filesystem::is_directory(path), "data.path '{}' is not a directory{}", path,
                  config.data.path().empty()
                      ? " (install Debian's dataset-" + config.data.dataset() + " package or set data.path)"
                      : "");
}

std::string to_toml(const Config& config) {
  std::string out;
  std::string section;
  for (const auto& f : schema()) {
    if (f.section != section) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", f.section);
      section = f.section;
    }
    out += fmt::format("{} = {}\n", f.key, f.write(config));
  }
  return out;
}

namespace {

// train.epochs and train.max_steps say how long the run is, not what each step computes.
bool is_run_length(const Field& field) {
  return field.section == "train" && (field.key == "epochs" || field.key == "max_steps");
}

// Keys that change how fast or how visibly a run trains, never what it computes beyond rounding: a
// resume may change them (more workers on a bigger machine, another log cadence, the fused or
// foreach optimizer kernels, eager or captured steps). [memory] too: checkpointed
// blocks recompute the same values, and the warm-up puts back everything it touches. [dist] too: a
// checkpoint records its world size and dist.zero, and load_checkpoint checks them itself.
bool shapes_training(const Field& field) {
  static const std::vector<std::string> neutral = {
      "data.eval_batch_size",   "data.workers",         "data.prefetch",         "data.pin_memory",
      "data.device_resident",   "train.threads",        "train.blas_threads",    "train.device",
      "train.eval_every_steps", "train.eval_from_step", "train.target_accuracy", "train.stop_at_target",
      "train.init_from",        "train.detect_anomaly", "train.cuda_graphs",     "optim.kernel"};
  if (is_run_length(field)) return false;  // a resume may extend the run: run_length_change
  if (field.section == "log" || field.section == "run" || field.section == "checkpoint" ||
      field.section == "memory" || field.section == "dist")
    return false;
  return std::find(neutral.begin(), neutral.end(), field.section + "." + field.key) == neutral.end();
}

}  // namespace

std::string training_fingerprint(const Config& config) {
  std::string text;
  for (const auto& f : schema()) {
    if (shapes_training(f)) text += fmt::format("{}.{} = {}\n", f.section, f.key, f.write(config));
  }
  return sha256_hex(text);
}

std::vector<std::string> training_differences(const Config& a, const Config& b) {
  std::vector<std::string> keys;
  for (const auto& f : schema()) {
    if (shapes_training(f) && f.write(a) != f.write(b)) {
      keys.push_back(fmt::format("{}.{} ({} vs {})", f.section, f.key, f.write(a), f.write(b)));
    }
  }
  return keys;
}

RunLengthChange run_length_change(const Config& saved, const Config& now) {
  RunLengthChange change;
  // `before` and `after` as written; compared as `from` and `to` (max_steps = 0 is no step limit).
  auto note = [&](const std::string& key, int64_t before, int64_t after, int64_t from, int64_t to) {
    if (from == to) return;
    (to > from ? change.longer : change.shorter)
        .push_back(fmt::format("train.{} {} -> {}", key, before, after));
  };
  auto step_limit = [](const Config& c) {
    return c.train.max_steps() > 0 ? c.train.max_steps() : std::numeric_limits<int64_t>::max();
  };
  note("epochs", saved.train.epochs(), now.train.epochs(), saved.train.epochs(), now.train.epochs());
  note("max_steps", saved.train.max_steps(), now.train.max_steps(), step_limit(saved), step_limit(now));
  return change;
}

std::string config_reference() {
  Config defaults;
  std::string out =
      "# Configuration reference\n\n"
      "Every key of a fasttrain TOML config, its default and its meaning. Override any key on the command\n"
      "line with `--set section.key=value`. This file is generated by `fasttrain config --reference`;\n"
      "a test keeps it in step with the code.\n";
  std::string section;
  for (const auto& f : schema()) {
    if (f.section != section) {
      out += fmt::format("\n## [{}]\n\n| key | default | meaning |\n| --- | --- | --- |\n", f.section);
      section = f.section;
    }
    out += fmt::format("| `{}` | `{}` | {} |\n", f.key, f.write(defaults), f.help);
  }
  return out;
}

}  // namespace fasttrain
