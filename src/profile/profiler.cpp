#include "fasttrain/profile/profiler.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/detail/trace_recorder.h"
#include "fasttrain/log/metrics.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/run/batch_finder.h"
#include "fasttrain/run/run.h"
#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace fs = std::filesystem;

namespace {

// Starts the profiler and the memory timeline after the warm-up steps, stops both after the
// recorded steps and ends the fit. Runs on the training thread (the profilers record the thread
// that enabled them and the autograd threads it starts).
class ProfileWindow : public Callback {
 public:
  ProfileWindow(const ProfileOptions& options, std::string trace_path, torch::Device device)
      : options_(options), trace_path_(std::move(trace_path)), device_(device) {}

  void on_fit_start(Trainer& trainer, int64_t) override {
    if (options_.measure().warmup_steps() == 0) start(trainer);
  }
  void on_micro_batch(Trainer&) override { sample_device_memory(); }
  void on_step(Trainer& trainer) override {
    if (recording_) {
      ++steps_;
      sample_device_memory();
      const double timed_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start_).count();
      if (steps_ >= options_.measure().steps() && timed_s >= options_.measure().min_seconds()) {
        stop(trainer);
        trainer.request_stop();
      }
    } else if (!finished_ && trainer.step() == options_.measure().warmup_steps()) {
      start(trainer);
    }
  }

  bool finished() const { return finished_; }
  int64_t steps() const { return steps_; }
  int64_t samples() const { return samples_; }
  const StepPhases& phases() const { return phases_; }
  std::vector<MemorySample> timeline;
  int64_t dropped = 0;
  std::string profiler;  // what recorded the trace (TraceRecorder::kind)
  int64_t peak_bytes = 0;
  int64_t allocations = 0;

 private:
  void start(Trainer& trainer) {
    samples_at_start_ = trainer.progress().samples_seen;
    phases_at_start_ = trainer.fit_phases();
    allocations_at_start_ = memory_stats(device_).allocations;
    reset_peak_memory(device_);
    if (options_.record() && device_.is_cpu()) start_memory_timeline();
    clock_start_ = std::chrono::steady_clock::now();
    if (options_.record()) {
      profile_.emplace(trace_path_, device_);
      profiler = profile_->kind();
    }
    recording_ = true;
  }
  void stop(Trainer& trainer) {
    profile_.reset();  // writes the trace
    recording_ = false;
    finished_ = true;
    samples_ = trainer.progress().samples_seen - samples_at_start_;
    phases_ = trainer.fit_phases() - phases_at_start_;
    if (options_.record() && device_.is_cpu()) timeline = stop_memory_timeline(&dropped);
    peak_bytes = memory_stats(device_).peak_allocated_bytes;
    allocations = memory_stats(device_).allocations - allocations_at_start_;
  }
  // CUDA: no per-allocation hook; the caching allocator's counters at each micro-batch and step.
  void sample_device_memory() {
    if (!recording_ || !options_.record() || device_.is_cpu()) return;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start_).count();
    timeline.push_back({t, memory_stats(device_).allocated_bytes});
  }

  ProfileOptions options_;
  std::string trace_path_;
  torch::Device device_;
  std::optional<TraceRecorder> profile_;
  bool recording_ = false, finished_ = false;
  int64_t steps_ = 0, samples_ = 0, samples_at_start_ = 0, allocations_at_start_ = 0;
  StepPhases phases_at_start_, phases_;
  std::chrono::steady_clock::time_point clock_start_;
};

}  // namespace

int64_t count_host_reads(const nlohmann::json& trace) {
  const nlohmann::json& events = trace.is_object() ? trace.at("traceEvents") : trace;
  struct Span {
    double begin, end;
    std::string thread;
  };
  std::vector<Span> reads, fused_kernels;
  for (const auto& event : events) {
    if (!event.is_object() || event.value("ph", "") != "X") continue;
    const std::string name = event.at("name").get<std::string>();
    const double begin = event.at("ts").get<double>();
    const Span span{begin, begin + event.at("dur").get<double>(),
                    event.value("tid", nlohmann::json()).dump()};
    if (name == "aten::_local_scalar_dense" || name == "aten::nonzero") reads.push_back(span);
    if (name.rfind("aten::_fused_", 0) == 0) fused_kernels.push_back(span);
  }
  return std::count_if(reads.begin(), reads.end(), [&](const Span& read) {
    return std::none_of(fused_kernels.begin(), fused_kernels.end(), [&](const Span& kernel) {
      return kernel.thread == read.thread && kernel.begin <= read.begin && read.end <= kernel.end;
    });
  });
}

