#pragma once
// Batch-size finder (`fasttrain find-batch`, data.batch_size = "auto"): the largest micro-batch a
// run can train with inside its memory, and the throughput of each size tried.
//
// Each trial builds the run at one batch size and does what the run does: a few optimizer steps
// through the real loader (its prefetch queue included), then an evaluation pass. It fits when no
// allocation fails: on CUDA against the device's memory (out-of-memory is caught and the cache
// emptied), on CPU against memory.budget, which a CpuMemoryLimit turns into the same
// out-of-memory error. The search doubles from `start` until a size fails (or the training set's
// size is reached), then bisects between the largest fit and the smallest failure until they are
// within `tolerance`, on multiples of 8 while the gap is wide (tensor-core friendly sizes).
//
//   fasttrain::Config config = fasttrain::load_config("configs/default.toml");
//   config.memory.budget("2GiB");
//   fasttrain::RunBuilder builder;                   // or a program's own (run/run.h)
//   fasttrain::BatchFinderResult result = fasttrain::find_batch_size(builder, config);
//   std::cout << result.table();    // every size tried: fits, peak bytes, samples/s
//   config.data.batch_size(result.batch_size);
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"
#include "fasttrain/log/reporter.h"
#include "fasttrain/run/measure.h"
#include "fasttrain/run/run.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct BatchFinderOptions {
  // Optimizer steps per trial (measure.steps(), at least 2): the first allocates the optimizer state,
  // the rest reach the peak and time the step (samples/s is the median of steps 2..n). The reporter
  // hears each trial as it finishes.
  FT_ARG(MeasureOptions, measure) = MeasureOptions().steps(4);
  // The first size tried.
  FT_ARG(int64_t, start) = 16;
  // Stop bisecting when the gap between the largest fit and the smallest failure is at most this
  // fraction of the largest fit.
  FT_ARG(double, tolerance) = 0.05;
  // The largest size tried (0 = the training set's size).
  FT_ARG(int64_t, max_batch) = 0;
};

struct BatchTrial {
  int64_t batch_size = 0;
  bool fits = false;
  int64_t peak_bytes = 0;    // the allocator peak of the trial (0 when it did not fit)
  double samples_per_s = 0;  // 0 when it did not fit
  double seconds = 0;        // the trial's wall time
};

struct BatchFinderResult {
  int64_t batch_size = 0;    // the largest size that fitted
  int64_t budget_bytes = 0;  // memory.budget (0 = the device's memory)
  std::string device;
  std::vector<BatchTrial> trials;  // in the order tried
  // The trials as a text table sorted by batch size, and the answer.
  std::string table() const;
};

// Searches with `config`'s run (`builder`'s model and data, the config's optimizer and precision). CPU
// needs memory.budget (the CPU has no memory limit of its own to run into); a batch of 1 that does not
// fit is an error saying how much the run holds without activations. Other errors of a trial propagate.
BatchFinderResult find_batch_size(RunBuilder& builder, const Config& config,
                                  const BatchFinderOptions& options = BatchFinderOptions());

// `config` with data.batch_size = "auto" replaced by find_batch_size's answer (told to `reporter` with
// its table); any other config is returned as it is.
Config resolve_batch_size(RunBuilder& builder, const Config& config,
                          const std::shared_ptr<Reporter>& reporter = nullptr);

}  // namespace fasttrain
