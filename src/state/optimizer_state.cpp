#include "fasttrain/state/optimizer_state.h"

#include <torch/optim.h>

#include <nlohmann/json.hpp>
#include <set>

#include "fasttrain/util/check.h"
#include "fasttrain/util/compat.h"

namespace fasttrain {

namespace {

// Optimizer state is keyed by the parameter's TensorImpl address (LibTorch's own convention).
compat::OptimizerStateKey state_key(const torch::Tensor& parameter) {
  return compat::optimizer_state_key(parameter);
}

// ---------------------------------------------------------------------------------------------
// Per optimizer kind: its name, its per-parameter fields, its group options as JSON.
// ---------------------------------------------------------------------------------------------

struct AdamFields {
  template <typename State>
  static void save(const State& state, const std::string& name, NamedTensors& out) {
    out.emplace_back(name + ".step", torch::tensor(state.step(), torch::kLong));
    out.emplace_back(name + ".exp_avg", state.exp_avg());
    out.emplace_back(name + ".exp_avg_sq", state.exp_avg_sq());
    if (state.max_exp_avg_sq().defined()) out.emplace_back(name + ".max_exp_avg_sq", state.max_exp_avg_sq());
  }
  template <typename State>
  static std::unique_ptr<State> load(const std::function<torch::Tensor(const std::string&, bool)>& field) {
    auto state = std::make_unique<State>();
    state->step(field("step", true).template item<int64_t>());
    state->exp_avg(field("exp_avg", true));
    state->exp_avg_sq(field("exp_avg_sq", true));
    state->max_exp_avg_sq(field("max_exp_avg_sq", false));
    return state;
  }
  template <typename Options>
  static nlohmann::json options(const Options& o) {
    return {{"lr", o.lr()},   {"beta1", std::get<0>(o.betas())},  {"beta2", std::get<1>(o.betas())},
            {"eps", o.eps()}, {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad()}};
  }
  template <typename Options>
  static void set_options(Options& o, const nlohmann::json& j) {
    o.lr(j.at("lr").get<double>())
        .betas(std::make_tuple(j.at("beta1").get<double>(), j.at("beta2").get<double>()))
        .eps(j.at("eps").get<double>())
        .weight_decay(j.at("weight_decay").get<double>())
        .amsgrad(j.at("amsgrad").get<bool>());
  }
};

struct SgdFields {
  static void save(const torch::optim::SGDParamState& state, const std::string& name, NamedTensors& out) {
    if (state.momentum_buffer().defined())
      out.emplace_back(name + ".momentum_buffer", state.momentum_buffer());
  }
  template <typename State>
  static std::unique_ptr<State> load(const std::function<torch::Tensor(const std::string&, bool)>& field) {
    auto state = std::make_unique<State>();
    state->momentum_buffer(field("momentum_buffer", false));
    return state;
  }
  static nlohmann::json options(const torch::optim::SGDOptions& o) {
    return {{"lr", o.lr()},
            {"momentum", o.momentum()},
            {"dampening", o.dampening()},
            {"weight_decay", o.weight_decay()},
            {"nesterov", o.nesterov()}};
  }
  static void set_options(torch::optim::SGDOptions& o, const nlohmann::json& j) {
    o.lr(j.at("lr").get<double>())
        .momentum(j.at("momentum").get<double>())
        .dampening(j.at("dampening").get<double>())
        .weight_decay(j.at("weight_decay").get<double>())
        .nesterov(j.at("nesterov").get<bool>());
  }
};

template <typename OptimizerT, typename OptionsT, typename StateT, typename Fields>
struct Kind {
  using Optimizer = OptimizerT;
  using Options = OptionsT;
  using State = StateT;
  using FieldIo = Fields;
};
using AdamWKind =
    Kind<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, AdamFields>;
using AdamKind =
    Kind<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, AdamFields>;
using SgdKind = Kind<torch::optim::SGD, torch::optim::SGDOptions, torch::optim::SGDParamState, SgdFields>;

// Calls fn(KindTag{}, name) for the optimizer's kind; an error for kinds we cannot save.
template <typename Fn>
void visit_kind(const torch::optim::Optimizer& optimizer, Fn&& fn) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return fn(AdamWKind{}, "adamw");
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return fn(AdamKind{}, "adam");
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return fn(SgdKind{}, "sgd");
  FT_FAIL("cannot checkpoint this optimizer: supported are sgd, adam and adamw (make_optimizer's)");
}

std::map<const c10::TensorImpl*, std::string> parameter_names(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : named_parameters) names[item.value().unsafeGetTensorImpl()] = item.key();
  return names;
}

}  // namespace

