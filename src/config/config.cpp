#include "fasttrain/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "fasttrain/detail/sha256.h"
#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

int64_t MemoryConfig::budget_bytes() const {
  return budget_.empty() ? 0 : parse_bytes(budget_, "memory.budget");
}

namespace {

// ---------------------------------------------------------------------------------------------
// TOML node -> KeyValue (util/key.h reads keys from those).
// ---------------------------------------------------------------------------------------------

KeyValue key_value(const toml::node& node) {
  KeyValue value;
  if (node.is_boolean()) {
    value.kind = KeyValue::Kind::kBoolean;
    value.boolean = node.as_boolean()->get();
  } else if (node.is_integer()) {
    value.kind = KeyValue::Kind::kInteger;
    value.integer = node.as_integer()->get();
  } else if (node.is_floating_point()) {
    value.kind = KeyValue::Kind::kFloat;
    value.floating = node.as_floating_point()->get();
  } else if (node.is_string()) {
    value.kind = KeyValue::Kind::kString;
    value.string = node.as_string()->get();
  } else if (node.is_array()) {
    value.kind = KeyValue::Kind::kArray;
    for (const auto& element : *node.as_array()) value.array.push_back(key_value(element));
  } else {
    throw ConfigError(
        "a TOML table or date is not a config value here (keys take numbers, strings, booleans and "
        "arrays)");
  }
  return value;
}

// ---------------------------------------------------------------------------------------------
// The schema: sections made of parts, a part an options struct somewhere in a Config (its FT_KEYs), or a
// selection (its name key, then the selected component's keys).
// ---------------------------------------------------------------------------------------------

struct Part {
  std::string section;
  // A struct: where it is, and its keys.
  std::function<void*(Config&)> object;
  const std::vector<KeyInfo>* keys = nullptr;
  // A selection: its name key, what it holds, and how to change it.
  std::string selector;
  std::string selector_help;
  std::function<std::string(const Config&)> selected;
  std::function<void(Config&, const std::string&)> select;
  std::function<std::vector<std::string>(const Config&)> choices;
  std::function<AnyOptions&(Config&)> selection_options;
};

template <typename Options>
Part struct_part(const std::string& section, Options& (*in)(Config&)) {
  static const std::vector<KeyInfo> keys = key_infos<Options>();
  Part part;
  part.section = section;
  part.object = [in](Config& config) -> void* { return &in(config); };
  part.keys = &keys;
  return part;
}

template <typename Recipe>
Part selection_part(const std::string& section, const std::string& key, const std::string& help,
                    Selection<Recipe>& (*in)(Config&)) {
  Part part;
  part.section = section;
  part.selector = key;
  part.selector_help = help;
  part.selected = [in](const Config& config) { return in(const_cast<Config&>(config)).name(); };
  part.select = [in](Config& config, const std::string& name) { in(config).select(name); };
  part.choices = [in](const Config& config) { return in(const_cast<Config&>(config)).choices(); };
  part.selection_options = [in](Config& config) -> AnyOptions& { return in(config).options(); };
  return part;
}

const std::vector<Part>& parts() {
  static const std::vector<Part> all = [] {
    std::vector<Part> p;
    p.push_back(selection_part<DatasetRecipe>(
        "data", "dataset",
        "Dataset: fashion-mnist, mnist, idx (any MNIST-format IDX files), text (byte-level documents for a "
        "sequence model), or one a program registered; its own keys follow",
        [](Config& c) -> Selection<DatasetRecipe>& { return c.data.dataset; }));
    p.push_back(struct_part<DataConfig>("data", [](Config& c) -> DataConfig& { return c.data; }));
    p.push_back(
        struct_part<LoaderOptions>("data", [](Config& c) -> LoaderOptions& { return c.data.loader; }));
    p.push_back(selection_part<ModelRecipe>(
        "model", "name", "Model: cnn, gpt, mlp, resnet, or one a program registered; its own keys follow",
        [](Config& c) -> Selection<ModelRecipe>& { return c.model; }));
    p.push_back(selection_part<TaskRecipe>(
        "task", "name",
        "Task (loss and metrics): auto (the data's own: classification for labelled images, "
        "language_modeling for text), classification, language_modeling, regression, reconstruction, or one "
        "a program registered; its own keys follow",
        [](Config& c) -> Selection<TaskRecipe>& { return c.task; }));
    p.push_back(
        struct_part<OptimizerOptions>("optim", [](Config& c) -> OptimizerOptions& { return c.optim; }));
    p.push_back(
        struct_part<ScheduleOptions>("schedule", [](Config& c) -> ScheduleOptions& { return c.schedule; }));
    p.push_back(
        struct_part<TrainOptions>("train", [](Config& c) -> TrainOptions& { return c.train.options; }));
    p.push_back(struct_part<TrainConfig>("train", [](Config& c) -> TrainConfig& { return c.train; }));
    p.push_back(struct_part<EmaConfig>("ema", [](Config& c) -> EmaConfig& { return c.ema; }));
    p.push_back(struct_part<EmaOptions>("ema", [](Config& c) -> EmaOptions& { return c.ema.options; }));
    p.push_back(struct_part<MemoryConfig>("memory", [](Config& c) -> MemoryConfig& { return c.memory; }));
    p.push_back(struct_part<DistOptions>("dist", [](Config& c) -> DistOptions& { return c.dist; }));
    p.push_back(struct_part<LogOptions>("log", [](Config& c) -> LogOptions& { return c.log; }));
    p.push_back(struct_part<RunCheckpointOptions>(
        "checkpoint", [](Config& c) -> RunCheckpointOptions& { return c.checkpoint; }));
    p.push_back(struct_part<RunConfig>("run", [](Config& c) -> RunConfig& { return c.run; }));
    return p;
  }();
  return all;
}

// One key of a config as it stands (a selection's keys are its current component's).
struct Field {
  std::string section;
  std::string key;
  std::string help;
  KeyTrait trait = KeyTrait::kShapesTraining;
  bool selector = false;
  std::function<void(Config&, const KeyValue&)> read;
  std::function<std::string(const Config&)> write;

