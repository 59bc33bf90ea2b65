#pragma once
// What a run tells its user, as events: the library never prints. The CLI renders them on the console
// (ConsoleReporter: "fasttrain: " lines and the progress bar); a library user passes a reporter of its
// own, or none, and nothing is said. The run directory's metrics.jsonl and TensorBoard events are
// written by RunLogger (train/run_logger.h) whatever the reporter.
//
//   auto console = std::make_shared<fasttrain::ConsoleReporter>(fasttrain::Progress::parse_mode("auto"));
//   fasttrain::train_run(config, "runs/a", fasttrain::RunOptions().reporter(console));
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "fasttrain/log/progress.h"

namespace fasttrain {

class Reporter {
 public:
  virtual ~Reporter() = default;
  // What the run built, chose ("auto" and its reason) or did (resuming, a damaged checkpoint skipped).
  // May hold several lines (a table).
  virtual void note(const std::string& text) { (void)text; }
  // What the user may want to change: a setting ignored, an oversubscribed thread pool.
  virtual void warning(const std::string& text) { (void)text; }
  // Training: `total_steps` optimizer steps planned; one log interval's figures; the end (or the stop).
  virtual void training_started(int64_t total_steps) { (void)total_steps; }
  virtual void training_progress(const ProgressState& state) { (void)state; }
  virtual void training_finished() {}
};

// The reporter for callers that passed none (a null shared_ptr): it says nothing.
Reporter& quiet_reporter();
inline Reporter& reporter_or_quiet(const std::shared_ptr<Reporter>& reporter) {
  return reporter ? *reporter : quiet_reporter();
}

// Renders on `out`: a note as "<name>: <text>", a warning as "<name>: warning: <text>", the training
// progress as Progress draws it in `mode` (a bar on a terminal); a note while the bar is drawn is a line
// above it (none at all in Mode::kNone, as the progress).
class ConsoleReporter : public Reporter {
 public:
  explicit ConsoleReporter(Progress::Mode mode, std::string name = "fasttrain", std::FILE* out = stderr);
  void note(const std::string& text) override;
  void warning(const std::string& text) override;
  void training_started(int64_t total_steps) override;
  void training_progress(const ProgressState& state) override;
  void training_finished() override;

 private:
  void line(const std::string& text);
  Progress::Mode mode_;
  std::string name_;
  std::FILE* out_;
  std::unique_ptr<Progress> progress_;  // while training
};

}  // namespace fasttrain
