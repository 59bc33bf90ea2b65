#include "fasttrain/profile/profiler.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>

#include "fasttrain/detail/compat.h"
#include "fasttrain/run/run.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

Config small_config() {
  Config config;
  config.data.batch_size(64).workers(1);
  config.data.dataset.as<ImageDataOptions>().train_limit(2048);
  config.model.select("cnn").as<CnnOptions>().widths({8}).hidden({32}).batchnorm(true);
  config.train.threads(1);
  config.train.options.max_steps(30);
  return config;
}

ProfileOptions measuring(int64_t steps, int64_t warmup = 5, double min_seconds = 0) {
  return ProfileOptions().measure(
      MeasureOptions().steps(steps).warmup_steps(warmup).min_seconds(min_seconds));
}

// A Chrome trace's events: the legacy profiler writes an array, Kineto an object with traceEvents.
const nlohmann::json& events_of(const nlohmann::json& trace) {
  return trace.is_object() ? trace.at("traceEvents") : trace;
}

int64_t count_events(const nlohmann::json& trace, const std::string& name) {
  int64_t count = 0;
  for (const auto& event : events_of(trace)) count += event.value("name", "") == name ? 1 : 0;
  return count;
}

TEST(Profile, WritesATraceWithThePhasesAndOperatorsAndAMemoryTimeline) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  // The CPU's operators, on a GPU machine too: there autograd runs backward's kernels on its device
  // thread, so the main thread's backward range tops the legacy profiler's table (CUDA traces: issue P4).
  Config config = small_config();
  config.train.device("cpu");
  RunBuilder builder;
  ProfileResult result = profile_run(builder, config, dir.path(), measuring(6, 3));
  EXPECT_EQ(result.steps, 6);
  EXPECT_EQ(result.samples, 6 * 64);
  for (Phase phase : {Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
    EXPECT_GT(result.phases.seconds(phase), 0) << phase_name(phase);
  }
  const nlohmann::json trace = nlohmann::json::parse(testing::read_text(dir.file("trace.json")));
  ASSERT_TRUE(events_of(trace).is_array());
  EXPECT_EQ(result.profiler, FASTTRAIN_HAS_KINETO ? "kineto (CPU)" : "legacy (CPU)");
  EXPECT_EQ(count_events(trace, "fasttrain::forward"), 6);
  EXPECT_EQ(count_events(trace, "fasttrain::backward"), 6);
  EXPECT_EQ(count_events(trace, "fasttrain::optimizer"), 6);
  EXPECT_GE(count_events(trace, "aten::mkldnn_convolution") + count_events(trace, "aten::_convolution"), 6);
  ASSERT_FALSE(result.operators.empty());
  EXPECT_EQ(result.operators.front().name.rfind("aten::", 0), 0u) << result.table();

  // The timeline rises and falls with each step's activations, from the allocator itself.
  std::istringstream csv(testing::read_text(dir.file("memory_timeline.csv")));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "time_s,allocated_bytes");
  int64_t rows = 0, low = INT64_MAX, high = 0;
  double last_time = -1;
  while (std::getline(csv, line)) {
    const double time = std::stod(line.substr(0, line.find(',')));
    const int64_t bytes = std::stoll(line.substr(line.find(',') + 1));
    EXPECT_GE(time, last_time);
    last_time = time, low = std::min(low, bytes), high = std::max(high, bytes), ++rows;
  }
  EXPECT_EQ(rows, result.memory_samples);
  EXPECT_GT(rows, 6 * 10);
  EXPECT_GT(high - low, 64 * 8 * 28 * 28 * 4) << "at least one conv activation comes and goes";
  const nlohmann::json saved = nlohmann::json::parse(testing::read_text(dir.file("profile.json")));
  EXPECT_EQ(saved.at("steps"), 6);
  EXPECT_TRUE(saved.at("step_phases_s").contains("data_wait"));
}

// On a GPU, Kineto records the CUDA side too: each step's kernels and the batches' copies, with their
// times on the device. (Seen by hand on an H200 before this test: the main job's 10 profiled steps
// held 2,050 kernel events and 310 copies; BENCHMARKS "GPU: the second run".)
TEST(Profile, AGpuTraceHoldsEachStepsKernelsAndCopies_CUDA) {
  FT_REQUIRE_FASHION_MNIST();
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!FASTTRAIN_HAS_KINETO) GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no Kineto";
  testing::TempDir dir;
  Config config = small_config();
  config.train.device("cuda");
  apply_override(config, "data.device_resident=false");  // each batch copied from the host
  RunBuilder builder;
  ProfileResult result = profile_run(builder, config, dir.path(), measuring(6, 3));
  EXPECT_EQ(result.profiler, "kineto (CPU + CUDA)");
  const nlohmann::json trace = nlohmann::json::parse(testing::read_text(dir.file("trace.json")));
  int64_t kernels = 0, copies = 0, timed = 0;
  for (const auto& event : events_of(trace)) {
    const std::string category = event.value("cat", "");
    if (category != "kernel" && category != "gpu_memcpy") continue;
    (category == "kernel" ? kernels : copies) += 1;
    timed += event.value("dur", 0.0) > 0 ? 1 : 0;
  }
  EXPECT_GE(kernels, 6 * 10) << "a conv net's step launches tens of kernels";
  EXPECT_GE(copies, 6) << "a host-to-device copy of each batch";
  EXPECT_EQ(timed, kernels + copies) << "every device event has its duration";
}

