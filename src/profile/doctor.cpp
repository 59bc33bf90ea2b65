#include "fasttrain/profile/doctor.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "fasttrain/config/auto.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/profile/profiler.h"
#include "fasttrain/train/batch_finder.h"
#include "fasttrain/train/run.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/hardware.h"

namespace fasttrain {

namespace {

// ---------------------------------------------------------------------------------------------
// Thresholds: a finding needs a measured gain past the run-to-run noise of this kind of machine
// (single runs vary by 10-15% in throughput).
// ---------------------------------------------------------------------------------------------
constexpr double kDataBound = 0.10;        // share of step time waiting for data
constexpr double kBatchSpeedup = 1.5;      // samples/s at 4x the batch over the current batch
constexpr double kSwitchSpeedup = 1.15;    // samples/s with a switch flipped (bf16, channels_last)
constexpr double kHostReadsPerStep = 0.5;  // device-to-host reads per optimizer step

std::string percent(double fraction) {
  return fmt::format("{:.1f}%", 100 * fraction);
}

int severity_rank(const std::string& severity) {
  return severity == "high" ? 0 : severity == "medium" ? 1 : 2;
}

// Convolutions with a bias directly followed (max-pool in between commutes) by a BatchNorm.
int64_t conv_biases_before_batchnorm(torch::nn::Module& model) {
  int64_t count = 0;
  for (const auto& module : model.modules(/*include_self=*/true)) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(module.get());
    if (!sequential) continue;
    bool biased_conv = false;
    for (const auto& child : *sequential) {
      const auto* conv = child.ptr()->as<torch::nn::Conv2d>();
      if (conv) {
        biased_conv = conv->options.bias();
      } else if (child.ptr()->as<torch::nn::BatchNorm2d>()) {
        count += biased_conv ? 1 : 0;
        biased_conv = false;
      } else if (!child.ptr()->as<torch::nn::MaxPool2d>()) {
        biased_conv = false;
      }
    }
  }
  return count;
}

bool has_convolutions(torch::nn::Module& model) {
  for (const auto& parameter : model.parameters()) {
    if (parameter.dim() == 4) return true;
  }
  return false;
}

}  // namespace

