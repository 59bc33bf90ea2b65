// The run's outputs open in the tools people already use, their real libraries from PyPI
// (FASTTRAIN_PYTHON: scripts/install-deps's pinned .venv with PyTorch 2.11, tensorboard, safetensors):
// final/model.safetensors (and the EMA weights) load with strict names into the plain PyTorch peer
// model (tests/interop/safetensors_peer.py) and score the same test accuracy there as in
// `fasttrain eval`; the `safetensors` package and fasttrain read each other's files, byte for byte;
// TensorBoard's own event reader returns the scalars of metrics.jsonl, a resumed run's included.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/state/safetensors.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::kCli;

using testing::run_command;

const std::string kPython = FASTTRAIN_PYTHON;
const std::string kInterop = FASTTRAIN_SOURCE_DIR "/tests/interop/";

nlohmann::json last_json(const std::string& output) {
  return nlohmann::json::parse(output.substr(output.rfind('{')));
}

// Skips, naming what is missing, where FASTTRAIN_PYTHON lacks a package; scripts/test installs them,
// so CI never skips.
#define FT_REQUIRE_PYTHON_WITH(modules)                                                               \
  if (run_command(kPython + " -c 'import " modules "'").exit_code != 0) {                             \
    GTEST_SKIP() << "needs " << kPython << " with " modules " (scripts/install-deps makes .venv; or " \
                 << "configure with -DFASTTRAIN_PYTHON=<a python that has them>)";                    \
  }

