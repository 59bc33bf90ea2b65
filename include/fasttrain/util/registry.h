#pragma once
// Registry: the components a config names (models, optimizers, schedules, tasks, datasets, the
// doctor's rules), each registered once under its name with a line of help, and open to user code:
//
//   fasttrain::model_registry().add("my_net", "my conv net", fasttrain::model_recipe<MyNetOptions>(build));
//   // now `[model] name = "my_net"` in a config, or model_registry().at("my_net") in code
//
// An unknown name is a ConfigError that names the key and lists the registered names. Registration is
// not synchronised: register before any run starts, as main() or a test's set-up does. The built-in
// components are added by each registry's accessor when it is first called, one line each.
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/util/check.h"

namespace fasttrain {

template <typename Entry>
class Registry {
 public:
  // `key`: the config key that names an entry ("model.name"), for messages.
  explicit Registry(std::string key) : key_(std::move(key)) {}

  // Registers `entry` as `name`. A name already taken is an Error: a second registration would
  // silently change what configs mean.
  Registry& add(std::string name, std::string help, Entry entry) {
    FT_CHECK(!name.empty(), "{}: a registered name must not be empty", key_);
    FT_CHECK(!contains(name), "{} '{}' is already registered ({}); choose another name", key_, name,
             find(name)->help);
    items_.push_back({std::move(name), std::move(help), std::move(entry)});
    return *this;
  }
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  // The entry called `name`; a ConfigError listing the registered names otherwise.
  const Entry& at(const std::string& name) const { return item(name).entry; }
  const std::string& help(const std::string& name) const { return item(name).help; }
  // A ConfigError unless `name` is registered (what a config key's rule runs).
  void check(const std::string& name) const { item(name); }
  // In registration order.
  std::vector<std::string> names() const {
    std::vector<std::string> result;
    for (const auto& item : items_) result.push_back(item.name);
    return result;
  }
  const std::string& key() const { return key_; }

 private:
  struct Item {
    std::string name;
    std::string help;
    Entry entry;
  };
  const Item* find(const std::string& name) const {
    for (const auto& item : items_) {
      if (item.name == name) return &item;
    }
    return nullptr;
  }
  const Item& item(const std::string& name) const {
    const Item* found = find(name);
    FT_CONFIG_CHECK(found, "{} '{}' is not allowed; valid: {}", key_, name, fmt::join(names(), ", "));
    return *found;
  }

  std::string key_;
  std::vector<Item> items_;
};

}  // namespace fasttrain
