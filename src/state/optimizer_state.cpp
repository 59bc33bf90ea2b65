#include "fasttrain/state/optimizer_state.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "fasttrain/util/check.h"

namespace fasttrain {

OptimizerStateTensors optimizer_state(const Optimizer& optimizer) {
  OptimizerStateTensors result;
  nlohmann::json groups = nlohmann::json::array();
  for (size_t g = 0; g < optimizer.groups().size(); ++g) {
    const ParamGroup& group = optimizer.groups()[g];
    const auto& fields = optimizer.state_fields(g);
    nlohmann::json entry = optimizer.group_options(g);
    entry["params"] = group.names;
    for (size_t i = 0; i < group.params.size(); ++i) {
      if (!optimizer.has_state(g, i)) continue;  // not stepped yet
      const std::string& name = group.names[i];
      if (optimizer.counts_steps(g)) {
        const double step = optimizer.step_count(g, i).item<double>();
        result.tensors.emplace_back(name + ".step", torch::tensor(static_cast<int64_t>(step), torch::kLong));
      }
      for (size_t f = 0; f < fields.size(); ++f) {
        result.tensors.emplace_back(name + "." + fields[f], optimizer.state(g, f, i));
      }
    }
    groups.push_back(std::move(entry));
  }
  result.metadata = {{"optimizer", optimizer.name()}, {"param_groups", groups.dump()}};
  return result;
}

namespace {

const std::string& metadata(const SafetensorsFile& file, const char* key) {
  auto found = file.metadata().find(key);
  FT_CHECK(found != file.metadata().end(), "optimizer state lacks the metadata key '{}'", key);
  return found->second;
}

nlohmann::json saved_groups(const SafetensorsFile& file, size_t expected) {
  nlohmann::json groups;
  try {
    groups = nlohmann::json::parse(metadata(file, "param_groups"));
  } catch (const nlohmann::json::exception& error) {
    FT_FAIL("optimizer state has malformed param_groups metadata: {}", error.what());
  }
  FT_CHECK(groups.is_array() && groups.size() == expected,
           "optimizer state has {} parameter groups, the optimizer {}", groups.size(), expected);
  return groups;
}

// One parameter's saved state, checked against the parameter; nothing when it was never stepped.
struct SavedParameter {
  std::vector<torch::Tensor> fields;
  int64_t step = 0;
};

std::optional<SavedParameter> saved_parameter(const Optimizer& optimizer, size_t group,
                                              const SafetensorsFile& file, const std::string& name,
                                              const torch::Tensor& param, std::set<std::string>& used) {
  const auto& fields = optimizer.state_fields(group);
  const bool counts_steps = optimizer.counts_steps(group);
  const bool stepped = (counts_steps && file.contains(name + ".step")) ||
                       (!fields.empty() && file.contains(name + "." + fields.front()));
  if (!stepped) return std::nullopt;
  SavedParameter saved;
  if (counts_steps) {
    const std::string key = name + ".step";
    FT_CHECK(file.contains(key), "optimizer state lacks '{}'", key);
    used.insert(key);
    saved.step = file.at(key).to(torch::kDouble).item<int64_t>();
  }
  for (const auto& field : fields) {
    const std::string key = name + "." + field;
    FT_CHECK(file.contains(key), "optimizer state lacks '{}'", key);
    used.insert(key);
    const torch::Tensor& tensor = file.at(key);
    FT_CHECK(tensor.sizes() == param.sizes(), "optimizer state '{}' has shape {}, the parameter {}", key,
             tensor.sizes(), param.sizes());
    saved.fields.push_back(tensor.to(param.options()).contiguous(param.suggest_memory_format()));
  }
  return saved;
}

}  // namespace

void load_optimizer_state(Optimizer& optimizer, const SafetensorsFile& file) {
  FT_CHECK(metadata(file, "optimizer") == optimizer.name(),
           "optimizer state was saved for {}, but the run uses {}", metadata(file, "optimizer"),
           optimizer.name());
  const auto& groups = optimizer.groups();
  const nlohmann::json saved = saved_groups(file, groups.size());

  // Everything is read and checked first, then swapped in: an error leaves the optimizer untouched.
  std::vector<std::vector<std::optional<SavedParameter>>> states(groups.size());
  std::set<std::string> used;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& saved_names = saved[g].at("params");
    FT_CHECK(saved_names.size() == groups[g].params.size(),
             "optimizer state group {} has {} parameters, the optimizer {}", g, saved_names.size(),
             groups[g].params.size());
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const std::string& name = groups[g].names[i];
      FT_CHECK(saved_names[i] == name, "optimizer state group {} position {} is '{}', the optimizer has '{}'",
               g, i, saved_names[i].dump(), name);
      states[g].push_back(saved_parameter(optimizer, g, file, name, groups[g].params[i], used));
    }
  }
  for (const auto& entry : file.tensors()) {
    FT_CHECK(used.count(entry.first) > 0,
             "optimizer state has '{}', which no parameter of the optimizer uses", entry.first);
  }
  std::vector<nlohmann::json> before;
  for (size_t g = 0; g < groups.size(); ++g) before.push_back(optimizer.group_options(g));
  for (size_t g = 0; g < groups.size(); ++g) {
    try {
      optimizer.set_group_options(g, saved[g]);
    } catch (const std::exception& error) {
      for (size_t k = 0; k < g; ++k) optimizer.set_group_options(k, before[k]);
      FT_FAIL("optimizer state group {} has malformed options: {}", g, error.what());
    }
  }
  optimizer.clear_state();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < states[g].size(); ++i) {
      if (states[g][i]) optimizer.set_state(g, i, std::move(states[g][i]->fields), states[g][i]->step);
    }
  }
}

}  // namespace fasttrain
