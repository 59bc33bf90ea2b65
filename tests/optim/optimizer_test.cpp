// Optimizers: names, validation, param groups, single steps against hand computation, both kernels
// (fused, foreach) against LibTorch's own torch::optim over several steps, the found-inf skip, and
// state saved from torch::optim loading into them.
#include "fasttrain/optim/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "fasttrain/detail/compat.h"
#include "fasttrain/state/optimizer_state.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

struct LinearNorm;

// What making an optimizer with `options` says (the checks every caller meets); "" when it is made.
std::string config_error(const OptimizerOptions& options);

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

std::string config_error(const OptimizerOptions& options) {
  LinearNorm model;
  try {
    make_optimizer(model.named_parameters(), options);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

torch::Tensor lr_tensor(double lr, torch::ScalarType dtype = torch::kDouble) {
  return torch::full({}, lr, torch::TensorOptions().dtype(dtype));
}

// The kernels this LibTorch runs on the CPU: foreach always, fused from 2.4.
std::vector<std::string> cpu_kernels() {
  std::vector<std::string> kernels = {"foreach"};
  if (compat::has_fused_optimizer_kernel("aten::_fused_adamw_", torch::kCPU)) kernels.push_back("fused");
  return kernels;
}

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
    const auto& groups = optimizer->groups();
    ASSERT_EQ(groups.size(), 2u) << name;
    ASSERT_EQ(groups[0].params.size(), 1u) << name;
    EXPECT_TRUE(holds(groups[0].params, model.linear->weight)) << name;
    ASSERT_EQ(groups[1].params.size(), 3u) << name;
    EXPECT_TRUE(holds(groups[1].params, model.linear->bias)) << name;
    EXPECT_TRUE(holds(groups[1].params, model.norm->weight)) << name;
    EXPECT_TRUE(holds(groups[1].params, model.norm->bias)) << name;
    EXPECT_EQ(groups[0].names, std::vector<std::string>{"linear.weight"}) << name;
    EXPECT_EQ(groups[0].weight_decay, 0.05) << name;
    EXPECT_EQ(groups[1].weight_decay, 0.0) << name;
    EXPECT_EQ(optimizer->group_options(0).at("weight_decay"), 0.05) << name;
  }
}

TEST(Optimizer, FrozenParametersAreLeftOut) {
  LinearNorm model;
  model.norm->weight.set_requires_grad(false);
  model.norm->bias.set_requires_grad(false);
  auto optimizer = make_optimizer(model.named_parameters(), OptimizerOptions("sgd"));
  EXPECT_EQ(optimizer->groups()[1].params.size(), 1u);
  EXPECT_FALSE(holds(optimizer->groups()[1].params, model.norm->weight));
}

TEST(Optimizer, KernelsAreChosenByNameAndAnUnknownOneListsTheValidOnes) {
  const std::string message = config_error(OptimizerOptions("adamw").kernel("apex"));
  EXPECT_TRUE(contains(message, "optim.kernel")) << message;
  EXPECT_TRUE(contains(message, "auto, fused, foreach")) << message;
  LinearNorm model;
  const bool fused_here = cpu_kernels().size() == 2;
  for (const auto& name : optimizer_names()) {
    auto automatic = make_optimizer(model.named_parameters(), OptimizerOptions(name));
    EXPECT_EQ(automatic->fused(), fused_here) << name << ": auto takes the fused kernel where the CPU has it";
    auto foreach = make_optimizer(model.named_parameters(), OptimizerOptions(name).kernel("foreach"));
    EXPECT_FALSE(foreach->fused()) << name;
    EXPECT_EQ(foreach->describe_kernel(), "foreach");
    if (fused_here) {
      EXPECT_TRUE(contains(automatic->describe_kernel(), "_fused_")) << automatic->describe_kernel();
    } else {
      EXPECT_THROW(make_optimizer(model.named_parameters(), OptimizerOptions(name).kernel("fused")),
                   ConfigError)
          << name << ": LibTorch " << compat::torch_version() << " has no fused kernel";
    }
  }
}

