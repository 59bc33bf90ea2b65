// EMA: the averaging math, buffer copies, and the in-place swap of SwapGuard.
#include "fasttrain/optim/ema.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

struct Net : torch::nn::Module {
  Net() {
    linear = register_module("linear", torch::nn::Linear(3, 2));
    norm = register_module("norm", torch::nn::BatchNorm1d(2));
    to(torch::kDouble);
  }
  torch::Tensor forward(const torch::Tensor& x) { return norm(linear(x)); }
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

// Sets every parameter to `value` (what an optimizer step would have produced).
void set_parameters(torch::nn::Module& model, double value) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.fill_(value);
}

std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  for (const auto& t : tensors) copies.push_back(t.detach().clone());
  return copies;
}

TEST(Ema, WarmupDecayMatchesHandComputation) {
  Net model;
  set_parameters(model, 1.0);
  Ema ema(model, EmaOptions(0.3));  // warmup on: decay_t = min(0.3, (1 + t) / (10 + t))
  double expected = 1.0;
  const std::vector<double> values = {2.0, -1.0, 4.0, 0.5, 3.0};
  for (size_t t = 0; t < values.size(); ++t) {
    set_parameters(model, values[t]);
    ema.update();
    const double decay = std::min(0.3, (1.0 + t) / (10.0 + t));
    expected = decay * expected + (1 - decay) * values[t];
    for (size_t i = 0; i < model.parameters().size(); ++i) {
      EXPECT_TRUE(torch::allclose(ema.shadow()[i], torch::full_like(ema.shadow()[i], expected), 1e-14, 1e-14))
          << "update " << t << ": " << ema.shadow()[i] << " vs " << expected;
    }
  }
  EXPECT_EQ(ema.updates(), 5);
  // The first three updates are warm-up limited (0.1, 0.18, 0.25 < 0.3), the rest use 0.3: the
  // expected value above went through both branches.
  EXPECT_LT((1.0 + 2) / (10.0 + 2), 0.3);
  EXPECT_GT((1.0 + 3) / (10.0 + 3), 0.3);
}

TEST(Ema, EveryNStepsUsesDecayToTheN) {
  Net model;
  set_parameters(model, 0.0);
  Ema ema(model, EmaOptions(0.9).warmup(false).every(3));
  double expected = 0.0;
  for (int step = 1; step <= 7; ++step) {
    set_parameters(model, step);
    ema.update();
    if (step % 3 == 0) expected = std::pow(0.9, 3) * expected + (1 - std::pow(0.9, 3)) * step;
    EXPECT_NEAR(ema.shadow()[0].flatten()[0].item<double>(), expected, 1e-14) << "step " << step;
  }
  EXPECT_EQ(ema.updates(), 2);
}

TEST(Ema, LookaheadSetsTheWeightsToTheAverageAtEachUpdateAndOnlyThen) {
  Net with, without;
  set_parameters(with, 1.0), set_parameters(without, 1.0);
  Ema lookahead(with, EmaOptions(0.5).warmup(false).every(2).lookahead(true));
  Ema plain(without, EmaOptions(0.5).warmup(false).every(2));
  // decay^2 = 0.25 per update, every 2 calls; the model continues from the average under lookahead.
  double average = 1.0, live = 1.0;
  for (int call = 1; call <= 4; ++call) {
    live += 1.0;  // an optimizer step
    set_parameters(with, live), set_parameters(without, 1.0 + call);
    lookahead.update(), plain.update();
    if (call % 2 == 0) {
      average = 0.25 * average + 0.75 * live;
      live = average;
    }
    for (const auto& p : with.parameters()) EXPECT_DOUBLE_EQ(p.min().item<double>(), live) << "call " << call;
    for (const auto& p : without.parameters()) EXPECT_DOUBLE_EQ(p.max().item<double>(), 1.0 + call);
    EXPECT_DOUBLE_EQ(lookahead.shadow().front().max().item<double>(), average) << "call " << call;
  }
}

TEST(Ema, AfterStepStartsTheAverageAtTheWeightsAndLeavesEvaluationsToThemUntilThen) {
  Net model;
  set_parameters(model, 1.0);
  Ema ema(model, EmaOptions(0.5).warmup(false).every(2).after_step(3));
  const torch::Tensor weight = model.linear->weight;
  for (double value : {2.0, 3.0, 4.0}) {  // the first three calls: no averaging, the guard leaves the weights
    set_parameters(model, value);
    ema.update();
    EXPECT_FALSE(ema.averaging());
    Ema::SwapGuard guard(ema);
    EXPECT_EQ(weight.max().item<double>(), value);
  }
  EXPECT_EQ(ema.updates(), 1);  // call 2's update slot, counted though skipped
  set_parameters(model, 5.0);
  ema.update();  // call 4: the first update, at the weights (5), then 0.25 * 5 + 0.75 * 5
  EXPECT_TRUE(ema.averaging());
  EXPECT_EQ(ema.updates(), 2);
  EXPECT_DOUBLE_EQ(ema.shadow()[0].max().item<double>(), 5.0);
  set_parameters(model, 7.0);
  ema.update();  // call 5: not an update step
  set_parameters(model, 10.0);
  ema.update();  // call 6: 0.25 * 5 + 0.75 * 10
  EXPECT_DOUBLE_EQ(ema.shadow()[0].max().item<double>(), 0.25 * 5 + 0.75 * 10);
  {
    Ema::SwapGuard guard(ema);
    EXPECT_DOUBLE_EQ(weight.max().item<double>(), 8.75);
  }
  EXPECT_EQ(weight.max().item<double>(), 10.0);
}