OptimizerStateTensors optimizer_state(
    const torch::optim::Optimizer& optimizer,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters) {
  OptimizerStateTensors result;
  const auto names = parameter_names(named_parameters);
  visit_kind(optimizer, [&](auto kind, const char* kind_name) {
    using K = decltype(kind);
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& group : optimizer.param_groups()) {
      nlohmann::json entry = K::FieldIo::options(static_cast<const typename K::Options&>(group.options()));
      entry["params"] = nlohmann::json::array();
      for (const auto& parameter : group.params()) {
        auto name = names.find(parameter.unsafeGetTensorImpl());
        FT_CHECK(name != names.end(),
                 "the optimizer holds a parameter of shape {} that the model does not name",
                 parameter.sizes());
        entry["params"].push_back(name->second);
        auto state = optimizer.state().find(state_key(parameter));
        if (state == optimizer.state().end()) continue;  // not stepped yet
        K::FieldIo::save(static_cast<const typename K::State&>(*state->second), name->second, result.tensors);
      }
      groups.push_back(std::move(entry));
    }
    result.metadata = {{"optimizer", kind_name}, {"param_groups", groups.dump()}};
  });
  return result;
}

void load_optimizer_state(torch::optim::Optimizer& optimizer,
                          const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                          const SafetensorsFile& file) {
  const auto names = parameter_names(named_parameters);
  visit_kind(optimizer, [&](auto kind, const char* kind_name) {
    using K = decltype(kind);
    auto meta = [&](const char* key) -> const std::string& {
      auto found = file.metadata().find(key);
      FT_CHECK(found != file.metadata().end(), "optimizer state lacks the metadata key '{}'", key);
      return found->second;
    };
    FT_CHECK(meta("optimizer") == kind_name, "optimizer state was saved for {}, but the run uses {}",
             meta("optimizer"), kind_name);
    nlohmann::json groups;
    try {
      groups = nlohmann::json::parse(meta("param_groups"));
    } catch (const nlohmann::json::exception& error) {
      FT_FAIL("optimizer state has malformed param_groups metadata: {}", error.what());
    }
    auto& param_groups = optimizer.param_groups();
    FT_CHECK(groups.is_array() && groups.size() == param_groups.size(),
             "optimizer state has {} parameter groups, the optimizer {}", groups.size(), param_groups.size());

    // Build everything first, then swap it in: an error leaves the optimizer untouched.
    std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
    std::vector<typename K::Options> options;
    std::set<std::string> used;
    for (size_t g = 0; g < param_groups.size(); ++g) {
      const auto& saved_names = groups[g].at("params");
      const auto& params = param_groups[g].params();
      FT_CHECK(saved_names.size() == params.size(),
               "optimizer state group {} has {} parameters, the optimizer {}", g, saved_names.size(),
               params.size());
      typename K::Options group_options = static_cast<const typename K::Options&>(param_groups[g].options());
      try {
        K::FieldIo::set_options(group_options, groups[g]);
      } catch (const nlohmann::json::exception& error) {
        FT_FAIL("optimizer state group {} has malformed options: {}", g, error.what());
      }
      options.push_back(group_options);
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = names.at(params[i].unsafeGetTensorImpl());
        FT_CHECK(saved_names[i] == name,
                 "optimizer state group {} position {} is '{}', the optimizer has '{}'", g, i,
                 saved_names[i].dump(), name);
        if (!file.contains(name + ".step") && !file.contains(name + ".momentum_buffer") &&
            !file.contains(name + ".exp_avg")) {
          continue;  // never stepped
        }
        auto field = [&](const std::string& field_name, bool required) -> torch::Tensor {
          const std::string key = name + "." + field_name;
          if (!file.contains(key)) {
            FT_CHECK(!required, "optimizer state lacks '{}'", key);
            return {};
          }
          used.insert(key);
          const torch::Tensor& saved = file.at(key);
          if (field_name == "step") return saved;
          FT_CHECK(saved.sizes() == params[i].sizes(), "optimizer state '{}' has shape {}, the parameter {}",
                   key, saved.sizes(), params[i].sizes());
          return saved.to(params[i].options()).contiguous(params[i].suggest_memory_format());
        };
        states.emplace_back(state_key(params[i]), K::FieldIo::template load<typename K::State>(field));
      }
    }
    for (const auto& entry : file.tensors()) {
      FT_CHECK(used.count(entry.first) > 0,
               "optimizer state has '{}', which no parameter of the optimizer uses", entry.first);
    }
    for (size_t g = 0; g < param_groups.size(); ++g) {
      static_cast<typename K::Options&>(param_groups[g].options()) = options[g];
    }
    optimizer.state().clear();
    for (auto& entry : states) optimizer.state()[entry.first] = std::move(entry.second);
  });
}

}  // namespace fasttrain
