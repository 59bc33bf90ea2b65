// memory.snapshot: the CUDA caching allocator's history, written where the run writes and read as
// PyTorch's memory_viz reads it (a pickled dict of segments and per-device traces).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/log/metrics.h"
#include "fasttrain/memory/snapshot.h"
#include "fasttrain/profile/report.h"
#include "fasttrain/run/train_run.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;

Config snapshot_config(const std::string& device) {
  Config config;
  config.train.device(device);
  config.data.batch_size(64).workers(0);
  config.data.dataset.as<ImageDataOptions>().train_limit(1024);
  config.model.select("cnn").as<CnnOptions>().widths({8}).hidden({32}).batchnorm(true);
  config.train.options.max_steps(8).eval_every_steps(0);
  config.log.progress("none");
  config.memory.snapshot(true).warmup(true);
  return config;
}

TEST(MemorySnapshot, ARunWritesTheAllocatorsHistoryThatPythonReadsAndTheReportShows_CUDA) {
  FT_REQUIRE_FASHION_MNIST();
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  train_run(snapshot_config("cuda"), dir.path());

  const std::vector<uint8_t> pickle = read_binary_file(dir.file(CudaMemoryHistory::kPickle));
  ASSERT_GT(pickle.size(), 100u);
  EXPECT_EQ(pickle[0], 0x80) << "a pickle starts with its protocol opcode";
  const nlohmann::json summary =
      nlohmann::json::parse(testing::read_text(dir.file(CudaMemoryHistory::kSummary)));
  const int64_t batch_bytes = 64 * 8 * 28 * 28 * 2;  // the first conv's bf16 or fp32 activations, at least
  EXPECT_GE(summary.at("allocations").get<int64_t>(), 8 * 10) << summary.dump();
  EXPECT_GE(summary.at("largest_allocation_bytes").get<int64_t>(), batch_bytes) << summary.dump();
  EXPECT_GE(summary.at("segments").get<int64_t>(), 1) << summary.dump();
  EXPECT_GE(summary.at("reserved_bytes").get<int64_t>(), batch_bytes) << summary.dump();

  // What memory_viz reads: the pickle's own counts equal the summary's.
  const std::string python = fs::exists(FASTTRAIN_PYTHON) ? FASTTRAIN_PYTHON : "python3";
  const testing::CommandResult read = testing::run_command(
      python +
      " -c \"import pickle, sys; s = pickle.load(open(sys.argv[1], 'rb')); t = s['device_traces'][0]; "
      "print(sum(e['action'] != 'snapshot' for e in t), sum(e['action'] == 'alloc' for e in t), "
      "len(s['segments']))\" " +
      dir.file(CudaMemoryHistory::kPickle));
  ASSERT_EQ(read.exit_code, 0) << read.output;
  EXPECT_EQ(read.output,
            fmt::format("{} {} {}\n", summary.at("events").get<int64_t>(),
                        summary.at("allocations").get<int64_t>(), summary.at("segments").get<int64_t>()));

  const std::string html = render_report(dir.path());
  EXPECT_TRUE(testing::contains_all(html, {"memory_snapshot.pickle", "memory_viz", "allocations"})) << html;
}

// Off CUDA there is no caching allocator to record: a config error naming the key and the device,
// raised before the run directory is touched.
TEST(MemorySnapshot, OffCudaItIsAConfigErrorThatNamesTheKeyAndClearsNothing) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  write_text_file(dir.file("summary.json"), "{\"earlier\": true}");
  try {
    train_run(snapshot_config("cpu"), dir.path(), RunOptions().fresh(true));
    FAIL() << "memory.snapshot on the CPU trained";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(testing::contains_all(error.what(), {"memory.snapshot", "cpu", "memory_timeline.csv"}))
        << error.what();
  }
  EXPECT_EQ(testing::read_text(dir.file("summary.json")), "{\"earlier\": true}")
      << "the earlier run's summary";
  EXPECT_FALSE(fs::exists(dir.file(CudaMemoryHistory::kPickle)));
}

}  // namespace
}  // namespace fasttrain
