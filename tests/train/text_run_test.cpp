// Training the gpt on a text corpus through the run functions: windows and token buckets, the
// validation loss in bits per byte, padding accounting, generation from the final weights, and the
// config checks that pair the model with its data.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/run/run.h"
#include "fasttrain/train/run_logger.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;
using testing::TempDir;
using testing::write_text_corpus;

Config text_config(const std::string& corpus) {
  Config config;
  config.data.dataset("text")
      .path(corpus)
      .include("*.py")
      .val_fraction(0.2)
      .batch_size(8)
      .eval_batch_size(8)
      .workers(1);
  config.model.name("gpt").layers(2).heads(2).embed(32).context(32);
  config.optim.name("adamw").lr(3e-3);
  config.schedule.name("constant");
  config.train.max_steps(60).threads(1).eval_every_steps(30);
  config.log.progress("none").every_steps(10);
  return config;
}

TEST(TextRun, TrainsOnWindowsAndReportsBitsPerByte) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  const FitSummary summary = train_run(config, dir.file("run"));
  ASSERT_TRUE(summary.last_eval.has_value());
  ASSERT_TRUE(summary.last_eval->bits_per_byte.has_value());
  EXPECT_NEAR(*summary.last_eval->bits_per_byte, summary.last_eval->loss / std::log(2.0), 1e-12);
  EXPECT_LT(*summary.last_eval->bits_per_byte, 4.0) << "8 bits per byte is chance; the corpus is repetitive";
  EXPECT_EQ(summary.padding_fraction, 0.0);
  // samples/s counts target tokens: 60 steps of 8 windows of 32.
  const auto json = nlohmann::json::parse(read_text_file(dir.file("run/summary.json")));
  EXPECT_NEAR(json["test_bits_per_byte"].get<double>(), *summary.last_eval->bits_per_byte, 1e-9);
  EXPECT_GT(json["train_samples_per_s"].get<double>(), 0);
  int evaluations = 0;
  std::istringstream metrics(read_text_file(dir.file("run/metrics.jsonl")));
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["kind"] != "eval") continue;
    ++evaluations;
    EXPECT_NEAR(record["test_bits_per_byte"].get<double>(), record["test_loss"].get<double>() / std::log(2.0),
                1e-9);
  }
  EXPECT_GE(evaluations, 2);  // steps 30 and 60, and the ends of the (short) epochs
  // The weights generate text, through the CLI's path (config from the run directory).
  const std::string text = generate_run(config, dir.file("run/final/model.safetensors"), "def ",
                                        GenerateOptions(0).max_new_tokens(16));
  EXPECT_LE(text.size(), 16u);
  const EvalResult evaluated = eval_run(config, dir.file("run/final/model.safetensors"));
  EXPECT_NEAR(evaluated.loss, summary.last_eval->loss, 1e-6);
}

TEST(TextRun, TokenBucketsTrainWithLittlePaddingAndMemoryWarmUpAtTheLongest) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  config.data.batching("tokens").max_tokens(128);
  config.memory.warmup(true);
  Experiment experiment = Experiment::build(config);
  const Batch largest = experiment.largest_batch();
  EXPECT_EQ(largest.inputs.sizes(), (torch::IntArrayRef{4, 32}));  // max_tokens / context sequences
  const FitSummary bucketed = train_run(config, dir.file("bucketed"));
  EXPECT_GT(bucketed.padding_fraction, 0.0);
  EXPECT_LT(bucketed.padding_fraction, 0.15);
  ASSERT_TRUE(bucketed.last_eval && bucketed.last_eval->bits_per_byte);
  EXPECT_TRUE(std::isfinite(*bucketed.last_eval->bits_per_byte));
  // Random batches of the same worst-case size (4 documents) pad much more.
  config.data.max_tokens(0).batch_size(4);
  const FitSummary random = train_run(config, dir.file("random"));
  EXPECT_GT(random.padding_fraction, 3 * bucketed.padding_fraction);  // measured 0.091 vs 0.013
}

// train.blas_threads sizes OpenBLAS's own pool (the matmuls); it changes the speed, not the losses.
TEST(TextRun, BlasThreadsChangeNoLoss) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  config.model.embed(64);  // matmuls large enough for OpenBLAS to split them over its threads
  config.train.max_steps(20).eval_every_steps(0);
  if (blas_library().name.empty()) {  // MKL and others follow train.threads: the key is an error
    config.train.blas_threads(1);
    EXPECT_TRUE(contains_all(error_message([&] { train_run(config, dir.file("refused")); }),
                             {"train.blas_threads = 1", "OpenBLAS"}));
    return;
  }
  const int at_start = set_blas_threads(0);
  std::vector<double> losses;
  for (int threads : {1, 2}) {
    config.train.blas_threads(threads);
    EXPECT_EQ(Experiment::build(config).blas.threads, threads);
    const FitSummary summary = train_run(config, dir.file("blas" + std::to_string(threads)));
    ASSERT_TRUE(summary.last_eval.has_value());
    losses.push_back(summary.last_eval->loss);
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-5 * losses[0]);
  config.train.blas_threads(0);  // the library's own count again
  EXPECT_EQ(Experiment::build(config).blas.threads, at_start);
  EXPECT_TRUE(contains_all(error_message([] { set_blas_threads(-1); }), {"train.blas_threads", "-1"}));
}

