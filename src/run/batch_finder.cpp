#include "fasttrain/run/batch_finder.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "fasttrain/detail/compat.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/run/run.h"
#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"

namespace fasttrain {

namespace {

// The throughput of each step (logged every step); stops the fit after `steps`. The schedule stays
// planned over the whole run, as the run will use it.
class TrialSteps : public Callback {
 public:
  explicit TrialSteps(int64_t steps) : steps_(steps) {}
  void on_log(Trainer& trainer, const StepRecord& record) override {
    rates.push_back(record.samples_per_s);
    if (static_cast<int64_t>(rates.size()) >= steps_) trainer.request_stop();
  }
  std::vector<double> rates;

 private:
  int64_t steps_;
};

void validate(const BatchFinderOptions& options) {
  check_measure_options(options.measure(), "find-batch");
  FT_CONFIG_CHECK(options.measure().steps() >= 2,
                  "find-batch --steps must be >= 2 (the first step allocates the "
                  "optimizer state, the peak comes after it), got {}",
                  options.measure().steps());
  FT_CONFIG_CHECK(options.start() >= 1, "find-batch --start must be >= 1, got {}", options.start());
  FT_CONFIG_CHECK(options.tolerance() > 0 && options.tolerance() < 1,
                  "find-batch --tolerance must be in (0, 1), got {}", options.tolerance());
  FT_CONFIG_CHECK(options.max_batch() >= 0, "find-batch --max must be >= 0, got {}", options.max_batch());
}

// One trial: what the run does at `batch_size` (steps through the real loader, then an evaluation),
// under the budget on CPU.
BatchTrial run_trial(RunBuilder& builder, const Config& base, int64_t batch_size,
                     const BatchFinderOptions& options, int64_t budget_bytes) {
  Config config = base;
  config.data.batch_size(batch_size);
  config.train.options.eval_every_steps(0).stop_at_target(false);
  config.log.every_steps(1);
  BatchTrial trial;
  trial.batch_size = batch_size;
  const auto start = std::chrono::steady_clock::now();
  try {
    Run run = build_run(builder, config);
    std::optional<CpuMemoryLimit> limit;
    if (run.device.is_cpu()) limit.emplace(budget_bytes);
    auto trainer = run.make_trainer();
    auto rates = std::make_shared<TrialSteps>(options.measure().steps());
    trainer->add_callback(rates);
    trainer->fit(*run.train_loader, nullptr);  // resets the peak at its start
    if (run.test_loader) trainer->evaluate(*run.test_loader);
    trial.peak_bytes = memory_stats(run.device).peak_allocated_bytes;
    trial.fits = budget_bytes == 0 || trial.peak_bytes <= budget_bytes;
    std::vector<double> after_first(rates->rates.begin() + std::min<size_t>(1, rates->rates.size()),
                                    rates->rates.end());
    if (!after_first.empty()) {
      std::nth_element(after_first.begin(), after_first.begin() + after_first.size() / 2, after_first.end());
      trial.samples_per_s = after_first[after_first.size() / 2];
    }
  } catch (const std::exception& error) {
    if (!is_out_of_memory(error)) throw;
    compat::empty_cuda_cache();  // what the failed trial cached would crowd the next one
    trial = BatchTrial{batch_size};
  }
  trial.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return trial;
}

}  // namespace

BatchFinderResult find_batch_size(RunBuilder& builder, const Config& config,
                                  const BatchFinderOptions& options) {
  validate(options);
  BatchFinderResult result;
  const torch::Device device = parse_device(config.train.device());
  result.device = device.str();
  result.budget_bytes = config.memory.budget_bytes();
  FT_CONFIG_CHECK(!device.is_cpu() || result.budget_bytes > 0,
                  "finding the batch size on CPU needs memory.budget (for example \"4GiB\"): the CPU has no "
                  "memory limit of its own to search against");
  if (device.is_cpu()) track_cpu_allocations();  // before the data, so that it is counted too

  const DataSplits data = builder.reused_data(config);
  FT_CONFIG_CHECK(
      !data.train->batch_plan(0, false, 0),
      "data.batch_size = \"auto\" searches batches of data.batch_size samples, but {} groups its own "
      "batches (a token budget such as data.max_tokens): size those instead",
      data.train->describe());
  const int64_t train_size = data.train->size();
  const int64_t largest = options.max_batch() > 0 ? std::min(options.max_batch(), train_size) : train_size;

  auto fits = [&](int64_t batch_size) {
    BatchTrial trial = run_trial(builder, config, batch_size, options, result.budget_bytes);
    const std::string measured = trial.fits ? fmt::format(", peak {}, {:.0f} samples/s",
                                                          format_bytes(trial.peak_bytes), trial.samples_per_s)
                                            : "";
    reporter_or_quiet(options.measure().reporter())
        .note(fmt::format("find-batch: {:>6} {}{} ({:.1f} s)", batch_size,
                          trial.fits ? "fits" : "does not fit", measured, trial.seconds));
    result.trials.push_back(trial);
    return trial.fits;
  };

  // ---- double until a size fails, then bisect between the largest fit and the smallest failure ----
  int64_t fit = 0, fail = 0;  // 0 = none seen yet
  for (int64_t size = std::min(options.start(), largest);; size = std::min(2 * size, largest)) {
    if (!fits(size)) {
      fail = size;
      break;
    }
    fit = size;
    if (size == largest) break;
  }
  while (fail > 0 && fail - fit > std::max<int64_t>(1, static_cast<int64_t>(options.tolerance() * fit))) {
    int64_t middle = (fit + fail) / 2;
    if (fail - fit > 16 && middle / 8 * 8 > fit) middle = middle / 8 * 8;
    if (fits(middle)) {
      fit = middle;
    } else {
      fail = middle;
    }
  }
  FT_CHECK(fit > 0,
           "even data.batch_size = 1 does not fit {} on {}: the dataset, model, optimizer state and an "
           "evaluation batch of data.eval_batch_size = {} already take more; raise memory.budget or lower "
           "data.eval_batch_size",
           result.budget_bytes > 0 ? "memory.budget = " + format_bytes(result.budget_bytes) : "the memory",
           result.device, config.data.eval_batch_size());
  result.batch_size = fit;
  return result;
}

std::string BatchFinderResult::table() const {
  std::vector<BatchTrial> sorted = trials;
  std::sort(sorted.begin(), sorted.end(),
            [](const BatchTrial& a, const BatchTrial& b) { return a.batch_size < b.batch_size; });
  std::string out = fmt::format("{:>8}  {:>5}  {:>12}  {:>10}  {:>7}\n", "batch", "fits", "peak memory",
                                "samples/s", "trial s");
  for (const auto& trial : sorted) {
    out += fmt::format("{:>8}  {:>5}  {:>12}  {:>10}  {:>7.1f}\n", trial.batch_size,
                       trial.fits ? "yes" : "no", trial.fits ? format_bytes(trial.peak_bytes) : "-",
                       trial.fits ? fmt::format("{:.0f}", trial.samples_per_s) : "-", trial.seconds);
  }
  out += fmt::format("largest batch that fits {} on {}: {}\n",
                     budget_bytes > 0 ? "memory.budget " + format_bytes(budget_bytes) : "the device memory",
                     device, batch_size);
  return out;
}

Config resolve_batch_size(RunBuilder& builder, const Config& config,
                          const std::shared_ptr<Reporter>& reporter) {
  if (config.data.batch_size() != 0) return config;
  reporter_or_quiet(reporter).note("data.batch_size = \"auto\": searching for the largest batch that fits");
  BatchFinderResult result = find_batch_size(
      builder, config, BatchFinderOptions().measure(MeasureOptions().steps(4).reporter(reporter)));
  reporter_or_quiet(reporter).note("find-batch:\n" + result.table());
  Config resolved = config;
  resolved.data.batch_size(result.batch_size);
  return resolved;
}

}  // namespace fasttrain
