#include "fasttrain/train/run_logger.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "fasttrain/detail/file_io.h"

namespace fasttrain {

RunLogger::RunLogger(const std::string& run_dir, std::shared_ptr<Reporter> reporter)
    : metrics_path_(run_dir + "/metrics.jsonl"),
      metrics_(metrics_path_),
      events_(run_dir),
      reporter_(std::move(reporter)) {}

void RunLogger::on_fit_start(Trainer& trainer, int64_t total_steps) {
  // A new run must not mix its records with an earlier run's (a resume continues them).
  FT_CHECK(trainer.step() > 0 || std::filesystem::file_size(metrics_path_) == 0,
           "{} holds an earlier run's records: continue that run (load_checkpoint), clear the directory "
           "first (fasttrain::clear_run_dir, what `fasttrain train --fresh` does), or choose another one",
           metrics_path_);
  Reporter& reporter = reporter_or_quiet(reporter_);
  // How the steps run, said once on a GPU: captured, or why train.cuda_graphs = "auto" could not.
  if (trainer.device().is_cuda()) {
    reporter.note(fmt::format("steps: {}; optimizer {}, {}", trainer.engine_name(),
                              trainer.optimizer().name(), trainer.optimizer().describe_kernel()));
  }
  reporter.training_started(total_steps);
  if (trainer.step() > 0) events_.purge_from(trainer.step() + 1);  // resumed: hide the repeated steps
}

void RunLogger::on_log(Trainer&, const StepRecord& r) {
  metrics_.write({{"kind", "train"},
                  {"step", r.step},
                  {"epoch", r.epoch},
                  {"loss", r.loss},
                  {"lr", r.lr},
                  {"grad_norm", r.grad_norm ? nlohmann::json(*r.grad_norm) : nlohmann::json(nullptr)},
                  {"samples_per_s", r.samples_per_s},
                  {"data_wait_fraction", r.data_wait_fraction},
                  {"phases_s", r.phases.to_json()},
                  {"elapsed_s", r.elapsed_s}});
  events_.add_scalar("train/loss", r.loss, r.step);
  events_.add_scalar("train/lr", r.lr, r.step);
  if (r.grad_norm) events_.add_scalar("train/grad_norm", *r.grad_norm, r.step);
  events_.add_scalar("train/samples_per_s", r.samples_per_s, r.step);
  events_.add_scalar("train/data_wait_fraction", r.data_wait_fraction, r.step);
  reporter_or_quiet(reporter_).training_progress(
      {r.step, r.epoch, r.loss, r.lr, r.samples_per_s, r.data_wait_fraction, r.elapsed_s});
}

void RunLogger::on_evaluate(Trainer&, const EvalRecord& r) {
  nlohmann::json record{{"kind", "eval"}, {"step", r.step}, {"epoch", r.epoch}};
  std::vector<std::string> shown;
  for (const auto& [name, value] : r.result.metrics.items()) {
    record["test_" + name] = value;
    events_.add_scalar("test/" + name, value, r.step);
    shown.push_back(fmt::format("{} {:.4f}", name, value));
  }
  record["ema"] = r.ema;
  record["elapsed_s"] = r.elapsed_s;
  metrics_.write(record);
  events_.flush();
  reporter_or_quiet(reporter_).note(fmt::format("step {} epoch {}: test {}{} at {:.1f}s", r.step, r.epoch,
                                                fmt::join(shown, ", "), r.ema ? " (EMA)" : "", r.elapsed_s));
}

void RunLogger::on_checkpoint(Trainer& trainer, const std::string& dir) {
  metrics_.write({{"kind", "checkpoint"},
                  {"step", trainer.step()},
                  {"dir", dir},
                  {"save_s", trainer.last_checkpoint_seconds()}});
  events_.flush();
}

void RunLogger::on_fit_end(Trainer&, const FitSummary&) {
  events_.flush();
  reporter_or_quiet(reporter_).training_finished();
}

void truncate_metrics(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::vector<std::pair<std::string, nlohmann::json>> records;
  std::istringstream lines(read_text_file(path));
  for (std::string line; std::getline(lines, line);) {
    records.emplace_back(line, nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
  }
  auto is_marker = [&](const nlohmann::json& r) {
    return r.is_object() && r.value("kind", "") == "checkpoint" && r.value("step", int64_t{-1}) == step;
  };
  const bool has_marker =
      std::any_of(records.begin(), records.end(), [&](const auto& r) { return is_marker(r.second); });
  std::string kept;
  for (const auto& [line, record] : records) {
    if (!record.is_object()) continue;  // a line cut short by a kill
    const int64_t record_step = record.value("step", int64_t{-1});
    if (!has_marker && !(record_step < step || (record_step == step && record.value("kind", "") == "train")))
      break;
    kept += line + "\n";
    if (has_marker && is_marker(record)) break;
  }
  write_text_file(path, kept);
}

}  // namespace fasttrain
