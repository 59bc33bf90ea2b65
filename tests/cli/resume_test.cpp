// Run state through the executable, each resume in a fresh process: 2N steps straight equal N steps,
// a resume, and N more (bit-identical files), with shuffling, augmentation, dropout, EMA,
// accumulation and two loader workers; SIGTERM/SIGINT stop with a checkpoint and exit 143/130;
// kill -9 at random instants never leaves a checkpoint that does not load.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/log/tensorboard.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/safetensors.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::bytes_of;
using testing::kCli;

namespace fs = std::filesystem;
using testing::run_command;

// 6400 samples in micro-batches of 64, windows of 3: 100 batches and 34 steps per epoch (the last
// window has 1 micro-batch), 68 steps in all.
const std::string kRun =
    " --set model.name=cnn --set model.widths=[8] --set model.hidden=[32] --set model.dropout=0.2"
    " --set data.train_limit=6400 --set data.batch_size=64 --set data.workers=2 --set data.crop_padding=2"
    " --set data.hflip=0.5 --set optim.name=adamw --set optim.lr=3e-3 --set schedule.name=one-cycle"
    " --set train.accumulation=3 --set train.epochs=2 --set train.threads=1 --set train.clip_norm=2.0"
    " --set ema.enabled=true --set ema.decay=0.99 --set log.every_steps=1 --set log.progress=none"
    // On a GPU, cuDNN's benchmark picks conv algorithms by timing in each process: bit-identical
    // runs need the deterministic ones (on the CPU this changes nothing).
    " --set train.deterministic=true";
constexpr int kSteps = 68;

// The files that must be identical between two runs that ended at the same step.
void expect_same_end_state(const std::string& a, const std::string& b) {
  for (const char* file : {"final/model.safetensors", "final/model_ema.safetensors"}) {
    EXPECT_TRUE(bytes_of(a + "/" + file) == bytes_of(b + "/" + file)) << file << " differs";
  }
  const std::string last = "/checkpoints/step-" + std::to_string(kSteps) + "/";
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "ema.safetensors", "rng.safetensors"}) {
    EXPECT_TRUE(bytes_of(a + last + file) == bytes_of(b + last + file)) << last << file << " differs";
  }
  // (The straight run saved step N before the last evaluation, a run without every_steps after it.)
  auto state_a = nlohmann::json::parse(read_text_file(a + last + "state.json"));
  auto state_b = nlohmann::json::parse(read_text_file(b + last + "state.json"));
  EXPECT_EQ(state_a["progress"]["samples_seen"], state_b["progress"]["samples_seen"]);
  EXPECT_EQ(state_a["ema"], state_b["ema"]);
  auto summary_a = nlohmann::json::parse(read_text_file(a + "/summary.json"));
  auto summary_b = nlohmann::json::parse(read_text_file(b + "/summary.json"));
  for (const char* key : {"steps", "test_accuracy", "best_test_accuracy"}) {
    EXPECT_EQ(summary_a[key], summary_b[key]) << key;
  }
}

class CliResume : public ::testing::Test {
 protected:
  // One straight run shared by the tests: checkpoints after every step, all kept.
  static void SetUpTestSuite() {
    if (!testing::have_fashion_mnist()) return;
    straight_dir_ = new testing::TempDir();
    auto result =
        run_command(kCli + " train" + kRun + " --set checkpoint.every_steps=1 --set checkpoint.keep=1000" +
                    " --run-dir " + straight());
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  static void TearDownTestSuite() {
    delete straight_dir_;
    straight_dir_ = nullptr;
  }
  void SetUp() override { FT_REQUIRE_FASHION_MNIST(); }
  static std::string straight() { return straight_dir_->file("straight"); }
  static std::string checkpoint(int step) { return straight() + "/checkpoints/step-" + std::to_string(step); }

  static testing::TempDir* straight_dir_;
};
testing::TempDir* CliResume::straight_dir_ = nullptr;

TEST_F(CliResume, AResumeInAFreshProcessEndsBitIdenticalToTheStraightRun) {
  // Step 10: mid-epoch (batch 30 of 100). Step 34: the end of epoch 0, before its evaluation.
  for (int step : {10, 34}) {
    testing::TempDir dir;
    const std::string run = dir.file("resumed");
    auto result = run_command(kCli + " train" + kRun + " --resume " + checkpoint(step) + " --run-dir " + run);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("resuming from " + checkpoint(step)), std::string::npos) << result.output;
    expect_same_end_state(straight(), run);
    auto summary = nlohmann::json::parse(read_text_file(run + "/summary.json"));
    EXPECT_EQ(summary["steps"], kSteps);
  }
  auto state = nlohmann::json::parse(read_text_file(checkpoint(34) + "/state.json"));
  EXPECT_EQ(state["progress"]["batch_in_epoch"], 100) << "step 34 ends epoch 0";
}