// With every = 2 and after_step = 4, call 5 is past after_step but not an update step: the average has not
// started, so an evaluation there sees the weights, not the averages' initial values.
TEST(Ema, TheAverageStartsAtTheFirstUpdateAfterAfterStep) {
  Net model;
  set_parameters(model, 1.0);
  Ema ema(model, EmaOptions(0.5).warmup(false).every(2).after_step(4));
  for (int call = 1; call <= 5; ++call) {
    set_parameters(model, 10.0 * call);
    ema.update();
    EXPECT_FALSE(ema.averaging()) << "call " << call;
    Ema::SwapGuard guard(ema);
    EXPECT_EQ(model.linear->weight.max().item<double>(), 10.0 * call) << "call " << call;
  }
  set_parameters(model, 60.0);
  ema.update();  // call 6: the first update after after_step, at the weights
  EXPECT_TRUE(ema.averaging());
  EXPECT_DOUBLE_EQ(ema.shadow()[0].max().item<double>(), 60.0);
}

TEST(Ema, AfterStepKeepsTheWarmUpsCountOfEveryStep) {
  // With the warm-up, the first update after 100 skipped steps already uses decay_t of t = 101: the
  // average a run evaluating late sees, less the updates whose weight had decayed away.
  Net model;
  Ema ema(model, EmaOptions(0.99).after_step(100));
  for (int step = 0; step < 100; ++step) ema.update();
  set_parameters(model, 2.0);
  ema.update();
  set_parameters(model, 4.0);
  ema.update();
  const double decay = (1.0 + 101) / (10.0 + 101);
  EXPECT_NEAR(ema.shadow()[0].max().item<double>(), decay * 2.0 + (1 - decay) * 4.0, 1e-12);
}

TEST(Ema, BuffersAreCopiedNotAveraged) {
  torch::manual_seed(0);
  Net model;
  Ema ema(model, EmaOptions(0.99));
  model.train();
  model.forward(torch::randn({8, 3}, torch::kDouble) * 5 + 2);  // moves the running stats
  ema.update();
  const auto buffers = model.buffers();
  const size_t parameter_count = model.parameters().size();
  ASSERT_EQ(ema.shadow().size(), parameter_count + buffers.size());
  ASSERT_EQ(buffers.size(), 3u);  // running_mean, running_var, num_batches_tracked
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_TRUE(torch::equal(ema.shadow()[parameter_count + i], buffers[i])) << i;
  }
  EXPECT_EQ(ema.shadow().back().item<double>(), 1);  // num_batches_tracked: a count, copied as is
}

TEST(Ema, SwapGuardSwapsInPlaceAndRestoresExactly) {
  torch::manual_seed(1);
  Net model;
  Ema ema(model, EmaOptions(0.5).warmup(false));
  set_parameters(model, 3.0);
  ema.update();  // averages differ from the live values now
  const auto live = model.parameters();
  const auto before = snapshot(live);
  const auto averages = snapshot(ema.shadow());
  std::vector<const void*> addresses, impls;
  for (const auto& p : live) {
    addresses.push_back(p.data_ptr());
    impls.push_back(p.unsafeGetTensorImpl());
  }
  {
    Ema::SwapGuard guard(ema);
    const auto swapped = model.parameters();
    for (size_t i = 0; i < swapped.size(); ++i) {
      EXPECT_TRUE(torch::equal(swapped[i], averages[i])) << i;
      EXPECT_TRUE(torch::equal(ema.shadow()[i], before[i])) << i;
      EXPECT_EQ(swapped[i].data_ptr(), addresses[i]) << i;
      EXPECT_EQ(swapped[i].unsafeGetTensorImpl(), impls[i]) << i;
    }
    EXPECT_THROW(ema.update(), Error);
    EXPECT_THROW(Ema::SwapGuard nested(ema), Error);
  }
  const auto restored = model.parameters();
  for (size_t i = 0; i < restored.size(); ++i) {
    EXPECT_TRUE(torch::equal(restored[i], before[i])) << i;
    EXPECT_TRUE(torch::equal(ema.shadow()[i], averages[i])) << i;
    EXPECT_EQ(restored[i].data_ptr(), addresses[i]) << i;
  }
}