DoctorReport diagnose(const Config& requested, const std::string& out_dir, const DoctorOptions& options,
                      const std::vector<std::shared_ptr<Callback>>& callbacks) {
  DoctorReport report;
  auto add = [&](Finding finding) { report.findings.push_back(std::move(finding)); };
  const bool profiler_was_on = at::hasGlobalCallbacks() || at::hasThreadLocalCallbacks();

  // ---- the run as configured: a short profile ----
  // "auto" precision and threads as this machine resolves them: what the run would do here.
  const Hardware hardware = detect_hardware(parse_device(requested.train.device()));
  const Config config = with_room_to_profile(resolve_auto(resolve_batch_size(requested), hardware).config);
  const ProfileOptions profile_options =
      ProfileOptions().steps(options.steps()).warmup_steps(options.warmup_steps()).announce(false);
  Experiment experiment = Experiment::build(config, /*announce=*/false);
  const torch::Device device = experiment.device;
  const bool cuda = device.is_cuda();
  const int64_t conv_biases = conv_biases_before_batchnorm(*experiment.model);
  const bool conv_net = has_convolutions(*experiment.model);
  const int64_t train_size = experiment.train_loader->samples_per_epoch();
  const int workers = experiment.train_loader->workers();
  const int threads = experiment.threads, cores = physical_cores();
  const ProfileResult base =
      profile_experiment(experiment, out_dir + "/doctor/as-configured", profile_options, callbacks);
  report.measurements["as_configured"] = base.to_json();
  // Speeds are compared between unrecorded runs (the profiler's per-operator cost is no part of a
  // real run and weighs differently on each). Short runs are noisy here, bimodally so where threads
  // contend, so the run as configured is timed twice before the first comparison, and a change that
  // clears its threshold is timed again with the configured run once more: it counts only if the
  // means still clear it. One lucky run on a busy machine is no finding.
  const ProfileOptions timed_options =
      ProfileOptions(profile_options).record(false).min_seconds(options.min_seconds());
  auto timed = [&](const std::string& name, const Config& run) {
    const ProfileResult result = profile_run(run, out_dir + "/doctor/" + name, timed_options);
    report.measurements[name] = result.to_json();
    return result.samples_per_s;
  };
  std::vector<double> configured_speeds;
  auto mean = [](const std::vector<double>& values) {
    return std::accumulate(values.begin(), values.end(), 0.0) / std::max<size_t>(values.size(), 1);
  };
  struct Comparison {
    double configured = 0, changed = 0, speedup = 0;  // mean samples/s; changed / configured
  };
  auto compare = [&](const std::string& name, const Config& changed, double threshold) {
    while (configured_speeds.size() < 2)
      configured_speeds.push_back(timed(fmt::format("as_configured_{}", configured_speeds.size()), config));
    std::vector<double> changed_speeds = {timed(name, changed)};
    if (changed_speeds[0] / std::max(mean(configured_speeds), 1e-9) >= threshold) {
      configured_speeds.push_back(timed(fmt::format("as_configured_{}", configured_speeds.size()), config));
      changed_speeds.push_back(timed(name + "_again", changed));
    }
    Comparison result{mean(configured_speeds), mean(changed_speeds)};
    result.speedup = result.changed / std::max(result.configured, 1e-9);
    return result;
  };
  const double step_s = base.phases.total() / std::max<int64_t>(base.steps, 1);
  const int64_t batch = config.data.batch_size();

  // ---- data: waiting for batches, or workers fighting the compute threads ----
  const double wait = base.phases.seconds(Phase::kDataWait) / std::max(base.phases.total(), 1e-12);
  if (wait >= kDataBound) {
    add({"data_bound",
         workers == 0
             ? "Build batches in loader workers: set data.workers (now 0: the step builds them itself)"
             : fmt::format("Add loader workers: data.workers = {} cannot keep up", workers),
         fmt::format("{} of step time is spent waiting for the next batch ({:.2f} of {:.2f} ms per step; {} "
                     "workers, {} compute threads, {} cores)",
                     percent(wait), 1000 * base.phases.seconds(Phase::kDataWait) / base.steps, 1000 * step_s,
                     workers, threads, cores),
         fmt::format("up to {} of step time", percent(wait)), wait >= 0.3 ? "high" : "medium", wait});
  } else if (workers > 1 && workers + threads > cores && wait < 0.01) {
    add({"too_many_workers",
         fmt::format("Use fewer loader workers: {} workers share {} cores with {} compute threads", workers,
                     cores, threads),
         fmt::format("the step waits for data only {} of the time", percent(wait)), "fewer context switches",
         "low", 0});
  }

  // ---- throughput vs batch ----
  if (batch * 4 <= train_size) {
    Config larger = config;
    larger.data.batch_size(batch * 4);
    const Comparison result = compare("batch_x4", larger, kBatchSpeedup);
    const double speedup = result.speedup;
    if (speedup >= kBatchSpeedup) {
      add({"small_batch",
           fmt::format("Raise data.batch_size: {} leaves the hardware idle (scale the LR with it, or run "
                       "fasttrain find-batch)",
                       batch),
           fmt::format("{:.0f} samples/s at batch {} vs {:.0f} at batch {} ({:.2f}x)", result.configured,
                       batch, result.changed, batch * 4, speedup),
           fmt::format("{:.2f}x samples/s", speedup), speedup >= 2 ? "high" : "medium", 1 - 1 / speedup});
    }
  }

  // ---- switches that may pay here, measured flipped ----
  auto add_if_faster = [&](const std::string& rule, const std::string& title, const Comparison& result,
                           const std::string& what) {
    if (result.speedup < kSwitchSpeedup) return;
    add({rule, title,
         fmt::format("{:.0f} samples/s {} vs {:.0f} as configured ({:.2f}x)", result.changed, what,
                     result.configured, result.speedup),
         fmt::format("{:.2f}x samples/s", result.speedup), "medium", 1 - 1 / result.speedup});
  };
  auto try_switch = [&](const std::string& rule, const std::string& title, const Config& changed,
                        const std::string& what) {
    add_if_faster(rule, title, compare(rule, changed, kSwitchSpeedup), what);
  };
  if (!cuda && config.train.precision() == "bf16" && !hardware.native_bf16()) {
    // Flagged whatever the measurement says: emulated bf16 is never the right setting.
    Config fp32 = config;
    fp32.train.precision("fp32");
    const Comparison result = compare("emulated_bf16", fp32, 1.0);
    add({"emulated_bf16",
         "Train in fp32 (train.precision = \"fp32\" or \"auto\"): this CPU has no native bfloat16 "
         "(AVX512-BF16 or AMX), so every bf16 op is emulated",
         fmt::format("{:.0f} samples/s in fp32 vs {:.0f} in emulated bf16 ({:.2f}x) on {}", result.changed,
                     result.configured, result.speedup, hardware.describe()),
         fmt::format("{:.2f}x samples/s", result.speedup), "high", 1 - 1 / std::max(result.speedup, 1.0)});
  }
  if (config.train.precision() == "fp32" && hardware.native_bf16()) {
    Config bf16 = config;
    bf16.train.precision("bf16");
    try_switch("mixed_precision",
               cuda ? "Use mixed precision: train.precision = \"bf16\" (or \"fp16\")"
                    : "Use bf16 autocast: train.precision = \"bf16\" (this CPU has native bfloat16)",
               bf16, "with bf16 autocast");
  }
  const BlasLibrary blas = experiment.blas;
  if (!cuda && threads > 1 && blas.threads > 0 && threads + blas.threads > cores) {
    // Either pool can give way: one OpenMP thread, or one BLAS thread; the better one is reported.
    Config one_thread = config, one_blas_thread = config;
    one_thread.train.threads(1);
    one_blas_thread.train.blas_threads(1);
    const Comparison fewer_threads = compare("thread_contention", one_thread, kSwitchSpeedup);
    const Comparison fewer_blas = compare("thread_contention_blas", one_blas_thread, kSwitchSpeedup);
    const bool blas_better = fewer_blas.speedup > fewer_threads.speedup;
    add_if_faster("thread_contention",
                  fmt::format("{}: {}'s own pool of {} threads runs the matmuls, and {} OpenMP threads on {} "
                              "cores spin against it",
                              blas_better ? "Shrink the BLAS pool (train.blas_threads = 1)"
                                          : "Use one intra-op thread (train.threads = 1)",
                              blas.name, blas.threads, threads, cores),
                  blas_better ? fewer_blas : fewer_threads,
                  blas_better ? "at train.blas_threads = 1" : "at train.threads = 1");
  }
  if (conv_net && !config.train.channels_last()) {
    Config nhwc = config;
    nhwc.train.channels_last(true);
    try_switch("channels_last", "Use channels_last for this conv net: train.channels_last = true", nhwc,
               "in channels_last");
  }

  // ---- debugging aids left on ----
  if (config.train.detect_anomaly() || torch::autograd::AnomalyMode::is_enabled()) {
    Config off = config;
    off.train.detect_anomaly(false);
    // Reported whatever it measures: no threshold to confirm.
    const Comparison result = compare("anomaly_off", off, std::numeric_limits<double>::infinity());
    const double speedup = result.speedup;
    add({"anomaly_detection",
         "Turn autograd anomaly detection off (train.detect_anomaly = false): it is a debugging aid",
         fmt::format("{:.0f} samples/s with it vs {:.0f} without ({:.2f}x)", result.configured,
                     result.changed, speedup),
         fmt::format("{:.2f}x samples/s", speedup), "high", std::max(0.0, 1 - 1 / speedup)});
  }
  if (profiler_was_on) {
    add({"profiler_on",
         "Stop the profiler or RecordFunction callbacks that were active before the doctor ran",
         "at::hasCallbacks() was true outside fasttrain's own measurement",
         "the profiler's per-operator overhead", "medium", 0});
  }

  // ---- the step loop: host reads, allocator ----
  const double reads_per_step = static_cast<double>(base.host_reads) / std::max<int64_t>(base.steps, 1);
  if (reads_per_step >= kHostReadsPerStep) {
    add({"host_sync",
         "Stop reading tensors on the host every step (.item(), nonzero, printing a loss): keep values on "
         "the "
         "device and read them at log steps",
         fmt::format("{} device-to-host reads in {} steps ({:.1f} per step; aten::_local_scalar_dense and "
                     "aten::nonzero in the profile)",
                     base.host_reads, base.steps, reads_per_step),
         cuda ? "each read stalls the GPU queue" : "small on CPU; on a GPU each read stalls the queue",
         cuda ? "high" : "medium", 0});
  }
  if (cuda) {
    const int64_t retries = memory_stats(device).alloc_retries;
    if (retries > 0) {
      add({"allocator_churn",
           "The caching allocator had to free its cache to allocate: lower the batch, set memory.warmup, or "
           "memory.expandable_segments",
           fmt::format("{} allocation retries in {} steps", retries, base.steps),
           "fewer cudaMalloc/free stalls", "medium", 0});
    }
  }

  // ---- the model and the config ----
  if (conv_biases > 0) {
    add({"conv_bias_before_batchnorm",
         "Drop the conv biases before BatchNorm (model.bias_before_norm = false): BatchNorm subtracts the "
         "mean, so "
         "the bias does nothing but cost an add and its gradient",
         fmt::format("{} convolution(s) with a bias feed a BatchNorm", conv_biases),
         "a bias add and its gradient per conv", "low", 0});
  }
  if (config.schedule.name() == "constant") {
    add({"constant_lr",
         "Schedule the learning rate: run fasttrain find-lr, then schedule.name = \"one-cycle\" with its "
         "suggestion",
         "schedule.name = \"constant\"",
         "in the default config one-cycle reached 91% where a constant LR did not (BENCHMARKS ablation)",
         "low", 0});
  }
  if (cuda) {
    if (conv_net && !config.train.cudnn_benchmark() && !config.train.deterministic()) {
      add({"cudnn_benchmark",
           "Let cuDNN pick the fastest convolution algorithms: train.cudnn_benchmark = true",
           "the shapes are fixed and cudnn_benchmark is off", "often 10-30% on conv nets", "medium", 0});
    }
    std::vector<std::string> odd;
    if (batch % 8 != 0) odd.push_back(fmt::format("data.batch_size {}", batch));
    for (int64_t width : config.model.widths())
      if (width % 8 != 0) odd.push_back(fmt::format("model.widths {}", width));
    for (int64_t hidden : config.model.hidden())
      if (hidden % 8 != 0) odd.push_back(fmt::format("model.hidden {}", hidden));
    if (!odd.empty()) {
      add({"tensor_core_sizes", "Use multiples of 8 for sizes that become matrix dimensions (tensor cores)",
           fmt::format("not multiples of 8: {}", fmt::join(odd, ", ")),
           "tensor-core kernels instead of fallbacks", "low", 0});
    }
    if (!config.data.drop_last() && train_size % batch != 0 && !config.memory.warmup()) {
      add({"variable_shapes",
           "Set memory.warmup = true (or data.drop_last = true): the last batch of each epoch has "
           "another shape",
           fmt::format("{} samples in batches of {} leave a last batch of {}", train_size, batch,
                       train_size % batch),
           "no allocator growth at epoch ends", "low", 0});
    }
  }

  std::stable_sort(report.findings.begin(), report.findings.end(), [](const Finding& a, const Finding& b) {
    if (severity_rank(a.severity) != severity_rank(b.severity))
      return severity_rank(a.severity) < severity_rank(b.severity);
    return a.gain > b.gain;
  });
  return report;
}

nlohmann::json DoctorReport::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : findings) {
    list.push_back({{"rule", f.rule},
                    {"title", f.title},
                    {"evidence", f.evidence},
                    {"estimated_gain", f.estimated_gain},
                    {"severity", f.severity}});
  }
  return {{"findings", list}, {"measurements", measurements}};
}

std::string DoctorReport::text() const {
  if (findings.empty())
    return "fasttrain doctor: nothing to fix: no rule found a measured gain for this config\n";
  std::string out = fmt::format("fasttrain doctor: {} finding(s), most valuable first\n", findings.size());
  int index = 1;
  for (const auto& f : findings) {
    out += fmt::format("{}. [{}] {}\n   evidence: {}\n   estimated gain: {}\n", index++, f.severity, f.title,
                       f.evidence, f.estimated_gain);
  }
  return out;
}

}  // namespace fasttrain
