// The run's outputs open in the tools people already use: final/model.safetensors (and the EMA
// weights) load with strict names into the plain PyTorch peer model (tests/interop/safetensors_peer.py)
// and score the same test accuracy there as in `fasttrain eval`.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support.h"

namespace fasttrain {
namespace {

using testing::run_command;

const std::string kCli = FASTTRAIN_CLI;
const std::string kPython = "/usr/bin/python3";

nlohmann::json last_json(const std::string& output) {
  return nlohmann::json::parse(output.substr(output.rfind('{')));
}

TEST(Interop, SafetensorsWeightsScoreTheSameInThePyTorchPeer) {
  FT_REQUIRE_FASHION_MNIST();
  if (run_command(kPython + " -c 'import torch'").exit_code != 0) {
    GTEST_SKIP() << "needs Debian's python3-torch for " << kPython;
  }
  testing::TempDir dir;
  const std::string run = dir.file("run");
  // The main job's model (conv -> pool -> BatchNorm -> ReLU, channels_last, bf16), shortened, with EMA.
  auto trained = run_command(
      kCli + " train " FASTTRAIN_SOURCE_DIR "/configs/default.toml --set train.max_steps=150" +
      " --set train.stop_at_target=false --set train.eval_every_steps=0 --set ema.enabled=true" +
      " --set train.threads=1" + " --set ema.decay=0.99 --set log.progress=none --run-dir " + run);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  for (const char* weights : {"final/model.safetensors", "final/model_ema.safetensors"}) {
    // The peer evaluates in fp32 NCHW: so does fasttrain here.
    auto ours = run_command(kCli + " eval " + run + "/config.toml --set train.precision=fp32" +
                            " --set train.channels_last=false --weights " + run + "/" + weights);
    ASSERT_EQ(ours.exit_code, 0) << ours.output;
    auto peer = run_command(kPython + " " FASTTRAIN_SOURCE_DIR "/tests/interop/safetensors_peer.py " + run +
                            "/config.toml " + run + "/" + weights);
    ASSERT_EQ(peer.exit_code, 0) << peer.output;
    const auto a = last_json(ours.output), b = last_json(peer.output);
    std::printf("[          ] %s: fasttrain %.4f, PyTorch peer %.4f\n", weights,
                a["test_accuracy"].get<double>(), b["test_accuracy"].get<double>());
    EXPECT_GT(a["test_accuracy"].get<double>(), 0.8) << weights;
    EXPECT_DOUBLE_EQ(a["test_accuracy"].get<double>(), b["test_accuracy"].get<double>()) << weights;
    EXPECT_NEAR(a["test_loss"].get<double>(), b["test_loss"].get<double>(), 1e-5) << weights;
    EXPECT_EQ(a["samples"], b["samples"]);
  }
  // Initialisation from safetensors: a run that starts from the final weights begins where it ended.
  auto init = run_command(kCli + " eval " + run + "/config.toml --set train.init_from=" + run +
                          "/final/model.safetensors --weights " + run + "/final/model.safetensors");
  EXPECT_EQ(init.exit_code, 0) << init.output;
  auto continued =
      run_command(kCli + " train " + run + "/config.toml --set train.max_steps=1 --set ema.enabled=false" +
                  " --set schedule.name=constant --set optim.lr=1e-9 --set train.init_from=" + run +
                  "/final/model.safetensors --run-dir " + dir.file("continued"));
  ASSERT_EQ(continued.exit_code, 0) << continued.output;
  EXPECT_NE(continued.output.find("initial weights from"), std::string::npos) << continued.output;
  auto before = last_json(
      run_command(kCli + " eval " + run + "/config.toml --weights " + run + "/final/model.safetensors")
          .output);
  auto after = nlohmann::json::parse(testing::read_text(dir.file("continued/summary.json")));
  EXPECT_NEAR(after["test_accuracy"].get<double>(), before["test_accuracy"].get<double>(), 0.003);
}

}  // namespace
}  // namespace fasttrain
