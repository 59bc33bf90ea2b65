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
#include "fasttrain/run/train_run.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/task/tasks.h"
#include "support.h"

namespace fasttrain {
namespace {

const std::string kCli = FASTTRAIN_CLI;

struct ScaledRegressorImpl : torch::nn::Module {
  ScaledRegressorImpl() {
    layers = register_module("layers",
                             Stage(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                                   torch::nn::ReLU(), torch::nn::Linear(32, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& scale) {
    return layers->forward(x) * scale;
  }
  Stage layers{nullptr};
};
TORCH_MODULE(ScaledRegressor);

// The program's run: its data and its model; the task (regression) and every switch from the config.
struct UserRun : RunBuilder {
  DataSplits data(const Config&) override {
    auto split = [](int64_t samples, uint64_t seed) {
      torch::manual_seed(seed);
      const torch::Tensor x = torch::randn({samples, 8}), scale = torch::rand({samples, 1}) + 0.5;
      const torch::Tensor y = (x.slice(1, 0, 4).sum(1, true) - x.slice(1, 4).sum(1, true)) * scale;
      return std::make_shared<TensorSource>(
          std::map<std::string, torch::Tensor>{{"inputs", x}, {"scale", scale}, {"targets", y}});
    };
    return {split(512, 1), split(128, 2), "test"};
  }
  Model model(const Config&, const DataShape&) override {
    return Model(ScaledRegressor(), [](ScaledRegressorImpl& net, const Batch& b) {
      return net.forward(b.inputs, b.at("scale"));
    });
  }
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
  UserRun builder;
  const FitSummary summary =
      train_run(builder, user_config(16, std::atoi(std::getenv("FASTTRAIN_TEST_USER_ZERO"))), run_dir);
  EXPECT_EQ(summary.steps, 12);
  EXPECT_TRUE(summary.test.has("r2"));
}

double max_difference(const std::string& a, const std::string& b) {
  SafetensorsFile first = load_safetensors(a), second = load_safetensors(b);
  EXPECT_EQ(first.names(), second.names());
  double worst = 0;
  for (const auto& name : first.names())
    worst = std::max(worst, (first.at(name) - second.at(name)).abs().max().item<double>());
  return worst;
}

TEST(DistUser, AProgramsRegressorTrainsDataParallelAndFullyShardedAsInOneProcess) {
  testing::TempDir dir;
  UserRun builder;
  const FitSummary single = train_run(builder, user_config(32, 0), dir.file("single"));
  ASSERT_EQ(single.steps, 12);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (int zero : {0, 3}) {
    const std::string run = dir.file("zero" + std::to_string(zero));
    const auto result = testing::run_command(
        "FASTTRAIN_TEST_USER_RUN=" + run + " FASTTRAIN_TEST_USER_ZERO=" + std::to_string(zero) + " " + kCli +
        " launch --nproc 2 --grace-s 5 -- " + self + " --gtest_filter=DistUserRank.TrainsAsOneRank");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    ASSERT_TRUE(std::filesystem::exists(run + "/final/model.safetensors")) << result.output;
  }
  // Two ranks of 16 are one process of 32 (rounding aside); the sharded run is DDP's.
  EXPECT_LT(
      max_difference(dir.file("single/final/model.safetensors"), dir.file("zero0/final/model.safetensors")),
      1e-5);
  EXPECT_LT(
      max_difference(dir.file("zero0/final/model.safetensors"), dir.file("zero3/final/model.safetensors")),
      1e-6);
  const auto summary = nlohmann::json::parse(testing::read_text(dir.file("zero3/summary.json")));
  EXPECT_EQ(summary["dist"]["zero"], 3);
  EXPECT_NEAR(summary["test_r2"].get<double>(), single.test.at("r2"), 1e-4);
}

}  // namespace
}  // namespace fasttrain
