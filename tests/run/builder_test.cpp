// The tools of the playbook on a program's own run: a RunBuilder brings the model and the data, and
// find-batch, find-lr, profile and train_run build their runs from it. Bad input is found when the run is
// built, before anything in the run directory changes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "fasttrain/data/tensor_source.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/profile/profiler.h"
#include "fasttrain/run/batch_finder.h"
#include "fasttrain/run/run.h"
#include "fasttrain/run/train_run.h"
#include "fasttrain/state/optimizer_state.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/task/tasks.h"
#include "support.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;
using testing::contains_all;
using testing::error_message;

// A regression of 16 features to 2 values by a program's own module; `outputs` values per sample, so a
// test can make the model's output not fit the targets.
struct UserRun : RunBuilder {
  explicit UserRun(int64_t outputs = 2) : outputs(outputs) {}
  DataSplits data(const Config&) override {
    ++data_calls;
    torch::manual_seed(4);
    auto split = [](int64_t n) {
      const torch::Tensor x = torch::randn({n, 16});
      return std::make_shared<TensorSource>(std::map<std::string, torch::Tensor>{
          {"inputs", x}, {"targets", torch::stack({x.sum(1), x.slice(1, 0, 8).sum(1)}, 1)}});
    };
    return {split(2048), split(256), "test"};
  }
  Model model(const Config&, const DataShape& shape) override {
    return Model(torch::nn::Sequential(torch::nn::Linear(shape.input[0], 256), torch::nn::ReLU(),
                                       torch::nn::Linear(256, outputs)));
  }
  int64_t outputs;
  int data_calls = 0;
};

Config user_config() {
  Config config;
  config.data.batch_size(32).workers(0);
  config.optim.name("adamw").lr(1e-3);
  config.train.options.max_steps(120);
  config.train.threads(1).device("cpu");
  config.log.progress("none");
  return config;
}

TEST(RunBuilder, TheTaskIsTheDatasAndTheRunIsTheProgramsModelAndData) {
  UserRun builder;
  fasttrain::Run run = build_run(builder, user_config());
  EXPECT_EQ(run.task->name(), "regression");  // task.name = "auto": the data's (float targets)
  EXPECT_EQ(run.config.task.name(), "regression");
  EXPECT_EQ(run.shape.target, (std::vector<int64_t>{2}));
  EXPECT_NE(run.model.name().find("Sequential"), std::string::npos);
  const FitSummary summary = run.make_trainer()->fit(*run.train_loader, run.test_loader.get());
  for (const char* metric : {"loss", "rmse", "mae", "r2"}) EXPECT_TRUE(summary.test.has(metric)) << metric;
  EXPECT_GT(summary.test.at("r2"), 0.5) << "the sums of features are learnable";
}

TEST(RunBuilder, FindBatchFindLrAndProfileRunOnTheProgramsRun) {
  UserRun builder;
  Config config = user_config();
  config.memory.budget("64MiB");
  const BatchFinderResult batches = find_batch_size(builder, config, BatchFinderOptions().max_batch(512));
  EXPECT_GE(batches.batch_size, 16);
  EXPECT_EQ(builder.data_calls, 1) << "the trials reuse the data the builder loaded";

  const LrFinderResult lr = find_lr_run(builder, config, LrFinderOptions().steps(30), "");
  EXPECT_GE(lr.points.size(), 10u);
  EXPECT_GT(lr.suggested_lr, 0);

  testing::TempDir dir;
  const ProfileResult profile = profile_run(
      builder, config, dir.path(), ProfileOptions().measure(MeasureOptions().steps(4).warmup_steps(2)));
  EXPECT_EQ(profile.steps, 4);
  EXPECT_GT(profile.samples_per_s, 0);
  EXPECT_TRUE(fs::exists(dir.file("trace.json")));
}

// A model whose output does not fit the task is found before training, naming both, and the run
// directory is not touched: an earlier run there is kept, even with --fresh.
TEST(RunBuilder, AModelThatDoesNotFitTheTaskIsAnErrorBeforeAnythingIsWritten) {
  testing::TempDir dir;
  UserRun good;
  train_run(good, user_config(), dir.file("run"));
  const std::string summary = testing::read_text(dir.file("run/summary.json"));
  UserRun wrong(/*outputs=*/3);
  const std::string message =
      error_message([&] { train_run(wrong, user_config(), dir.file("run"), RunOptions().fresh(true)); });
  EXPECT_TRUE(contains_all(message, {"task 'regression'", "[2, 3]", "[2, 2]"})) << message;
  EXPECT_EQ(testing::read_text(dir.file("run/summary.json")), summary) << "the earlier run must be kept";
  EXPECT_TRUE(fs::exists(dir.file("run/checkpoints")));
  EXPECT_FALSE(fs::exists(dir.file("new"))) << "nothing is made for a run that cannot start";
  error_message([&] { train_run(wrong, user_config(), dir.file("new")); });
  EXPECT_FALSE(fs::exists(dir.file("new")));
  // A forward that fails on the data (a layer of the wrong width) names the model, not ATen's frames.
  struct WrongWidth : UserRun {
    Model model(const Config&, const DataShape&) override { return Model(torch::nn::Linear(8, 2)); }
  } wrong_width;
  const std::string failed = error_message([&] { build_run(wrong_width, user_config()); });
  EXPECT_TRUE(contains_all(failed, {"fails on two training samples", "inputs [16] Float", "2x16"})) << failed;
  EXPECT_EQ(failed.find("Exception raised from"), std::string::npos) << failed;
  // A switch the model cannot take is named the same way: no convolutions to lay out.
  Config channels_last = user_config();
  channels_last.train.channels_last(true);
  EXPECT_TRUE(
      contains_all(error_message([&] { build_run(good, channels_last); }), {"train.channels_last", "4-d"}));
  Config checkpointed = user_config();
  checkpointed.memory.checkpoint("blocks");
  EXPECT_TRUE(contains_all(error_message([&] { build_run(good, checkpointed); }),
                           {"memory.checkpoint", "fasttrain::Stage"}));
}

