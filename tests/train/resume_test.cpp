// Run state: a run stopped and resumed from its checkpoint by new objects ends bit-exactly where the
// run that never stopped ends (weights, buffers, optimizer moments, EMA, RNG, counters), with
// shuffling, augmentation, dropout and two loader workers; for the built-in classifier and for a
// program's own module with two inputs, trained for regression. The fresh-process version of these
// checks, through the CLI and signals, is in tests/cli/resume_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "fasttrain/data/tensor_source.h"
#include "fasttrain/detail/file_io.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/optimizer_state.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/train/trainer.h"
#include "support.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;

// 100 samples in batches of 8: 12 batches per epoch, windows of 5, 5 and 2 micro-batches: 3 steps
// per epoch, 9 in all.
constexpr int64_t kAccumulation = 5;
constexpr int64_t kEpochs = 3;

struct TrainingRun {
  std::unique_ptr<DataLoader> loader;
  Model model;
  std::unique_ptr<Trainer> trainer;
};

// A program's own module: features and a per-sample scale (a second input) to one value, through a
// Stage, with dropout.
struct ScaledRegressorImpl : torch::nn::Module {
  ScaledRegressorImpl() {
    layers = register_module("layers", Stage(torch::nn::Linear(6, 16), torch::nn::ReLU(),
                                             torch::nn::Dropout(0.3), torch::nn::Linear(16, 1)));
  }
  torch::Tensor forward(const torch::Tensor& features, const torch::Tensor& scale) {
    return layers->forward(features) * scale;  // [B, 1]
  }
  Stage layers{nullptr};
};
TORCH_MODULE(ScaledRegressor);

// What a run trains: the built-in mlp classifying augmented images, or ScaledRegressor regressing.
enum class ResumeCase { kImageClassifier, kUserRegressor };

std::shared_ptr<const BatchSource> source_of(ResumeCase kind) {
  if (kind == ResumeCase::kImageClassifier) {
    static const ImageDataset data = testing::synthetic_images(100, 1, 8, 8, 4, /*seed=*/3);
    TransformPipeline pipeline({0.5f}, {0.25f});
    pipeline.add(std::make_shared<RandomCrop>(1));
    pipeline.add(std::make_shared<HorizontalFlip>(0.5));
    return std::make_shared<ImageBatchSource>(data, pipeline);
  }
  torch::manual_seed(3);
  const torch::Tensor features = torch::randn({100, 6}), scale = torch::rand({100, 1}) + 0.5;
  const torch::Tensor targets = features.sum(1, /*keepdim=*/true) * scale;
  return std::make_shared<TensorSource>(
      std::map<std::string, torch::Tensor>{{"inputs", features}, {"scale", scale}, {"targets", targets}});
}

TrainingRun make_run(uint64_t seed, const std::string& checkpoint_root = "",
                     ResumeCase kind = ResumeCase::kImageClassifier) {
  TrainingRun run;
  run.loader =
      std::make_unique<DataLoader>(source_of(kind), LoaderOptions(8).workers(2).shuffle(true).seed(11));
  torch::manual_seed(seed);
  std::shared_ptr<Task> task;
  if (kind == ResumeCase::kImageClassifier) {
    run.model = make_mlp(MlpOptions().hidden({32}).dropout(0.3), DataShape::images(1, 8, 8, 4));
    task = std::make_shared<ClassificationTask>();
  } else {
    run.model = Model(ScaledRegressor(), [](ScaledRegressorImpl& net, const Batch& batch) {
      return net.forward(batch.inputs, batch.at("scale"));
    });
    task = std::make_shared<RegressionTask>(RegressionOptions().loss("huber"));
  }
  const int64_t total = planned_steps(TrainOptions().epochs(kEpochs).accumulation(kAccumulation),
                                      run.loader->batches_per_epoch());
  auto optimizer = make_optimizer(run.model.module().named_parameters(),
                                  OptimizerOptions("adamw").lr(3e-3).weight_decay(0.1));
  auto schedule = make_schedule(ScheduleOptions("one-cycle"), 3e-3, 0.9, total);
  run.trainer =
      std::make_unique<Trainer>(run.model, task, std::move(optimizer), std::move(schedule),
                                TrainOptions().epochs(kEpochs).accumulation(kAccumulation).clip_norm(1.0));
  run.trainer->enable_ema(EmaOptions(0.9));
  if (!checkpoint_root.empty())
    run.trainer->enable_checkpoints(RunCheckpointOptions(checkpoint_root).keep(2));
  return run;
}