  std::string name() const { return section + "." + key; }
};

std::vector<Field> struct_fields(const std::string& section, const std::vector<KeyInfo>& keys,
                                 std::function<void*(Config&)> object) {
  std::vector<Field> fields;
  for (const KeyInfo& info : keys) {
    Field field{section, info.name, info.help, info.trait, false, nullptr, nullptr};
    const std::string name = field.name();
    field.read = [object, info, name](Config& config, const KeyValue& value) {
      info.read(object(config), value, name);
    };
    field.write = [object, info](const Config& config) {
      return info.write(object(const_cast<Config&>(config)));
    };
    fields.push_back(std::move(field));
  }
  return fields;
}

std::vector<Field> fields_of(const Config& config) {
  std::vector<Field> all;
  for (const Part& part : parts()) {
    if (part.selector.empty()) {
      auto fields = struct_fields(part.section, *part.keys, part.object);
      all.insert(all.end(), fields.begin(), fields.end());
      continue;
    }
    Field name{part.section, part.selector, part.selector_help, KeyTrait::kShapesTraining, true,
               nullptr,      nullptr};
    const std::string qualified = name.name();
    name.read = [part, qualified](Config& c, const KeyValue& value) {
      std::string chosen;
      read_key_value(value, qualified, chosen);
      const auto valid = part.choices(c);
      FT_CONFIG_CHECK(std::find(valid.begin(), valid.end(), chosen) != valid.end(),
                      "{} '{}' is not allowed; valid: {}", qualified, chosen, fmt::join(valid, ", "));
      part.select(c, chosen);
    };
    name.write = [part](const Config& c) { return key_literal(part.selected(c)); };
    all.push_back(std::move(name));
    Config& mutable_config = const_cast<Config&>(config);
    const AnyOptions& options = part.selection_options(mutable_config);
    auto selection_options = part.selection_options;
    auto fields = struct_fields(part.section, options.keys(),
                                [selection_options](Config& c) { return selection_options(c).data(); });
    all.insert(all.end(), fields.begin(), fields.end());
  }
  return all;
}

std::vector<std::string> sections() {
  std::vector<std::string> result;
  for (const Part& part : parts()) {
    if (result.empty() || result.back() != part.section) result.push_back(part.section);
  }
  return result;
}

// Keys that moved: a config written before gets told where they went.
const std::map<std::string, std::string>& moved_keys() {
  static const std::map<std::string, std::string> moved = {
      {"train.label_smoothing",
       "task.label_smoothing, a key of the classification and language_modeling tasks: set task.name = "
       "\"classification\" (or \"language_modeling\") and [task] label_smoothing"},
  };
  return moved;
}

// The field `section.key` of `config` as it stands; a ConfigError listing the valid ones otherwise.
Field find_field(const Config& config, const std::string& section, const std::string& key) {
  const auto all_sections = sections();
  FT_CONFIG_CHECK(std::find(all_sections.begin(), all_sections.end(), section) != all_sections.end(),
                  "unknown config section [{}]; valid: {}", section, fmt::join(all_sections, ", "));
  const auto moved = moved_keys().find(section + "." + key);
  FT_CONFIG_CHECK(moved == moved_keys().end(), "{}.{} has moved: it is now {}", section, key,
                  moved == moved_keys().end() ? "" : moved->second);
  std::vector<std::string> keys;
  std::string selected;
  for (const Part& part : parts()) {
    if (part.section == section && !part.selector.empty())
      selected = fmt::format(" ({} = \"{}\")", part.selector, part.selected(config));
  }
  for (Field& field : fields_of(config)) {
    if (field.section != section) continue;
    if (field.key == key) return field;
    keys.push_back(field.key);
  }
  throw ConfigError(fmt::format("unknown config key {}.{}; valid keys of [{}]{}: {}", section, key, section,
                                selected, fmt::join(keys, ", ")));
}

void read_field(Config& config, const std::string& section, const std::string& key, const KeyValue& value) {
  find_field(config, section, key).read(config, value);
}

void apply_table(Config& config, const toml::table& table, const std::string& source) {
  for (const auto& [section_key, section_node] : table) {
    const std::string section(section_key.str());
    FT_CONFIG_CHECK(section_node.is_table(), "{}: '{}' must be a [section] table; valid sections: {}", source,
                    section, fmt::join(sections(), ", "));
  }
  auto read = [&](const std::string& section, const std::string& key, const toml::node& node) {
    try {
      read_field(config, section, key, key_value(node));
    } catch (const ConfigError& error) {
      throw ConfigError(fmt::format("{}: {}", source, error.what()));
    }
  };
  for (const auto& [section_key, section_node] : table) {
    const std::string section(section_key.str());
    const toml::table& keys = *section_node.as_table();
    // A selection's name first: the section's other keys are the chosen component's.
    std::vector<std::string> selectors;
    for (const Part& part : parts()) {
      if (part.section == section && !part.selector.empty()) selectors.push_back(part.selector);
    }
    for (const auto& selector : selectors) {
      if (const toml::node* node = keys.get(selector)) read(section, selector, *node);
    }
    for (const auto& [key, node] : keys) {
      const std::string name(key.str());
      if (std::find(selectors.begin(), selectors.end(), name) == selectors.end()) read(section, name, node);
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
  toml::table parsed;
  try {
    parsed = toml::parse("value = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"value", value}};  // a bare word: model.name=resnet
  }
  read_field(config, section, key, key_value(*parsed.get("value")));
}

std::string to_toml(const Config& config) {
  std::string out;
  std::string section;
  for (const Field& field : fields_of(config)) {
    if (field.section != section) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", field.section);
      section = field.section;
    }
    out += fmt::format("{} = {}\n", field.key, field.write(config));
  }
  return out;
}

namespace {

// The keys that decide what a run computes, by name, with their values.
std::map<std::string, std::string> training_keys(const Config& config) {
  std::map<std::string, std::string> keys;
  for (const Field& field : fields_of(config)) {
    if (field.trait == KeyTrait::kShapesTraining) keys[field.name()] = field.write(config);
  }
  return keys;
}

}  // namespace

std::string training_fingerprint(const Config& config) {
  std::string text;
  for (const Field& field : fields_of(config)) {
    if (field.trait == KeyTrait::kShapesTraining)
      text += fmt::format("{} = {}\n", field.name(), field.write(config));
  }
  return sha256_hex(text);
}

std::vector<std::string> training_differences(const Config& a, const Config& b) {
  const auto keys_a = training_keys(a), keys_b = training_keys(b);
  std::vector<std::string> differences;
  std::vector<std::string> names;
  for (const Field& field : fields_of(a)) names.push_back(field.name());
  for (const Field& field : fields_of(b)) {
    if (std::find(names.begin(), names.end(), field.name()) == names.end()) names.push_back(field.name());
  }
  for (const auto& name : names) {
    const auto in_a = keys_a.find(name), in_b = keys_b.find(name);
    if (in_a == keys_a.end() && in_b == keys_b.end()) continue;
    const std::string value_a = in_a == keys_a.end() ? "(none)" : in_a->second;
    const std::string value_b = in_b == keys_b.end() ? "(none)" : in_b->second;
    if (value_a != value_b) differences.push_back(fmt::format("{} ({} vs {})", name, value_a, value_b));
  }
  return differences;
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
    return c.train.options.max_steps() > 0 ? c.train.options.max_steps()
                                           : std::numeric_limits<int64_t>::max();
  };
  const TrainOptions& before = saved.train.options;
  const TrainOptions& after = now.train.options;
  note("epochs", before.epochs(), after.epochs(), before.epochs(), after.epochs());
  note("max_steps", before.max_steps(), after.max_steps(), step_limit(saved), step_limit(now));
  return change;
}

namespace {

std::string key_table(const std::vector<Field>& fields, const Config& config) {
  std::string out = "| key | default | meaning |\n| --- | --- | --- |\n";
  for (const Field& field : fields)
    out += fmt::format("| `{}` | `{}` | {} |\n", field.key, field.write(config), field.help);
  return out;
}

}  // namespace

std::string config_reference() {
  Config defaults;
  std::string out =
      "# Configuration reference\n\n"
      "Every key of a fasttrain TOML config, its default and its meaning. Override any key on the command\n"
      "line with `--set section.key=value`. The keys of [data], [model] and [task] that follow their name "
      "key\n"
      "(data.dataset, model.name, task.name) are the named component's own: each registered one is listed\n"
      "with its keys. This file is generated by `fasttrain config --reference`; a test keeps it in step "
      "with\n"
      "the code.\n";
  const std::vector<Field> fields = fields_of(defaults);
  for (const std::string& section : sections()) {
    std::vector<Field> own;
    std::string selector;
    for (const Part& part : parts()) {
      if (part.section != section) continue;
      if (!part.selector.empty()) {
        selector = part.selector;
        continue;
      }
      auto keys = struct_fields(section, *part.keys, part.object);
      own.insert(own.end(), keys.begin(), keys.end());
    }
    if (!selector.empty()) {
      for (const Field& field : fields) {
        if (field.section == section && field.key == selector) own.insert(own.begin(), field);
      }
    }
    out += fmt::format("\n## [{}]\n\n{}", section, key_table(own, defaults));
    if (selector.empty()) continue;
    // Each registered component's own keys, at their defaults.
    for (const Part& part : parts()) {
      if (part.section != section || part.selector.empty()) continue;
      for (const std::string& name : part.choices(defaults)) {
        Config chosen;
        part.select(chosen, name);
        const AnyOptions& options = part.selection_options(chosen);
        auto selection_options = part.selection_options;
        auto keys = struct_fields(section, options.keys(),
                                  [selection_options](Config& c) { return selection_options(c).data(); });
        out += fmt::format("\n### {} = \"{}\"\n\n", selector, name);
        out += keys.empty() ? std::string("No keys of its own.\n") : key_table(keys, chosen);
      }
    }
  }
  return out;
}

}  // namespace fasttrain
