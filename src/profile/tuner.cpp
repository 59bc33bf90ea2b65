#include "fasttrain/profile/tuner.h"

#include <torch/torch.h>

#include <functional>

#include "fasttrain/log/metrics.h"
#include "fasttrain/profile/profiler.h"
#include "fasttrain/train/batch_finder.h"
#include "fasttrain/util/check.h"
#include "fasttrain/config/auto.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/hardware.h"

namespace fasttrain {

namespace {

// One candidate: what it changes, and the change.
struct Candidate {
  std::string change;
  std::function<void(Config&)> apply;
};

}  // namespace

TuneResult tune(const Config& requested, const std::string& run_dir, const TuneOptions& options) {
  FT_CONFIG_CHECK(options.min_gain() >= 1, "tune --min-gain must be >= 1, got {}", options.min_gain());
  TuneResult result;
  const torch::Device device = parse_device(requested.train.device());
  const Hardware hardware = detect_hardware(device);
  // "auto" precision and threads start as this machine resolves them; the trials go from there.
  Config best = resolve_auto(resolve_batch_size(requested), hardware).config;
  const ProfileOptions profile = ProfileOptions()
                                     .steps(options.steps())
                                     .warmup_steps(options.warmup_steps())
                                     .min_seconds(options.min_seconds())
                                     .announce(false)
                                     .record(false);
  auto measure = [&](Config config, const std::string& name) {
    return profile_run(with_room_to_profile(std::move(config)), run_dir + "/tune/" + name, profile)
        .samples_per_s;
  };
  double best_speed = measure(best, "baseline");
  result.baseline_samples_per_s = best_speed;

  bool kept_any = false;
  auto try_candidates = [&](const std::vector<Candidate>& candidates) {
    for (const auto& candidate : candidates) {
      Config changed = best;
      candidate.apply(changed);
      if (to_toml(changed) == to_toml(best)) continue;  // already so
      TuneTrial trial;
      trial.change = candidate.change;
      try {
        const std::string name = "trial-" + std::to_string(result.trials.size());
        trial.samples_per_s = measure(changed, name);
        trial.speedup = trial.samples_per_s / std::max(best_speed, 1e-9);
        if (trial.speedup >= options.min_gain()) {
          // One pair of runs is no gain: both again, and the means must still clear min_gain.
          best_speed = (best_speed + measure(best, name + "-best-again")) / 2;
          // Still the config as given: the re-measure refines the baseline the result compares with.
          if (!kept_any) result.baseline_samples_per_s = best_speed;
          trial.samples_per_s = (trial.samples_per_s + measure(changed, name + "-again")) / 2;
          trial.speedup = trial.samples_per_s / std::max(best_speed, 1e-9);
        }
        trial.kept = trial.speedup >= options.min_gain();
        if (!trial.kept) trial.note = fmt::format("less than {:.2f}x", options.min_gain());
      } catch (const Error& error) {
        trial.note = std::string("failed: ") + error.what();
      }
      if (trial.kept) {
        kept_any = true;
        best = changed;
        best_speed = trial.samples_per_s;
      }
      result.trials.push_back(trial);
    }
  };

  // train.threads = 0 is the physical cores.
  auto threads_in_effect = [&] { return best.train.threads() > 0 ? best.train.threads() : physical_cores(); };
  auto thread_candidates = [&] {
    std::vector<Candidate> threads;
    for (int count = 1; count <= physical_cores(); ++count) {
      if (count == threads_in_effect()) continue;
      threads.push_back(
          {fmt::format("train.threads = {}", count), [count](Config& c) { c.train.threads(count); }});
    }
    return threads;
  };
  const BlasLibrary blas_now = blas_library();
  auto try_thread_counts = [&] {
    try_candidates(thread_candidates());
    if (!device.is_cpu() || blas_now.name.empty()) return;
    // OpenBLAS's pool runs the matmuls beside the intra-op threads: fewer can beat both fighting.
    const int kept_blas = best.train.blas_threads();
    const int effective = kept_blas > 0 ? kept_blas : blas_now.threads_at_start;
    std::vector<Candidate> blas;
    for (int count = 1; count <= physical_cores(); ++count) {
      if (count == effective) continue;  // what 0 means already
      blas.push_back({fmt::format("train.blas_threads = {}", count),
                      [count](Config& c) { c.train.blas_threads(count); }});
    }
    try_candidates(blas);
    // A smaller BLAS pool leaves cores to the intra-op threads: the threads count tried before may
    // no longer be the best.
    if (best.train.blas_threads() != kept_blas) try_candidates(thread_candidates());
  };
  if (best.train.precision() == "bf16" && !hardware.native_bf16()) {
    // Emulated bf16 (a CPU without AVX512-BF16 / AMX) is never proposed, and fp32 is tried before anything else.
    try_candidates({{"train.precision = \"fp32\"", [](Config& c) { c.train.precision("fp32"); }}});
  }
  try_thread_counts();
  const Config after_threads = best;
  std::vector<Candidate> workers;
  for (int count : {0, 1, 2})
    workers.push_back(
        {fmt::format("data.workers = {}", count), [count](Config& c) { c.data.workers(count); }});
  try_candidates(workers);
  if (best.train.precision() == "fp32" && hardware.native_bf16()) {
    // With each thread count: bf16 matmuls leave OpenBLAS for oneDNN on the intra-op threads, so the
    // best count in fp32 may be the worst in bf16 (the gpt: 1 thread in fp32, 2 in bf16).
    std::vector<Candidate> bf16;
    const int effective = threads_in_effect();
    for (int count = 1; count <= physical_cores(); ++count) {
      if (count == effective) {
        bf16.push_back({"train.precision = \"bf16\"", [](Config& c) { c.train.precision("bf16"); }});
      } else {
        bf16.push_back({fmt::format("train.precision = \"bf16\", train.threads = {}", count),
                        [count](Config& c) { c.train.precision("bf16").threads(count); }});
      }
    }
    try_candidates(bf16);
  }
  if (best.model.name() != "mlp" && best.model.name() != "gpt") {  // conv nets
    try_candidates({{"train.channels_last = true", [](Config& c) { c.train.channels_last(true); }}});
  }
  if (device.is_cuda()) {
    try_candidates({{"train.cudnn_benchmark = true", [](Config& c) { c.train.cudnn_benchmark(true); }}});
  }
  if (options.batch()) {
    std::vector<Candidate> batches;
    for (int64_t factor : {2, 4}) {
      batches.push_back(
          {fmt::format("data.batch_size x{} (optim.lr x{})", factor, factor), [factor](Config& c) {
             c.data.batch_size(c.data.batch_size() * factor);
             c.optim.lr(c.optim.lr() * static_cast<double>(factor));
           }});
    }
    try_candidates(batches);
  }
  // Which threads do the work depends on the other switches (bf16 matmuls run in oneDNN on the
  // intra-op threads, fp32 ones in OpenBLAS's pool): after any kept change, the counts again.
  if (to_toml(best) != to_toml(after_threads)) try_thread_counts();

  result.tuned = best;
  result.tuned_samples_per_s = best_speed;
  write_text_file(run_dir + "/tuned.toml",
                  "# fasttrain tune: " +
                      fmt::format("{:.0f} -> {:.0f} samples/s\n", result.baseline_samples_per_s, best_speed) +
                      to_toml(best));
  write_text_file(run_dir + "/tune.md", result.table());
  return result;
}

std::string TuneResult::table() const {
  std::string out = "| change | samples/s | vs best so far | kept |\n| --- | --- | --- | --- |\n";
  out += fmt::format("| (as configured) | {:.0f} | | |\n", baseline_samples_per_s);
  for (const auto& trial : trials) {
    out += fmt::format("| {} | {} | {} | {} |\n", trial.change,
                       trial.samples_per_s > 0 ? fmt::format("{:.0f}", trial.samples_per_s) : "-",
                       trial.speedup > 0 ? fmt::format("{:.2f}x", trial.speedup) : "-",
                       trial.kept ? "yes" : "no: " + trial.note);
  }
  out += fmt::format("\ntuned: {:.0f} samples/s ({:.2f}x the config as given)\n", tuned_samples_per_s,
                     tuned_samples_per_s / std::max(baseline_samples_per_s, 1e-9));
  return out;
}

}  // namespace fasttrain