// AdamW, one step: p <- p * (1 - lr * wd) - lr * m_hat / (sqrt(v_hat) + eps) with m_hat = g and
// v_hat = g^2 on the first step; the no-decay group (bias) gets no shrinkage.
TEST(Optimizer, AdamWDecouplesWeightDecay) {
  for (const auto& kernel : cpu_kernels()) {
    torch::manual_seed(0);
    torch::nn::Linear linear(torch::nn::LinearOptions(3, 2));
    linear->to(torch::kDouble);
    const double lr = 0.01, wd = 0.1, eps = 1e-8;
    auto optimizer = make_optimizer(
        linear->named_parameters(),
        OptimizerOptions("adamw").lr(lr).weight_decay(wd).beta1(0.8).beta2(0.99).eps(eps).kernel(kernel));
    const torch::Tensor w0 = linear->weight.detach().clone();
    const torch::Tensor b0 = linear->bias.detach().clone();
    const torch::Tensor gw = torch::randn({2, 3}, torch::kDouble);
    linear->weight.mutable_grad() = gw.clone();
    linear->bias.mutable_grad() = torch::zeros({2}, torch::kDouble);
    optimizer->step(lr_tensor(lr));

    const torch::Tensor expected_w = w0 * (1 - lr * wd) - lr * gw / (gw.abs() + eps);
    EXPECT_TRUE(torch::allclose(linear->weight, expected_w, 1e-12, 1e-14)) << kernel;
    // A zero gradient moves nothing: the bias would shrink by lr * wd if it were decayed.
    EXPECT_TRUE(torch::equal(linear->bias, b0)) << kernel;
  }
}

// Adam's weight decay is L2 (added to the gradient), so it differs from AdamW's on the same step.
TEST(Optimizer, AdamAddsWeightDecayToTheGradient) {
  for (const auto& kernel : cpu_kernels()) {
    torch::manual_seed(1);
    torch::nn::Linear linear(torch::nn::LinearOptions(3, 2).bias(false));
    linear->to(torch::kDouble);
    const double lr = 0.01, wd = 0.1;
    auto optimizer = make_optimizer(linear->named_parameters(),
                                    OptimizerOptions("adam").lr(lr).weight_decay(wd).kernel(kernel));
    const torch::Tensor w0 = linear->weight.detach().clone();
    const torch::Tensor gw = torch::randn({2, 3}, torch::kDouble);
    linear->weight.mutable_grad() = gw.clone();
    optimizer->step(lr_tensor(lr));
    const torch::Tensor g = gw + wd * w0;
    EXPECT_TRUE(torch::allclose(linear->weight, w0 - lr * g / (g.abs() + 1e-8), 1e-12, 1e-14)) << kernel;
  }
}

// SGD with Nesterov momentum over two steps (LibTorch/PyTorch form, dampening 0):
//   buf_1 = g_1;              p_1 = p_0 - lr * (g_1 + m * buf_1)
//   buf_2 = m * buf_1 + g_2;  p_2 = p_1 - lr * (g_2 + m * buf_2)
// with g including weight decay (wd * p) for the weight, not for the bias.
TEST(Optimizer, SgdNesterovMatchesHandComputation) {
  for (const auto& kernel : cpu_kernels()) {
    torch::manual_seed(2);
    torch::nn::Linear linear(torch::nn::LinearOptions(4, 2));
    linear->to(torch::kDouble);
    const double lr = 0.1, m = 0.9, wd = 0.01;
    auto optimizer = make_optimizer(
        linear->named_parameters(),
        OptimizerOptions("sgd").lr(lr).momentum(m).nesterov(true).weight_decay(wd).kernel(kernel));
    torch::Tensor w = linear->weight.detach().clone(), b = linear->bias.detach().clone();
    torch::Tensor buf_w, buf_b;
    for (int step = 0; step < 2; ++step) {
      const torch::Tensor gw = torch::randn({2, 4}, torch::kDouble), gb = torch::randn({2}, torch::kDouble);
      linear->weight.mutable_grad() = gw.clone();
      linear->bias.mutable_grad() = gb.clone();
      optimizer->step(lr_tensor(lr));
      const torch::Tensor dw = gw + wd * w;
      buf_w = step == 0 ? dw : m * buf_w + dw;
      buf_b = step == 0 ? gb : m * buf_b + gb;
      w = w - lr * (dw + m * buf_w);
      b = b - lr * (gb + m * buf_b);
      EXPECT_TRUE(torch::allclose(linear->weight, w, 1e-12, 1e-14)) << kernel << " step " << step;
      EXPECT_TRUE(torch::allclose(linear->bias, b, 1e-12, 1e-14)) << kernel << " step " << step;
    }
  }
}

