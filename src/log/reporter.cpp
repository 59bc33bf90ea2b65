#include "fasttrain/log/reporter.h"

#include <fmt/format.h>

namespace fasttrain {

Reporter& quiet_reporter() {
  static Reporter quiet;
  return quiet;
}

ConsoleReporter::ConsoleReporter(Progress::Mode mode, std::string name, std::FILE* out)
    : mode_(mode), name_(std::move(name)), out_(out) {}

void ConsoleReporter::line(const std::string& text) {
  std::string prefixed = name_ + ": " + text;
  while (!prefixed.empty() && prefixed.back() == '\n') prefixed.pop_back();  // a table's last line
  if (progress_) {
    progress_->message(prefixed);
  } else {
    fmt::print(out_, "{}\n", prefixed);
    std::fflush(out_);
  }
}

void ConsoleReporter::note(const std::string& text) {
  line(text);
}

void ConsoleReporter::warning(const std::string& text) {
  line("warning: " + text);
}

void ConsoleReporter::training_started(int64_t total_steps) {
  progress_ = std::make_unique<Progress>(mode_, total_steps, out_);
}

void ConsoleReporter::training_progress(const ProgressState& state) {
  if (progress_) progress_->update(state);
}

void ConsoleReporter::training_finished() {
  if (progress_) progress_->finish();
  progress_.reset();
}

}  // namespace fasttrain
