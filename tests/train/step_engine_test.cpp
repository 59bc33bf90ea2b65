// The step engines (train/step_engine.h): when a step can be captured, what train.cuda_graphs does
// where it cannot, the device-side bookkeeping a captured step relies on (the LR table, the loss
// tracker), and on a GPU: N captured steps equal N eager steps.
#include "fasttrain/train/step_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/data/tensor_source.h"
#include "fasttrain/detail/loss_tracker.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/run/auto.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/check.h"
#include "support.h"
#include "trainer_support.h"

namespace fasttrain {
namespace {

using testing::plain_pipeline;

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

TEST(StepEngine, LossTrackerSumsAndNamesTheFirstBadStepOnTheDeviceOrTheHost) {
  for (auto bookkeeping : {LossTracker::Bookkeeping::kDevice, LossTracker::Bookkeeping::kHost}) {
    SCOPED_TRACE(bookkeeping == LossTracker::Bookkeeping::kHost ? "host" : "device");
    LossTracker losses(torch::kCPU, bookkeeping);
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
    losses.add(torch::full({}, 2.0), torch::full({}, 7, torch::kLong));
    losses.reset();
    EXPECT_DOUBLE_EQ(losses.take_sum(), 0.0);
  }
}

// ---- through the Trainer ----

struct TrainerCase {
  Model model;
  std::unique_ptr<Trainer> trainer;
};

// What a captured step trains: the built-in conv net classifying images, or a program's own module
// with two inputs regressing values.
enum class EngineCase { kConvClassifier, kUserRegressor };

struct TwoInputsImpl : torch::nn::Module {
  TwoInputsImpl()
      : features(register_module("features", torch::nn::Linear(6, 8))),
        head(register_module("head", torch::nn::Linear(8, 1))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& scale) {
    return head(torch::relu(features(x))) * scale;
  }
  torch::nn::Linear features, head;
};
TORCH_MODULE(TwoInputs);

std::shared_ptr<const BatchSource> regression_data() {
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({256, 6}), scale = torch::rand({256, 1}) + 0.5;
  return std::make_shared<TensorSource>(std::map<std::string, torch::Tensor>{
      {"inputs", x}, {"scale", scale}, {"targets", x.sum(1, true) * scale}});
}

// A model with AdamW (optim.kernel auto), one-cycle over `steps`, clipping, EMA and accumulation 2:
// everything a captured step holds. The conv net has BatchNorm, and its EMA starts after step 5 (inside
// the captured replays: the device gates the decay, no host decision).
TrainerCase make_case(torch::Device device, bool cuda_graphs, torch::ScalarType precision, int64_t steps,
                      EngineCase kind = EngineCase::kConvClassifier) {
  torch::manual_seed(7);
  TrainerCase c;
  std::shared_ptr<Task> task;
  if (kind == EngineCase::kConvClassifier) {
    c.model =
        make_cnn(CnnOptions().widths({4, 8}).hidden({16}).batchnorm(true), DataShape::images(1, 8, 8, 4));
    task = std::make_shared<ClassificationTask>();
  } else {
    c.model = Model(TwoInputs(),
                    [](TwoInputsImpl& net, const Batch& b) { return net.forward(b.inputs, b.at("scale")); });
    task = std::make_shared<RegressionTask>();
  }
  c.model.module().to(device);
  auto optimizer = make_optimizer(c.model.module().named_parameters(),
                                  OptimizerOptions("adamw").lr(1e-2).weight_decay(0.01));
  auto schedule = make_schedule(ScheduleOptions("one-cycle").cycle_momentum(false), 1e-2, 0.9, steps);
  c.trainer = std::make_unique<Trainer>(
      c.model, task, std::move(optimizer), std::move(schedule),
      TrainOptions().max_steps(steps).accumulation(2).clip_norm(0.5).precision(precision).cuda_graphs(
          cuda_graphs));
  c.trainer->enable_ema(kind == EngineCase::kConvClassifier ? EmaOptions(0.9).after_step(5)
                                                            : EmaOptions(0.9));
  return c;
}

TEST(StepEngine, OnTheCpuStepsRunEagerAndCapturingIsAnErrorNamingWhy) {
  auto data = testing::synthetic_images(64);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(8).workers(0));
  TrainerCase eager = make_case(torch::kCPU, false, torch::kFloat, 4);
  const FitSummary summary = eager.trainer->fit(loader, nullptr);
  EXPECT_EQ(summary.step_engine, "eager");
  EXPECT_EQ(summary.graph_capture_s, 0);
  EXPECT_EQ(summary.steps, 4);
  TrainerCase forced = make_case(torch::kCPU, true, torch::kFloat, 4);
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] { forced.trainer->fit(loader, nullptr); }),
                                    {"train.cuda_graphs = true", "CUDA device"}));
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
// counts, EMA averages, the logged loss; also when the warm-up captured the step before fit() and put
// back what its steps changed. Resident data (batches gathered on the GPU) on every side.
TEST(StepEngine, CapturedStepsEqualEagerSteps_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  auto images = testing::synthetic_images(256);
  struct Precision {
    std::string name;
    torch::ScalarType dtype;
  };
  for (const EngineCase kind : {EngineCase::kConvClassifier, EngineCase::kUserRegressor}) {
    for (const Precision& precision : {Precision{"fp32", torch::kFloat}, Precision{"bf16", torch::kBFloat16},
                                       Precision{"fp16", torch::kHalf}}) {
      const std::string what =
          (kind == EngineCase::kConvClassifier ? "cnn " : "user regressor ") + precision.name;
      const int64_t steps = 14;  // 3 warm-up steps, the capture, 10 replays
      std::vector<FitSummary> summaries;
      std::vector<TrainerCase> runs;
      // Eager; captured in fit(); captured by the warm-up (memory.warmup), its state put back.
      for (const int engine : {0, 1, 2}) {
        // Images resident on the GPU; the regression's tensors copied from pinned memory.
        auto make_loader = [&] {
          return kind == EngineCase::kConvClassifier
                     ? std::make_unique<DataLoader>(
                           images, plain_pipeline(),
                           LoaderOptions(16).device(cuda).device_resident(true).seed(3))
                     : std::make_unique<DataLoader>(regression_data(),
                                                    LoaderOptions(16).device(cuda).seed(3));
        };
        auto loader = make_loader();
        runs.push_back(make_case(cuda, engine > 0, precision.dtype, steps, kind));
        if (engine == 2) {
          auto probe = make_loader();  // a training batch, from a loader of its own
          probe->start_epoch(0);
          runs.back().trainer->warm_up(*probe->next(), nullptr, loader.get());
        }
        summaries.push_back(runs.back().trainer->fit(*loader, nullptr));
      }
      // The same kernels in the same order: differences are the graph's, i.e. none beyond rounding.
      const double tolerance = precision.dtype == torch::kFloat ? 1e-5 : 1e-3;
      EXPECT_EQ(summaries[0].step_engine, "eager") << what;
      for (const size_t run : {size_t{1}, size_t{2}}) {
        const std::string which = what + (run == 2 ? " captured ahead" : " captured");
        EXPECT_EQ(summaries[run].step_engine, "cuda_graph") << which;
        EXPECT_GT(summaries[run].graph_capture_s, 0) << which;
        EXPECT_EQ(runs[run].trainer->step(), steps) << which;
        expect_close(runs[0].model.module().parameters(), runs[run].model.module().parameters(), tolerance,
                     which + " weights");
        expect_close(runs[0].model.module().buffers(), runs[run].model.module().buffers(), tolerance,
                     which + " buffers");
        expect_close(runs[0].trainer->ema()->shadow(), runs[run].trainer->ema()->shadow(), tolerance,
                     which + " EMA");
        EXPECT_EQ(runs[0].trainer->ema()->updates(), runs[run].trainer->ema()->updates()) << which;
        const Optimizer& eager = runs[0].trainer->optimizer();
        const Optimizer& captured = runs[run].trainer->optimizer();
        for (size_t g = 0; g < eager.groups().size(); ++g) {
          for (size_t i = 0; i < eager.groups()[g].params.size(); ++i) {
            EXPECT_DOUBLE_EQ(eager.step_count(g, i).item<double>(), captured.step_count(g, i).item<double>())
                << which;
            for (size_t f = 0; f < eager.state_fields(g).size(); ++f)
              expect_close({eager.state(g, f, i)}, {captured.state(g, f, i)}, tolerance, which + " moments");
          }
        }
        EXPECT_DOUBLE_EQ(runs[0].trainer->scaler().scale(), runs[run].trainer->scaler().scale()) << which;
        EXPECT_EQ(summaries[0].skipped_steps, summaries[run].skipped_steps) << which;
      }
    }
  }
}

}  // namespace
}  // namespace fasttrain
