#pragma once
// `fasttrain doctor`: measures a short run of a config and says, in plain words and ranked, which
// techniques of the playbook it needs, each with the measurement behind it and the gain estimated
// from it.
//
//   fasttrain::DoctorReport report = fasttrain::diagnose(config, "runs/default");
//   std::cout << report.text();          // findings, most valuable first; "nothing to fix" when none
//   report.to_json();                    // what doctor.json holds (fasttrain report draws it)
//
// What is measured: a recorded profile of `steps` steps (time per phase, host reads, allocations);
// then unrecorded timed runs of at least `min_seconds`: the config as given (twice), 4x the batch
// (throughput vs batch), and, where a switch may pay, the run with it flipped (bf16 autocast on a
// CPU with AVX512-BF16 or AMX; one OpenMP or one OpenBLAS thread where the pools outnumber the
// cores; channels_last; anomaly detection off). A change that clears its threshold is timed again
// with the config as given once more, and counts only if the means still clear it. What is read from the
// config and the model: workers vs cores, conv bias before BatchNorm, the schedule, and on CUDA
// cudnn_benchmark, channels_last, tensor-core-friendly sizes, variable shapes without warm-up.
// Every rule, its threshold and what it measures is listed in docs/TECHNIQUES.md ("Doctor").
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct DoctorOptions {
  FT_ARG(int64_t, steps) = 20;  // recorded steps per measurement
  FT_ARG(int64_t, warmup_steps) = 5;
  // Each timed comparison run lasts at least `steps` and at least this long (short runs are noise).
  FT_ARG(double, min_seconds) = 2.0;
};

struct Finding {
  std::string rule;      // e.g. "data_bound"
  std::string title;     // what to do, in a sentence
  std::string evidence;  // what was measured or read
  std::string estimated_gain;
  std::string severity;  // "high" | "medium" | "low"
  double gain = 0;       // estimated fraction of step time saved (ranking; 0 when unknown)
};

struct DoctorReport {
  std::vector<Finding> findings;  // ranked: severity, then estimated gain
  nlohmann::json measurements;    // the profiles behind the findings
  std::string text() const;
  nlohmann::json to_json() const;  // {"findings": [...], "measurements": {...}}
};

// Diagnoses `config`; profile files of the measurements go under `out_dir`/doctor. `callbacks`
// join the main measurement's fit (tests plant a per-step synchronisation this way).
DoctorReport diagnose(const Config& config, const std::string& out_dir,
                      const DoctorOptions& options = DoctorOptions(),
                      const std::vector<std::shared_ptr<Callback>>& callbacks = {});

}  // namespace fasttrain
