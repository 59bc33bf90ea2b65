// A table trained through the run layer from a config alone (tests/data has the CSV source itself;
// this needs the whole library, which the sanitizer build of data/ and state/ leaves out).
#include <gtest/gtest.h>

#include <filesystem>

#include "fasttrain/config/config.h"
#include "fasttrain/run/train_run.h"
#include "support.h"

namespace fasttrain {
namespace {

// A real table Debian ships (python3-vega-datasets): 1461 days of Seattle weather, 2012-2015.
const std::string kSeattle = "/usr/lib/python3/dist-packages/vega_datasets/_data/seattle-weather.csv";

// The run layer trains a table from a config alone: the MLP regresses Seattle's highest temperature of a
// day from its other measurements.
TEST(CsvRun, TrainsARegressionFromTheConfigAlone) {
  if (!std::filesystem::exists(kSeattle))
    GTEST_SKIP() << "needs Debian's python3-vega-datasets (scripts/install-deps) at " << kSeattle;
  testing::TempDir dir;
  Config config;
  for (const char* setting :
       {"data.dataset=csv", "data.targets=[\"temp_max\"]",
        "data.features=[\"precipitation\", \"temp_min\", \"wind\"]", "model.name=mlp", "model.hidden=[32]",
        "data.batch_size=32", "train.epochs=20", "train.threads=1", "optim.lr=3e-3", "log.progress=none"}) {
    apply_override(config, setting);
  }
  apply_override(config, "data.path=" + kSeattle);
  RunBuilder builder;
  const FitSummary summary = train_run(builder, config, dir.file("run"));
  EXPECT_GT(summary.test.at("r2"), 0.6) << "the day's lowest temperature says much of its highest";
}

// Mirroring is for images: a table with train.eval_flip is refused before training, naming the key and
// the inputs it got.
TEST(CsvRun, EvalFlipOnATableNamesTheKeyAndTheInputs) {
  if (!std::filesystem::exists(kSeattle))
    GTEST_SKIP() << "needs Debian's python3-vega-datasets (scripts/install-deps) at " << kSeattle;
  testing::TempDir dir;
  Config config;
  for (const char* setting : {"data.dataset=csv", "data.targets=[\"temp_max\"]",
                              "data.features=[\"temp_min\", \"wind\"]", "model.name=mlp", "train.max_steps=2",
                              "train.eval_flip=true", "train.threads=1", "log.progress=none"}) {
    apply_override(config, setting);
  }
  apply_override(config, "data.path=" + kSeattle);
  RunBuilder builder;
  const std::string message = testing::error_message([&] { train_run(builder, config, dir.file("run")); });
  EXPECT_TRUE(testing::contains_all(message, {"train.eval_flip", "[N, C, H, W]", "Float [2, 2]"})) << message;
  EXPECT_FALSE(std::filesystem::exists(dir.file("run") + "/metrics.jsonl")) << "nothing trained";
}

}  // namespace
}  // namespace fasttrain