TEST_F(CliResume, SigtermStopsWithACheckpointAndExits143AndResumeFinishesTheRun) {
  testing::TempDir dir;
  const std::string run = dir.file("signalled");
  const pid_t child =
      testing::spawn_command(kCli + " train" + kRun + " --run-dir " + run + " >" + dir.file("log") + " 2>&1");
  ASSERT_GT(child, 0);
  // Signal once a few steps are logged: the stop lands inside the 3-micro-batch windows 2 times in 3.
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::read_text(run + "/metrics.jsonl").find("\"step\":3}") != std::string::npos; },
      60));
  ASSERT_EQ(::kill(child, SIGTERM), 0);
  ASSERT_EQ(testing::wait_exit_code(child), 143) << testing::read_text(dir.file("log"));
  const std::string log = testing::read_text(dir.file("log"));
  EXPECT_NE(log.find("--resume"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(run + "/summary.json"));
  EXPECT_FALSE(fs::exists(run + "/final/model.safetensors"));
  auto checkpoints = list_checkpoints(run + "/checkpoints");
  ASSERT_EQ(checkpoints.size(), 1u);
  EXPECT_LT(checkpoints[0].step, kSteps);
  auto state = nlohmann::json::parse(read_text_file(checkpoints[0].dir + "/state.json"));
  std::printf("[          ] stopped at step %lld with %lld micro-batches of the window done\n",
              static_cast<long long>(checkpoints[0].step), state["progress"]["window_done"].get<long long>());

  auto resumed = run_command(kCli + " train" + kRun + " --run-dir " + run + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_end_state(straight(), run);
  // TensorBoard: the resumed session's file starts with a SessionLog START after the checkpoint's
  // step, on which TensorBoard hides the first session's events of the repeated steps.
  int starts = 0;
  for (const auto& entry : fs::directory_iterator(run)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) != 0) continue;
    for (const auto& event : read_tensorboard_events(entry.path())) {
      if (event.session_status == 1) {
        ++starts;
        EXPECT_EQ(event.step, checkpoints[0].step + 1);
      }
    }
  }
  EXPECT_EQ(starts, 1);
  // metrics.jsonl continues after the checkpoint's marker: every step is logged exactly once.
  std::istringstream lines(testing::read_text(run + "/metrics.jsonl"));
  std::vector<int64_t> train_steps;
  for (std::string line; std::getline(lines, line);) {
    auto record = nlohmann::json::parse(line);
    if (record["kind"] == "train") train_steps.push_back(record["step"]);
  }
  ASSERT_EQ(train_steps.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) EXPECT_EQ(train_steps[i], i + 1);
}

