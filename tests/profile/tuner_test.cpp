#include "fasttrain/profile/tuner.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/run/auto.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"
#include "support.h"

namespace fasttrain {
namespace {

// A small cnn on 300 Fashion-MNIST images at one thread, its data resident or built by the loader.
Config small_cnn_run(int64_t batch_size, const std::string& device_resident) {
  Config config;
  config.data.batch_size(batch_size);
  config.data.dataset.as<ImageDataOptions>().train_limit(300);
  config.data.device_resident(device_resident);
  config.model.select("cnn").as<CnnOptions>().widths({8, 16}).hidden({32});
  config.train.threads(1);
  return config;
}

TEST(Tune, KeepsWhatIsFasterAndWritesTheTunedConfig) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  const Config config = small_cnn_run(128, "false");  // the loader's workers are then a switch to try
  RunBuilder builder;
  TuneResult result =
      tune(builder, config, dir.path(),
           TuneOptions().measure(MeasureOptions().steps(6).warmup_steps(2).min_seconds(0.3)).batch(true));

  ASSERT_FALSE(result.trials.empty());
  bool failed_reported = false;
  for (const auto& trial : result.trials) {
    if (trial.kept) {
      EXPECT_GE(trial.speedup, TuneOptions().min_gain()) << trial.change;
    }
    if (trial.change.rfind("data.batch_size x4", 0) == 0) {
      // 4 x 128 exceeds the 300 samples: the trial fails, is reported and changes nothing.
      EXPECT_FALSE(trial.kept);
      EXPECT_NE(trial.note.find("failed: "), std::string::npos) << trial.note;
      failed_reported = true;
    }
  }
  EXPECT_TRUE(failed_reported) << result.table();
  EXPECT_GE(result.tuned_samples_per_s, result.baseline_samples_per_s);
  // The tuned config is the given one with exactly the kept changes applied.
  int kept = 0;
  for (const auto& trial : result.trials) kept += trial.kept ? 1 : 0;
  // (The trials start from "auto" resolved for this run here: train.blas_threads and task.name made
  // concrete.)
  const Config resolved = build_run(builder, config).config;
  EXPECT_EQ(kept == 0, to_toml(result.tuned) == to_toml(resolved)) << result.table();
  // Nothing kept: the tuned speed is the baseline's (its re-measures refine both alike).
  if (kept == 0) {
    EXPECT_EQ(result.tuned_samples_per_s, result.baseline_samples_per_s);
  }
  // tuned.toml is the tuned config, loadable as it is; tune.md the table.
  EXPECT_EQ(to_toml(load_config(dir.file("tuned.toml"))), to_toml(result.tuned));
  EXPECT_EQ(testing::read_text(dir.file("tune.md")), result.table());
  // Every applicable switch was tried; a value already in effect was not (before a kept change:
  // afterwards the thread counts are tried again, from the new best).
  const BlasLibrary blas = blas_library();
  const int blas_in_effect =
      resolved.train.blas_threads() > 0 ? resolved.train.blas_threads() : blas.threads_at_start;
  for (const auto& trial : result.trials) {
    EXPECT_NE(trial.change, "train.threads = 1") << result.table();
    if (!blas.name.empty()) {
      EXPECT_NE(trial.change, fmt::format("train.blas_threads = {}", blas_in_effect)) << result.table();
    }
    if (trial.kept) break;
  }
  // This CPU's bf16 is proposed only where it is native.
  if (!detect_hardware(torch::kCPU).native_bf16()) {
    for (const auto& trial : result.trials)
      EXPECT_EQ(trial.change.find("bf16"), std::string::npos) << result.table();
  }
  for (const char* tried :
       {"| data.workers = 0 |", "| train.channels_last = true |", "| data.batch_size x2"}) {
    EXPECT_NE(result.table().find(tried), std::string::npos) << tried << "\n" << result.table();
  }
}

TEST(Tune, TriesNoLoaderWorkersWhereTheDataIsResident) {
  // A resident copy (data.device_resident; "auto" keeps unaugmented images so on a CPU) builds batches on the
  // step's thread and runs no loader workers: data.workers would change nothing, so it is not tried.
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  RunBuilder builder;
  const TuneResult result =
      tune(builder, small_cnn_run(64, "true"), dir.path(),
           TuneOptions().measure(MeasureOptions().steps(2).warmup_steps(1).min_seconds(0.05)));
  ASSERT_FALSE(result.trials.empty());
  EXPECT_EQ(result.table().find("data.workers"), std::string::npos) << result.table();
}

}  // namespace
}  // namespace fasttrain
