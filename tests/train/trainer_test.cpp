#include "fasttrain/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/memory/stats.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/run/run.h"
#include "fasttrain/util/check.h"
#include "memory/peak_cpu_memory.h"
#include "support.h"
#include "trainer_support.h"

namespace fasttrain {
namespace {

using testing::plain_pipeline;

using testing::make_trainer;
using testing::small_mlp;

void expect_same_parameters(const Model& a, const Model& b, double tolerance) {
  auto pa = a.module().parameters(), pb = b.module().parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::allclose(pa[i], pb[i], /*rtol=*/0, tolerance))
        << "parameter " << i << " differs by " << (pa[i] - pb[i]).abs().max().item<double>();
  }
}

TEST(Trainer, AccumulatedMicroBatchesEqualOneLargeBatch) {
  auto data = testing::synthetic_images(128);
  // 4 micro-batches of 8 vs one batch of 32, same sample order (the order depends on seed and epoch only).
  DataLoader small(data, plain_pipeline(), LoaderOptions(8).workers(0).seed(3));
  DataLoader large(data, plain_pipeline(), LoaderOptions(32).workers(0).seed(3));
  auto accumulated = small_mlp(11), reference = small_mlp(11);
  auto accumulating = make_trainer(accumulated, TrainOptions().epochs(2).accumulation(4));
  auto plain = make_trainer(reference, TrainOptions().epochs(2).accumulation(1));
  auto a = accumulating->fit(small, nullptr);
  auto b = plain->fit(large, nullptr);
  EXPECT_EQ(a.steps, 8);
  EXPECT_EQ(b.steps, 8);
  expect_same_parameters(accumulated, reference, 1e-6);
  // And the weights really moved: the test would pass trivially otherwise.
  auto untouched = small_mlp(11);
  EXPECT_FALSE(torch::allclose(untouched.module().parameters()[0], accumulated.module().parameters()[0]));
}

TEST(Trainer, PlannedStepsCountShortWindowsAtEpochEnds) {
  EXPECT_EQ(planned_steps(TrainOptions().epochs(2).accumulation(3), 8), 2 * 3);  // windows 3, 3, 2
  EXPECT_EQ(planned_steps(TrainOptions().epochs(5).max_steps(7), 100), 7);
  auto data = testing::synthetic_images(64);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(8).workers(0));
  auto trainer = make_trainer(small_mlp(1), TrainOptions().epochs(2).accumulation(3));
  EXPECT_EQ(trainer->fit(loader, nullptr).steps, 6);
}

TEST(Trainer, ClippingBoundsTheUpdateToLrTimesNorm) {
  auto data = testing::synthetic_images(32);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(32).workers(0));
  auto model = small_mlp(5);
  auto before = torch::cat([&] {
    std::vector<torch::Tensor> flat;
    for (auto& p : model.module().parameters()) flat.push_back(p.detach().clone().flatten());
    return flat;
  }());
  const double lr = 0.5, clip = 1e-3;
  auto opt = make_optimizer(model.module().named_parameters(), OptimizerOptions("sgd").lr(lr).momentum(0));
  Trainer trainer(model, std::make_shared<ClassificationTask>(), std::move(opt),
                  make_schedule(ScheduleOptions("constant"), lr, 0, 10),
                  TrainOptions().max_steps(1).clip_norm(clip));
  trainer.fit(loader, nullptr);
  std::vector<torch::Tensor> flat;
  for (auto& p : model.module().parameters()) flat.push_back(p.detach().flatten());
  double moved = (torch::cat(flat) - before).norm().item<double>();
  EXPECT_NEAR(moved, lr * clip, lr * clip * 1e-3);
}

TEST(Trainer, PeakMemoryIsTheAllocatorsPeakAndGrowsWithTheBatch) {
  auto data = testing::synthetic_images(512, 1, 16, 16);
  auto peak_of = [&](int64_t batch) {
    DataLoader loader(data, plain_pipeline(), LoaderOptions(batch).workers(0));
    torch::manual_seed(1);
    auto model = make_mlp(MlpOptions().hidden({512}), DataShape::images(1, 16, 16, 4));
    return make_trainer(model, TrainOptions().max_steps(2))->fit(loader, nullptr);
  };
  FitSummary small = peak_of(8), large = peak_of(256);
  // The step's activations: [B, 256] inputs and [B, 512] hidden values, fp32, more than once.
  EXPECT_GT(large.peak_memory_bytes - small.peak_memory_bytes, 248 * (256 + 512) * 4);
  EXPECT_GT(small.peak_memory_bytes, 0);
  EXPECT_GE(large.peak_resident_bytes, large.peak_memory_bytes);
  EXPECT_TRUE(tracking_cpu_allocations());
}