// Every event a run sends, in order, as text.
class RecordingReporter : public Reporter {
 public:
  void note(const std::string& text) override { events.push_back("note " + text); }
  void warning(const std::string& text) override { events.push_back("warning " + text); }
  void training_started(int64_t total_steps) override {
    events.push_back(fmt::format("started {}", total_steps));
  }
  void training_progress(const ProgressState& state) override {
    events.push_back(fmt::format("progress {}", state.step));
  }
  void training_finished() override { events.push_back("finished"); }
  int64_t count(const std::string& prefix) const {
    return std::count_if(events.begin(), events.end(),
                         [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  }
  std::vector<std::string> events;
};

// The library says nothing itself: what a run builds and does reaches the reporter the caller passed,
// and without one, stderr stays empty while metrics.jsonl is written all the same.
TEST(TextRun, RunsReportThroughTheReporterAndPrintNothingThemselves) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  config.train.max_steps(20).eval_every_steps(10);
  auto recorder = std::make_shared<RecordingReporter>();
  ::testing::internal::CaptureStderr();
  train_run(config, dir.file("reported"), RunOptions().reporter(recorder));
  train_run(config, dir.file("quiet"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  const auto& events = recorder->events;
  auto has = [&](const std::string& text) {
    return std::any_of(events.begin(), events.end(),
                       [&](const std::string& e) { return e.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(has("LibTorch")) << "the machine and LibTorch";
  EXPECT_TRUE(has("note model gpt,"));
  EXPECT_TRUE(has("note data: train"));
  EXPECT_TRUE(has("note run directory " + dir.file("reported")));
  EXPECT_EQ(recorder->count("started 20"), 1);
  EXPECT_EQ(recorder->count("progress"), 2);  // log.every_steps = 10 of 20
  EXPECT_EQ(recorder->count("finished"), 1);
  EXPECT_GE(recorder->count("note step 10 epoch"), 1) << "the evaluation at step 10";
  auto records = [&](const std::string& run) {
    const std::string text = read_text_file(dir.file(run + "/metrics.jsonl"));
    return std::count(text.begin(), text.end(), '\n');
  };
  EXPECT_GE(records("reported"), 3);
  EXPECT_EQ(records("quiet"), records("reported")) << "the same records with or without a reporter";
}

// A library user driving a Trainer gets the run directory's records by adding a RunLogger.
TEST(TextRun, RunLoggerWritesMetricsForATrainerDrivenDirectly) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  config.train.max_steps(20).eval_every_steps(20);
  Experiment experiment = Experiment::build(config);
  auto trainer = experiment.make_trainer();
  auto recorder = std::make_shared<RecordingReporter>();
  trainer->add_callback(std::make_shared<RunLogger>(dir.path(), recorder));
  trainer->fit(*experiment.train_loader, experiment.test_loader.get());
  std::istringstream metrics(read_text_file(dir.file("metrics.jsonl")));
  std::vector<std::string> kinds;
  for (std::string line; std::getline(metrics, line);) kinds.push_back(nlohmann::json::parse(line)["kind"]);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "train"), 2);
  EXPECT_GE(std::count(kinds.begin(), kinds.end(), "eval"), 1);
  EXPECT_EQ(recorder->count("progress"), 2);
  bool has_events = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    has_events |= entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_TRUE(has_events) << "TensorBoard events next to metrics.jsonl";
}

TEST(TextRun, ModelAndDataMustMatch) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  config.model.name("cnn");
  EXPECT_TRUE(contains_all(error_message([&] { validate(config); }), {"model.name = \"cnn\"", "\"text\""}));
  Config images;
  images.model.name("gpt");
  EXPECT_TRUE(
      contains_all(error_message([&] { validate(images); }), {"model.name = \"gpt\"", "fashion-mnist"}));
  config = text_config(write_text_corpus(dir));
  config.data.batching("tokens").max_tokens(16);
  EXPECT_TRUE(
      contains_all(error_message([&] { validate(config); }), {"data.max_tokens = 16", "model.context = 32"}));
  config = text_config(dir.file("nowhere"));
  EXPECT_TRUE(
      contains_all(error_message([&] { validate(config); }), {"data.path", "nowhere", "does not exist"}));
}

}  // namespace
}  // namespace fasttrain
