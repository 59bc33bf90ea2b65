// Checkpoint directories: commit, verify, latest and prune; damaged and interrupted checkpoints are
// detected and skipped; and a writer killed with SIGKILL at random instants never leaves a state in
// which latest_checkpoint returns something that does not verify.
#include "fasttrain/state/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/detail/sha256.h"
#include "fasttrain/state/safetensors.h"
#include "state/state_test_util.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;
using testing::contains_all;
using testing::error_message;
using testing::read_raw;
using testing::TempDir;
using testing::write_raw;

std::string commit_step(const std::string& root, int64_t step, size_t bytes = 100) {
  CheckpointWriter writer(root, step);
  write_raw(writer.file("a.bin"), std::string(bytes, static_cast<char>('a' + step % 26)));
  write_raw(writer.file("b.txt"), "step " + std::to_string(step));
  return writer.commit();
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointDir, CommitWritesAVerifiableDirectoryWithAManifest) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");  // created on demand
  CheckpointWriter writer(root, 42);
  EXPECT_TRUE(contains_all(writer.staging_dir(), {root + "/.tmp-step-42-"}));
  save_safetensors(writer.file("model.safetensors"), {{"w", torch::arange(10, torch::kFloat)}});
  write_raw(writer.file("state.json"), "{\"epoch\": 3}");
  const std::string dir = writer.commit();
  EXPECT_EQ(dir, root + "/step-42");
  EXPECT_EQ(entries(root), std::vector<std::string>{"step-42"});
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"manifest.json", "model.safetensors", "state.json"}));

  const CheckpointManifest manifest = verify_checkpoint(dir);
  EXPECT_EQ(manifest.step, 42);
  ASSERT_EQ(manifest.files.size(), 2u);
  EXPECT_EQ(manifest.files[1].file, "state.json");
  EXPECT_EQ(manifest.files[1].bytes, 12u);
  EXPECT_EQ(manifest.files[1].sha256, sha256_hex("{\"epoch\": 3}"));
  const nlohmann::json json = nlohmann::json::parse(read_raw(dir + "/manifest.json"));
  EXPECT_EQ(json["format"], "fasttrain-checkpoint");
  EXPECT_EQ(json["version"], 1);
  EXPECT_EQ(json["step"], 42);
  EXPECT_TRUE(
      torch::equal(load_safetensors(dir + "/model.safetensors").at("w"), torch::arange(10, torch::kFloat)));
}

TEST(CheckpointDir, WriterRefusesToReplaceBadNamesAndEmptyCheckpoints) {
  TempDir tmp;
  commit_step(tmp.path(), 5);
  EXPECT_TRUE(
      contains_all(error_message([&] { CheckpointWriter(tmp.path(), 5); }), {"step-5", "already exists"}));
  CheckpointWriter writer(tmp.path(), 6);
  for (const std::string bad : {"", "a/b", ".hidden", "manifest.json"}) {
    EXPECT_TRUE(contains_all(error_message([&] { writer.file(bad); }), {"'" + bad + "'", "not allowed"}));
  }
  EXPECT_TRUE(contains_all(error_message([&] { writer.commit(); }), {"no files"}));
  fs::create_directory(writer.staging_dir() + "/sub");
  EXPECT_TRUE(contains_all(error_message([&] { writer.commit(); }), {"'sub'", "not a regular file"}));
  fs::remove(writer.staging_dir() + "/sub");
  write_raw(writer.staging_dir() + "/.x.tmp-1", "junk");
  EXPECT_TRUE(contains_all(error_message([&] { writer.commit(); }), {"'.x.tmp-1'", "leftover temporary"}));
  EXPECT_TRUE(contains_all(error_message([&] { CheckpointWriter(tmp.path(), -1); }), {"-1"}));
}

TEST(CheckpointDir, AnAbandonedWriterLeavesNothing) {
  TempDir tmp;
  {
    CheckpointWriter writer(tmp.path(), 1);
    write_raw(writer.file("a.bin"), "partial");
  }  // e.g. an exception while saving: no commit
  EXPECT_TRUE(entries(tmp.path()).empty());
  EXPECT_FALSE(latest_checkpoint(tmp.path()).has_value());
}

