#pragma once
// Optimizers built by name: "sgd" (momentum, nesterov), "adam", "adamw" (decoupled weight decay).
// Weight decay applies to weight matrices and conv kernels only: biases and norm weights (every
// parameter with dim <= 1) go to a second group with weight_decay 0. Parameters that do not
// require grad are left out. Group 0 holds the decayed parameters, group 1 the others (a group
// with no parameters is omitted).
//
//   auto optimizer = fasttrain::make_optimizer(model->named_parameters(),
//                                              fasttrain::OptimizerOptions("adamw").lr(3e-3));
//   fasttrain::set_learning_rate(*optimizer, 1e-3);
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "fasttrain/util/arg.h"

namespace fasttrain {

struct OptimizerOptions {
  explicit OptimizerOptions(std::string name) : name_(std::move(name)) {}
  FT_ARG(std::string, name);
  FT_ARG(double, lr) = 1e-3;
  FT_ARG(double, momentum) = 0.9;  // sgd momentum; adam/adamw beta1 is betas[0]
  FT_ARG(bool, nesterov) = false;
  FT_ARG(double, weight_decay) = 0.0;
  FT_ARG(double, beta1) = 0.9;
  FT_ARG(double, beta2) = 0.999;
  FT_ARG(double, eps) = 1e-8;
};

const std::vector<std::string>& optimizer_names();

// Validates `options`: throws ConfigError naming optim.<key> and the value for an unknown name (the
// message lists the valid ones), a non-finite or negative lr / weight_decay / eps, momentum or
// betas outside [0, 1), or sgd nesterov without momentum. make_optimizer calls it.
void validate(const OptimizerOptions& options);

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters, const OptimizerOptions& options);

// An optimizer of `prototype`'s type (SGD, Adam or AdamW), defaults and per-group options over other
// tensors: `group_parameters[i]` replaces group i's parameters. Its state starts empty. ZeRO uses it
// to step only this rank's part of each group.
std::unique_ptr<torch::optim::Optimizer> rebuild_optimizer(
    const torch::optim::Optimizer& prototype,
    const std::vector<std::vector<torch::Tensor>>& group_parameters);

// Sets lr on every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);
double learning_rate(const torch::optim::Optimizer& optimizer);
// Sets SGD momentum or Adam/AdamW beta1 on every group (for momentum cycling).
void set_momentum(torch::optim::Optimizer& optimizer, double momentum);
// SGD momentum or Adam/AdamW beta1 of the first group.
double momentum(const torch::optim::Optimizer& optimizer);

}  // namespace fasttrain
