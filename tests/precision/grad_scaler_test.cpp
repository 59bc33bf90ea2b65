// GradScaler against torch.amp.GradScaler's own test cases (test/test_cuda.py:
// test_grad_scaling_autocast, _clipping, _clipping_separate_unscale, _accumulation): a run with the
// scaler, where one step gets an inf gradient, must end with the same parameters, gradients and
// optimizer state as a control run without scaling that skipped the same step, and with the scale
// 128 * 2^unskipped * 0.5^skipped.
#include "fasttrain/precision/grad_scaler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <limits>
#include <memory>

#include "fasttrain/detail/compat.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

enum class LibTorchOptimizer { kSgd, kSgdMomentum, kAdam };

std::unique_ptr<torch::optim::Optimizer> make_libtorch_optimizer(LibTorchOptimizer kind,
                                                                 const std::vector<torch::Tensor>& params) {
  switch (kind) {
    case LibTorchOptimizer::kSgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1.0));
    case LibTorchOptimizer::kSgdMomentum:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
    case LibTorchOptimizer::kAdam:
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  }
  return nullptr;
}

// The optimizer's per-parameter state tensors, in parameter order (momentum buffers; Adam's
// moments and step count).
std::vector<torch::Tensor> libtorch_state(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> tensors;
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) {
      auto found = optimizer.state().find(compat::optimizer_state_key(parameter));
      if (found == optimizer.state().end()) continue;
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get())) {
        tensors.push_back(sgd->momentum_buffer());
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(found->second.get())) {
        tensors.push_back(adam->exp_avg());
        tensors.push_back(adam->exp_avg_sq());
        tensors.push_back(torch::tensor(static_cast<double>(adam->step())));
      }
    }
  }
  return tensors;
}

// _create_scaling_case: two identical Linear(8, 8) x 2 models, SGD, four (input, target) batches of
// 8x8, MSE loss, an inf injected at iteration 2.
struct ScalingCase {
  torch::nn::Sequential control{nullptr};
  torch::nn::Sequential scaling{nullptr};
  std::unique_ptr<torch::optim::Optimizer> control_optimizer;
  std::unique_ptr<torch::optim::Optimizer> scaling_optimizer;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  int skip_iter = 2;

  explicit ScalingCase(LibTorchOptimizer kind) {
    torch::manual_seed(0);
    control = torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
    scaling = torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
    {
      torch::NoGradGuard no_grad;
      auto c = control->parameters();
      auto s = scaling->parameters();
      for (size_t i = 0; i < c.size(); ++i) s[i].copy_(c[i]);
    }
    control_optimizer = make_libtorch_optimizer(kind, control->parameters());
    scaling_optimizer = make_libtorch_optimizer(kind, scaling->parameters());
    for (int i = 0; i < 4; ++i) data.emplace_back(torch::randn({8, 8}), torch::randn({8, 8}));
  }
};

// run(case, model, optimizer, scaler, try_scaling_api): one training run as in the PyTorch test.
using ScalingRun =
    std::function<void(ScalingCase&, torch::nn::Sequential&, torch::optim::Optimizer&, GradScaler&, bool)>;