std::vector<OperatorStat> operator_stats(const nlohmann::json& trace) {
  const nlohmann::json& events = trace.is_object() ? trace.at("traceEvents") : trace;
  struct Event {
    std::string name;
    double begin, end;
    std::string thread;
  };
  std::vector<Event> spans;
  for (const auto& event : events) {
    if (!event.is_object() || event.value("ph", "") != "X") continue;
    if (event.value("cat", "") == "Trace") continue;  // Kineto's span of the whole recording, not an operator
    const double begin = event.at("ts").get<double>(), duration = event.at("dur").get<double>();
    spans.push_back({event.at("name").get<std::string>(), begin, begin + duration,
                     event.value("tid", nlohmann::json()).dump()});
  }
  // Per thread, by start (ties: the longer first, so parents precede children): a stack of open
  // spans; each span's duration is subtracted from its innermost enclosing span's self time.
  std::sort(spans.begin(), spans.end(), [](const Event& a, const Event& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end > b.end;
  });
  std::map<std::string, OperatorStat> by_name;
  std::vector<std::pair<const Event*, double>> stack;  // span, its self time so far (us)
  auto close = [&](const Event* span, double self) {
    OperatorStat& stat = by_name[span->name];
    stat.name = span->name;
    ++stat.calls;
    stat.self_ms += self / 1000.0;
  };
  std::string thread;
  for (const Event& span : spans) {
    if (span.thread != thread) {
      for (auto& open : stack) close(open.first, open.second);
      stack.clear();
      thread = span.thread;
    }
    while (!stack.empty() && stack.back().first->end <= span.begin) {
      close(stack.back().first, stack.back().second);
      stack.pop_back();
    }
    if (!stack.empty()) stack.back().second -= span.end - span.begin;
    stack.emplace_back(&span, span.end - span.begin);
  }
  for (auto& open : stack) close(open.first, open.second);
  std::vector<OperatorStat> stats;
  for (auto& entry : by_name) stats.push_back(entry.second);
  std::sort(stats.begin(), stats.end(),
            [](const OperatorStat& a, const OperatorStat& b) { return a.self_ms > b.self_ms; });
  return stats;
}

Config with_room_to_profile(Config config) {
  config.train.options.max_steps(0).epochs(std::max<int64_t>(config.train.options.epochs(), 1000));
  return config;
}

ProfileResult profile_run(RunBuilder& builder, const Config& requested, const std::string& out_dir,
                          const ProfileOptions& options,
                          const std::vector<std::shared_ptr<Callback>>& callbacks) {
  const std::shared_ptr<Reporter>& reporter = options.measure().reporter();
  Run run = build_run(builder, resolve_batch_size(builder, requested, reporter), reporter.get());
  return profile_built_run(run, out_dir, options, callbacks);
}