TEST(CheckpointDir, VerifyNamesTheDamagedFile) {
  TempDir tmp;
  const std::string dir = commit_step(tmp.path(), 7, 1000);
  const std::string file = dir + "/a.bin";
  const std::string good = read_raw(file);

  write_raw(file, good.substr(0, 999));
  EXPECT_TRUE(contains_all(error_message([&] { verify_checkpoint(dir); }),
                           {dir, "'a.bin'", "999 bytes", "says 1000", "truncated"}));
  std::string flipped = good;
  flipped[500] ^= 0x01;
  write_raw(file, flipped);
  EXPECT_TRUE(
      contains_all(error_message([&] { verify_checkpoint(dir); }),
                   {"'a.bin' is corrupt", "sha256 " + sha256_hex(flipped), "says " + sha256_hex(good)}));
  write_raw(file, good);
  EXPECT_EQ(verify_checkpoint(dir).step, 7);

  fs::remove(dir + "/b.txt");
  EXPECT_TRUE(contains_all(error_message([&] { verify_checkpoint(dir); }), {"'b.txt' is missing"}));
  write_raw(dir + "/b.txt", "step 7");
  write_raw(dir + "/extra", "");
  EXPECT_TRUE(contains_all(error_message([&] { verify_checkpoint(dir); }), {"'extra' is not listed"}));
  fs::remove(dir + "/extra");
  EXPECT_EQ(verify_checkpoint(dir).step, 7);

  // The manifest itself: a renamed directory, a broken or missing manifest.
  fs::rename(dir, tmp.file("step-8"));
  EXPECT_TRUE(
      contains_all(error_message([&] { verify_checkpoint(tmp.file("step-8")); }), {"says step 7", "step-8"}));
  fs::rename(tmp.file("step-8"), dir);
  const std::string manifest = read_raw(dir + "/manifest.json");
  write_raw(dir + "/manifest.json", manifest.substr(0, manifest.size() / 2));
  EXPECT_TRUE(
      contains_all(error_message([&] { verify_checkpoint(dir); }), {"manifest.json", "not valid JSON"}));
  nlohmann::json edited = nlohmann::json::parse(manifest);
  edited["version"] = 2;
  write_raw(dir + "/manifest.json", edited.dump());
  EXPECT_TRUE(
      contains_all(error_message([&] { verify_checkpoint(dir); }), {"format version 2 is not supported"}));
  edited = nlohmann::json::parse(manifest);
  edited["files"][0]["file"] = "../escape";
  write_raw(dir + "/manifest.json", edited.dump());
  EXPECT_TRUE(
      contains_all(error_message([&] { verify_checkpoint(dir); }), {"unsafe or reserved name '../escape'"}));
  fs::remove(dir + "/manifest.json");
  EXPECT_TRUE(
      contains_all(error_message([&] { verify_checkpoint(dir); }), {dir, "no manifest.json", "incomplete"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { verify_checkpoint(tmp.file("nothing")); }), {"not a directory"}));
}

TEST(CheckpointDir, LatestSkipsDamagedAndInterruptedCheckpoints) {
  TempDir tmp;
  const std::string root = tmp.path();
  EXPECT_FALSE(latest_checkpoint(root + "/absent").has_value());
  for (int64_t step : {10, 20, 30, 40}) commit_step(root, step);
  auto latest = latest_checkpoint(root);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 40);
  EXPECT_EQ(latest->dir, root + "/step-40");

  // step-40 damaged, step-30 without its manifest (as if copied partially), a crashed writer's
  // staging directory for step-50 holding a complete-looking copy, and names that are not checkpoints.
  write_raw(root + "/step-40/b.txt", "step 4X");
  fs::remove(root + "/step-30/manifest.json");
  fs::create_directory(root + "/.tmp-step-50-deadbeef");
  fs::copy(root + "/step-20", root + "/.tmp-step-50-deadbeef");
  fs::create_directory(root + "/step-020");
  fs::create_directory(root + "/step-x");
  write_raw(root + "/step-60", "a file, not a directory");

  std::vector<std::string> skipped;
  latest = latest_checkpoint(root, &skipped);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 20);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_TRUE(contains_all(skipped[0], {"step-40", "'b.txt' is corrupt"}));
  EXPECT_TRUE(contains_all(skipped[1], {"step-30", "no manifest.json"}));
  EXPECT_FALSE(fs::exists(root + "/.tmp-step-50-deadbeef"));  // stale staging removed
  // A live writer's staging directory is not touched.
  CheckpointWriter live(root, 70);
  write_raw(live.file("a.bin"), "x");
  latest_checkpoint(root);
  EXPECT_TRUE(fs::exists(live.file("a.bin")));
  EXPECT_EQ(live.commit(), root + "/step-70");
  EXPECT_EQ(latest_checkpoint(root)->step, 70);
  EXPECT_EQ(list_checkpoints(root).size(), 5u);
}