TEST(Profile, StepsBeyondTheRunAreAConfigError) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  RunBuilder builder;
  EXPECT_THROW(profile_run(builder, small_config(), dir.path(), measuring(40)), ConfigError);
  EXPECT_THROW(profile_run(builder, small_config(), dir.path(), measuring(0)), ConfigError);
}

// min_seconds keeps an unrecorded timing going past `steps` until it has lasted that long.
TEST(Profile, MinSecondsTimesPastTheStepsUntilThatLong) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  const Config config = with_room_to_profile(small_config());
  RunBuilder builder;
  const auto timed = measuring(3, 1).record(false);
  const ProfileResult exact = profile_run(builder, config, dir.file("exact"), timed);
  EXPECT_EQ(exact.steps, 3);
  const ProfileResult longer =
      profile_run(builder, config, dir.file("longer"), measuring(3, 1, 0.5).record(false));
  EXPECT_GT(longer.steps, 3);
  EXPECT_GE(longer.phases.total(), 0.45);  // the phases cover the steps' time, not the callbacks between
  EXPECT_EQ(longer.samples, longer.steps * 64);
  EXPECT_THROW(profile_run(builder, config, dir.file("bad"), measuring(3, 1, -1).record(false)), ConfigError);
}

// Self time: a parent's duration minus its direct children's; per thread.
TEST(Profile, OperatorStatsSubtractNestedTime) {
  auto span = [](const char* name, double ts, double dur, int tid) {
    return nlohmann::json{{"name", name}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"tid", tid}};
  };
  nlohmann::json trace = nlohmann::json::array(
      {span("outer", 0, 100, 1), span("inner", 10, 30, 1), span("leaf", 15, 5, 1), span("inner", 50, 20, 1),
       span("outer", 0, 7, 2), nlohmann::json{{"name", "meta"}, {"ph", "M"}},
       nlohmann::json{
           {"name", "PyTorch Profiler (0)"}, {"ph", "X"}, {"cat", "Trace"}, {"ts", 0}, {"dur", 500}}});
  std::map<std::string, OperatorStat> stats;
  for (const auto& stat : operator_stats(trace)) stats[stat.name] = stat;
  EXPECT_EQ(stats.at("outer").calls, 2);
  EXPECT_DOUBLE_EQ(stats.at("outer").self_ms, (100 - 30 - 20 + 7) / 1000.0);
  EXPECT_DOUBLE_EQ(stats.at("inner").self_ms, (30 - 5 + 20) / 1000.0);
  EXPECT_DOUBLE_EQ(stats.at("leaf").self_ms, 5 / 1000.0);
  EXPECT_EQ(stats.count("meta"), 0u);
  EXPECT_EQ(stats.count("PyTorch Profiler (0)"), 0u);  // Kineto's whole-recording span
}

// Reads inside ATen's fused optimizer kernels (their CPU versions read step counts from host memory)
// are not the step loop's; the others are, on every thread.
TEST(Profile, HostReadsLeaveOutTheFusedOptimizerKernelsOwn) {
  auto span = [](const std::string& name, double ts, double dur, int tid) {
    return nlohmann::json{{"name", name}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"tid", tid}};
  };
  const nlohmann::json trace = nlohmann::json::array({
      span("aten::_fused_adamw_", 0, 100, 1), span("aten::_local_scalar_dense", 10, 2, 1),
      span("aten::_local_scalar_dense", 20, 2, 1),   // inside the kernel: not counted
      span("aten::_local_scalar_dense", 20, 2, 2),   // the same time on another thread: counted
      span("aten::_local_scalar_dense", 150, 2, 1),  // after the kernel: counted
      span("aten::nonzero", 200, 5, 1),              // counted
  });
  EXPECT_EQ(count_host_reads(trace), 3);
}

// Normal steps never wait for the device: no tensor is read on the host except at log steps (the
// loss and gradient norm), checked by counting the operators that copy a value to the host
// (count_host_reads: _local_scalar_dense is what .item() runs; nonzero() must size its output on the
// host), and those reads are there: the end of the run reads the loss.
TEST(Profile, NormalStepsReadNothingBackToTheHost) {
  FT_REQUIRE_FASHION_MNIST();
  Config config = small_config();
  config.log.every_steps(1000);  // one log record: at the end of the 30 steps
  config.train.options.clip_norm(1.0);
  config.task.select("classification").as<ClassificationOptions>().label_smoothing(0.1);
  RunBuilder builder;
  fasttrain::Run run = build_run(builder, config);
  auto trainer = run.make_trainer();
  testing::TempDir dir;
  FitSummary summary;
  {
    torch::autograd::profiler::RecordProfile profile(dir.file("trace.json"));
    summary = trainer->fit(*run.train_loader, nullptr);
  }
  EXPECT_EQ(summary.steps, 30);
  const nlohmann::json trace = nlohmann::json::parse(testing::read_text(dir.file("trace.json")));
  const int64_t host_reads = count_host_reads(trace);
  EXPECT_LE(host_reads, 4) << "host reads in 30 steps: the step loop reads values back on the host";
  EXPECT_GE(host_reads, 1) << "the end-of-run log must read the loss: is the profiler recording?";
  // And every run records where its time went.
  const nlohmann::json phases = summary.to_json().at("step_phases_s");
  double sum = 0;
  for (const auto& item : phases.items()) sum += item.value().get<double>();
  EXPECT_GT(phases.at("forward").get<double>(), 0);
  EXPECT_GT(phases.at("backward").get<double>(), 0);
  EXPECT_NEAR(sum, summary.wall_s, 0.1 * summary.wall_s + 0.05);
}

}  // namespace
}  // namespace fasttrain