ProfileResult profile_built_run(Run& run, const std::string& out_dir, const ProfileOptions& options,
                                const std::vector<std::shared_ptr<Callback>>& callbacks) {
  const MeasureOptions& measure = options.measure();
  check_measure_options(measure, "profile");
  Config& config = run.config;
  config.train.options.eval_every_steps(0).stop_at_target(false);
  // A recorded profile shows operators, which a replayed CUDA graph hides: "auto" records eager steps.
  if (options.record() && config.train.cuda_graphs() == "auto") config.train.cuda_graphs("false");
  const int64_t planned = planned_steps(config.train.options, run.train_loader->batches_per_epoch());
  FT_CONFIG_CHECK(
      measure.warmup_steps() + measure.steps() <= planned,
      "profile: {} warm-up + {} recorded steps exceed the run's {} steps (train.epochs / train.max_steps)",
      measure.warmup_steps(), measure.steps(), planned);
  fs::create_directories(out_dir);

  ProfileResult result;
  result.data_resident = run.residency.resident;
  result.trace_path = out_dir + "/trace.json";
  result.memory_timeline_path = out_dir + "/memory_timeline.csv";
  auto trainer = run.make_trainer();
  if (config.memory.warmup()) trainer->warm_up(run.largest_batch());
  auto window = std::make_shared<ProfileWindow>(options, result.trace_path, run.device);
  trainer->add_callback(window);
  for (const auto& callback : callbacks) trainer->add_callback(callback);
  trainer->fit(*run.train_loader, nullptr);
  FT_CHECK(window->finished(), "profile: the run ended before the {} recorded steps were done",
           measure.steps());

  // ---- what was recorded ----
  result.steps = window->steps();
  result.samples = window->samples();
  result.phases = window->phases();
  result.peak_memory_bytes = window->peak_bytes;
  result.memory_samples = static_cast<int64_t>(window->timeline.size());
  result.memory_samples_dropped = window->dropped;
  result.profiler = window->profiler;
  result.samples_per_s = result.samples / std::max(result.phases.total(), 1e-9);
  result.allocations = window->allocations;
  if (!options.record()) return result;  // timed only: no trace, timeline or profile.json
  std::string csv = "time_s,allocated_bytes\n";
  for (const auto& sample : window->timeline)
    csv += fmt::format("{:.6f},{}\n", sample.time_s, sample.allocated_bytes);
  write_text_file(result.memory_timeline_path, csv);
  const nlohmann::json trace = nlohmann::json::parse(read_text_file(result.trace_path));
  result.trace_events = static_cast<int64_t>((trace.is_object() ? trace.at("traceEvents") : trace).size());
  result.operators = operator_stats(trace);
  result.host_reads = count_host_reads(trace);
  if (static_cast<int64_t>(result.operators.size()) > options.top_operators())
    result.operators.resize(static_cast<size_t>(options.top_operators()));
  write_json_file(out_dir + "/profile.json", result.to_json());
  return result;
}

nlohmann::json ProfileResult::to_json() const {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& op : operators)
    ops.push_back({{"name", op.name}, {"calls", op.calls}, {"self_ms", op.self_ms}});
  return {{"steps", steps},
          {"samples", samples},
          {"samples_per_s", samples_per_s},
          {"host_reads", host_reads},
          {"profiler", profiler},
          {"data_resident", data_resident},
          {"allocations", allocations},
          {"step_phases_s", phases.to_json()},
          {"operators", ops},
          {"trace_events", trace_events},
          {"memory_samples", memory_samples},
          {"memory_samples_dropped", memory_samples_dropped},
          {"peak_memory_bytes", peak_memory_bytes},
          {"trace", trace_path},
          {"memory_timeline", memory_timeline_path}};
}

std::string ProfileResult::table() const {
  std::string out = fmt::format("{} steps profiled ({} samples); phases per step:\n", steps, samples);
  const double total = std::max(phases.total(), 1e-12);
  for (int i = 0; i < kPhaseCount; ++i) {
    const Phase phase = static_cast<Phase>(i);
    out += fmt::format("  {:<16} {:>9.3f} ms  {:>5.1f}%\n", phase_name(phase),
                       1000 * phases.seconds(phase) / std::max<int64_t>(steps, 1),
                       100 * phases.seconds(phase) / total);
  }
  out += fmt::format("operators by self time ({} trace events, {} profiler):\n", trace_events, profiler);
  for (const auto& op : operators)
    out += fmt::format("  {:<40} {:>7} calls {:>10.2f} ms\n", op.name, op.calls, op.self_ms);
  out += fmt::format("peak memory {}; {} memory samples{}\n", format_bytes(peak_memory_bytes), memory_samples,
                     memory_samples_dropped > 0 ? fmt::format(" ({} dropped)", memory_samples_dropped) : "");
  out += fmt::format("written: {}, {}\n", trace_path, memory_timeline_path);
  return out;
}

}  // namespace fasttrain