TEST(Optimizer, MomentumIsSetForTheNextStepAndRecorded) {
  LinearNorm model;
  auto sgd = make_optimizer(model.named_parameters(), OptimizerOptions("sgd").lr(0.1).momentum(0.9));
  sgd->set_momentum(0.85);
  EXPECT_EQ(sgd->momentum(), 0.85);
  EXPECT_EQ(sgd->group_options(0).at("momentum"), 0.85);
  for (const std::string name : {"adam", "adamw"}) {
    auto adam = make_optimizer(model.named_parameters(), OptimizerOptions(name).beta1(0.9).beta2(0.98));
    adam->set_momentum(0.8);
    EXPECT_EQ(adam->momentum(), 0.8) << name;
    EXPECT_EQ(adam->group_options(1).at("beta1"), 0.8) << name;
    EXPECT_EQ(adam->group_options(1).at("beta2"), 0.98) << name;  // untouched
  }
  EXPECT_THROW(sgd->set_momentum(1.0), Error);
}

// Momentum set after construction takes effect in the next step (what momentum cycling relies on).
TEST(Optimizer, SetMomentumChangesTheUpdate) {
  for (const auto& kernel : cpu_kernels()) {
    torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(false));
    linear->to(torch::kDouble);
    torch::NoGradGuard no_grad;
    linear->weight.fill_(0);
    auto optimizer = make_optimizer(linear->named_parameters(),
                                    OptimizerOptions("sgd").lr(1).momentum(0.9).kernel(kernel));
    linear->weight.mutable_grad() = torch::ones({1, 1}, torch::kDouble);
    optimizer->step(lr_tensor(1));  // buf = 1, w = -1
    optimizer->set_momentum(0.5);
    optimizer->step(lr_tensor(1));  // buf = 0.5 * 1 + 1 = 1.5, w = -2.5
    EXPECT_DOUBLE_EQ(linear->weight.item<double>(), -2.5) << kernel;
  }
}

// ---- against LibTorch's own optimizers ----

struct SmallNet : torch::nn::Module {
  SmallNet() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)));
    norm = register_module("norm", torch::nn::BatchNorm2d(3));
    fc = register_module("fc", torch::nn::Linear(12, 4));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  torch::nn::Linear fc{nullptr};
};

// torch::optim's optimizer of `options` over `net`'s parameters, grouped as fasttrain groups its own
// (by name), with the same weight decay per group.
std::unique_ptr<torch::optim::Optimizer> libtorch_optimizer(const Optimizer& ours, torch::nn::Module& net,
                                                            const OptimizerOptions& o) {
  const auto named = net.named_parameters();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& group : ours.groups()) {
    std::vector<torch::Tensor> params;
    for (const auto& name : group.names) params.push_back(named[name]);
    std::unique_ptr<torch::optim::OptimizerOptions> options;
    if (o.name() == "sgd") {
      options = std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(o.lr())
                                                               .momentum(o.momentum())
                                                               .nesterov(o.nesterov())
                                                               .weight_decay(group.weight_decay));
    } else if (o.name() == "adam") {
      options = std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(o.lr())
                                                                .betas({o.beta1(), o.beta2()})
                                                                .eps(o.eps())
                                                                .weight_decay(group.weight_decay));
    } else {
      options = std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr())
                                                                 .betas({o.beta1(), o.beta2()})
                                                                 .eps(o.eps())
                                                                 .weight_decay(group.weight_decay));
    }
    groups.emplace_back(params, std::move(options));
  }
  if (o.name() == "sgd") return std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(o.lr()));
  if (o.name() == "adam")
    return std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(o.lr()));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(o.lr()));
}

