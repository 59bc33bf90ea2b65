// The step engines (train/step_engine.h): when a step can be captured, what train.cuda_graphs does
// where it cannot, the device-side bookkeeping a captured step relies on (the LR table, the loss
// tracker), and on a GPU: N captured steps equal N eager steps.
#include "fasttrain/train/step_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/optim/schedule.h"
#include "fasttrain/detail/loss_tracker.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

CaptureFacts capturable() {
  CaptureFacts facts;
  facts.cuda_device = facts.cuda_build = true;
  return facts;
}

TEST(StepEngine, EachBlockerIsNamed) {
  EXPECT_FALSE(capture_blocker(capturable()).has_value());
  struct Case {
    std::function<void(CaptureFacts&)> change;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {[](CaptureFacts& f) { f.cuda_device = false; }, "CUDA device"},
      {[](CaptureFacts& f) { f.cuda_build = false; }, "without CUDA"},
      {[](CaptureFacts& f) { f.distributed = true; }, "distributed"},
      {[](CaptureFacts& f) { f.fixed_shapes = false; }, "change shape"},
      {[](CaptureFacts& f) { f.whole_windows = false; }, "accumulation windows"},
      {[](CaptureFacts& f) { f.momentum_cycles = true; }, "momentum"},
      {[](CaptureFacts& f) { f.fused_optimizer = false; }, "optim.kernel"},
      {[](CaptureFacts& f) { f.ema_every_step = false; }, "ema.every"},
      {[](CaptureFacts& f) { f.detect_anomaly = true; }, "detect_anomaly"},
  };
  for (const auto& c : cases) {
    CaptureFacts facts = capturable();
    c.change(facts);
    const auto blocker = capture_blocker(facts);
    ASSERT_TRUE(blocker.has_value()) << c.reason;
    EXPECT_NE(blocker->find(c.reason), std::string::npos) << *blocker;
  }
}

TEST(StepEngine, AutoFallsBackWithTheReasonTrueFailsWithItFalseRunsEager) {
  CaptureFacts blocked = capturable();
  blocked.distributed = true;
  const EngineChoice automatic = choose_engine("auto", blocked);
  EXPECT_FALSE(automatic.capture);
  EXPECT_NE(automatic.reason.find("distributed"), std::string::npos) << automatic.reason;
  EXPECT_TRUE(choose_engine("auto", capturable()).capture);
  EXPECT_TRUE(choose_engine("true", capturable()).capture);
  const std::string message = testing::error_message([&] { choose_engine("true", blocked); });
  EXPECT_TRUE(testing::contains_all(message, {"train.cuda_graphs = true", "distributed"})) << message;
  EXPECT_THROW(choose_engine("true", blocked), ConfigError);
  const EngineChoice off = choose_engine("false", capturable());
  EXPECT_FALSE(off.capture);
  EXPECT_TRUE(off.reason.empty());
  const std::string wrong = testing::error_message([&] { choose_engine("yes", capturable()); });
  EXPECT_TRUE(testing::contains_all(wrong, {"train.cuda_graphs", "'yes'", "auto, true, false"})) << wrong;
}

TEST(StepEngine, LrTableHoldsTheScheduleAndItsLastValuePastTheEnd) {
  auto schedule = make_schedule(ScheduleOptions("one-cycle"), 0.01, 0.9, 50);
  LrTable table(*schedule, 50, torch::kCPU);
  EXPECT_EQ(table.size(), 51);
  for (int64_t step = 0; step <= 60; ++step) {
    const double expected = schedule->lr(std::min<int64_t>(step, 50));
    EXPECT_DOUBLE_EQ(table.at(step).item<double>(), expected) << step;
    const torch::Tensor counter = torch::full({}, step, torch::kLong);
    EXPECT_DOUBLE_EQ(table.at(counter).item<double>(), expected) << step;
  }
}

TEST(StepEngine, LossTrackerSumsOnTheDeviceAndNamesTheFirstBadStep) {
  LossTracker losses(torch::kCPU);
  for (int step = 1; step <= 3; ++step)
    losses.add(torch::full({}, 0.5 * step), torch::full({}, step, torch::kLong));
  EXPECT_DOUBLE_EQ(losses.take_sum(), 3.0);
  EXPECT_DOUBLE_EQ(losses.take_sum(), 0.0);  // restarted
  losses.check_finite("advice");             // nothing bad: no error
  losses.add(torch::full({}, 1.0), torch::full({}, 4, torch::kLong));
  losses.add(torch::full({}, NAN), torch::full({}, 5, torch::kLong));
  losses.add(torch::full({}, INFINITY), torch::full({}, 6, torch::kLong));
  const std::string message = testing::error_message([&] { losses.check_finite("lower optim.lr"); });
  EXPECT_TRUE(testing::contains_all(message, {"nan", "step 5", "lower optim.lr"})) << message;
  losses.check_finite("advice");  // the check starts over
}

// ---- through the Trainer ----

TransformPipeline plain_pipeline() {
  return TransformPipeline({0.5f}, {0.25f});
}