// _run_scaling_case, comparing gradients and optimizer state as well as parameters and the scale.
void run_scaling_case(const ScalingRun& run, int unskipped, int skipped, double atol,
                      LibTorchOptimizer kind = LibTorchOptimizer::kSgd) {
  for (bool enabled : {true, false}) {
    SCOPED_TRACE(enabled ? "scaler enabled" : "scaler disabled");
    ScalingCase c(kind);
    // A modest initial scale and growth every step, so errors in growth handling are magnified.
    GradScaler scaler(
        GradScalerOptions().init_scale(128.0).growth_factor(2.0).growth_interval(1).enabled(enabled));
    run(c, c.control, *c.control_optimizer, scaler, false);
    run(c, c.scaling, *c.scaling_optimizer, scaler, true);

    if (enabled) {
      EXPECT_EQ(scaler.scale(), 128.0 * std::pow(2.0, unskipped) * std::pow(0.5, skipped));
      EXPECT_EQ(scaler.skipped_steps(), skipped);
    } else {
      EXPECT_EQ(scaler.scale(), 1.0);
      EXPECT_EQ(scaler.skipped_steps(), 0);
    }
    auto control_params = c.control->parameters();
    auto scaling_params = c.scaling->parameters();
    for (size_t i = 0; i < control_params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(control_params[i], scaling_params[i], 1e-5, atol))
          << "parameter " << i << " max diff "
          << (control_params[i] - scaling_params[i]).abs().max().item<double>();
      const torch::Tensor& cg = control_params[i].grad();
      const torch::Tensor& sg = scaling_params[i].grad();
      ASSERT_EQ(cg.defined(), sg.defined());
      if (cg.defined()) {
        EXPECT_TRUE(torch::allclose(cg, sg, 1e-5, atol))
            << "gradient " << i << " max diff " << (cg - sg).abs().max().item<double>();
      }
    }
    auto control_state = libtorch_state(*c.control_optimizer);
    auto scaling_state = libtorch_state(*c.scaling_optimizer);
    ASSERT_EQ(control_state.size(), scaling_state.size());
    if (kind != LibTorchOptimizer::kSgd) {
      EXPECT_FALSE(control_state.empty());
    }
    for (size_t i = 0; i < control_state.size(); ++i) {
      EXPECT_TRUE(torch::allclose(control_state[i], scaling_state[i], 1e-5, atol)) << "optimizer state " << i;
    }
  }
}

void inject_inf(torch::nn::Sequential& model) {
  model->ptr(1)->as<torch::nn::Linear>()->weight.mutable_grad().fill_(kInf);
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

class GradScalingCases : public ::testing::TestWithParam<LibTorchOptimizer> {};

// test_grad_scaling_autocast: scaling + autocast (bf16 on CPU) against fp32 without either.
TEST_P(GradScalingCases, Autocast) {
  ScalingRun run = [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                      GradScaler& scaler, bool try_scaling_api) {
    for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        AutocastGuard autocast(torch::kCPU, torch::kBFloat16, try_scaling_api);
        loss = mse(model->forward(c.data[i].first), c.data[i].second);
      }
      if (try_scaling_api) {
        scaler.scale(loss).backward();
        if (i == c.skip_iter && scaler.enabled()) inject_inf(model);
        scaler.step(optimizer);
        scaler.update();
      } else {
        loss.backward();
        if (!scaler.enabled() || i != c.skip_iter) optimizer.step();
      }
    }
  };
  // bf16 keeps 8 significant bits (fp16 keeps 11; PyTorch's fp16 case uses 1e-3): the mixed run
  // drifts by up to ~1e-2 from fp32 over four lr-1 steps. A scaling error would be off by 128x.
  run_scaling_case(run, 3, 1, 3e-2, GetParam());
}

// test_grad_scaling_clipping: clip the scaled gradients at max_norm * scale.
TEST_P(GradScalingCases, Clipping) {
  ScalingRun run = [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                      GradScaler& scaler, bool try_scaling_api) {
    const double max_norm = 0.2;
    for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
      optimizer.zero_grad();
      torch::Tensor loss = mse(model->forward(c.data[i].first), c.data[i].second);
      if (try_scaling_api) {
        scaler.scale(loss).backward();
        torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm * scaler.scale());
        if (i == c.skip_iter && scaler.enabled()) inject_inf(model);
        scaler.step(optimizer);
        scaler.update();
      } else {
        loss.backward();
        torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm);
        if (!scaler.enabled() || i != c.skip_iter) optimizer.step();
      }
    }
  };
  run_scaling_case(run, 3, 1, 1e-5, GetParam());
}

// test_grad_scaling_clipping_separate_unscale: unscale_ first, then clip at max_norm — the order
// the Trainer uses.
TEST_P(GradScalingCases, UnscaleThenClip) {
  ScalingRun run = [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                      GradScaler& scaler, bool try_scaling_api) {
    const double max_norm = 0.2;
    for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
      optimizer.zero_grad();
      torch::Tensor loss = mse(model->forward(c.data[i].first), c.data[i].second);
      if (try_scaling_api) {
        scaler.scale(loss).backward();
        if (i == c.skip_iter && scaler.enabled()) inject_inf(model);
        scaler.unscale_(optimizer);
        torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm, 2.0, /*error_if_nonfinite=*/false);
        scaler.step(optimizer);
        scaler.update();
      } else {
        loss.backward();
        torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm);
        if (!scaler.enabled() || i != c.skip_iter) optimizer.step();
      }
    }
  };
  run_scaling_case(run, 3, 1, 1e-6, GetParam());
}

