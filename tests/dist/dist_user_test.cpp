// A program's own model, data and task, trained data-parallel: the ranks are this test binary itself,
// started by `fasttrain launch` with DistUserRank.TrainsAsOneRank, which builds the run with its own
// RunBuilder (a regressor with two inputs whose layers are a Stage, over a TensorSource) and trains it
// with train_run. DDP on 2 ranks equals one process on the global batch, and fully sharded training
// (dist.zero = 3, the Stage's blocks sharded) equals DDP.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "fasttrain/data/tensor_source.h"
#include "fasttrain/dist/process_group.h"
#include "fasttrain/models/torchscript.h"
#include "fasttrain/run/train_run.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/task/tasks.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::kCli;
using testing::max_difference;

struct ScaledRegressorImpl : torch::nn::Module {
  explicit ScaledRegressorImpl(int64_t features) {
    layers = register_module(
        "layers", Stage(torch::nn::Linear(features, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                        torch::nn::ReLU(), torch::nn::Linear(32, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& scale) {
    return layers->forward(x) * scale;
  }
  Stage layers{nullptr};
};
TORCH_MODULE(ScaledRegressor);

// The program's run: its data and its model, written in C++ or in Python (`scripted`: a TorchScript archive
// of tests/models/scripted_models.py's ScaledRegressor, over 6 features); the task (regression) and every
// switch from the config.
struct UserRun : RunBuilder {
  explicit UserRun(std::string scripted = "") : scripted(std::move(scripted)) {}
  DataSplits data(const Config&) override {
    const int64_t features = scripted.empty() ? 8 : 6;
    auto split = [features](int64_t samples, uint64_t seed) {
      torch::manual_seed(seed);
      const torch::Tensor x = torch::randn({samples, features}), scale = torch::rand({samples, 1}) + 0.5;
      const torch::Tensor y = (x.slice(1, 0, 4).sum(1, true) - x.slice(1, 4).sum(1, true)) * scale;
      return std::make_shared<TensorSource>(
          std::map<std::string, torch::Tensor>{{"inputs", x}, {"scale", scale}, {"targets", y}});
    };
    return {split(512, 1), split(128, 2), "test"};
  }
  Model model(const Config&, const DataShape& shape) override {
    if (!scripted.empty()) return load_torchscript(scripted);
    return Model(ScaledRegressor(shape.input[0]), [](ScaledRegressorImpl& net, const Batch& b) {
      return net.forward(b.inputs, b.at("scale"));
    });
  }
  std::string scripted;
};

Config user_config(int64_t batch_size, int zero) {
  Config config;
  config.data.batch_size(batch_size).workers(0);
  config.task.select("regression");
  config.optim.name("adamw").lr(3e-3);
  config.schedule.name("one-cycle");
  config.train.options.max_steps(12).accumulation(2).clip_norm(1.0).eval_every_steps(0);
  config.train.threads(1).device("cpu");
  config.log.progress("none");
  config.dist.zero(zero);
  return config;
}

// A rank of DistUser's jobs: runs only under `fasttrain launch` with FASTTRAIN_TEST_USER_RUN set.
TEST(DistUserRank, TrainsAsOneRank) {
  const char* run_dir = std::getenv("FASTTRAIN_TEST_USER_RUN");
  if (run_dir == nullptr) GTEST_SKIP() << "a rank of DistUser.*: runs under fasttrain launch only";
  const char* scripted = std::getenv("FASTTRAIN_TEST_USER_SCRIPTED");
  UserRun builder(scripted ? scripted : "");
  const FitSummary summary =
      train_run(builder, user_config(16, std::atoi(std::getenv("FASTTRAIN_TEST_USER_ZERO"))), run_dir);
  EXPECT_EQ(summary.steps, 12);
  EXPECT_TRUE(summary.test.has("r2"));
}

// DistUserRank.TrainsAsOneRank's ranks, launched for `zero` into `run` (the model from `scripted`, or the
// C++ one): the launcher's exit code and output.
testing::CommandResult launch_ranks(const std::string& run, int zero, const std::string& scripted = "") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return testing::run_command(
      "FASTTRAIN_TEST_USER_RUN=" + run + " FASTTRAIN_TEST_USER_ZERO=" + std::to_string(zero) +
      (scripted.empty() ? "" : " FASTTRAIN_TEST_USER_SCRIPTED=" + scripted) + " " + kCli +
      " launch --nproc 2 --grace-s 5 -- " + self + " --gtest_filter=DistUserRank.TrainsAsOneRank");
}

// One process on the global batch of 32, then two ranks of 16 with DDP and with ZeRO `zero`, each into
// DIR/single, DIR/zero0, DIR/zero<zero>: two ranks are one process (rounding aside), the sharded run DDP's.
FitSummary expect_ranks_equal_one_process(const testing::TempDir& dir, int zero,
                                          const std::string& scripted = "") {
  UserRun builder(scripted);
  const FitSummary single = train_run(builder, user_config(32, 0), dir.file("single"));
  EXPECT_EQ(single.steps, 12);
  for (int z : {0, zero}) {
    const std::string run = dir.file("zero" + std::to_string(z));
    const auto result = launch_ranks(run, z, scripted);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_TRUE(std::filesystem::exists(run + "/final/model.safetensors")) << result.output;
  }
  EXPECT_LT(
      max_difference(dir.file("single/final/model.safetensors"), dir.file("zero0/final/model.safetensors")),
      1e-5);
  EXPECT_LT(max_difference(dir.file("zero0/final/model.safetensors"),
                           dir.file("zero" + std::to_string(zero) + "/final/model.safetensors")),
            1e-6);
  return single;
}

TEST(DistUser, AProgramsRegressorTrainsDataParallelAndFullyShardedAsInOneProcess) {
  testing::TempDir dir;
  const FitSummary single = expect_ranks_equal_one_process(dir, 3);
  const auto summary = nlohmann::json::parse(testing::read_text(dir.file("zero3/summary.json")));
  EXPECT_EQ(summary["dist"]["zero"], 3);
  EXPECT_NEAR(summary["test_r2"].get<double>(), single.test.at("r2"), 1e-4);
}

// A model written in Python trains data-parallel (DDP, ZeRO-2) as in one process, under PyTorch's names;
// fully sharded training, which would have to reach inside its interpreted forward, is refused by name
// before any step.
TEST(DistUser, AScriptedRegressorTrainsDataParallelAsInOneProcess) {
  FT_REQUIRE_SCRIPTED_MODELS();
  const std::string scripted = testing::scripted_models().path("regressor_plain");
  testing::TempDir dir;
  expect_ranks_equal_one_process(dir, 2, scripted);
  EXPECT_EQ(
      load_safetensors(dir.file("zero2/final/model.safetensors")).names(),
      (std::vector<std::string>{"layers.0.bias", "layers.0.weight", "layers.3.bias", "layers.3.weight"}));
  const auto refused = launch_ranks(dir.file("zero3"), 3, scripted);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(
      testing::contains_all(refused.output, {"dist.zero = 3", "TorchScript interpreter", "dist.zero = 2"}))
      << refused.output;
}

}  // namespace
}  // namespace fasttrain