// ---------------------------------------------------------------------------------------------
// A program's own optimizer, registered once and named in a config
// ---------------------------------------------------------------------------------------------

// Lion (Chen et al. 2023) on the foreach path only: its keys are [optim]'s beta1, beta2 and
// weight_decay; beta1 is what momentum schedules move.
//   c <- beta1 m + (1 - beta1) g;  p <- p (1 - lr wd) - lr sign(c);  m <- beta2 m + (1 - beta2) g
class Lion : public Optimizer {
 public:
  Lion(std::vector<ParamGroup> groups, const OptimizerOptions& options)
      : Optimizer(std::move(groups), options, /*fused_kernel=*/nullptr, options.beta1()),
        beta2_(options.beta2()) {}
  const std::vector<std::string>& state_fields(size_t) const override {
    static const std::vector<std::string> fields = {"exp_avg"};
    return fields;
  }
  bool counts_steps(size_t) const override { return false; }
  nlohmann::json group_options(size_t group) const override {
    return {{"lr", options().lr()},
            {"beta1", momentum()},
            {"beta2", beta2_},
            {"weight_decay", weight_decay_of(group)}};
  }
  void set_group_options(size_t group, const nlohmann::json& j) override {
    set_momentum(j.at("beta1").get<double>());
    beta2_ = j.at("beta2").get<double>();
    set_weight_decay(group, j.at("weight_decay").get<double>());
  }

 protected:
  void update_foreach(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr) override {
    auto params = gather_params(g, with_grad), grads = gather_grads(g, with_grad);
    auto averages = gather(g, 0, with_grad);
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < params.size(); ++k) {
      const torch::Tensor direction = (averages[k] * momentum() + grads[k] * (1 - momentum())).sign_();
      if (weight_decay_of(g) != 0) params[k].sub_(params[k] * lr * weight_decay_of(g));
      params[k].sub_(direction * lr);
      averages[k].mul_(beta2_).add_(grads[k], 1 - beta2_);
    }
  }

 private:
  double beta2_;
};

void register_lion() {
  if (optimizer_registry().contains("lion")) return;
  optimizer_registry().add(
      "lion", "Lion: the sign of an interpolated momentum",
      OptimizerRecipe{[](const OptimizerOptions& options) { return options.beta1(); },
                      [](std::vector<ParamGroup> groups, const OptimizerOptions& options) {
                        return std::make_unique<Lion>(std::move(groups), options);
                      }});
}

TEST(OptimizerRegistry, AProgramsOptimizerStepsAsWrittenAndHasNoFusedKernel) {
  register_lion();
  torch::Tensor weight = torch::tensor({{1.0f, -2.0f}, {0.5f, 3.0f}}).requires_grad_(true);
  auto lion = make_optimizer({ParamGroup{{"w"}, {weight}, 0.1}},
                             OptimizerOptions("lion").beta1(0.9).beta2(0.99).weight_decay(0.1));
  EXPECT_EQ(lion->describe_kernel(), "foreach");
  torch::Tensor expected = weight.detach().clone(), average = torch::zeros_like(expected);
  const torch::Tensor lr = torch::full({}, 0.01);
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor gradient = torch::tensor({{0.3f, -0.1f}, {0.0f, 2.0f}}) * (step + 1) - 0.2;
    weight.mutable_grad() = gradient.clone();
    lion->step(lr);
    lion->zero_grad();
    expected = expected * (1 - 0.01 * 0.1) - 0.01 * (0.9 * average + 0.1 * gradient).sign();
    average = 0.99 * average + 0.01 * gradient;
  }
  EXPECT_TRUE(torch::allclose(weight.detach(), expected, 0, 1e-6)) << weight << expected;
  EXPECT_TRUE(torch::allclose(optimizer_state(*lion).tensors.at(0).second, average));
  EXPECT_TRUE(contains_all(
      error_message([&] {
        make_optimizer({ParamGroup{{"w"}, {weight}, 0}}, OptimizerOptions("lion").kernel("fused"));
      }),
      {"optim.kernel = \"fused\"", "'lion' has no fused kernel"}));
}

TEST(OptimizerRegistry, AProgramsOptimizerNamedInAConfigTrainsAndCheckpoints) {
  register_lion();
  testing::TempDir dir;
  UserRun builder;
  Config config = user_config();
  apply_toml(config, "[optim]\nname = \"lion\"\nlr = 1e-3\nweight_decay = 0.01\n", "lion.toml");
  config.schedule.name("one-cycle");  // moves beta1, Lion's momentum
  const FitSummary summary = train_run(builder, config, dir.file("run"));
  EXPECT_GT(summary.test.at("r2"), 0.5);
  const std::string effective = testing::read_text(dir.file("run/config.toml"));
  EXPECT_NE(effective.find("name = \"lion\""), std::string::npos) << effective;
  const SafetensorsFile state = load_safetensors(summary.checkpoint + "/optimizer.safetensors");
  bool has_averages = false;
  for (const auto& name : state.names()) has_averages |= name.find("exp_avg") != std::string::npos;
  EXPECT_TRUE(has_averages) << "the checkpoint holds Lion's averages";
  // A config naming an optimizer nobody registered lists those that are.
  EXPECT_TRUE(
      contains_all(error_message([&] { apply_toml(config, "[optim]\nname = \"lamb\"\n", "lamb.toml"); }),
                   {"optim.name 'lamb' is not allowed", "lion"}));
}

}  // namespace
}  // namespace fasttrain
