#pragma once
// `fasttrain tune`: tries the switches that apply to a config on this machine, a bounded number of
// steps each, keeps what helps, and writes the tuned config with the table of what it measured.
//
//   fasttrain::RunBuilder builder;   // or a program's own: its model and data (run/run.h)
//   fasttrain::TuneResult result = fasttrain::tune(builder, config, "runs/default");
//   std::cout << result.table();                   // every trial: the change, samples/s, kept or why not
//   fasttrain::to_toml(result.tuned);              // also written to RUN_DIR/tuned.toml
//
// Greedy, one switch at a time in this order, each trial measured against the best so far (an
// unrecorded run: `warmup_steps`, then at least `steps` and `min_seconds` timed): train.threads
// (1 .. physical cores), train.blas_threads (1 .. physical cores, where the BLAS is OpenBLAS; the
// threads again when one is kept), data.workers (0, 1, 2), train.precision (bf16 from fp32 where
// this CPU or a GPU has it, at each thread count), train.channels_last (conv nets),
// train.cudnn_benchmark (CUDA), data.batch_size (x2, x4; the learning rate scaled with it), then the
// thread counts again if any of those was kept (bf16 matmuls run on the intra-op threads, fp32 ones
// in OpenBLAS's pool). Values already in effect are not tried. A change is kept when it is at least
// `min_gain` faster (a first pair of runs that says so is timed again, and the means must agree)
// and its losses stay finite (the trainer's own check: a diverging trial fails and is reported, not
// kept).
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"
#include "fasttrain/log/reporter.h"
#include "fasttrain/run/measure.h"
#include "fasttrain/run/run.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct TuneOptions {
  // Each trial times at least `steps` and at least `min_seconds` (short runs are noise here); the
  // reporter hears the batch search of data.batch_size = "auto".
  FT_ARG(MeasureOptions, measure) = MeasureOptions().min_seconds(2.0);
  // Required speedup over the best so far to keep a change, on the means of two pairs of runs
  // (2 s runs still vary about 10% here; 1.05 kept noise).
  FT_ARG(double, min_gain) = 1.10;
  // Also try larger batches (changes the optimisation, so off unless asked).
  FT_ARG(bool, batch) = false;
};

struct TuneTrial {
  std::string change;  // "train.threads = 1"
  double samples_per_s = 0;
  double speedup = 0;  // over the best config when it was tried
  bool kept = false;
  std::string note;  // why not kept, or the error of a failed trial
};

struct TuneResult {
  Config tuned;
  double baseline_samples_per_s = 0;
  double tuned_samples_per_s = 0;
  std::vector<TuneTrial> trials;
  std::string table() const;  // Markdown
};

// Writes RUN_DIR/tuned.toml and RUN_DIR/tune.md (the table) as well.
TuneResult tune(RunBuilder& builder, const Config& config, const std::string& run_dir,
                const TuneOptions& options = TuneOptions());

}  // namespace fasttrain
