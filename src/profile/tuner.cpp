#include "fasttrain/profile/tuner.h"

#include <torch/torch.h>

#include <functional>

#include "fasttrain/log/metrics.h"
#include "fasttrain/profile/profiler.h"
#include "fasttrain/run/auto.h"
#include "fasttrain/run/batch_finder.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/hardware.h"
#include "kernel_switches.h"

namespace fasttrain {

namespace {

// One candidate: what it changes, and the change.
struct Candidate {
  std::string change;
  std::function<void(Config&)> apply;
};

// A greedy search from the config as given: each candidate is measured against the best config so
// far and kept when it is at least options.min_gain() faster (a first win is measured again, both
// sides, so one lucky pair of runs is no gain).
class Tuner {
 public:
  Tuner(RunBuilder& builder, Config start, const std::string& run_dir, const TuneOptions& options)
      : builder_(builder),
        best_(std::move(start)),
        run_dir_(run_dir),
        min_gain_(options.min_gain()),
        profile_(ProfileOptions()
                     .measure(MeasureOptions()
                                  .steps(options.measure().steps())
                                  .warmup_steps(options.measure().warmup_steps())
                                  .min_seconds(options.measure().min_seconds()))
                     .record(false)) {
    const ProfileResult baseline = profile(best_, "baseline");
    best_speed_ = baseline.samples_per_s;
    data_resident_ = baseline.data_resident;
    result_.baseline_samples_per_s = best_speed_;
  }

  // The baseline's batches come from a resident copy of the data: data.workers changes nothing then.
  bool data_resident() const { return data_resident_; }

  const Config& best() const { return best_; }
  // train.threads = 0 is the physical cores.
  int threads_in_effect() const {
    return best_.train.threads() > 0 ? best_.train.threads() : physical_cores();
  }

  void try_candidates(const std::vector<Candidate>& candidates) {
    for (const auto& candidate : candidates) {
      Config changed = best_;
      candidate.apply(changed);
      if (to_toml(changed) == to_toml(best_)) continue;  // already so
      TuneTrial trial = measure_trial(candidate.change, changed);
      if (trial.kept) {
        kept_any_ = true;
        best_ = changed;
        best_speed_ = trial.samples_per_s;
      }
      result_.trials.push_back(trial);
    }
  }

  TuneResult finish() {
    result_.tuned = best_;
    result_.tuned_samples_per_s = best_speed_;
    return result_;
  }

 private:
  ProfileResult profile(Config config, const std::string& name) {
    return profile_run(builder_, with_room_to_profile(std::move(config)), run_dir_ + "/tune/" + name,
                       profile_);
  }
  double measure(Config config, const std::string& name) {
    return profile(std::move(config), name).samples_per_s;
  }

  TuneTrial measure_trial(const std::string& change, const Config& changed) {
    TuneTrial trial;
    trial.change = change;
    try {
      const std::string name = "trial-" + std::to_string(result_.trials.size());
      trial.samples_per_s = measure(changed, name);
      trial.speedup = trial.samples_per_s / std::max(best_speed_, 1e-9);
      if (trial.speedup >= min_gain_) {
        // One pair of runs is no gain: both again, and the means must still clear min_gain.
        best_speed_ = (best_speed_ + measure(best_, name + "-best-again")) / 2;
        // Still the config as given: the re-measure refines the baseline the result compares with.
        if (!kept_any_) result_.baseline_samples_per_s = best_speed_;
        trial.samples_per_s = (trial.samples_per_s + measure(changed, name + "-again")) / 2;
        trial.speedup = trial.samples_per_s / std::max(best_speed_, 1e-9);
      }
      trial.kept = trial.speedup >= min_gain_;
      if (!trial.kept) trial.note = fmt::format("less than {:.2f}x", min_gain_);
    } catch (const Error& error) {
      trial.note = std::string("failed: ") + error.what();
    }
    return trial;
  }