void set_libtorch_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

// The same random gradients for both nets; the norm's bias gets none on odd steps (a parameter
// without a gradient is skipped, its state untouched).
void give_gradients(SmallNet& a, SmallNet& b, int step) {
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const bool skip = step % 2 == 1 && pa[i].unsafeGetTensorImpl() == a.norm->bias.unsafeGetTensorImpl();
    const torch::Tensor g = torch::randn_like(pa[i]);
    pa[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
    pb[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
  }
}

void copy_weights(SmallNet& from, SmallNet& to) {
  torch::NoGradGuard no_grad;
  auto source = from.parameters(), target = to.parameters();
  for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
}

std::vector<OptimizerOptions> parity_cases() {
  return {OptimizerOptions("sgd").lr(0.05).momentum(0.9).weight_decay(1e-2),
          OptimizerOptions("sgd").lr(0.05).momentum(0.8).nesterov(true).weight_decay(1e-3),
          OptimizerOptions("adam").lr(3e-3).beta1(0.85).beta2(0.98).eps(1e-7).weight_decay(1e-2),
          OptimizerOptions("adamw").lr(3e-3).beta2(0.995).weight_decay(5e-2)};
}

TEST(Optimizer, BothKernelsMatchLibTorchsOwnOptimizersOverSteps) {
  const std::vector<double> lrs = {1.0, 0.5, 2.0, 0.25, 1.5, 0.1};  // x the base lr: a schedule
  for (const auto& kernel : cpu_kernels()) {
    for (auto options : parity_cases()) {
      options.kernel(kernel);
      const std::string what = options.name() + " (" + kernel + ")";
      torch::manual_seed(3);
      SmallNet ours_net, theirs_net;
      copy_weights(ours_net, theirs_net);
      auto ours = make_optimizer(ours_net.named_parameters(), options);
      auto theirs = libtorch_optimizer(*ours, theirs_net, options);
      for (size_t step = 0; step < lrs.size(); ++step) {
        give_gradients(ours_net, theirs_net, static_cast<int>(step));
        const double lr = options.lr() * lrs[step];
        ours->step(lr_tensor(lr, torch::kFloat));
        set_libtorch_lr(*theirs, lr);
        theirs->step();
      }
      auto a = ours_net.named_parameters(), b = theirs_net.named_parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::allclose(a[i].value(), b[i].value(), 1e-5, 1e-7))
            << what << ": " << a[i].key() << " differs by "
            << (a[i].value() - b[i].value()).abs().max().item<double>();
      }
    }
  }
}

TEST(Optimizer, AFoundInfSkipsTheWholeStepOnTheDevice) {
  for (const auto& kernel : cpu_kernels()) {
    for (auto options : parity_cases()) {
      options.kernel(kernel);
      torch::manual_seed(4);
      SmallNet net, reference;
      copy_weights(net, reference);
      auto optimizer = make_optimizer(net.named_parameters(), options);
      auto control = make_optimizer(reference.named_parameters(), options);
      give_gradients(net, reference, 0);
      optimizer->step(lr_tensor(options.lr()), torch::zeros({}));
      control->step(lr_tensor(options.lr()));
      const torch::Tensor found_inf = torch::ones({});
      give_gradients(net, reference, 1);
      optimizer->step(lr_tensor(options.lr()), found_inf);  // skipped: weights, moments, counts as before
      for (size_t i = 0; i < net.parameters().size(); ++i) {
        EXPECT_TRUE(torch::equal(net.parameters()[i], reference.parameters()[i]))
            << options.name() << " " << kernel;
      }
      const auto state = optimizer_state(*optimizer).tensors, expected = optimizer_state(*control).tensors;
      ASSERT_EQ(state.size(), expected.size());
      for (size_t i = 0; i < state.size(); ++i) {
        EXPECT_TRUE(torch::equal(state[i].second, expected[i].second))
            << options.name() << " " << kernel << " " << state[i].first;
      }
    }
  }
}