TEST(Ema, OptimizerStillUpdatesTheModelAfterTheGuard) {
  torch::manual_seed(2);
  Net model;
  auto optimizer = make_optimizer(model.named_parameters(), OptimizerOptions("sgd").lr(0.5).momentum(0));
  Ema ema(model, EmaOptions(0.9));
  set_parameters(model, 1.0);
  ema.update();
  { Ema::SwapGuard guard(ema); }
  const auto before = snapshot(model.parameters());
  const auto averages = snapshot(ema.shadow());
  for (auto& p : model.parameters()) p.mutable_grad() = torch::ones_like(p);
  optimizer->step(torch::full({}, 0.5, torch::kDouble));
  const auto after = model.parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(torch::allclose(after[i], before[i] - 0.5)) << i;
    EXPECT_TRUE(torch::equal(ema.shadow()[i], averages[i])) << i;  // the step moved the model only
  }
}

// The CPU computes decay_t on the host from the count of updates; a GPU keeps it on the device (for CUDA
// graphs). The same updates, warm-up and every = 2 included, give the same averages on both.
TEST(Ema, TheDeviceCountAveragesAsTheHostCount_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Net on_cpu, on_gpu;
  set_parameters(on_cpu, 0.25), set_parameters(on_gpu, 0.25);  // the two start from the same averages
  on_gpu.to(torch::kCUDA);
  Ema host(on_cpu, EmaOptions(0.7).every(2)), device(on_gpu, EmaOptions(0.7).every(2));
  for (int call = 1; call <= 9; ++call) {
    set_parameters(on_cpu, 0.5 * call), set_parameters(on_gpu, 0.5 * call);
    host.update(), device.update();
  }
  for (size_t i = 0; i < host.shadow().size(); ++i)
    EXPECT_TRUE(torch::allclose(host.shadow()[i], device.shadow()[i].cpu(), 1e-14, 1e-14)) << i;
}

// What a CUDA graph replays, on the CPU: the device count runs the updates before ema.after_step with
// decay_t = 0 where the host's count skips them, and gives the same averages and the same evaluations,
// with and without the warm-up, every = 2 and lookahead. Values differ at every call, so an average that
// started a call early or late, or kept an old weight, differs.
TEST(Ema, TheDeviceCountGivesTheHostCountsAveragesAfterStep) {
  const std::vector<EmaOptions> cases = {
      EmaOptions(0.7).after_step(4),
      EmaOptions(0.7).warmup(false).after_step(3),
      EmaOptions(0.6).every(2).after_step(3),
      EmaOptions(0.6).warmup(false).every(2).after_step(4).lookahead(true),
      EmaOptions(0.7),  // after_step 0: no update is zeroed
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    Net on_host, on_device;
    set_parameters(on_host, 0.25), set_parameters(on_device, 0.25);
    Ema host(on_host, cases[c]), device(on_device, cases[c], Ema::Count::kDevice);
    for (int call = 1; call <= 9; ++call) {
      set_parameters(on_host, 0.5 * call * call), set_parameters(on_device, 0.5 * call * call);
      host.update(), device.update();
      ASSERT_EQ(host.averaging(), device.averaging()) << "case " << c << " call " << call;
      for (size_t i = 0; host.averaging() && i < host.shadow().size(); ++i) {
        EXPECT_TRUE(torch::allclose(host.shadow()[i], device.shadow()[i], 1e-14, 1e-14))
            << "case " << c << " call " << call << " tensor " << i;
      }
      Ema::SwapGuard host_weights(host), device_weights(device);
      EXPECT_TRUE(torch::allclose(on_host.linear->weight, on_device.linear->weight, 1e-14, 1e-14))
          << "case " << c << " call " << call;
    }
  }
}

// A restored count sets decay_t's warm-up where it left off.
TEST(Ema, LoadStateContinuesTheWarmUpFromTheRestoredCount) {
  Net model;
  set_parameters(model, 1.0);
  Ema ema(model, EmaOptions(0.9));
  ema.load_state(snapshot(ema.shadow()), 4, 4);
  set_parameters(model, 3.0);
  ema.update();
  const double decay = std::min(0.9, (1.0 + 4) / (10.0 + 4));  // t = the 4 updates restored
  EXPECT_NEAR(ema.shadow()[0].flatten()[0].item<double>(), decay * 1.0 + (1 - decay) * 3.0, 1e-14);
}

TEST(Ema, InvalidOptionsNameTheKey) {
  Net model;
  for (const auto& [options, needle] :
       std::vector<std::pair<EmaOptions, std::string>>{{EmaOptions(1.5), "ema.decay"},
                                                       {EmaOptions(-0.1), "ema.decay"},
                                                       {EmaOptions(0.9).every(0), "ema.every"}}) {
    try {
      Ema ema(model, options);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fasttrain
