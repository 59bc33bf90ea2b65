// End-to-end tests of the fasttrain executable: what a user types, what lands in the run directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "fasttrain/log/tensorboard.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::kCli;

using testing::run_command;

const std::string kSmallRun =
    " --set model.name=mlp --set model.hidden=[64] --set data.batch_size=64 --set optim.lr=2e-3"
    " --set schedule.name=one-cycle --set train.max_steps=300 --set train.eval_every_steps=150"
    " --set train.target_accuracy=0.7 --set log.every_steps=50 --set train.threads=1";

TEST(Cli, HelpListsTheSubcommands) {
  auto result = run_command(kCli + " --help");
  EXPECT_EQ(result.exit_code, 0);
  for (const char* command : {"train", "eval", "find-lr", "find-batch", "report", "config"}) {
    EXPECT_NE(result.output.find(command), std::string::npos) << result.output;
  }
  auto train_help = run_command(kCli + " train --help");
  EXPECT_EQ(train_help.exit_code, 0);
  EXPECT_NE(train_help.output.find("--set"), std::string::npos);
  EXPECT_NE(train_help.output.find("--run-dir"), std::string::npos);
}

TEST(Cli, TrainsAFewHundredStepsAndWritesTheRunDirectory) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  std::string run_dir = dir.file("run");
  auto result = run_command(kCli + " train" + kSmallRun + " --run-dir " + run_dir);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  auto summary = nlohmann::json::parse(testing::read_text(run_dir + "/summary.json"));
  for (const char* key :
       {"test_accuracy", "best_test_accuracy", "wall_s", "time_to_target_s", "train_samples_per_s", "steps",
        "skipped_steps", "data_wait_fraction", "peak_memory_bytes"}) {
    EXPECT_TRUE(summary.contains(key)) << key;
  }
  EXPECT_EQ(summary["steps"], 300);
  EXPECT_EQ(summary["skipped_steps"], 0);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.75);
  EXPECT_GE(summary["best_test_accuracy"].get<double>(), summary["test_accuracy"].get<double>());
  ASSERT_TRUE(summary["time_to_target_s"].is_number());
  EXPECT_LE(summary["time_to_target_s"].get<double>(), summary["wall_s"].get<double>());
  EXPECT_GT(summary["train_samples_per_s"].get<double>(), 100);
  EXPECT_GE(summary["data_wait_fraction"].get<double>(), 0);
  EXPECT_LT(summary["data_wait_fraction"].get<double>(), 1);
  EXPECT_GT(summary["peak_memory_bytes"].get<int64_t>(), 1 << 20);

  // metrics.jsonl: a train record every 50 steps and an eval record every 150.
  std::istringstream lines(testing::read_text(run_dir + "/metrics.jsonl"));
  int train_records = 0, eval_records = 0, checkpoint_records = 0;
  for (std::string line; std::getline(lines, line);) {
    auto record = nlohmann::json::parse(line);
    train_records += record["kind"] == "train";
    eval_records += record["kind"] == "eval";
    checkpoint_records += record["kind"] == "checkpoint";
  }
  EXPECT_EQ(train_records, 6);
  EXPECT_EQ(eval_records, 2);
  EXPECT_EQ(checkpoint_records, 1);  // the end of the run
  EXPECT_TRUE(nlohmann::json::parse(
                  testing::read_text(run_dir + "/metrics.jsonl")
                      .substr(0, testing::read_text(run_dir + "/metrics.jsonl").find('\n')))["grad_norm"]
                  .is_null());
  // The terminal gets a closing statement, not the summary: the target, its step and time, the metrics.
  EXPECT_TRUE(testing::contains_all(
      result.output, {"fasttrain: reached accuracy >= 0.7 at step", "test loss", "run directory " + run_dir}))
      << result.output;
  EXPECT_EQ(result.output.find("\"train_samples_per_s\""), std::string::npos) << "no JSON on the terminal";

  // TensorBoard: the same scalars in events.out.tfevents.*, every record's CRCs verified on read.
  std::string events_path;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events_path = entry.path();
  }
  ASSERT_FALSE(events_path.empty()) << "no events file in " << run_dir;
  std::vector<TensorBoardEvent> events = read_tensorboard_events(events_path);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  std::map<std::string, std::vector<std::pair<int64_t, float>>> scalars;
  for (const auto& event : events) {
    for (const auto& scalar : event.scalars) scalars[scalar.tag].emplace_back(event.step, scalar.value);
  }
  for (const char* tag : {"train/loss", "train/lr", "train/samples_per_s", "train/data_wait_fraction",
                          "test/accuracy", "test/loss"}) {
    EXPECT_EQ(scalars[tag].size(), std::string(tag).rfind("test/", 0) == 0 ? 2u : 6u) << tag;
  }
  // Without clipping nothing measured the gradient norm: no scalar for it, and null in metrics.jsonl.
  EXPECT_EQ(scalars.count("train/grad_norm"), 0u);
  std::istringstream again(testing::read_text(run_dir + "/metrics.jsonl"));
  size_t train_index = 0, eval_index = 0;
  for (std::string line; std::getline(again, line);) {
    auto record = nlohmann::json::parse(line);
    if (record["kind"] == "train" && train_index < scalars["train/loss"].size()) {
      EXPECT_EQ(scalars["train/loss"][train_index].first, record["step"].get<int64_t>());
      EXPECT_EQ(scalars["train/loss"][train_index++].second,
                static_cast<float>(record["loss"].get<double>()));
    } else if (record["kind"] == "eval" && eval_index < scalars["test/accuracy"].size()) {
      EXPECT_EQ(scalars["test/accuracy"][eval_index++].second,
                static_cast<float>(record["test_accuracy"].get<double>()));
    }
  }

  // The effective config is complete and reproduces the run's settings.
  std::string effective = testing::read_text(run_dir + "/config.toml");
  EXPECT_NE(effective.find("max_steps = 300"), std::string::npos) << effective;
  auto reloaded = run_command(kCli + " config " + run_dir + "/config.toml");
  EXPECT_EQ(reloaded.exit_code, 0) << reloaded.output;
  EXPECT_EQ(reloaded.output, effective);

  // eval on the saved weights gives the run's final accuracy.
  auto eval = run_command(kCli + " eval " + run_dir + "/config.toml --weights " + run_dir +
                          "/final/model.safetensors");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  auto evaluated = nlohmann::json::parse(eval.output.substr(eval.output.find('{')));
  EXPECT_DOUBLE_EQ(evaluated["test_accuracy"].get<double>(), summary["test_accuracy"].get<double>());
}