struct TrainerCase {
  std::shared_ptr<Model> model;
  std::unique_ptr<Trainer> trainer;
};

// A conv net with BatchNorm, AdamW (optim.kernel auto), one-cycle over `steps`, clipping, EMA and
// accumulation 2: everything a captured step holds.
TrainerCase conv_trainer(torch::Device device, const std::string& cuda_graphs, const std::string& precision,
                         int64_t steps) {
  torch::manual_seed(7);
  TrainerCase c;
  c.model = make_model(ModelOptions("cnn")
                           .in_channels(1)
                           .height(8)
                           .width(8)
                           .num_classes(4)
                           .widths({4, 8})
                           .hidden({16})
                           .batchnorm(true));
  c.model->to(device);
  auto optimizer =
      make_optimizer(c.model->named_parameters(), OptimizerOptions("adamw").lr(1e-2).weight_decay(0.01));
  auto schedule = make_schedule(ScheduleOptions("one-cycle").cycle_momentum(false), 1e-2, 0.9, steps);
  c.trainer = std::make_unique<Trainer>(
      c.model, std::move(optimizer), std::move(schedule),
      TrainOptions().max_steps(steps).accumulation(2).clip_norm(0.5).precision(precision).cuda_graphs(
          cuda_graphs),
      device);
  c.trainer->enable_ema(EmaOptions(0.9));
  return c;
}

TEST(StepEngine, OnTheCpuAutoRunsEagerAndSaysWhyAndTrueIsAnError) {
  auto data = testing::synthetic_images(64);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(8).workers(0));
  TrainerCase automatic = conv_trainer(torch::kCPU, "auto", "fp32", 4);
  const FitSummary summary = automatic.trainer->fit(loader, nullptr);
  EXPECT_EQ(summary.step_engine, "eager");
  EXPECT_NE(automatic.trainer->engine_reason().find("CUDA device"), std::string::npos)
      << automatic.trainer->engine_reason();
  EXPECT_EQ(summary.steps, 4);
  TrainerCase forced = conv_trainer(torch::kCPU, "true", "fp32", 4);
  EXPECT_THROW(forced.trainer->fit(loader, nullptr), ConfigError);
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    const double difference =
        (a[i].cpu().to(torch::kDouble) - b[i].cpu().to(torch::kDouble)).abs().max().item<double>();
    EXPECT_LE(difference, tolerance) << what << " " << i;
  }
}

// N captured steps equal N eager steps: weights, BatchNorm statistics, optimizer moments and step
// counts, EMA averages, the logged loss. Resident data (batches gathered on the GPU) on both sides.
TEST(StepEngine, CapturedStepsEqualEagerSteps_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  auto data = testing::synthetic_images(256);
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    const int64_t steps = 14;  // 3 warm-up steps, the capture, 10 replays
    std::vector<FitSummary> summaries;
    std::vector<TrainerCase> runs;
    for (const std::string graphs : {"false", "true"}) {
      DataLoader loader(data, plain_pipeline(), LoaderOptions(16).device(cuda).device_resident(true).seed(3));
      runs.push_back(conv_trainer(cuda, graphs, precision, steps));
      summaries.push_back(runs.back().trainer->fit(loader, nullptr));
    }
    EXPECT_EQ(summaries[0].step_engine, "eager") << precision;
    EXPECT_EQ(summaries[1].step_engine, "cuda_graph") << precision;
    EXPECT_EQ(runs[1].trainer->step(), steps) << precision;
    // The same kernels in the same order: differences are the graph's, i.e. none beyond rounding.
    const double tolerance = precision == "fp32" ? 1e-5 : 1e-3;
    expect_close(runs[0].model->parameters(), runs[1].model->parameters(), tolerance, precision + " weights");
    expect_close(runs[0].model->buffers(), runs[1].model->buffers(), tolerance, precision + " buffers");
    expect_close(runs[0].trainer->ema()->shadow(), runs[1].trainer->ema()->shadow(), tolerance,
                 precision + " EMA");
    EXPECT_EQ(runs[0].trainer->ema()->updates(), runs[1].trainer->ema()->updates());
    const Optimizer& eager = runs[0].trainer->optimizer();
    const Optimizer& captured = runs[1].trainer->optimizer();
    for (size_t g = 0; g < eager.groups().size(); ++g) {
      for (size_t i = 0; i < eager.groups()[g].params.size(); ++i) {
        EXPECT_DOUBLE_EQ(eager.step_count(g, i).item<double>(), captured.step_count(g, i).item<double>());
        for (size_t f = 0; f < eager.state_fields().size(); ++f)
          expect_close({eager.state(g, f, i)}, {captured.state(g, f, i)}, tolerance, precision + " moments");
      }
    }
    EXPECT_DOUBLE_EQ(runs[0].trainer->scaler().scale(), runs[1].trainer->scaler().scale()) << precision;
    EXPECT_EQ(summaries[0].skipped_steps, summaries[1].skipped_steps) << precision;
  }
}

}  // namespace
}  // namespace fasttrain
