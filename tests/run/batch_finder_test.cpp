#include "fasttrain/run/batch_finder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/memory/stats.h"
#include "fasttrain/run/run.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

// A small run: 4096 Fashion-MNIST samples, a cnn whose activations grow with the batch. On the CPU
// (memory.budget binds there; device = auto would take a GPU where there is one).
Config small_config() {
  Config config;
  config.train.device("cpu");
  config.data.eval_batch_size(256).workers(1);
  config.data.loader.prefetch(2);
  config.data.dataset.as<ImageDataOptions>().train_limit(4096);
  config.model.select("cnn").as<CnnOptions>().widths({8, 16}).hidden({32});
  config.train.threads(1);
  return config;
}

TEST(CpuMemoryLimit, AllocationsPastTheLimitFailAsOutOfMemory) {
  track_cpu_allocations();
  const int64_t now = memory_stats(torch::kCPU).allocated_bytes;
  {
    CpuMemoryLimit limit(now + (1 << 20));
    torch::Tensor fits = torch::empty({1 << 16}, torch::kFloat);  // 256 KiB
    try {
      torch::Tensor too_big = torch::empty({1 << 20}, torch::kFloat);  // 4 MiB
      FAIL() << "expected an out-of-memory error";
    } catch (const c10::Error& error) {
      EXPECT_TRUE(is_out_of_memory(error));
      EXPECT_NE(std::string(error.what()).find("memory.budget"), std::string::npos) << error.what();
    }
    EXPECT_THROW(CpuMemoryLimit second(1 << 30), Error) << "one limit at a time";
  }
  torch::Tensor after = torch::empty({1 << 20}, torch::kFloat);  // the limit is gone
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("other")));
}

// The answer fits, a size just past it (beyond the tolerance) does not, and a run at the answer
// stays inside the budget over many more steps than the trials took.
TEST(BatchFinder, FindsTheLargestBatchUnderTheBudget) {
  FT_REQUIRE_FASHION_MNIST();
  Config config = small_config();
  config.memory.budget("96MiB");
  auto options = BatchFinderOptions().tolerance(0.05);
  RunBuilder builder;
  BatchFinderResult result = find_batch_size(builder, config, options);
  ASSERT_GT(result.batch_size, 16);
  EXPECT_LT(result.batch_size, 4096) << "the budget must bind for this test to mean anything";
  EXPECT_EQ(result.budget_bytes, 96 << 20);
  bool answer_fits = false, failure_above = false;
  for (const auto& trial : result.trials) {
    if (trial.batch_size == result.batch_size)
      answer_fits = trial.fits && trial.peak_bytes <= result.budget_bytes;
    if (trial.fits) {
      EXPECT_LE(trial.batch_size, result.batch_size);
      EXPECT_GT(trial.samples_per_s, 0);
    } else if (trial.batch_size <= result.batch_size * 1.06 + 1) {
      failure_above = true;
    }
  }
  EXPECT_TRUE(answer_fits);
  EXPECT_TRUE(failure_above) << result.table();
  EXPECT_NE(result.table().find("largest batch that fits memory.budget 96.00 MiB on cpu: " +
                                std::to_string(result.batch_size)),
            std::string::npos)
      << result.table();

  Config run = config;
  run.data.batch_size(result.batch_size);
  run.train.options.max_steps(20);
  fasttrain::Run built = build_run(builder, run);
  FitSummary summary = built.make_trainer()->fit(*built.train_loader, built.test_loader.get());
  EXPECT_LE(summary.peak_memory_bytes, result.budget_bytes);
}

TEST(BatchFinder, OnCpuTheBudgetIsRequiredAndMustHoldOneSample) {
  FT_REQUIRE_FASHION_MNIST();
  Config config = small_config();
  RunBuilder builder;
  try {
    find_batch_size(builder, config, BatchFinderOptions());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("memory.budget"), std::string::npos) << error.what();
  }
  config.memory.budget("1MiB");  // less than the dataset itself
  try {
    find_batch_size(builder, config, BatchFinderOptions());
    FAIL() << "expected Error";
  } catch (const Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("even data.batch_size = 1 does not fit memory.budget = 1.00 MiB"),
        std::string::npos)
        << error.what();
  }
  EXPECT_THROW(find_batch_size(builder, config, BatchFinderOptions().measure(MeasureOptions().steps(1))),
               ConfigError);
}

TEST(BatchFinder, ResolveReplacesOnlyAuto) {
  FT_REQUIRE_FASHION_MNIST();
  Config config = small_config();
  config.data.batch_size(96);
  RunBuilder builder;
  EXPECT_EQ(resolve_batch_size(builder, config).data.batch_size(), 96);
  config.data.batch_size(0);
  try {
    build_run(builder, config);
    FAIL() << "an unresolved \"auto\" must not build";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("resolve"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace fasttrain