TEST(Cli, ConfigErrorsExitWithCodeTwoAndNameTheKey) {
  struct Case {
    std::string args;
    std::vector<std::string> expected;
  };
  std::vector<Case> cases = {
      {"--set data.batch_size=0", {"data.batch_size", "0"}},
      {"--set data.batch_size=-5", {"data.batch_size", "-5"}},
      {"--set train.accumulation=0", {"train.accumulation", "0"}},
      {"--set optim.lr=nan", {"optim.lr", "nan"}},
      {"--set optim.lr=inf", {"optim.lr", "inf"}},
      {"--set train.precision=fp8", {"train.precision", "fp8", "bf16"}},
      {"--set checkpoint.keep=1", {"checkpoint.keep", "1"}},
      {"--set train.init_from=/nonexistent/w.safetensors", {"train.init_from", "/nonexistent/w.safetensors"}},
      {"--set optim.name=lbfgs", {"optim.name", "lbfgs", "adamw"}},
      {"--set train.nope=1", {"train.nope", "epochs"}},
      {"--set data.path=/nonexistent/fmnist", {"data.path", "/nonexistent/fmnist"}},
      {"/nonexistent/config.toml", {"/nonexistent/config.toml"}},
      {"--set memory.budget=lots", {"memory.budget", "lots"}},
      {"--set memory.checkpoint=all", {"memory.checkpoint", "all", "blocks"}},
      {"--set data.batch_size=auto --set train.device=cpu", {"memory.budget", "CPU"}},
  };
  if (testing::have_fashion_mnist())
    cases.push_back({"--set data.batch_size=70000", {"data.batch_size", "70000"}});
  for (const auto& c : cases) {
    auto result = run_command(kCli + " train " + c.args + " --set log.progress=none");
    EXPECT_EQ(result.exit_code, 2) << c.args << "\n" << result.output;
    EXPECT_NE(result.output.find("error: "), std::string::npos) << result.output;
    for (const auto& part : c.expected)
      EXPECT_NE(result.output.find(part), std::string::npos) << result.output;
  }
  auto unknown_flag = run_command(kCli + " train --bogus");
  EXPECT_EQ(unknown_flag.exit_code, 2) << unknown_flag.output;
}

// find-batch prints each size it tried and the answer; train with data.batch_size = "auto" runs
// the same search and records the size it trained with, and a resume reuses it without a search.
// On the CPU, where memory.budget binds (device = auto would take a GPU where there is one).
TEST(Cli, FindBatchAndAutoBatchSize) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  const std::string common =
      " --set model.name=mlp --set model.hidden=[256] --set data.train_limit=4096 --set "
      "data.eval_batch_size=256"
      " --set train.device=cpu --set train.threads=1 --set memory.budget=90MiB --set log.progress=none";
  auto found = run_command(kCli + " find-batch " FASTTRAIN_SOURCE_DIR "/configs/classic.toml" + common);
  ASSERT_EQ(found.exit_code, 0) << found.output;
  EXPECT_NE(found.output.find("samples/s"), std::string::npos) << found.output;
  const std::string marker = "largest batch that fits memory.budget 90.00 MiB on cpu: ";
  const auto at = found.output.find(marker);
  ASSERT_NE(at, std::string::npos) << found.output;
  const int64_t answer = std::stoll(found.output.substr(at + marker.size()));
  EXPECT_GT(answer, 16);

  const std::string run_dir = dir.file("auto");
  const std::string config = " " FASTTRAIN_SOURCE_DIR "/configs/classic.toml";
  auto trained = run_command(kCli + " train" + config + common +
                             " --set data.batch_size=auto --set train.max_steps=6 --run-dir " + run_dir);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("data.batch_size = \"auto\": searching"), std::string::npos)
      << trained.output;
  const std::string effective = testing::read_text(run_dir + "/config.toml");
  EXPECT_NE(effective.find("batch_size = " + std::to_string(answer) + "\n"), std::string::npos) << effective;

  auto resumed =
      run_command(kCli + " train" + config + common +
                  " --set data.batch_size=auto --set train.max_steps=6 --run-dir " + run_dir + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("searching"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
}

TEST(Cli, FindLrWritesTheCurveAndSuggestsARate) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  std::string config = dir.file("lr.toml");
  {
    std::ofstream out(config);
    out << "[model]\nname = \"mlp\"\nhidden = [64]\n[data]\nbatch_size = 64\n[train]\nthreads = 1\n";
  }
  auto result = run_command(kCli + " find-lr " + config + " --steps 60 --csv " + dir.file("lr.csv"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("suggested max lr"), std::string::npos) << result.output;
  std::string csv = testing::read_text(dir.file("lr.csv"));
  EXPECT_EQ(csv.rfind("lr,", 0), 0u) << csv;
  EXPECT_GT(std::count(csv.begin(), csv.end(), '\n'), 10);
}

}  // namespace
}  // namespace fasttrain