  RunBuilder& builder_;
  Config best_;
  double best_speed_ = 0;
  bool kept_any_ = false;
  bool data_resident_ = false;
  TuneResult result_;
  std::string run_dir_;
  double min_gain_;
  ProfileOptions profile_;
};

// `key` = each count of 1..physical cores but `skip`.
std::vector<Candidate> count_candidates(const std::string& key, int skip,
                                        const std::function<void(Config&, int)>& set) {
  std::vector<Candidate> candidates;
  for (int count = 1; count <= physical_cores(); ++count) {
    if (count == skip) continue;
    candidates.push_back({fmt::format("{} = {}", key, count), [set, count](Config& c) { set(c, count); }});
  }
  return candidates;
}

// The intra-op threads; on CPU then OpenBLAS's own pool, which runs the matmuls beside them (fewer can
// beat both fighting), and the intra-op threads again when a smaller pool left them cores.
void try_thread_counts(Tuner& tuner, const torch::Device& device, const BlasLibrary& blas) {
  auto set_threads = [](Config& c, int count) { c.train.threads(count); };
  tuner.try_candidates(count_candidates("train.threads", tuner.threads_in_effect(), set_threads));
  if (!device.is_cpu() || blas.name.empty()) return;
  const int kept_blas = tuner.best().train.blas_threads();
  const int effective = kept_blas > 0 ? kept_blas : blas.threads_at_start;  // what 0 means already
  tuner.try_candidates(count_candidates("train.blas_threads", effective,
                                        [](Config& c, int count) { c.train.blas_threads(count); }));
  if (tuner.best().train.blas_threads() != kept_blas)
    tuner.try_candidates(count_candidates("train.threads", tuner.threads_in_effect(), set_threads));
}

// bf16 with each thread count: bf16 matmuls leave OpenBLAS for oneDNN on the intra-op threads, so the
// best count in fp32 may be the worst in bf16 (the gpt: 1 thread in fp32, 2 in bf16).
std::vector<Candidate> bf16_candidates(int threads_in_effect) {
  std::vector<Candidate> bf16;
  for (int count = 1; count <= physical_cores(); ++count) {
    if (count == threads_in_effect) {
      bf16.push_back({"train.precision = \"bf16\"", [](Config& c) { c.train.precision("bf16"); }});
    } else {
      bf16.push_back({fmt::format("train.precision = \"bf16\", train.threads = {}", count),
                      [count](Config& c) { c.train.precision("bf16").threads(count); }});
    }
  }
  return bf16;
}

// The other value of each switch between fasttrain's kernels and ATen's that the config has for the device
// (on the CPU the model's and the task's `kernels` keys and muon's Newton-Schulz, on a GPU the model's
// `gpu_kernels`).
std::vector<Candidate> kernel_candidates(const Config& config, bool cuda) {
  std::vector<Candidate> candidates;
  for (const detail::KernelSwitch& s : detail::kernel_switches(config, cuda)) {
    const std::string other = detail::other_kernels(s.value);
    candidates.push_back({fmt::format("{} = \"{}\"", s.key, other),
                          [setting = s.key + "=" + other](Config& c) { apply_override(c, setting); }});
  }
  return candidates;
}

// 2x and 4x the batch with the LR scaled linearly (changes the optimisation: only when asked).
std::vector<Candidate> batch_candidates() {
  std::vector<Candidate> batches;
  for (int64_t factor : {2, 4}) {
    batches.push_back(
        {fmt::format("data.batch_size x{} (optim.lr x{})", factor, factor), [factor](Config& c) {
           c.data.batch_size(c.data.batch_size() * factor);
           c.optim.lr(c.optim.lr() * static_cast<double>(factor));
         }});
  }
  return batches;
}

}  // namespace

TuneResult tune(RunBuilder& builder, const Config& requested, const std::string& run_dir,
                const TuneOptions& options) {
  check_measure_options(options.measure(), "tune");
  FT_CONFIG_CHECK(options.min_gain() >= 1, "tune --min-gain must be >= 1, got {}", options.min_gain());
  // "auto" precision and threads start as this machine resolves them for this run; the trials go from there.
  Config start;
  bool conv_net = false;
  Hardware hardware;
  {
    const Run run = build_run(builder, resolve_batch_size(builder, requested, options.measure().reporter()));
    start = run.config;
    conv_net = run.model.has_convolutions();
    hardware = run.hardware;
  }
  const torch::Device device = hardware.device;
  const BlasLibrary blas = blas_library();
  Tuner tuner(builder, start, run_dir, options);

  if (tuner.best().train.precision() == "bf16" && !hardware.native_bf16()) {
    // Emulated bf16 (a CPU without AVX512-BF16 / AMX) is never proposed, and fp32 is tried before anything
    // else.
    tuner.try_candidates({{"train.precision = \"fp32\"", [](Config& c) { c.train.precision("fp32"); }}});
  }
  try_thread_counts(tuner, device, blas);
  const Config after_threads = tuner.best();
  std::vector<Candidate> workers;
  for (int count : {0, 1, 2})
    workers.push_back(
        {fmt::format("data.workers = {}", count), [count](Config& c) { c.data.workers(count); }});
  if (!tuner.data_resident()) tuner.try_candidates(workers);
  if (tuner.best().train.precision() == "fp32" && hardware.native_bf16())
    tuner.try_candidates(bf16_candidates(tuner.threads_in_effect()));
  tuner.try_candidates(kernel_candidates(tuner.best(), device.is_cuda()));
  if (conv_net)
    tuner.try_candidates({{"train.channels_last = true", [](Config& c) { c.train.channels_last(true); }}});
  if (device.is_cuda())
    tuner.try_candidates(
        {{"train.cudnn_benchmark = true", [](Config& c) { c.train.cudnn_benchmark(true); }}});
  if (options.batch()) tuner.try_candidates(batch_candidates());
  // Which threads do the work depends on the other switches (bf16 matmuls run in oneDNN on the
  // intra-op threads, fp32 ones in OpenBLAS's pool): after any kept change, the counts again.
  if (to_toml(tuner.best()) != to_toml(after_threads)) try_thread_counts(tuner, device, blas);

  TuneResult result = tuner.finish();
  write_text_file(run_dir + "/tuned.toml",
                  "# fasttrain tune: " +
                      fmt::format("{:.0f} -> {:.0f} samples/s\n", result.baseline_samples_per_s,
                                  result.tuned_samples_per_s) +
                      to_toml(result.tuned));
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
