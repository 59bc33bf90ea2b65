#pragma once
// `fasttrain doctor`: measures a short run of a config and says, in plain words and ranked, which
// techniques of the playbook it needs, each with the measurement behind it and the gain estimated
// from it.
//
//   fasttrain::RunBuilder builder;   // or a program's own: its model and data (run/run.h)
//   fasttrain::DoctorReport report = fasttrain::diagnose(builder, config, "runs/default");
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
// cudnn_benchmark, channels_last, tensor-core-friendly sizes, variable shapes without warm-up. The
// changes are config keys of the playbook, so a program's own model and data (its RunBuilder) are
// diagnosed as the built-in ones are.
// Every rule, its threshold and what it measures is listed in docs/TECHNIQUES.md ("Doctor"). Each
// rule is a registered unit (doctor_rules()) that reads a DoctorContext.
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"
#include "fasttrain/profile/profiler.h"
#include "fasttrain/run/measure.h"
#include "fasttrain/run/run.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/arg.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/hardware.h"
#include "fasttrain/util/registry.h"

namespace fasttrain {

struct DoctorOptions {
  // Steps recorded per measurement; each timed comparison lasts at least `steps` and at least
  // `min_seconds` (short runs are noise); the reporter hears the batch search of data.batch_size = "auto".
  FT_ARG(MeasureOptions, measure) = MeasureOptions().min_seconds(2.0);
};

// How much a finding matters, in ranking order.
enum class Severity { kHigh, kMedium, kLow };
// "high", "medium", "low".
const char* severity_name(Severity severity);

struct Finding {
  Finding(std::string rule, Severity severity) : rule_(std::move(rule)), severity_(severity) {}
  FT_ARG(std::string, rule);  // the rule that found it, e.g. "data_bound"
  FT_ARG(Severity, severity);
  FT_ARG(std::string, title);     // what to do, in a sentence
  FT_ARG(std::string, evidence);  // what was measured or read
  FT_ARG(std::string, estimated_gain);
  FT_ARG(double, gain) = 0;  // estimated fraction of step time saved (ranking; 0 when unknown)
};

// A speed comparison of the doctor: the config as given against one change, in samples/s (means of
// the runs timed; a change past its threshold is timed twice).
struct Comparison {
  double configured = 0, changed = 0, speedup = 0;  // speedup = changed / configured
};

// What the rules look at: the run as configured (resolved for this machine), its recorded profile,
// facts read from the model and the machine, and `compare`, which times the config against a change.
// Tests build one by hand, with `compare` answering from a table.
struct DoctorContext {
  Config config;  // "auto" resolved, the batch size found
  Hardware hardware;
  bool cuda = false;
  ProfileResult base;  // the recorded profile of the run as configured
  int workers = 0, threads = 1, cores = 1;
  BlasLibrary blas;
  bool conv_net = false;              // the model has 4-d (conv) weights
  int64_t conv_biases_before_bn = 0;  // conv biases that a BatchNorm makes redundant
  // The model's matrix and conv sizes that are not multiples of 8 ("fc.weight [100, 256]": its 100
  // outputs), the data's own input and output counts left out.
  std::vector<std::string> odd_layer_sizes;
  int64_t train_size = 0;        // samples per epoch
  int64_t alloc_retries = 0;     // CUDA: caching-allocator retries during the profile
  bool anomaly_mode = false;     // autograd anomaly detection was on before the doctor ran
  bool profiler_was_on = false;  // RecordFunction callbacks were active before the doctor ran
  // Times `changed` (named `name` in the measurements) against the config as given.
  std::function<Comparison(const std::string& name, const Config& changed, double threshold)> compare;
};

// A rule, registered under its name with what it checks (one line, for docs) as its help: the check
// returns its findings (none, usually). A program adds its own to doctor_rules().
using DoctorRule = std::function<std::vector<Finding>(const DoctorContext&)>;
// Every rule, in the order they run.
Registry<DoctorRule>& doctor_rules();

struct DoctorReport {
  std::vector<Finding> findings;  // ranked: severity, then estimated gain
  nlohmann::json measurements;    // the profiles behind the findings
  std::string text() const;
  nlohmann::json to_json() const;  // {"findings": [...], "measurements": {...}}
};

// Diagnoses the run of `config` that `builder` makes; profile files of the measurements go under
// `out_dir`/doctor. `callbacks` join the main measurement's fit (tests plant a per-step
// synchronisation this way).
DoctorReport diagnose(RunBuilder& builder, const Config& config, const std::string& out_dir,
                      const DoctorOptions& options = DoctorOptions(),
                      const std::vector<std::shared_ptr<Callback>>& callbacks = {});

}  // namespace fasttrain