TEST_F(CliResume, ASecondSignalEndsTheProcessAtOnce) {
  testing::TempDir dir;
  const std::string run = dir.file("twice");
  const pid_t child =
      testing::spawn_command(kCli + " train" + kRun + " --run-dir " + run + " >" + dir.file("log") + " 2>&1");
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::read_text(run + "/metrics.jsonl").find("\"step\":2}") != std::string::npos; },
      60));
  // Two different signals (two SIGINTs may merge into one pending signal). Threads may take them in
  // either order: the exit code is that of the one handled second.
  ASSERT_EQ(::kill(child, SIGINT), 0);
  ASSERT_EQ(::kill(child, SIGTERM), 0);
  const int code = testing::wait_exit_code(child);
  EXPECT_TRUE(code == 130 || code == 143) << code;
  const std::string log = testing::read_text(dir.file("log"));
  EXPECT_NE(log.find("signal again to quit now"), std::string::npos) << log;
  EXPECT_EQ(log.find("interrupted at step"), std::string::npos) << "it stopped gracefully instead: " << log;
  for (const auto& info : list_checkpoints(run + "/checkpoints"))
    EXPECT_NO_THROW(verify_checkpoint(info.dir));
}

TEST_F(CliResume, SigkillAtRandomInstantsNeverLeavesACheckpointThatDoesNotLoad) {
  testing::TempDir dir;
  const std::string run = dir.file("killed");
  std::mt19937 rng(7);
  int64_t newest = -1;
  int trials = 0;
  for (; trials < 20; ++trials) {
    const std::string resume = trials == 0 ? "" : " --resume";
    const pid_t child = testing::spawn_command(kCli + " train" + kRun + " --set checkpoint.every_steps=1" +
                                               resume + " --run-dir " + run + " >/dev/null 2>&1");
    // Kill it after its first checkpoint of this session, at a random instant of the saves that follow.
    ASSERT_TRUE(testing::wait_until(
        [&] {
          auto all = list_checkpoints(run + "/checkpoints");
          return !all.empty() && all.back().step > newest;
        },
        60));
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng)));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    const int code = testing::wait_exit_code(child);
    ASSERT_EQ(code, 128 + SIGKILL) << "trial " << trials << ": the run ended by itself";

    std::vector<std::string> skipped;
    auto latest = latest_checkpoint(run + "/checkpoints", &skipped);
    ASSERT_TRUE(latest.has_value()) << "trial " << trials;
    EXPECT_TRUE(skipped.empty()) << skipped.front();
    EXPECT_GE(latest->step, newest) << "a committed checkpoint was lost";
    newest = latest->step;
    for (const auto& entry : verify_checkpoint(latest->dir).files) {
      if (entry.file.size() > 12 && entry.file.substr(entry.file.size() - 12) == ".safetensors") {
        EXPECT_NO_THROW(load_safetensors(latest->dir + "/" + entry.file)) << entry.file;
      }
    }
    if (newest >= kSteps - 2) break;  // leave room for the final resume
  }
  std::printf("[          ] %d kills, newest checkpoint step %lld\n", trials + 1,
              static_cast<long long>(newest));
  EXPECT_GE(trials + 1, 10);
  auto resumed = run_command(kCli + " train" + kRun + " --run-dir " + run + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_end_state(straight(), run);
}