TEST(Run, BackendSwitchesReachTheGlobalContext) {
  FT_REQUIRE_FASHION_MNIST();
  Config config;
  config.data.dataset.as<ImageDataOptions>().train_limit(256);
  config.train.deterministic(true).tf32(false);
  RunBuilder builder;
  build_run(builder, config);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().benchmarkCuDNN()) << "deterministic turns cudnn_benchmark off";
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
  config.train.deterministic(false).tf32(true).cudnn_benchmark(true);
  build_run(builder, config);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_TRUE(at::globalContext().benchmarkCuDNN());
  EXPECT_TRUE(at::globalContext().allowTF32CuBLAS());
  EXPECT_TRUE(at::globalContext().allowTF32CuDNN());
}

TEST(Trainer, GradientsAreNoneAfterEachStep) {
  auto data = testing::synthetic_images(32);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(16).workers(0));
  auto model = small_mlp(2);
  auto trainer = make_trainer(model, TrainOptions().max_steps(2));
  trainer->fit(loader, nullptr);
  for (const auto& p : model.module().parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Trainer, EvaluateRunsInEvalModeAndRestoresIt) {
  auto data = testing::synthetic_images(64);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(16).workers(0).shuffle(false).drop_last(false));
  auto model = small_mlp(0, /*dropout=*/0.5);
  auto trainer = make_trainer(model, TrainOptions());
  model.module().train();
  EvalResult first = trainer->evaluate(loader);
  EvalResult second = trainer->evaluate(loader);
  EXPECT_TRUE(model.module().is_training());
  EXPECT_EQ(first.samples, 64);
  EXPECT_DOUBLE_EQ(first.metrics.at("accuracy"),
                   second.metrics.at("accuracy"));  // dropout off: deterministic
  EXPECT_DOUBLE_EQ(first.metrics.at("loss"), second.metrics.at("loss"));
}

TEST(Trainer, EmaWeightsAreWhatEvaluationSees) {
  auto data = testing::synthetic_images(64);
  DataLoader train(data, plain_pipeline(), LoaderOptions(16).workers(0));
  DataLoader test(data, plain_pipeline(), LoaderOptions(64).workers(0).shuffle(false).drop_last(false));
  auto model = small_mlp(9);
  auto trainer = make_trainer(model, TrainOptions().epochs(3), 0.5);
  trainer->enable_ema(EmaOptions(0.9).warmup(false));
  trainer->fit(train, nullptr);
  EvalResult with_ema = trainer->evaluate(test);
  // The same model evaluated by a trainer without EMA sees the live weights.
  EvalResult without_ema = make_trainer(model, TrainOptions())->evaluate(test);
  EvalResult again = trainer->evaluate(test);
  EXPECT_NE(with_ema.metrics.at("loss"), without_ema.metrics.at("loss"));
  EXPECT_DOUBLE_EQ(with_ema.metrics.at("loss"),
                   again.metrics.at("loss"));  // the guard swapped the live weights back
}