TEST(Interop, SafetensorsWeightsScoreTheSameInThePyTorchPeer) {
  FT_REQUIRE_FASHION_MNIST();
  FT_REQUIRE_PYTHON_WITH("torch, safetensors");
  testing::TempDir dir;
  const std::string run = dir.file("run");
  // The main job's model (conv -> pool -> BatchNorm -> ReLU, channels_last, bf16), shortened, with EMA
  // from the first step (the default config's starts at step 300).
  auto trained = run_command(
      kCli + " train " FASTTRAIN_SOURCE_DIR "/configs/default.toml --set train.max_steps=150" +
      " --set train.stop_at_target=false --set train.eval_every_steps=0 --set ema.enabled=true" +
      " --set train.threads=1" + " --set ema.decay=0.99 --set ema.after_step=0 --set log.progress=none" +
      " --run-dir " + run);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  for (const char* weights : {"final/model.safetensors", "final/model_ema.safetensors"}) {
    // The peer evaluates in fp32 NCHW on the CPU: so does fasttrain here (training may have run on a GPU).
    auto ours =
        run_command(kCli + " eval " + run + "/config.toml --set train.precision=fp32 --set train.device=cpu" +
                    " --set train.channels_last=false --weights " + run + "/" + weights);
    ASSERT_EQ(ours.exit_code, 0) << ours.output;
    auto peer = run_command(kPython + " " + kInterop + "safetensors_peer.py " + run + "/config.toml " + run +
                            "/" + weights);
    ASSERT_EQ(peer.exit_code, 0) << peer.output;
    const auto a = last_json(ours.output), b = last_json(peer.output);
    std::printf("[          ] %s: fasttrain %.4f, PyTorch %s peer %.4f\n", weights,
                a["test_accuracy"].get<double>(), b["torch"].get<std::string>().c_str(),
                b["test_accuracy"].get<double>());
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

// The tensors of tests/interop/safetensors_roundtrip.py's expected(), by the same formulas.
NamedTensors roundtrip_tensors() {
  auto base = torch::arange(24, torch::kFloat64).reshape({2, 3, 4}) * 0.375 - 4.0;
  return {{"f32", base.to(torch::kFloat32)},
          {"f16", base.to(torch::kFloat16)},
          {"bf16", base.to(torch::kBFloat16)},
          {"i64", torch::arange(-6, 6, torch::kInt64) * int64_t{1'000'000'000'007}},
          {"scalar_f32", torch::tensor(2.5f)},
          {"empty_f32", torch::zeros({0, 3}, torch::kFloat32)}};
}
// One key: the reference writes __metadata__ from a Rust HashMap, whose order changes from process to
// process, so a file with two keys has no single byte image to compare with.
const std::map<std::string, std::string> kRoundtripMetadata{{"format", "pt"}};

TEST(Interop, TheSafetensorsPackageAndFasttrainReadEachOthersFilesByteForByte) {
  FT_REQUIRE_PYTHON_WITH("torch, safetensors");
  testing::TempDir dir;
  // fasttrain writes, safetensors.torch.load_file and safe_open read (values, dtypes, shapes, metadata).
  save_safetensors(dir.file("ours.safetensors"), roundtrip_tensors(), kRoundtripMetadata);
  auto checked = run_command(kPython + " " + kInterop + "safetensors_roundtrip.py check " +
                             dir.file("ours.safetensors"));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  // safetensors.torch.save_file writes, fasttrain reads.
  auto written = run_command(kPython + " " + kInterop + "safetensors_roundtrip.py write " +
                             dir.file("theirs.safetensors"));
  ASSERT_EQ(written.exit_code, 0) << written.output;
  SafetensorsFile theirs = load_safetensors(dir.file("theirs.safetensors"));
  EXPECT_EQ(theirs.metadata(), kRoundtripMetadata);
  ASSERT_EQ(theirs.size(), roundtrip_tensors().size());
  for (const auto& [name, tensor] : roundtrip_tensors()) {
    ASSERT_TRUE(theirs.contains(name)) << name;
    const torch::Tensor& read = theirs.at(name);
    EXPECT_EQ(read.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(read.sizes(), tensor.sizes()) << name;
    EXPECT_TRUE(torch::equal(read, tensor)) << name;
  }
  // The same tensors and metadata make the same file: the layout follows the reference exactly.
  EXPECT_TRUE(read_binary_file(dir.file("ours.safetensors")) ==
              read_binary_file(dir.file("theirs.safetensors")));
}

// metrics.jsonl's values by TensorBoard tag: {tag: [(step, value)]}, in the file's order. A value that was
// not measured (null: grad_norm without clipping) has no scalar.
std::map<std::string, std::vector<std::pair<int64_t, double>>> metrics_by_tag(const std::string& path) {
  const std::map<std::string, std::vector<std::pair<std::string, std::string>>> tags{
      {"train",
       {{"loss", "train/loss"},
        {"lr", "train/lr"},
        {"grad_norm", "train/grad_norm"},
        {"samples_per_s", "train/samples_per_s"},
        {"data_wait_fraction", "train/data_wait_fraction"}}},
      {"eval", {{"test_loss", "test/loss"}, {"test_accuracy", "test/accuracy"}}}};
  std::map<std::string, std::vector<std::pair<int64_t, double>>> values;
  std::istringstream lines(testing::read_text(path));
  for (std::string line; std::getline(lines, line);) {
    auto record = nlohmann::json::parse(line);
    auto kind = tags.find(record["kind"].get<std::string>());
    if (kind == tags.end()) continue;
    for (const auto& [key, tag] : kind->second) {
      if (!record[key].is_null()) values[tag].emplace_back(record["step"], record[key]);
    }
  }
  return values;
}

TEST(Interop, TensorBoardsOwnReaderReturnsTheScalarsOfMetricsJsonlAcrossAResume) {
  FT_REQUIRE_FASHION_MNIST();
  FT_REQUIRE_PYTHON_WITH("tensorboard");
  testing::TempDir dir;
  const std::string run = dir.file("run");
  // 25 steps an epoch, 2 epochs, a record every step, an evaluation each epoch, a checkpoint every 10.
  const std::string job = kCli +
                          " train --set model.name=mlp --set model.hidden=[32] --set data.train_limit=1600" +
                          " --set data.batch_size=64 --set data.workers=0 --set train.epochs=2" +
                          " --set train.threads=1 --set log.every_steps=1 --set log.progress=none" +
                          " --set checkpoint.every_steps=10 --set checkpoint.keep=10 --run-dir " + run;
  auto straight = run_command(job);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  // Again from step 20, in the same directory: TensorBoard must hide the first session's steps >= 21.
  auto resumed = run_command(job + " --resume " + run + "/checkpoints/step-20");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;

  auto read = run_command(kPython + " " + kInterop + "tensorboard_scalars.py " + run);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  const auto shown = last_json(read.output);
  const auto expected = metrics_by_tag(run + "/metrics.jsonl");
  ASSERT_EQ(expected.at("train/loss").size(), 50u) << "every step once in metrics.jsonl";
  ASSERT_EQ(expected.at("test/accuracy").size(), 2u);
  EXPECT_EQ(expected.count("train/grad_norm"), 0u) << "no clipping: nothing measured the gradient norm";
  std::vector<std::string> shown_tags;
  for (const auto& [tag, points] : shown.items()) shown_tags.push_back(tag);
  std::vector<std::string> expected_tags;
  for (const auto& [tag, points] : expected) expected_tags.push_back(tag);
  EXPECT_EQ(shown_tags, expected_tags);
  for (const auto& [tag, points] : expected) {
    if (!shown.contains(tag)) continue;
    const auto& got = shown[tag];
    ASSERT_EQ(got.size(), points.size()) << tag << ": TensorBoard shows " << got.dump();
    for (size_t i = 0; i < points.size(); ++i) {
      EXPECT_EQ(got[i][0].get<int64_t>(), points[i].first) << tag << " #" << i;
      // TensorBoard keeps scalars as float32.
      EXPECT_EQ(static_cast<float>(got[i][1].get<double>()), static_cast<float>(points[i].second))
          << tag << " at step " << points[i].first;
    }
  }
}

}  // namespace
}  // namespace fasttrain