TEST(CheckpointDir, PruneKeepsTheNewestAndEnforcesKeepAtLeastTwo) {
  TempDir tmp;
  const std::string root = tmp.path();
  for (int64_t step : {3, 100, 20, 1000, 4}) commit_step(root, step);
  try {
    prune_checkpoints(root, 1);
    ADD_FAILURE() << "keep = 1 accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains_all(e.what(), {"checkpoint.keep", ">= 2", "got 1"}));
  }
  EXPECT_EQ(prune_checkpoints(root, 3), (std::vector<std::string>{root + "/step-3", root + "/step-4"}));
  EXPECT_EQ(entries(root), (std::vector<std::string>{"step-100", "step-1000", "step-20"}));
  EXPECT_TRUE(prune_checkpoints(root, 3).empty());
  EXPECT_EQ(prune_checkpoints(root, 2), std::vector<std::string>{root + "/step-20"});
  EXPECT_EQ(latest_checkpoint(root)->step, 1000);
  EXPECT_TRUE(prune_checkpoints(root + "/absent", 2).empty());
}

// The child: resume like a trainer (latest_checkpoint, which also cleans up), then write and prune
// checkpoints as fast as it can until it is killed. It never returns.
[[noreturn]] void checkpoint_forever(const std::string& root, uint64_t seed) {
  try {
    const auto latest = latest_checkpoint(root);
    int64_t step = latest ? latest->step + 1 : 0;
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 100000; ++i, ++step) {
      CheckpointWriter writer(root, step);
      for (const char* name : {"model.bin", "optimizer.bin", "extra.bin"}) {
        std::string data(4096 + rng() % (128 << 10), '\0');
        for (size_t j = 0; j < data.size(); j += 8) data[j] = static_cast<char>(rng());
        write_file_atomically(writer.file(name), data.data(), data.size());
      }
      writer.commit();
      prune_checkpoints(root, 2);
    }
    ::_exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint child: %s\n", e.what());
    ::_exit(3);
  }
}

TEST(CheckpointDir, SurvivesSigkillAtRandomInstants) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  std::mt19937 rng(2024);
  const auto start = std::chrono::steady_clock::now();
  int trials = 0;
  int left_staging = 0;
  int64_t newest = -1;
  for (; trials < 24; ++trials) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << "fork failed";
    if (child == 0) checkpoint_forever(root, rng());
    if (trials == 0) {
      // However slow the machine, let the first child commit once so that there is something to keep.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (list_checkpoints(root).empty() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 150000)(rng)));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the child ended by itself (status " << status << ") instead of being killed";

    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) {
        ++left_staging;
        break;
      }
    }
    // Every committed step-N verifies, not only the latest: the rename is the commit point.
    for (const CheckpointInfo& info : list_checkpoints(root)) {
      EXPECT_NO_THROW(verify_checkpoint(info.dir)) << "trial " << trials << ": " << info.dir;
    }
    std::vector<std::string> skipped;
    const auto latest = latest_checkpoint(root, &skipped);
    EXPECT_TRUE(skipped.empty()) << "trial " << trials << ": " << skipped.front();
    if (latest) {
      EXPECT_NO_THROW(verify_checkpoint(latest->dir));
      EXPECT_GE(latest->step, newest) << "a committed checkpoint was lost";
      newest = latest->step;
    }
    for (const auto& entry : fs::directory_iterator(root)) {
      EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << "stale " << entry.path();
    }
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  }
  EXPECT_GE(trials, 20);
  EXPECT_GE(newest, 0) << "no checkpoint was ever committed";
  std::printf("[          ] %d trials, %d killed mid-write (staging left), newest step %lld, %.1f s\n",
              trials, left_staging, static_cast<long long>(newest),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace
}  // namespace fasttrain