// A checkpoint written while fasttrain stepped with torch::optim (the same file format) loads, and the
// run continues with the numbers torch::optim would have given.
TEST(Optimizer, StateSavedFromLibTorchsOptimizerLoadsAndContinuesAlike) {
  for (auto options : parity_cases()) {
    torch::manual_seed(5);
    SmallNet ours_net, theirs_net;
    copy_weights(ours_net, theirs_net);
    auto ours = make_optimizer(ours_net.named_parameters(), options);
    auto theirs = libtorch_optimizer(*ours, theirs_net, options);
    for (int step = 0; step < 3; ++step) {
      give_gradients(ours_net, theirs_net, 0);
      theirs->step();
    }
    copy_weights(theirs_net, ours_net);
    // torch::optim's state in the checkpoint format: <name>.<field>, steps as int64, the groups' options.
    NamedTensors tensors;
    nlohmann::json groups = nlohmann::json::array();
    for (size_t g = 0; g < ours->groups().size(); ++g) {
      const ParamGroup& group = ours->groups()[g];
      for (size_t i = 0; i < group.params.size(); ++i) {
        const std::string& name = group.names[i];
        const auto found =
            theirs->state().find(compat::optimizer_state_key(theirs_net.named_parameters()[name]));
        ASSERT_NE(found, theirs->state().end());
        if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get())) {
          tensors.emplace_back(name + ".momentum_buffer",
                               sgd->momentum_buffer().clone());  // a file holds copies
        } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(found->second.get())) {
          tensors.emplace_back(name + ".step", torch::tensor(adam->step(), torch::kLong));
          tensors.emplace_back(name + ".exp_avg", adam->exp_avg().clone());
          tensors.emplace_back(name + ".exp_avg_sq", adam->exp_avg_sq().clone());
        } else {
          auto& adamw = dynamic_cast<torch::optim::AdamWParamState&>(*found->second);
          tensors.emplace_back(name + ".step", torch::tensor(adamw.step(), torch::kLong));
          tensors.emplace_back(name + ".exp_avg", adamw.exp_avg().clone());
          tensors.emplace_back(name + ".exp_avg_sq", adamw.exp_avg_sq().clone());
        }
      }
      nlohmann::json entry = ours->group_options(g);
      entry["params"] = group.names;
      groups.push_back(entry);
    }
    load_optimizer_state(
        *ours, SafetensorsFile(tensors, {{"optimizer", options.name()}, {"param_groups", groups.dump()}},
                               "torch::optim's state"));
    for (int step = 0; step < 3; ++step) {
      give_gradients(ours_net, theirs_net, 0);
      ours->step(lr_tensor(options.lr(), torch::kFloat));
      theirs->step();
    }
    for (size_t i = 0; i < ours_net.parameters().size(); ++i) {
      EXPECT_TRUE(torch::allclose(ours_net.parameters()[i], theirs_net.parameters()[i], 1e-5, 1e-7))
          << options.name() << " nesterov " << options.nesterov() << ": parameter " << i << " differs by "
          << (ours_net.parameters()[i] - theirs_net.parameters()[i]).abs().max().item<double>();
    }
  }
}

TEST(Optimizer, RebuildKeepsTheKindKernelAndGroupOptionsWithEmptyState) {
  LinearNorm model;
  auto optimizer =
      make_optimizer(model.named_parameters(), OptimizerOptions("adamw").weight_decay(0.1).kernel("foreach"));
  optimizer->set_momentum(0.7);
  model.linear->weight.mutable_grad() = torch::ones_like(model.linear->weight);
  optimizer->step(lr_tensor(0.1));
  EXPECT_GT(optimizer->state_bytes(), 0);
  auto rebuilt = optimizer->rebuild(optimizer->groups());
  EXPECT_EQ(rebuilt->name(), "adamw");
  EXPECT_FALSE(rebuilt->fused());
  EXPECT_EQ(rebuilt->momentum(), 0.7);
  EXPECT_EQ(rebuilt->groups()[0].weight_decay, 0.1);
  EXPECT_EQ(rebuilt->state_bytes(), 0);
  EXPECT_THROW(optimizer->rebuild({}), Error);
}

}  // namespace
}  // namespace fasttrain