TEST(Trainer, EvalFlipScoresTheMeanOfEachImagesAndItsMirrorsLogits) {
  auto data = testing::synthetic_images(48);
  DataLoader test(data, plain_pipeline(), LoaderOptions(16).workers(0).shuffle(false).drop_last(false));
  auto model = small_mlp(4);
  const EvalResult flipped = make_trainer(model, TrainOptions().eval_flip(true))->evaluate(test);
  const EvalResult plain = make_trainer(model, TrainOptions())->evaluate(test);
  // By hand: the mean of the two outputs, scored as the task scores one.
  torch::NoGradGuard no_grad;
  model.module().eval();
  double loss_sum = 0, correct = 0;
  test.start_epoch(0);
  while (auto batch = test.next()) {
    Batch mirrored = *batch;
    mirrored.inputs = batch->inputs.flip({3});
    const torch::Tensor logits = (model.forward(*batch).tensor() + model.forward(mirrored).tensor()) * 0.5;
    loss_sum +=
        torch::nn::functional::cross_entropy(
            logits, batch->targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += logits.argmax(1).eq(batch->targets).sum().item<double>();
  }
  EXPECT_NEAR(flipped.metrics.at("loss"), loss_sum / 48, 1e-6);
  EXPECT_DOUBLE_EQ(flipped.metrics.at("accuracy"), correct / 48);
  EXPECT_NE(flipped.metrics.at("loss"), plain.metrics.at("loss"));  // the mirror images were scored
  EXPECT_EQ(flipped.samples, 48);
}

TEST(Trainer, StopAtTargetEndsTheRunAndRecordsTheTime) {
  auto data = testing::synthetic_images(64);
  DataLoader train(data, plain_pipeline(), LoaderOptions(8).workers(0));
  DataLoader test(data, plain_pipeline(), LoaderOptions(64).workers(0).shuffle(false).drop_last(false));
  auto trainer = make_trainer(
      small_mlp(4), TrainOptions().epochs(5).eval_every_steps(2).target_accuracy(0.01).stop_at_target(true));
  FitSummary summary = trainer->fit(train, &test);
  EXPECT_EQ(summary.steps, 2);
  ASSERT_TRUE(summary.time_to_target_s.has_value());
  EXPECT_GT(*summary.time_to_target_s, 0);
  EXPECT_LE(*summary.time_to_target_s, summary.wall_s);
  EXPECT_EQ(summary.step_at_target, 2);
  EXPECT_EQ(summary.to_json().at("target"), "accuracy >= 0.01");
}

// train.target: any metric of the task, in either direction; a metric the task does not report is an
// error naming the ones it does.
TEST(Trainer, TargetIsAnyMetricOfTheTask) {
  auto data = testing::synthetic_images(64);
  DataLoader train(data, plain_pipeline(), LoaderOptions(8).workers(0));
  DataLoader test(data, plain_pipeline(), LoaderOptions(64).workers(0).shuffle(false).drop_last(false));
  FitSummary summary =
      make_trainer(small_mlp(4),
                   TrainOptions().epochs(5).eval_every_steps(2).target("loss <= 100").stop_at_target(true))
          ->fit(train, &test);
  EXPECT_EQ(summary.steps, 2) << "a loss below 100 is reached at the first evaluation";
  ASSERT_TRUE(summary.best_test.has("loss") && summary.test.has("accuracy"));
  EXPECT_LE(summary.best_test.at("loss"), summary.test.at("loss"));
  auto unknown =
      make_trainer(small_mlp(4), TrainOptions().max_steps(2).eval_every_steps(2).target("rmse <= 1"));
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] { unknown->fit(train, &test); }),
                                    {"rmse", "loss, accuracy"}));
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { make_trainer(small_mlp(4), TrainOptions().target("accuracy > 0.9")); }),
      {"train.target", "METRIC >= VALUE", "accuracy > 0.9"}));
  EXPECT_TRUE(testing::contains_all(
      testing::error_message(
          [&] { make_trainer(small_mlp(4), TrainOptions().target("accuracy >= 0.9").target_accuracy(0.5)); }),
      {"train.target", "train.target_accuracy", "keep one"}));
}

TEST(Trainer, EvaluationsWaitForEvalFromStep) {
  auto data = testing::synthetic_images(64);
  DataLoader train(data, plain_pipeline(), LoaderOptions(8).workers(0));  // 8 steps per epoch
  DataLoader test(data, plain_pipeline(), LoaderOptions(64).workers(0).shuffle(false).drop_last(false));
  struct Steps : Callback {
    std::vector<int64_t> evaluated;
    void on_evaluate(Trainer&, const EvalRecord& record) override { evaluated.push_back(record.step); }
  };
  auto steps = std::make_shared<Steps>();
  auto trainer = make_trainer(small_mlp(4), TrainOptions().epochs(3).eval_every_steps(3).eval_from_step(10));
  trainer->add_callback(steps);
  trainer->fit(train, &test);
  // Periodic at 12, 15, 18, 21; epoch ends at 16 (8 is too early) and 24 (the end of the run).
  EXPECT_EQ(steps->evaluated, (std::vector<int64_t>{12, 15, 16, 18, 21, 24}));
}

