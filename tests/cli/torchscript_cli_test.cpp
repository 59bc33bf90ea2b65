// A model written in Python through the executable: `model.name = "torchscript"` trains from a config,
// resumes bit-identically in a fresh process, and the measuring tools (find-lr, find-batch, profile,
// doctor) run on it as on a C++ model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/state/safetensors.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::bytes_of;
using testing::kCli;

using testing::contains_all;
using testing::run_command;

const std::string kDefault = " " FASTTRAIN_SOURCE_DIR "/configs/default.toml";

// The default config's recipe on tests/models/scripted_models.py's Cnn, with accumulation, clipping and
// EMA; 1024 samples in micro-batches of 64, windows of 2: 8 steps an epoch, 2 epochs.
std::string scripted_run() {
  return " --set model.name=torchscript --set model.path=" + testing::scripted_models().path("cnn") +
         " --set data.train_limit=1024 --set data.batch_size=64 --set data.workers=1 --set "
         "train.accumulation=2"
         " --set train.epochs=2 --set train.max_steps=0 --set train.threads=1 --set train.clip_norm=1.0"
         " --set ema.enabled=true --set ema.decay=0.9 --set ema.after_step=0 --set log.every_steps=1"
         " --set log.progress=none"
         // bit-identical runs on a GPU need cuDNN's deterministic algorithms, not its per-process benchmark
         " --set train.deterministic=true";
}

TEST(TorchScriptCli, TrainsAndResumesInAFreshProcessBitIdentically) {
  FT_REQUIRE_FASHION_MNIST();
  FT_REQUIRE_SCRIPTED_MODELS();
  testing::TempDir dir;
  const std::string straight = dir.file("straight"), resumed = dir.file("resumed");
  auto result =
      run_command(kCli + " train" + kDefault + scripted_run() +
                  " --set checkpoint.every_steps=1 --set checkpoint.keep=100 --run-dir " + straight);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("torchscript"), std::string::npos) << result.output;
  const auto summary = nlohmann::json::parse(read_text_file(straight + "/summary.json"));
  EXPECT_EQ(summary["steps"], 16);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.5) << "1024 samples, two epochs";
  // The export keeps the module's own state_dict names (PyTorch's load_state_dict takes it as it is).
  const auto names = load_safetensors(straight + "/final/model.safetensors").names();
  for (const char* name : {"features.0.weight", "features.2.running_mean", "features.2.num_batches_tracked",
                           "classifier.2.bias"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }

  // Step 5: mid-epoch, inside the EMA's and the schedule's course.
  result = run_command(kCli + " train" + kDefault + scripted_run() + " --resume " + straight +
                       "/checkpoints/step-5 --run-dir " + resumed);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* file : {"final/model.safetensors", "final/model_ema.safetensors"}) {
    EXPECT_TRUE(bytes_of(straight + "/" + file) == bytes_of(resumed + "/" + file)) << file << " differs";
  }
}

TEST(TorchScriptCli, TheMeasuringToolsRunOnAScriptedModel) {
  FT_REQUIRE_FASHION_MNIST();
  FT_REQUIRE_SCRIPTED_MODELS();
  testing::TempDir dir;
  auto lr =
      run_command(kCli + " find-lr" + kDefault + scripted_run() + " --steps 30 --csv " + dir.file("lr.csv"));
  ASSERT_EQ(lr.exit_code, 0) << lr.output;
  EXPECT_NE(lr.output.find("suggested max lr"), std::string::npos) << lr.output;

  // An allocation past memory.budget inside the interpreter is an out-of-memory trial, not a failure.
  auto batch = run_command(kCli + " find-batch" + kDefault + scripted_run() +
                           " --set data.train_limit=8192 --set train.device=cpu --set memory.budget=160MiB"
                           " --set data.eval_batch_size=256");
  ASSERT_EQ(batch.exit_code, 0) << batch.output;
  EXPECT_TRUE(contains_all(batch.output, {"largest batch that fits memory.budget", "   no  "}))
      << batch.output;

  auto profile = run_command(kCli + " profile" + kDefault + scripted_run() + " --steps 4 --warmup-steps 2" +
                             " --run-dir " + dir.file("profile"));
  ASSERT_EQ(profile.exit_code, 0) << profile.output;
  EXPECT_NE(read_text_file(dir.file("profile/trace.json")).find("aten::convolution"), std::string::npos);

  auto doctor = run_command(kCli + " doctor" + kDefault + scripted_run() +
                            " --steps 4 --min-seconds 0.2 --json --run-dir " + dir.file("doctor"));
  ASSERT_EQ(doctor.exit_code, 0) << doctor.output;
  EXPECT_NE(read_text_file(dir.file("doctor/doctor.json")).find("\"findings\""), std::string::npos);
}

}  // namespace
}  // namespace fasttrain