// test_grad_scaling_accumulation: two micro-batches per step, scaler.step/update once per window.
TEST_P(GradScalingCases, Accumulation) {
  ScalingRun run = [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                      GradScaler& scaler, bool try_scaling_api) {
    const int iters_to_accumulate = 2;
    for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
      torch::Tensor loss = mse(model->forward(c.data[i].first), c.data[i].second) / iters_to_accumulate;
      if (try_scaling_api) {
        scaler.scale(loss).backward();
      } else {
        loss.backward();
      }
      if ((i + 1) % iters_to_accumulate == 0) {
        if (try_scaling_api) {
          scaler.step(optimizer);
          scaler.update();
        } else {
          optimizer.step();
        }
        optimizer.zero_grad();
      }
    }
  };
  run_scaling_case(run, 2, 0, 1e-6, GetParam());
}

// Accumulation with an inf in the second window's first micro-batch: the whole window is skipped.
TEST_P(GradScalingCases, AccumulationSkipsTheWindowWithAnInf) {
  ScalingRun run = [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                      GradScaler& scaler, bool try_scaling_api) {
    const int iters_to_accumulate = 2;
    for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
      torch::Tensor loss = mse(model->forward(c.data[i].first), c.data[i].second) / iters_to_accumulate;
      if (try_scaling_api) {
        scaler.scale(loss).backward();
        if (i == c.skip_iter && scaler.enabled()) inject_inf(model);
      } else {
        loss.backward();
      }
      if ((i + 1) % iters_to_accumulate == 0) {
        if (try_scaling_api) {
          EXPECT_EQ(scaler.step(optimizer), !(scaler.enabled() && i == c.skip_iter + 1));
          scaler.update();
        } else if (!scaler.enabled() || i != c.skip_iter + 1) {
          optimizer.step();
        }
        optimizer.zero_grad();
      }
    }
  };
  run_scaling_case(run, 1, 1, 1e-6, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, GradScalingCases,
                         ::testing::Values(LibTorchOptimizer::kSgd, LibTorchOptimizer::kSgdMomentum,
                                           LibTorchOptimizer::kAdam),
                         [](const ::testing::TestParamInfo<LibTorchOptimizer>& info) {
                           switch (info.param) {
                             case LibTorchOptimizer::kSgd:
                               return std::string("Sgd");
                             case LibTorchOptimizer::kSgdMomentum:
                               return std::string("SgdMomentum");
                             case LibTorchOptimizer::kAdam:
                               return std::string("Adam");
                           }
                           return std::string("Unknown");
                         });

// One parameter w with loss = sum(w * g): its gradient is g, so steps are fully controlled.
struct Toy {
  torch::Tensor weight = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD optimizer{std::vector<torch::Tensor>{weight}, torch::optim::SGDOptions(0.5)};

  // A scaled backward with gradient `g`; returns whether the scaler stepped.
  bool step(GradScaler& scaler, const torch::Tensor& g) {
    compat::zero_grad_to_none(optimizer);
    scaler.scale((weight * g).sum()).backward();
    bool stepped = scaler.step(optimizer);
    scaler.update();
    return stepped;
  }
};

TEST(GradScaler, GrowsAfterGrowthIntervalCleanSteps) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().init_scale(4.0).growth_interval(3));
  EXPECT_EQ(scaler.scale(), 4.0);  // before the first scale(): init_scale
  for (int i = 1; i <= 2; ++i) {
    EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
    EXPECT_EQ(scaler.scale(), 4.0);
    EXPECT_EQ(scaler.growth_tracker(), i);
  }
  EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // The gradients the optimizer saw were unscaled: three steps of lr 0.5 x gradient 1.
  EXPECT_TRUE(torch::allclose(toy.weight, torch::full({3}, 1.0 - 3 * 0.5)));
  EXPECT_TRUE(torch::equal(toy.weight.grad(), torch::ones({3})));
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScaler, BacksOffAndSkipsOnInfOrNan) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(2));
  EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  torch::Tensor before = toy.weight.detach().clone();
  EXPECT_FALSE(toy.step(scaler, torch::tensor({1.0, kInf, 1.0})));
  EXPECT_TRUE(torch::equal(toy.weight, before));  // step skipped
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);  // the clean run restarts
  EXPECT_FALSE(toy.step(scaler, torch::tensor({std::nan(""), 1.0, 1.0})));
  EXPECT_TRUE(torch::equal(toy.weight, before));
  EXPECT_EQ(scaler.scale(), 256.0);
  EXPECT_EQ(scaler.skipped_steps(), 2);
  EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
  EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
  EXPECT_EQ(scaler.scale(), 512.0);
}