TEST(Trainer, Bf16AutocastStepMatchesFp32Step) {
  auto data = testing::synthetic_images(64);
  auto model_of = [] {
    torch::manual_seed(6);
    return make_cnn(CnnOptions().widths({8}).hidden({16}).batchnorm(true), testing::small_images());
  };
  auto flat = [](const Model& m) {
    std::vector<torch::Tensor> all;
    for (const auto& p : m.module().parameters()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat) << "master weights stay fp32";
      all.push_back(p.detach().flatten());
    }
    return torch::cat(all);
  };
  // One plain SGD step each: the update is -lr * gradient, so the updates compare the gradients.
  auto update = [&](torch::ScalarType precision) {
    DataLoader loader(data, plain_pipeline(), LoaderOptions(64).workers(0));
    auto model = model_of();
    auto before = flat(model).clone();
    auto opt = make_optimizer(model.module().named_parameters(), OptimizerOptions("sgd").lr(0.1).momentum(0));
    Trainer trainer(model, std::make_shared<ClassificationTask>(), std::move(opt),
                    make_schedule(ScheduleOptions("constant"), 0.1, 0, 10),
                    TrainOptions().max_steps(1).precision(precision));
    trainer.fit(loader, nullptr);
    return flat(model) - before;
  };
  auto fp32 = update(torch::kFloat), bf16 = update(torch::kBFloat16);
  double error = ((bf16 - fp32).norm() / fp32.norm()).item<double>();
  // bf16 keeps 8 bits of mantissa (~0.4% per rounding): a few percent on a whole gradient.
  EXPECT_GT(error, 0.0) << "autocast had no effect";
  EXPECT_LT(error, 0.05);
}

TEST(Trainer, Fp16OnCpuIsAConfigError) {
  try {
    make_trainer(small_mlp(1), TrainOptions().precision(torch::kHalf));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("bf16"), std::string::npos) << error.what();
  }
}

TEST(Trainer, NonFiniteLossStopsWithTheStep) {
  auto data = testing::synthetic_images(64);
  DataLoader train(data, plain_pipeline(), LoaderOptions(8).workers(0));
  auto trainer = make_trainer(small_mlp(4), TrainOptions().epochs(50), /*lr=*/1e30);
  trainer->set_logging(LogOptions().every_steps(1));
  try {
    trainer->fit(train, nullptr);
    FAIL() << "expected the run to stop on a non-finite loss";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("step"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("optim.lr"), std::string::npos) << error.what();
  }
}

TEST(Trainer, LearnsASeparableProblem) {
  // Labels are a function of the image: the mean brightness quartile.
  auto data = testing::synthetic_images(512);
  auto brightness = data.images.to(torch::kFloat).mean({1, 2, 3});
  auto edges = torch::quantile(brightness, torch::tensor({0.25, 0.5, 0.75}));
  data.labels = torch::bucketize(brightness, edges).to(torch::kLong);
  DataLoader train(data, plain_pipeline(), LoaderOptions(32).workers(2).seed(1));
  DataLoader test(data, plain_pipeline(), LoaderOptions(128).workers(0).shuffle(false).drop_last(false));
  auto trainer = make_trainer(small_mlp(3), TrainOptions().epochs(30), 3e-3, "adam");
  FitSummary summary = trainer->fit(train, &test);
  EXPECT_GT(summary.test.at("accuracy"), 0.8);
  EXPECT_EQ(summary.steps, 30 * 16);
  EXPECT_GT(summary.train_samples_per_s, 0);
  EXPECT_GE(summary.data_wait_fraction, 0);
  EXPECT_GT(summary.peak_memory_bytes, 0);
}

TEST(Trainer, FindLrLeavesTheModelAndOptimizerUntouched) {
  auto data = testing::synthetic_images(256);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(32).workers(1));
  auto model = small_mlp(8);
  auto trainer = make_trainer(model, TrainOptions(), 0.1, "adam");
  std::vector<torch::Tensor> before;
  for (const auto& p : model.module().parameters()) before.push_back(p.detach().clone());
  LrFinderResult result = trainer->find_lr(loader, LrFinderOptions().start_lr(1e-5).end_lr(10).steps(40));
  EXPECT_GE(result.points.size(), 10u);
  EXPECT_GT(result.suggested_lr, 1e-5);
  EXPECT_LT(result.suggested_lr, 10);
  auto after = model.module().parameters();
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(torch::equal(before[i], after[i])) << "parameter " << i;
  // The optimizer state was restored too: no Adam moments were left behind by the sweep.
  EXPECT_EQ(trainer->optimizer().state_bytes(), 0);
  EXPECT_EQ(trainer->step(), 0);
}