TEST_F(CliResume, ResumeChecksWhatItResumes) {
  testing::TempDir dir;
  // Bare --resume in an empty run directory: a new run, said so.
  auto fresh = run_command(kCli + " train" + kRun + " --set train.max_steps=2 --run-dir " + dir.file("new") +
                           " --resume");
  EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("starting fresh"), std::string::npos) << fresh.output;

  // A missing PATH, a damaged checkpoint, another training config: errors that name them.
  auto missing =
      run_command(kCli + " train" + kRun + " --resume " + dir.file("nope") + " --run-dir " + dir.file("a"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(testing::contains_all(missing.output, {"error:", dir.file("nope")}));

  fs::create_directories(dir.file("damaged"));
  fs::copy(checkpoint(10), dir.file("damaged/step-10"), fs::copy_options::recursive);
  {
    std::fstream file(dir.file("damaged/step-10/model.safetensors"),
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(300);
    file.put('\x01');
  }
  auto damaged = run_command(kCli + " train" + kRun + " --resume " + dir.file("damaged/step-10") +
                             " --run-dir " + dir.file("b"));
  EXPECT_EQ(damaged.exit_code, 1);
  EXPECT_TRUE(testing::contains_all(damaged.output, {"model.safetensors", "sha256"})) << damaged.output;

  auto other = run_command(kCli + " train" + kRun + " --set optim.lr=0.01 --resume " + checkpoint(10) +
                           " --run-dir " + dir.file("c"));
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_TRUE(testing::contains_all(other.output, {"optim.lr", "0.003", "0.01"})) << other.output;

  // A new run over a finished one needs --fresh; --resume of a finished run has nothing left to do.
  auto again = run_command(kCli + " train" + kRun + " --set train.max_steps=2 --run-dir " + dir.file("new"));
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_TRUE(testing::contains_all(again.output, {"--resume", "--fresh"})) << again.output;
  auto over =
      run_command(kCli + " train" + kRun + " --set train.max_steps=3 --fresh --run-dir " + dir.file("new"));
  EXPECT_EQ(over.exit_code, 0) << over.output;
  EXPECT_EQ(nlohmann::json::parse(read_text_file(dir.file("new/summary.json")))["steps"], 3);
}

TEST_F(CliResume, ALongerRunResumesAFinishedOneAndRecomputesTheSchedule) {
  testing::TempDir dir;
  // A constant LR does not depend on the total: 10 steps, then 10 more, equal 20 straight.
  const std::string constant = kRun + " --set schedule.name=constant";
  auto straight =
      run_command(kCli + " train" + constant + " --set train.max_steps=20 --run-dir " + dir.file("straight"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto first =
      run_command(kCli + " train" + constant + " --set train.max_steps=10 --run-dir " + dir.file("run"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto longer = run_command(kCli + " train" + constant + " --set train.max_steps=20 --resume --run-dir " +
                            dir.file("run"));
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_TRUE(testing::contains_all(
      longer.output, {"extending the run", "train.max_steps 10 -> 20", "schedule is recomputed"}))
      << longer.output;
  EXPECT_EQ(nlohmann::json::parse(read_text_file(dir.file("run/summary.json")))["steps"], 20);
  for (const char* file : {"final/model.safetensors", "final/model_ema.safetensors"}) {
    EXPECT_TRUE(bytes_of(dir.file("run/") + file) == bytes_of(dir.file("straight/") + file))
        << file << " differs";
  }

  // A shorter run is refused, naming the key; so is any other change to the training.
  auto shorter = run_command(kCli + " train" + constant + " --set train.max_steps=15 --resume --run-dir " +
                             dir.file("run"));
  EXPECT_EQ(shorter.exit_code, 2);
  EXPECT_TRUE(testing::contains_all(shorter.output, {"shorter", "train.max_steps 20 -> 15"}))
      << shorter.output;
  auto other =
      run_command(kCli + " train" + constant +
                  " --set train.max_steps=30 --set optim.lr=0.01 --resume --run-dir " + dir.file("run"));
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_TRUE(testing::contains_all(other.output, {"optim.lr", "0.003", "0.01"})) << other.output;

  // One-cycle over 20 steps, extended to 30: the schedule is laid out again over 30, and the LR after
  // the resume follows it (the finished run had annealed to its floor).
  auto cycle =
      run_command(kCli + " train" + kRun + " --set train.max_steps=20 --run-dir " + dir.file("cycle"));
  ASSERT_EQ(cycle.exit_code, 0) << cycle.output;
  auto cycle_longer = run_command(kCli + " train" + kRun + " --set train.max_steps=30 --resume --run-dir " +
                                  dir.file("cycle"));
  ASSERT_EQ(cycle_longer.exit_code, 0) << cycle_longer.output;
  const auto schedule = make_schedule(ScheduleOptions("one-cycle"), 3e-3, 0.9, 30);
  std::ifstream metrics(dir.file("cycle/metrics.jsonl"));
  int checked = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["kind"] != "train" || record["step"].get<int64_t>() <= 20) continue;
    // The record of step s carries the LR its update used: step s - 1 of the schedule.
    EXPECT_NEAR(record["lr"].get<double>(), schedule->lr(record["step"].get<int64_t>() - 1), 1e-9) << line;
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

}  // namespace
}  // namespace fasttrain