// ZeRO: each rank checks only its part of the gradients; the reducer (an all-reduce max across
// ranks) stands in here for another rank that saw an inf, so this rank must skip too.
TEST(GradScaler, FoundInfReducerMakesEveryRankSkipTheSameStep) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().init_scale(1024.0));
  bool other_rank_saw_inf = false;
  int calls = 0;
  scaler.set_found_inf_reducer([&](torch::Tensor& flag) {
    ++calls;
    if (other_rank_saw_inf) flag.fill_(1.0);
  });
  EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
  torch::Tensor before = toy.weight.detach().clone();
  other_rank_saw_inf = true;
  EXPECT_FALSE(toy.step(scaler, torch::ones({3})));  // finite here, skipped as the other rank's
  EXPECT_TRUE(torch::equal(toy.weight, before));
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(calls, 2);
}

TEST(GradScaler, DoesNotGrowPastFloatMax) {
  Toy toy;
  const double big = std::ldexp(1.0, 127);  // 2^127; 2^128 overflows fp32
  GradScaler scaler(GradScalerOptions().init_scale(big).growth_interval(1));
  EXPECT_TRUE(toy.step(scaler, torch::full({3}, 1e-30)));
  EXPECT_EQ(scaler.scale(), big);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().enabled(false));
  torch::Tensor loss = (toy.weight * 3.0).sum();
  torch::Tensor scaled = scaler.scale(loss);
  EXPECT_TRUE(scaled.is_same(loss));
  scaled.backward();
  scaler.unscale_(toy.optimizer);
  EXPECT_TRUE(torch::equal(toy.weight.grad(), torch::full({3}, 3.0)));
  EXPECT_TRUE(scaler.step(toy.optimizer));
  scaler.update();
  EXPECT_TRUE(torch::allclose(toy.weight, torch::full({3}, 1.0 - 1.5)));
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_FALSE(scaler.scale_tensor().defined());
  // Even an inf is stepped on: a disabled scaler checks nothing.
  EXPECT_TRUE(toy.step(scaler, torch::tensor({kInf, 1.0, 1.0})));
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScaler, UnscaleBeforeStepIsUsedOnce) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  scaler.scale((toy.weight * 2.0).sum()).backward();
  EXPECT_TRUE(torch::equal(toy.weight.grad(), torch::full({3}, 16.0)));
  scaler.unscale_(toy.optimizer);
  EXPECT_TRUE(torch::equal(toy.weight.grad(), torch::full({3}, 2.0)));
  EXPECT_TRUE(scaler.step(toy.optimizer));  // does not unscale again
  EXPECT_TRUE(torch::allclose(toy.weight, torch::full({3}, 0.0)));
  scaler.update();
}

TEST(GradScaler, MisuseIsReported) {
  Toy toy;
  GradScaler scaler;
  EXPECT_THROW(scaler.unscale_(toy.optimizer), Error);  // no scale() yet
  scaler.scale(toy.weight.sum()).backward();
  EXPECT_THROW(scaler.update(), Error);  // nothing recorded yet
  scaler.unscale_(toy.optimizer);
  EXPECT_THROW(scaler.unscale_(toy.optimizer), Error);
  scaler.step(toy.optimizer);
  EXPECT_THROW(scaler.step(toy.optimizer), Error);
  EXPECT_THROW(scaler.unscale_(toy.optimizer), Error);
  scaler.update();
  scaler.unscale_(toy.optimizer);  // a new iteration may unscale again
}