// A fit after find-lr trains exactly as a fit without it: the step count, the EMA (its average and
// counters), the scaler and the random streams are put back with the weights and the optimizer.
TEST(Trainer, FitAfterFindLrIsTheFitWithoutIt) {
  auto data = testing::synthetic_images(128);
  auto train = [&](bool sweep_first) {
    auto model = small_mlp(12, /*dropout=*/0.2);
    auto trainer = make_trainer(model, TrainOptions().max_steps(8), 0.05, "adamw");
    trainer->enable_ema(EmaOptions(0.9));
    DataLoader loader(data, plain_pipeline(), LoaderOptions(16).workers(0).seed(3));
    torch::manual_seed(21);
    if (sweep_first) trainer->find_lr(loader, LrFinderOptions().start_lr(1e-4).end_lr(1).steps(10));
    trainer->fit(loader, nullptr);
    std::vector<torch::Tensor> state;
    for (const auto& p : model.module().parameters()) state.push_back(p.detach().clone());
    for (const auto& t : trainer->ema()->shadow()) state.push_back(t.clone());
    state.push_back(torch::full({}, static_cast<double>(trainer->step())));
    state.push_back(torch::rand({3}));  // the random stream (dropout's) where it ended
    return state;
  };
  const auto plain = train(false), swept = train(true);
  ASSERT_EQ(plain.size(), swept.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], swept[i])) << "tensor " << i;
}

}  // namespace
}  // namespace fasttrain

namespace fasttrain {
namespace {

// memory.warmup: a forward, backward and optimizer update at the largest batch, and an evaluation,
// before training leave nothing behind: the run that follows is bit-identical to one without it (dropout
// masks, BatchNorm statistics, weights, the optimizer's moments and step counts), and the warm-up really ran
// a step's worth of allocations. Adam counts steps; muon keeps momentum buffers and orthogonalises.
class WarmUp : public ::testing::TestWithParam<const char*> {};

TEST_P(WarmUp, LeavesTheRunBitIdentical) {
  auto data = testing::synthetic_images(96, 1, 8, 8);
  auto train = [&](bool warm_up) {
    torch::manual_seed(4);
    auto model =
        make_cnn(CnnOptions().widths({4}).hidden({16}).batchnorm(true).dropout(0.3), testing::small_images());
    auto trainer = make_trainer(model, TrainOptions().max_steps(6), 0.05, GetParam());
    DataLoader loader(data, plain_pipeline(), LoaderOptions(16).workers(0).seed(2));
    torch::manual_seed(5);
    int64_t warm_up_peak = 0;
    if (warm_up) {
      testing::PeakCpuMemory memory;
      Batch largest{torch::ones({16, 1, 8, 8}), torch::zeros({16}, torch::kLong)};
      DataLoader test(data, plain_pipeline(), LoaderOptions(40).workers(0).shuffle(false).drop_last(false));
      trainer->warm_up(largest, &test, &loader);  // eager: nothing is captured ahead
      warm_up_peak = memory.peak_bytes();
      for (const auto& parameter : model.module().parameters()) EXPECT_FALSE(parameter.grad().defined());
      const Optimizer& optimizer = trainer->optimizer();
      for (size_t group = 0; group < optimizer.groups().size(); ++group) {
        for (size_t index = 0; index < optimizer.groups()[group].params.size(); ++index)
          EXPECT_FALSE(optimizer.has_state(group, index)) << "group " << group << " parameter " << index;
      }
    }
    trainer->fit(loader, nullptr);
    std::vector<torch::Tensor> state;
    for (const auto& tensor : model.module().parameters()) state.push_back(tensor.detach().clone());
    for (const auto& tensor : model.module().buffers()) state.push_back(tensor.clone());
    state.push_back(torch::rand({4}));  // where the random stream ended
    return std::make_pair(state, warm_up_peak);
  };
  auto [plain, no_peak] = train(false);
  auto [warmed, warm_up_peak] = train(true);
  ASSERT_EQ(plain.size(), warmed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], warmed[i])) << "tensor " << i;
  EXPECT_GT(warm_up_peak, 16 * 4 * 8 * 8 * 4) << "the warm-up held at least the first conv's activations";
}