// Asks the trainer to stop once it has taken `step` steps and backpropagated `window_done`
// micro-batches of the next window.
struct StopAt : Callback {
  StopAt(int64_t step, int64_t window_done) : step(step), window_done(window_done) {}
  void on_micro_batch(Trainer& trainer) override { check(trainer); }
  void on_log(Trainer& trainer, const StepRecord&) override { check(trainer); }
  void check(Trainer& trainer) {
    if (trainer.step() == step && trainer.progress().window_done == window_done) trainer.request_stop();
  }
  int64_t step, window_done;
};

torch::Tensor cpu_rng_state() {
  auto generator = at::globalContext().defaultGenerator(torch::kCPU);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void expect_identical(const NamedTensors& a, const NamedTensors& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << what << " " << a[i].first << " differs";
  }
}

void expect_same_run_state(TrainingRun& resumed, TrainingRun& straight, const torch::Tensor& straight_rng) {
  EXPECT_EQ(resumed.trainer->step(), straight.trainer->step());
  EXPECT_EQ(resumed.trainer->progress().samples_seen, straight.trainer->progress().samples_seen);
  expect_identical(module_state(resumed.model.module()), module_state(straight.model.module()), "weights");
  expect_identical(optimizer_state(resumed.trainer->optimizer()).tensors,
                   optimizer_state(straight.trainer->optimizer()).tensors, "optimizer state");
  EXPECT_EQ(resumed.trainer->ema()->updates(), straight.trainer->ema()->updates());
  for (size_t i = 0; i < resumed.trainer->ema()->shadow().size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed.trainer->ema()->shadow()[i], straight.trainer->ema()->shadow()[i]))
        << "EMA tensor " << i;
  }
  EXPECT_TRUE(torch::equal(cpu_rng_state(), straight_rng)) << "the global RNG (dropout) diverged";
}

struct StopPoint {
  const char* name;
  int64_t step;
  int64_t window_done;
  ResumeCase kind = ResumeCase::kImageClassifier;
};

class ResumeTest : public ::testing::TestWithParam<StopPoint> {};

TEST_P(ResumeTest, StoppedAndResumedByNewObjectsEqualsTheStraightRun) {
  const StopPoint point = GetParam();
  TrainingRun straight = make_run(5, "", point.kind);
  straight.trainer->fit(*straight.loader, nullptr);
  const torch::Tensor straight_rng = cpu_rng_state();
  ASSERT_EQ(straight.trainer->step(), 9);

  testing::TempDir dir;
  const std::string root = dir.file("checkpoints");
  std::string checkpoint;
  {
    TrainingRun first = make_run(5, root, point.kind);
    first.trainer->add_callback(std::make_shared<StopAt>(point.step, point.window_done));
    first.trainer->set_logging(
        LogOptions().every_steps(1));  // on_log after every step: stops at a step boundary
    FitSummary summary = first.trainer->fit(*first.loader, nullptr);
    ASSERT_TRUE(summary.interrupted);
    EXPECT_EQ(summary.steps, point.step);
    checkpoint = summary.checkpoint;
    ASSERT_EQ(checkpoint, root + "/step-" + std::to_string(point.step));
  }
  EXPECT_EQ(fs::exists(checkpoint + "/window.safetensors"), point.window_done > 0);

  torch::manual_seed(999);  // the resumed process starts from other weights and another RNG state
  TrainingRun resumed = make_run(77, root, point.kind);
  resumed.trainer->load_checkpoint(checkpoint, resumed.loader->batches_per_epoch());
  EXPECT_EQ(resumed.trainer->progress().window_done, point.window_done);
  FitSummary summary = resumed.trainer->fit(*resumed.loader, nullptr);
  EXPECT_FALSE(summary.interrupted);
  expect_same_run_state(resumed, straight, straight_rng);
}

INSTANTIATE_TEST_SUITE_P(
    Points, ResumeTest,
    ::testing::Values(StopPoint{"MidEpoch", 4, 0}, StopPoint{"EpochEnd", 6, 0},
                      StopPoint{"InsideAccumulationWindow", 4, 3},
                      StopPoint{"InsideTheShortLastWindow", 5, 1},
                      StopPoint{"UserRegressorMidEpoch", 4, 0, ResumeCase::kUserRegressor},
                      StopPoint{"UserRegressorInsideWindow", 4, 3, ResumeCase::kUserRegressor}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Resume, APeriodicCheckpointHoldsTheWholeRunState) {
  testing::TempDir dir;
  TrainingRun run = make_run(5, dir.file("checkpoints"));
  run.trainer->enable_checkpoints(RunCheckpointOptions(dir.file("checkpoints")).every_steps(4).keep(5));
  FitSummary summary = run.trainer->fit(*run.loader, nullptr);
  EXPECT_EQ(summary.checkpoint, dir.file("checkpoints/step-9"));
  std::vector<int64_t> steps;
  for (const auto& info : list_checkpoints(dir.file("checkpoints"))) steps.push_back(info.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 8, 9}));  // every 4 steps and the end
  CheckpointManifest manifest = verify_checkpoint(dir.file("checkpoints/step-4"));
  std::vector<std::string> files;
  for (const auto& entry : manifest.files) files.push_back(entry.file);
  EXPECT_EQ(files, (std::vector<std::string>{"ema.safetensors", "model.safetensors", "optimizer.safetensors",
                                             "rng.safetensors", "state.json"}));
  auto state = nlohmann::json::parse(read_text_file(dir.file("checkpoints/step-4/state.json")));
  EXPECT_EQ(state["format"], "fasttrain-run-state");
  EXPECT_EQ(state["version"], 1);
  EXPECT_EQ(state["step"], 4);
  EXPECT_EQ(state["progress"]["epoch"], 1);           // 3 steps per epoch: step 4 is in epoch 1
  EXPECT_EQ(state["progress"]["batch_in_epoch"], 5);  // after its first window of 5
  EXPECT_EQ(state["ema"]["updates"], 4);
}