TEST(GradScaler, Fp16GradientsAreRejected) {
  torch::Tensor half = torch::ones({2}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
  torch::optim::SGD optimizer(std::vector<torch::Tensor>{half}, torch::optim::SGDOptions(0.1));
  half.mutable_grad() = torch::ones({2}, torch::kHalf);
  GradScaler scaler;
  scaler.scale(torch::ones({}));
  try {
    scaler.unscale_(optimizer);
    FAIL() << "expected Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("fp16"), std::string::npos) << error.what();
  }
}

TEST(GradScaler, InvalidOptionsNameTheKey) {
  auto message_of = [](const GradScalerOptions& options) {
    try {
      GradScaler scaler(options);
    } catch (const ConfigError& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_NE(message_of(GradScalerOptions().init_scale(0)).find("scaler.init_scale"), std::string::npos);
  EXPECT_NE(
      message_of(GradScalerOptions().growth_factor(1.0)).find("scaler.growth_factor must be > 1, got 1"),
      std::string::npos);
  EXPECT_NE(message_of(GradScalerOptions().backoff_factor(1.5)).find("scaler.backoff_factor"),
            std::string::npos);
  EXPECT_NE(message_of(GradScalerOptions().growth_interval(0)).find("scaler.growth_interval"),
            std::string::npos);
}

TEST(GradScaler, EachOptimizerStepsOnItsOwnCheckButUpdateSeesAll) {
  torch::Tensor a = torch::ones({2}, torch::requires_grad());
  torch::Tensor b = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD opt_a(std::vector<torch::Tensor>{a}, torch::optim::SGDOptions(1.0));
  torch::optim::SGD opt_b(std::vector<torch::Tensor>{b}, torch::optim::SGDOptions(1.0));
  GradScaler scaler(GradScalerOptions().init_scale(16.0));
  scaler.scale((a * torch::tensor({1.0, kInf})).sum() + b.sum()).backward();
  EXPECT_FALSE(scaler.step(opt_a));
  EXPECT_TRUE(scaler.step(opt_b));
  scaler.update();
  EXPECT_TRUE(torch::equal(a, torch::ones({2})));
  EXPECT_TRUE(torch::equal(b, torch::zeros({2})));
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(GradScaler, OptimizerWithoutGradientsStillSteps) {
  Toy toy;
  GradScaler scaler;
  scaler.scale(torch::ones({}));  // creates the scale; no backward through the toy's weight
  EXPECT_TRUE(scaler.step(toy.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, UpdateToAGivenScale) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().init_scale(64.0));
  EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
  scaler.scale(toy.weight.sum()).backward();
  scaler.step(toy.optimizer);
  scaler.update(4.0);
  EXPECT_EQ(scaler.scale(), 4.0);
}

TEST(GradScaler, StateRoundTripResumesExactly) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().init_scale(256.0).growth_interval(3).backoff_factor(0.25));
  toy.step(scaler, torch::ones({3}));
  toy.step(scaler, torch::tensor({kInf, 1.0, 1.0}));
  toy.step(scaler, torch::ones({3}));
  GradScalerState saved = scaler.state();
  EXPECT_EQ(saved.scale, 64.0);
  EXPECT_EQ(saved.growth_tracker, 1);
  EXPECT_EQ(saved.skipped_steps, 1);

  // Through JSON, into a scaler built with different options and not yet used.
  nlohmann::json json = nlohmann::json::parse(saved.to_json().dump());
  GradScaler resumed(GradScalerOptions().init_scale(2.0).growth_interval(100));
  resumed.load_state(GradScalerState::from_json(json));
  EXPECT_EQ(resumed.scale(), 64.0);
  EXPECT_EQ(resumed.growth_tracker(), 1);
  EXPECT_EQ(resumed.skipped_steps(), 1);
  EXPECT_EQ(resumed.options().growth_interval(), 3);
  EXPECT_EQ(resumed.options().backoff_factor(), 0.25);

  Toy toy2;
  for (int i = 0; i < 3; ++i) {
    toy.step(scaler, torch::ones({3}));
    toy2.step(resumed, torch::ones({3}));
    EXPECT_EQ(resumed.scale(), scaler.scale()) << "step " << i;
    EXPECT_EQ(resumed.growth_tracker(), scaler.growth_tracker()) << "step " << i;
  }
  EXPECT_EQ(scaler.scale(), 128.0);  // grew after the 2 remaining clean steps

  // Loading into a scaler already in use overwrites its tensors.
  resumed.load_state(saved);
  EXPECT_EQ(resumed.scale(), 64.0);
  EXPECT_EQ(resumed.growth_tracker(), 1);
}

// A captured step's warm-up (Trainer::capture_ahead) undoes its steps with put_back: the scale, the growth
// tracker and the skip count as they were, in the tensors the scaler holds, and it then scales as before.
TEST(GradScaler, PutBackUndoesStepsInPlace) {
  Toy toy;
  GradScaler scaler(GradScalerOptions().init_scale(256.0).growth_interval(2));
  toy.step(scaler, torch::ones({3}));
  const GradScalerState saved = scaler.state();
  const torch::Tensor scaled_before = scaler.scale(torch::ones({}));
  toy.step(scaler, torch::tensor({kInf, 1.0, 1.0}));  // backs off, skips
  toy.step(scaler, torch::ones({3}));
  ASSERT_NE(scaler.scale(), saved.scale);
  scaler.put_back(saved);
  EXPECT_EQ(scaler.scale(), 256.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.skipped_steps(), 0);
  EXPECT_TRUE(torch::equal(scaler.scale(torch::ones({})), scaled_before));
  EXPECT_TRUE(toy.step(scaler, torch::ones({3})));
  EXPECT_EQ(scaler.scale(), 512.0) << "the growth tracker's count went on from where it was";

  GradScaler unused(GradScalerOptions().init_scale(8.0));  // no tensors yet: the first scale() makes them
  GradScalerState grown = unused.state();
  grown.growth_tracker = 3;
  unused.put_back(grown);
  EXPECT_EQ(unused.growth_tracker(), 3);
}

TEST(GradScaler, StateErrors) {
  GradScaler disabled(GradScalerOptions().enabled(false));
  GradScalerState from_disabled = disabled.state();
  EXPECT_FALSE(from_disabled.enabled);
  GradScaler enabled;
  EXPECT_THROW(enabled.load_state(from_disabled), Error);
  disabled.load_state(enabled.state());  // a disabled scaler ignores states
  EXPECT_EQ(disabled.scale(), 1.0);

  nlohmann::json json = enabled.state().to_json();
  json.erase("growth_tracker");
  try {
    GradScalerState::from_json(json);
    FAIL() << "expected Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("growth_tracker"), std::string::npos) << error.what();
  }
  json = enabled.state().to_json();
  json["scale"] = "big";
  EXPECT_THROW(GradScalerState::from_json(json), Error);
  GradScalerState bad = enabled.state();
  bad.growth_factor = 0.5;
  EXPECT_THROW(enabled.load_state(bad), ConfigError);
}

// Which fused AMP kernels this LibTorch registers; the portable path must agree with them where
// both exist (on CUDA builds, the *_CUDA test below).
TEST(AmpKernels, ProbeReportsWhatTheBuildHas) {
  EXPECT_TRUE(compat::has_kernel("aten::relu", torch::kCPU));  // registered for CPU (and CUDA) by name
  EXPECT_FALSE(compat::has_kernel("aten::no_such_op_", torch::kCPU));
  bool cpu = compat::has_amp_kernels(torch::kCPU);
  bool cuda = compat::has_amp_kernels(torch::Device(torch::kCUDA, 0));
  std::cout << "LibTorch " << compat::torch_version() << ": fused AMP kernels on cpu " << cpu << ", cuda "
            << cuda << "\n";
#if !FASTTRAIN_TORCH_AT_LEAST(2, 0)
  EXPECT_FALSE(cpu);  // 1.13 registers them for CUDA only
#endif
  if (torch::cuda::is_available()) {
    EXPECT_TRUE(cuda);
  }
}

// On a GPU: the fused CUDA kernels and the portable CPU path agree step by step.
TEST(GradScaler, FusedKernelsMatchPortablePath_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  std::vector<torch::Tensor> grads_sequence = {torch::ones({3}), torch::tensor({1.0, kInf, 1.0}),
                                               torch::ones({3}), torch::full({3}, 1e-3),
                                               torch::tensor({std::nan(""), 0.0, 0.0})};
  std::vector<double> scales[2];
  std::vector<torch::Tensor> weights[2];
  for (int d = 0; d < 2; ++d) {
    torch::Device device = d == 0 ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA, 0);
    torch::Tensor weight = torch::ones({3}, torch::TensorOptions().device(device).requires_grad(true));
    torch::optim::SGD optimizer(std::vector<torch::Tensor>{weight}, torch::optim::SGDOptions(0.5));
    GradScaler scaler(GradScalerOptions().init_scale(32.0).growth_interval(2));
    for (const torch::Tensor& g : grads_sequence) {
      compat::zero_grad_to_none(optimizer);
      scaler.scale((weight * g.to(device)).sum()).backward();
      scaler.step(optimizer);
      scaler.update();
      scales[d].push_back(scaler.scale());
      weights[d].push_back(weight.detach().cpu().clone());
    }
  }
  EXPECT_EQ(scales[0], scales[1]);
  for (size_t i = 0; i < weights[0].size(); ++i) EXPECT_TRUE(torch::allclose(weights[0][i], weights[1][i]));
}

// Where LibTorch registers ATen's fused loss-scaling kernels for the CPU (2.x), the portable
// arithmetic that GradScaler runs elsewhere (1.13's CPU) must equal them, step by step: unscaling
// with and without non-finite values, a found_inf that is already set, growth, backoff, and growth
// that would overflow fp32.
TEST(GradScaler, PortableArithmeticEqualsAtensFusedKernelsOnTheCpu) {
  if (!compat::has_amp_kernels(torch::kCPU)) {
    GTEST_SKIP()
        << "LibTorch " << TORCH_VERSION << " registers no CPU kernels for _amp_foreach_non_finite_check_"
        << "and_unscale_ / _amp_update_scale_ (they came with 2.x); the _CUDA test checks them on a GPU";
  }
  const double nan = std::nan("");
  const std::vector<std::vector<torch::Tensor>> unscale_cases = {
      {torch::tensor({1.0f, -2.0f, 3.0f}), torch::tensor({0.5f})},
      {torch::tensor({1.0f, static_cast<float>(kInf)}), torch::tensor({4.0f, 5.0f})},
      {torch::tensor({static_cast<float>(nan), 1.0f}), torch::tensor({-kInf}).to(torch::kFloat32)},
      {torch::full({1000}, 3e-3f), torch::arange(17, torch::kFloat32)}};
  for (size_t c = 0; c < unscale_cases.size(); ++c) {
    for (float found_before : {0.0f, 1.0f}) {
      std::vector<torch::Tensor> fused, portable;
      for (const auto& g : unscale_cases[c]) {
        fused.push_back(g.clone());
        portable.push_back(g.clone());
      }
      torch::Tensor found_fused = torch::full({1}, found_before),
                    found_portable = torch::full({1}, found_before);
      const torch::Tensor inv_scale = torch::full({1}, 1.0f / 1024.0f);
      at::_amp_foreach_non_finite_check_and_unscale_(fused, found_fused, inv_scale);
      portable_amp::non_finite_check_and_unscale(portable, found_portable, inv_scale);
      EXPECT_TRUE(torch::equal(found_fused, found_portable))
          << "case " << c << ": " << found_fused << found_portable;
      for (size_t i = 0; i < fused.size(); ++i) {
        EXPECT_TRUE(torch::allclose(fused[i], portable[i], 0, 0, /*equal_nan=*/true))
            << "case " << c << " grad " << i;
      }
    }
  }
  // update: (found_inf per step) from a scale of 2^15, growth 2, backoff 0.5, interval 2; then from
  // 3e38, where growing overflows fp32 and the scale must stay.
  for (float start : {32768.0f, 3e38f}) {
    torch::Tensor scale_fused = torch::full({1}, start), scale_portable = torch::full({1}, start);
    torch::Tensor tracker_fused = torch::zeros({1}, torch::kInt32),
                  tracker_portable = torch::zeros({1}, torch::kInt32);
    for (float found : {0.0f, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f, 0.0f}) {
      const torch::Tensor found_inf = torch::full({1}, found);
      at::_amp_update_scale_(scale_fused, tracker_fused, found_inf, 2.0, 0.5, 2);
      portable_amp::update_scale(scale_portable, tracker_portable, found_inf, 2.0, 0.5, 2);
      ASSERT_TRUE(torch::equal(scale_fused, scale_portable)) << scale_fused << scale_portable;
      ASSERT_TRUE(torch::equal(tracker_fused, tracker_portable)) << tracker_fused << tracker_portable;
    }
  }
}

}  // namespace
}  // namespace fasttrain