INSTANTIATE_TEST_SUITE_P(Trainer, WarmUp, ::testing::Values("adam", "muon"),
                         [](const auto& info) { return std::string(info.param); });

// The state an optimizer already has (a resumed run's) comes back from the warm-up as it was.
TEST(Trainer, WarmUpKeepsTheOptimizersStateAsItWas) {
  auto data = testing::synthetic_images(32, 1, 8, 8);
  auto model = make_cnn(CnnOptions().widths({4}).hidden({16}), testing::small_images());
  auto trainer = make_trainer(model, TrainOptions().max_steps(2), 0.05, "adam");
  DataLoader loader(data, plain_pipeline(), LoaderOptions(16).workers(0));
  trainer->fit(loader, nullptr);
  const Optimizer& optimizer = trainer->optimizer();
  // Every group's every field (exp_avg, exp_avg_sq) and step count, before and after.
  auto state_of = [&] {
    std::vector<torch::Tensor> state;
    for (size_t group = 0; group < optimizer.groups().size(); ++group) {
      for (size_t index = 0; index < optimizer.groups()[group].params.size(); ++index) {
        EXPECT_TRUE(optimizer.has_state(group, index)) << "group " << group << " parameter " << index;
        for (size_t field = 0; field < optimizer.state_fields(group).size(); ++field)
          state.push_back(optimizer.state(group, field, index).clone());
        state.push_back(optimizer.step_count(group, index).clone());
      }
    }
    return state;
  };
  const std::vector<torch::Tensor> before = state_of();
  ASSERT_EQ(before.size(), model.module().parameters().size() * 3);
  trainer->warm_up(Batch{torch::ones({16, 1, 8, 8}), torch::zeros({16}, torch::kLong)});
  const std::vector<torch::Tensor> after = state_of();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(torch::equal(after[i], before[i])) << "state tensor " << i;
}

TEST(Trainer, WarmUpInsideAnAccumulationWindowIsAnError) {
  auto data = testing::synthetic_images(32);
  DataLoader loader(data, plain_pipeline(), LoaderOptions(4).workers(0));
  auto trainer = make_trainer(small_mlp(3), TrainOptions().accumulation(2).max_steps(4));
  // A stop after the window's first micro-batch keeps its gradients (the checkpoint would hold them).
  struct StopInsideWindow : Callback {
    void on_micro_batch(Trainer& trainer) override { trainer.request_stop(); }
  };
  trainer->add_callback(std::make_shared<StopInsideWindow>());
  EXPECT_TRUE(trainer->fit(loader, nullptr).interrupted);
  Batch batch{torch::randn({4, 1, 8, 8}), torch::zeros({4}, torch::kLong)};
  batch.count = 4;
  EXPECT_THROW(trainer->warm_up(batch), Error);
}

// memory.checkpoint through the run: the same weights after training as without it, and the
// config key reaches the model.
TEST(Run, CheckpointedRunTrainsTheSameWeights) {
  FT_REQUIRE_FASHION_MNIST();
  auto train = [](const std::string& mode) {
    Config config;
    config.data.batch_size(64).workers(0);
    config.data.dataset.as<ImageDataOptions>().train_limit(512);
    config.model.select("cnn").as<CnnOptions>().widths({8, 16}).hidden({32}).batchnorm(true).dropout(0.2);
    config.train.options.max_steps(8);
    config.train.threads(1).device("cpu");  // bitwise-close: CPU kernels (cuDNN picks per run)
    config.memory.checkpoint(mode);
    RunBuilder builder;
    fasttrain::Run run = build_run(builder, config);
    for (StageImpl* stage : run.model.stages()) EXPECT_EQ(stage->checkpointing().enabled(), mode != "none");
    run.make_trainer()->fit(*run.train_loader, nullptr);
    std::vector<torch::Tensor> state;
    for (const auto& tensor : run.model.module().parameters()) state.push_back(tensor.detach().clone());
    for (const auto& tensor : run.model.module().buffers()) state.push_back(tensor.clone());
    return state;
  };
  auto plain = train("none"), checkpointed = train("blocks");
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain[i].to(torch::kDouble), checkpointed[i].to(torch::kDouble), 0, 1e-6))
        << "tensor " << i;
  }
}

}  // namespace
}  // namespace fasttrain
