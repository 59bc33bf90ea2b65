#include "fasttrain/optim/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

void check_non_negative(const char* key, double value) {
  FT_CONFIG_CHECK(std::isfinite(value) && value >= 0, "optim.{} must be finite and >= 0, got {}", key, value);
}

void check_unit_interval(const char* key, double value) {
  FT_CONFIG_CHECK(std::isfinite(value) && value >= 0 && value < 1, "optim.{} must be in [0, 1), got {}", key,
                  value);
}

// Each group gets its own options object: LibTorch clones the defaults only into groups without one.
std::unique_ptr<torch::optim::OptimizerOptions> group_options(const OptimizerOptions& o,
                                                              double weight_decay) {
  if (o.name() == "sgd") {
    return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(o.lr())
                                                          .momentum(o.momentum())
                                                          .nesterov(o.nesterov())
                                                          .weight_decay(weight_decay));
  }
  if (o.name() == "adam") {
    return std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(o.lr())
                                                           .betas({o.beta1(), o.beta2()})
                                                           .eps(o.eps())
                                                           .weight_decay(weight_decay));
  }
  // adamw; set weight_decay explicitly: AdamWOptions defaults it to 1e-2.
  return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr())
                                                          .betas({o.beta1(), o.beta2()})
                                                          .eps(o.eps())
                                                          .weight_decay(weight_decay));
}

}  // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "adam", "adamw"};
  return names;
}

void validate(const OptimizerOptions& o) {
  const auto& names = optimizer_names();
  FT_CONFIG_CHECK(std::find(names.begin(), names.end(), o.name()) != names.end(),
                  "unknown optim.name '{}'; valid: {}", o.name(), fmt::join(names, ", "));
  check_non_negative("lr", o.lr());
  check_non_negative("weight_decay", o.weight_decay());
  check_non_negative("eps", o.eps());
  check_unit_interval("momentum", o.momentum());
  check_unit_interval("beta1", o.beta1());
  check_unit_interval("beta2", o.beta2());
  FT_CONFIG_CHECK(!o.nesterov() || o.name() != "sgd" || o.momentum() > 0,
                  "optim.nesterov = true needs optim.momentum > 0, got momentum {}", o.momentum());
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters, const OptimizerOptions& options) {
  validate(options);
  // Decaying biases and norm scales toward 0 only hurts (they set offsets and scales, not
  // capacity), so every parameter with dim <= 1 trains without weight decay.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : named_parameters) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;  // frozen parameters are not the optimizer's to update
    (p.dim() <= 1 ? no_decay : decay).push_back(p);
  }
  FT_CHECK(!decay.empty() || !no_decay.empty(),
           "optimizer '{}' got no trainable parameters ({} parameters, none requires grad)", options.name(),
           named_parameters.size());

  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, group_options(options, options.weight_decay()));
  if (!no_decay.empty()) groups.emplace_back(no_decay, group_options(options, 0.0));

  auto defaults = group_options(options, options.weight_decay());
  if (options.name() == "sgd") {
    return std::make_unique<torch::optim::SGD>(groups,
                                               static_cast<const torch::optim::SGDOptions&>(*defaults));
  }
  if (options.name() == "adam") {
    return std::make_unique<torch::optim::Adam>(groups,
                                                static_cast<const torch::optim::AdamOptions&>(*defaults));
  }
  return std::make_unique<torch::optim::AdamW>(groups,
                                               static_cast<const torch::optim::AdamWOptions&>(*defaults));
}

std::unique_ptr<torch::optim::Optimizer> rebuild_optimizer(
    const torch::optim::Optimizer& prototype,
    const std::vector<std::vector<torch::Tensor>>& group_parameters) {
  FT_CHECK(group_parameters.size() == prototype.param_groups().size(),
           "rebuild_optimizer: {} parameter lists for {} groups", group_parameters.size(),
           prototype.param_groups().size());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t i = 0; i < group_parameters.size(); ++i) {
    groups.emplace_back(group_parameters[i], prototype.param_groups()[i].options().clone());
  }
  const torch::optim::OptimizerOptions& defaults = prototype.defaults();
  if (dynamic_cast<const torch::optim::SGD*>(&prototype)) {
    return std::make_unique<torch::optim::SGD>(groups,
                                               static_cast<const torch::optim::SGDOptions&>(defaults));
  }
  if (dynamic_cast<const torch::optim::AdamW*>(&prototype)) {
    return std::make_unique<torch::optim::AdamW>(groups,
                                                 static_cast<const torch::optim::AdamWOptions&>(defaults));
  }
  if (dynamic_cast<const torch::optim::Adam*>(&prototype)) {
    return std::make_unique<torch::optim::Adam>(groups,
                                                static_cast<const torch::optim::AdamOptions&>(defaults));
  }
  FT_FAIL("rebuild_optimizer: the optimizer is not SGD, Adam or AdamW (those made by make_optimizer: {})",
          fmt::join(optimizer_names(), ", "));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
  optimizer.defaults().set_lr(lr);  // so groups added later start at the current LR
}

double learning_rate(const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  return groups.empty() ? optimizer.defaults().get_lr() : groups.front().options().get_lr();
}

namespace {
void set_momentum_on(torch::optim::OptimizerOptions& options, double momentum) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    sgd->momentum(momentum);
  } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    adam->betas({momentum, std::get<1>(adam->betas())});
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    adamw->betas({momentum, std::get<1>(adamw->betas())});
  } else {
    FT_FAIL("set_momentum: the optimizer is not SGD, Adam or AdamW (those made by make_optimizer: {})",
            fmt::join(optimizer_names(), ", "));
  }
}
}  // namespace

void set_momentum(torch::optim::Optimizer& optimizer, double momentum) {
  FT_CHECK(std::isfinite(momentum) && momentum >= 0 && momentum < 1, "momentum must be in [0, 1), got {}",
           momentum);
  for (auto& group : optimizer.param_groups()) set_momentum_on(group.options(), momentum);
  set_momentum_on(optimizer.defaults(), momentum);
}

double momentum(const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  const torch::optim::OptimizerOptions& options =
      groups.empty() ? optimizer.defaults() : groups.front().options();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) return sgd->momentum();
  if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options))
    return std::get<0>(adam->betas());
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    return std::get<0>(adamw->betas());
  }
  FT_FAIL("momentum: the optimizer is not SGD, Adam or AdamW (those made by make_optimizer: {})",
          fmt::join(optimizer_names(), ", "));
}

}  // namespace fasttrain
