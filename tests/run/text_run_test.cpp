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
#include "fasttrain/run/train_run.h"
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
  config.data.dataset.select("text").as<TextDataOptions>().path(corpus).include("*.py").val_fraction(0.2);
  config.data.batch_size(8).eval_batch_size(8).workers(1);
  config.model.select("gpt").as<GptOptions>().layers(2).heads(2).embed(32).context(32);
  config.optim.name("adamw").lr(3e-3);
  config.schedule.name("constant");
  config.train.options.max_steps(60).eval_every_steps(30);
  config.train.threads(1);
  config.log.progress("none").every_steps(10);
  return config;
}

TextDataOptions& text_options(Config& config) {
  return config.data.dataset.as<TextDataOptions>();
}

Run build(const Config& config) {
  RunBuilder builder;
  return build_run(builder, config);
}

TEST(TextRun, TrainsOnWindowsAndReportsBitsPerByte) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  const FitSummary summary = train_run(config, dir.file("run"));
  ASSERT_TRUE(summary.test.has("bits_per_byte"));
  const double bits_per_byte = summary.test.at("bits_per_byte");
  EXPECT_NEAR(bits_per_byte, summary.test.at("loss") / std::log(2.0), 1e-12);
  EXPECT_LT(bits_per_byte, 4.0) << "8 bits per byte is chance; the corpus is repetitive";
  EXPECT_EQ(summary.padding_fraction, 0.0);
  // The task was the data's own: language modelling, recorded in the effective config.
  EXPECT_NE(read_text_file(dir.file("run/config.toml")).find("[task]\nname = \"language_modeling\""),
            std::string::npos);
  // samples/s counts target tokens: 60 steps of 8 windows of 32.
  const auto json = nlohmann::json::parse(read_text_file(dir.file("run/summary.json")));
  EXPECT_NEAR(json["test_bits_per_byte"].get<double>(), bits_per_byte, 1e-9);
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
  EXPECT_NEAR(evaluated.metrics.at("loss"), summary.test.at("loss"), 1e-6);
}

TEST(TextRun, TokenBucketsTrainWithLittlePaddingAndMemoryWarmUpAtTheLongest) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  text_options(config).batching("tokens").max_tokens(128);
  config.memory.warmup(true);
  const Batch largest = build(config).largest_batch();
  EXPECT_EQ(largest.inputs.sizes(), (torch::IntArrayRef{4, 32}));  // max_tokens / context sequences
  const FitSummary bucketed = train_run(config, dir.file("bucketed"));
  EXPECT_GT(bucketed.padding_fraction, 0.0);
  EXPECT_LT(bucketed.padding_fraction, 0.15);
  ASSERT_TRUE(bucketed.test.has("bits_per_byte"));
  EXPECT_TRUE(std::isfinite(bucketed.test.at("bits_per_byte")));
  // Random batches of the same worst-case size (4 documents) pad much more.
  text_options(config).max_tokens(0);
  config.data.batch_size(4);
  const FitSummary random = train_run(config, dir.file("random"));
  EXPECT_GT(random.padding_fraction, 3 * bucketed.padding_fraction);  // measured 0.091 vs 0.013
}

// train.blas_threads sizes OpenBLAS's own pool (the matmuls); it changes the speed, not the losses.
TEST(TextRun, BlasThreadsChangeNoLoss) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  config.model.as<GptOptions>().embed(
      64);  // matmuls large enough for OpenBLAS to split them over its threads
  config.train.options.max_steps(20).eval_every_steps(0);
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
    EXPECT_EQ(build(config).blas.threads, threads);
    const FitSummary summary = train_run(config, dir.file("blas" + std::to_string(threads)));
    losses.push_back(summary.test.at("loss"));
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-5 * losses[0]);
  config.train.blas_threads(0);  // the library's own count again
  EXPECT_EQ(build(config).blas.threads, at_start);
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
  config.train.options.max_steps(20).eval_every_steps(10);
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
  EXPECT_TRUE(has("auto: task.name = language_modeling"));
  EXPECT_TRUE(has("note data (loaded in "));
  EXPECT_TRUE(has("s): train "));
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
  config.train.options.max_steps(20).eval_every_steps(20);
  fasttrain::Run run = build(config);
  auto trainer = run.make_trainer();
  auto recorder = std::make_shared<RecordingReporter>();
  const std::string logs = dir.file("not/yet/made");  // the logger makes it
  trainer->add_callback(std::make_shared<RunLogger>(logs, recorder));
  trainer->fit(*run.train_loader, run.test_loader.get());
  std::istringstream metrics(read_text_file(logs + "/metrics.jsonl"));
  std::vector<std::string> kinds;
  for (std::string line; std::getline(metrics, line);) kinds.push_back(nlohmann::json::parse(line)["kind"]);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "train"), 2);
  EXPECT_GE(std::count(kinds.begin(), kinds.end(), "eval"), 1);
  EXPECT_EQ(recorder->count("progress"), 2);
  bool has_events = false;
  for (const auto& entry : std::filesystem::directory_iterator(logs))
    has_events |= entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_TRUE(has_events) << "TensorBoard events next to metrics.jsonl";
  // A second new run into the same directory would mix its records with these: refused before training,
  // naming what to do.
  fasttrain::Run again = build(config);
  auto second = again.make_trainer();
  second->add_callback(std::make_shared<RunLogger>(logs));
  EXPECT_TRUE(contains_all(error_message([&] { second->fit(*again.train_loader, nullptr); }),
                           {"metrics.jsonl", "earlier run", "clear_run_dir"}));
  EXPECT_EQ(second->step(), 0);
}

TEST(TextRun, ModelAndDataMustMatch) {
  TempDir dir;
  Config config = text_config(write_text_corpus(dir));
  config.model.select("cnn");
  EXPECT_TRUE(contains_all(error_message([&] { build(config); }), {"text", "sequence model", "gpt"}));
  Config images;
  images.model.select("gpt");
  if (testing::have_fashion_mnist()) {
    EXPECT_TRUE(contains_all(error_message([&] { build(images); }),
                             {"model 'gpt'", "token sequences", "[1, 28, 28]"}));
  }
  config = text_config(write_text_corpus(dir));
  text_options(config).batching("tokens").max_tokens(16);
  EXPECT_TRUE(
      contains_all(error_message([&] { build(config); }), {"data.max_tokens = 16", "model.context = 32"}));
  config = text_config(dir.file("nowhere"));
  EXPECT_TRUE(
      contains_all(error_message([&] { build(config); }), {"data.path", "nowhere", "does not exist"}));
  // A task that does not fit the data: regression on next-token classes.
  config = text_config(write_text_corpus(dir));
  config.task.select("regression");
  EXPECT_TRUE(
      contains_all(error_message([&] { build(config); }), {"model 'gpt'", "task 'regression'", "Long"}));
}

}  // namespace
}  // namespace fasttrain