TEST(Resume, ADamagedCheckpointIsRejectedBeforeAnythingIsLoaded) {
  testing::TempDir dir;
  {
    TrainingRun run = make_run(5, dir.file("checkpoints"));
    run.trainer->fit(*run.loader, nullptr);
  }
  const std::string checkpoint = dir.file("checkpoints/step-9");
  {
    std::fstream file(checkpoint + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(200);
    file.put('\x7f');
  }
  TrainingRun fresh = make_run(77);
  const auto before = module_state(fresh.model.module());
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] {
                                      fresh.trainer->load_checkpoint(checkpoint,
                                                                     fresh.loader->batches_per_epoch());
                                    }),
                                    {"optimizer.safetensors", "sha256"}));
  expect_identical(module_state(fresh.model.module()), before, "weights after a rejected load");
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { fresh.trainer->load_checkpoint(dir.file("nope"), 12); }),
      {"nope", "does not exist"}));
}

TEST(Resume, ACheckpointOfAnotherTrainingConfigDoesNotLoad) {
  testing::TempDir dir;
  {
    TrainingRun run = make_run(5);
    run.trainer->enable_checkpoints(RunCheckpointOptions(dir.file("checkpoints")).fingerprint("aaaa"));
    run.trainer->fit(*run.loader, nullptr);
  }
  TrainingRun other = make_run(5);
  other.trainer->enable_checkpoints(RunCheckpointOptions(dir.file("other")).fingerprint("bbbb"));
  try {
    other.trainer->load_checkpoint(dir.file("checkpoints/step-9"), 12);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(testing::contains_all(error.what(), {"step-9", "another training config"}));
  }
}

// A model whose loss turns NaN at one forward pass: the run must stop, name that step, and leave
// no checkpoint of the diverged state.
class PoisonedMlpImpl : public torch::nn::Module {
 public:
  explicit PoisonedMlpImpl(int64_t poisoned_call) : poisoned_call_(poisoned_call) {
    linear_ = register_module("linear", torch::nn::Linear(64, 4));
  }
  torch::Tensor forward(torch::Tensor images) {
    auto logits = linear_->forward(images.flatten(1));  // [B, 4]
    if (++calls_ == poisoned_call_) logits = logits * std::numeric_limits<float>::quiet_NaN();
    return logits;
  }

 private:
  torch::nn::Linear linear_{nullptr};
  int64_t calls_ = 0, poisoned_call_;
};
TORCH_MODULE(PoisonedMlp);

TEST(Resume, ANonFiniteLossStopsTheRunNamingTheStepAndNothingOfItIsSaved) {
  auto data = testing::synthetic_images(64);
  DataLoader loader(data, TransformPipeline({0.5f}, {0.25f}), LoaderOptions(8).workers(0));  // 8 steps/epoch
  PoisonedMlp model(/*poisoned_call=*/7);
  Trainer trainer(model, std::make_shared<ClassificationTask>(),
                  make_optimizer(model->named_parameters(), OptimizerOptions("sgd").lr(0.1)),
                  make_schedule(ScheduleOptions("constant"), 0.1, 0.9, 100), TrainOptions().epochs(2));
  testing::TempDir dir;
  trainer.enable_checkpoints(RunCheckpointOptions(dir.file("checkpoints")).every_steps(5).keep(3));
  trainer.set_logging(
      LogOptions().every_steps(1000));  // the check before the checkpoint at step 10 must find it
  EXPECT_TRUE(
      testing::contains_all(testing::error_message([&] { trainer.fit(loader, nullptr); }),
                            {"training loss became nan at step 7", "no checkpoint of this state", "step-5"}));
  std::vector<int64_t> steps;
  for (const auto& info : list_checkpoints(dir.file("checkpoints"))) steps.push_back(info.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{5}));
}

}  // namespace
}  // namespace fasttrain
