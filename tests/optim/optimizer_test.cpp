// Optimizer factory: names, validation, param groups, and single steps against hand computation.
#include "fasttrain/optim/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

std::string config_error(const OptimizerOptions& options) {
  try {
    validate(options);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

struct LinearNorm : torch::nn::Module {
  LinearNorm() {
    linear = register_module("linear", torch::nn::Linear(4, 3));
    norm = register_module("norm", torch::nn::BatchNorm1d(3));
  }
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

bool holds(const std::vector<torch::Tensor>& params, const torch::Tensor& t) {
  for (const auto& p : params) {
    if (p.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
  }
  return false;
}

TEST(Optimizer, UnknownNameListsValidNames) {
  const std::string message = config_error(OptimizerOptions("lamb"));
  EXPECT_TRUE(contains(message, "optim.name")) << message;
  EXPECT_TRUE(contains(message, "'lamb'")) << message;
  EXPECT_TRUE(contains(message, "sgd, adam, adamw")) << message;
  LinearNorm model;
  EXPECT_THROW(make_optimizer(model.named_parameters(), OptimizerOptions("lamb")), ConfigError);
}

TEST(Optimizer, InvalidValuesNameTheKeyAndValue) {
  struct Case {
    OptimizerOptions options;
    std::string key, value;
  };
  const std::vector<Case> cases = {
      {OptimizerOptions("sgd").lr(-0.1), "optim.lr", "-0.1"},
      {OptimizerOptions("sgd").lr(INFINITY), "optim.lr", "inf"},
      {OptimizerOptions("adamw").weight_decay(-1e-4), "optim.weight_decay", "-0.0001"},
      {OptimizerOptions("adam").eps(NAN), "optim.eps", "nan"},
      {OptimizerOptions("adam").beta1(1.0), "optim.beta1", "got 1"},
      {OptimizerOptions("adam").beta2(-0.5), "optim.beta2", "-0.5"},
      {OptimizerOptions("sgd").momentum(1.5), "optim.momentum", "1.5"},
      {OptimizerOptions("sgd").momentum(0.0).nesterov(true), "optim.nesterov", "momentum 0"},
  };
  for (const auto& c : cases) {
    const std::string message = config_error(c.options);
    EXPECT_TRUE(contains(message, c.key)) << c.key << ": " << message;
    EXPECT_TRUE(contains(message, c.value)) << c.key << ": " << message;
  }
  EXPECT_EQ(config_error(OptimizerOptions("sgd").momentum(0.9).nesterov(true)), "");
  EXPECT_EQ(config_error(OptimizerOptions("adamw").lr(0).weight_decay(0).eps(0)), "");
}

TEST(Optimizer, NoWeightDecayOnBiasesAndNormWeights) {
  for (const auto& name : optimizer_names()) {
    LinearNorm model;
    auto optimizer = make_optimizer(model.named_parameters(), OptimizerOptions(name).weight_decay(0.05));
    auto& groups = optimizer->param_groups();
    ASSERT_EQ(groups.size(), 2u) << name;
    const auto& decay = groups[0].params();
    const auto& no_decay = groups[1].params();
    ASSERT_EQ(decay.size(), 1u) << name;
    EXPECT_TRUE(holds(decay, model.linear->weight)) << name;
    ASSERT_EQ(no_decay.size(), 3u) << name;
    EXPECT_TRUE(holds(no_decay, model.linear->bias)) << name;
    EXPECT_TRUE(holds(no_decay, model.norm->weight)) << name;
    EXPECT_TRUE(holds(no_decay, model.norm->bias)) << name;

    auto weight_decay = [&](const torch::optim::OptimizerOptions& o) {
      if (auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&o)) return sgd->weight_decay();
      if (auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&o)) return adam->weight_decay();
      return dynamic_cast<const torch::optim::AdamWOptions&>(o).weight_decay();
    };
    EXPECT_EQ(weight_decay(groups[0].options()), 0.05) << name;
    EXPECT_EQ(weight_decay(groups[1].options()), 0.0) << name;
  }
}

TEST(Optimizer, FrozenParametersAreLeftOut) {
  LinearNorm model;
  model.norm->weight.set_requires_grad(false);
  model.norm->bias.set_requires_grad(false);
  auto optimizer = make_optimizer(model.named_parameters(), OptimizerOptions("sgd"));
  EXPECT_EQ(optimizer->param_groups()[1].params().size(), 1u);
  EXPECT_FALSE(holds(optimizer->param_groups()[1].params(), model.norm->weight));
}

// AdamW, one step: p <- p * (1 - lr * wd) - lr * m_hat / (sqrt(v_hat) + eps) with m_hat = g and
// v_hat = g^2 on the first step; the no-decay group (bias) gets no shrinkage.
TEST(Optimizer, AdamWDecouplesWeightDecay) {
  torch::manual_seed(0);
  torch::nn::Linear linear(torch::nn::LinearOptions(3, 2));
  linear->to(torch::kDouble);
  const double lr = 0.01, wd = 0.1, eps = 1e-8;
  auto optimizer =
      make_optimizer(linear->named_parameters(),
                     OptimizerOptions("adamw").lr(lr).weight_decay(wd).beta1(0.8).beta2(0.99).eps(eps));
  const torch::Tensor w0 = linear->weight.detach().clone();
  const torch::Tensor b0 = linear->bias.detach().clone();
  const torch::Tensor gw = torch::randn({2, 3}, torch::kDouble);
  linear->weight.mutable_grad() = gw.clone();
  linear->bias.mutable_grad() = torch::zeros({2}, torch::kDouble);
  optimizer->step();

  const torch::Tensor expected_w = w0 * (1 - lr * wd) - lr * gw / (gw.abs() + eps);
  EXPECT_TRUE(torch::allclose(linear->weight, expected_w, 1e-12, 1e-14));
  // A zero gradient moves nothing: the bias would shrink by lr * wd if it were decayed.
  EXPECT_TRUE(torch::equal(linear->bias, b0));
}

// Adam's weight decay is L2 (added to the gradient), so it differs from AdamW's on the same step.
TEST(Optimizer, AdamAddsWeightDecayToTheGradient) {
  torch::manual_seed(1);
  torch::nn::Linear linear(torch::nn::LinearOptions(3, 2).bias(false));
  linear->to(torch::kDouble);
  const double lr = 0.01, wd = 0.1;
  auto optimizer =
      make_optimizer(linear->named_parameters(), OptimizerOptions("adam").lr(lr).weight_decay(wd));
  const torch::Tensor w0 = linear->weight.detach().clone();
  const torch::Tensor gw = torch::randn({2, 3}, torch::kDouble);
  linear->weight.mutable_grad() = gw.clone();
  optimizer->step();
  const torch::Tensor g = gw + wd * w0;
  EXPECT_TRUE(torch::allclose(linear->weight, w0 - lr * g / (g.abs() + 1e-8), 1e-12, 1e-14));
}

// SGD with Nesterov momentum over two steps (LibTorch/PyTorch form, dampening 0):
//   buf_1 = g_1;              p_1 = p_0 - lr * (g_1 + m * buf_1)
//   buf_2 = m * buf_1 + g_2;  p_2 = p_1 - lr * (g_2 + m * buf_2)
// with g including weight decay (wd * p) for the weight, not for the bias.
TEST(Optimizer, SgdNesterovMatchesHandComputation) {
  torch::manual_seed(2);
  torch::nn::Linear linear(torch::nn::LinearOptions(4, 2));
  linear->to(torch::kDouble);
  const double lr = 0.1, m = 0.9, wd = 0.01;
  auto optimizer = make_optimizer(linear->named_parameters(),
                                  OptimizerOptions("sgd").lr(lr).momentum(m).nesterov(true).weight_decay(wd));
  torch::Tensor w = linear->weight.detach().clone(), b = linear->bias.detach().clone();
  torch::Tensor buf_w, buf_b;
  for (int step = 0; step < 2; ++step) {
    const torch::Tensor gw = torch::randn({2, 4}, torch::kDouble), gb = torch::randn({2}, torch::kDouble);
    linear->weight.mutable_grad() = gw.clone();
    linear->bias.mutable_grad() = gb.clone();
    optimizer->step();
    const torch::Tensor dw = gw + wd * w;
    buf_w = step == 0 ? dw : m * buf_w + dw;
    buf_b = step == 0 ? gb : m * buf_b + gb;
    w = w - lr * (dw + m * buf_w);
    b = b - lr * (gb + m * buf_b);
    EXPECT_TRUE(torch::allclose(linear->weight, w, 1e-12, 1e-14)) << "step " << step;
    EXPECT_TRUE(torch::allclose(linear->bias, b, 1e-12, 1e-14)) << "step " << step;
  }
}

TEST(Optimizer, SetLearningRateAndMomentum) {
  LinearNorm model;
  auto sgd = make_optimizer(model.named_parameters(), OptimizerOptions("sgd").lr(0.1).momentum(0.9));
  set_learning_rate(*sgd, 0.025);
  EXPECT_EQ(learning_rate(*sgd), 0.025);
  set_momentum(*sgd, 0.85);
  EXPECT_EQ(momentum(*sgd), 0.85);
  for (const auto& group : sgd->param_groups()) {
    const auto& o = dynamic_cast<const torch::optim::SGDOptions&>(group.options());
    EXPECT_EQ(o.lr(), 0.025);
    EXPECT_EQ(o.momentum(), 0.85);
  }

  for (const std::string name : {"adam", "adamw"}) {
    auto adam = make_optimizer(model.named_parameters(), OptimizerOptions(name).beta1(0.9).beta2(0.98));
    set_learning_rate(*adam, 3e-4);
    set_momentum(*adam, 0.8);
    EXPECT_EQ(momentum(*adam), 0.8) << name;
    for (const auto& group : adam->param_groups()) {
      EXPECT_EQ(group.options().get_lr(), 3e-4) << name;
      const auto betas = name == "adam"
                             ? dynamic_cast<const torch::optim::AdamOptions&>(group.options()).betas()
                             : dynamic_cast<const torch::optim::AdamWOptions&>(group.options()).betas();
      EXPECT_EQ(std::get<0>(betas), 0.8) << name;
      EXPECT_EQ(std::get<1>(betas), 0.98) << name;  // beta2 untouched
    }
  }
  EXPECT_THROW(set_momentum(*sgd, 1.0), Error);
}

// Momentum set after construction takes effect in the next step (what momentum cycling relies on).
TEST(Optimizer, SetMomentumChangesTheUpdate) {
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(false));
  linear->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  linear->weight.fill_(0);
  auto optimizer = make_optimizer(linear->named_parameters(), OptimizerOptions("sgd").lr(1).momentum(0.9));
  linear->weight.mutable_grad() = torch::ones({1, 1}, torch::kDouble);
  optimizer->step();  // buf = 1, w = -1
  set_momentum(*optimizer, 0.5);
  optimizer->step();  // buf = 0.5 * 1 + 1 = 1.5, w = -2.5
  EXPECT_DOUBLE_EQ(linear->weight.item<double>(), -2.5);
}

}  // namespace
}  // namespace fasttrain
