// The console rendering of a run's events: notes and warnings named, a multi-line note (a table) kept
// whole, progress lines in kLines mode, nothing but notes in kNone, and the quiet reporter for null.
#include "fasttrain/log/reporter.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace fasttrain {
namespace {

// What a ConsoleReporter wrote into a temporary FILE.
class CapturedConsole {
 public:
  CapturedConsole() : file_(std::tmpfile()) {}
  ~CapturedConsole() { std::fclose(file_); }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    std::rewind(file_);
    std::string out;
    for (int c; (c = std::fgetc(file_)) != EOF;) out += static_cast<char>(c);
    return out;
  }

 private:
  std::FILE* file_;
};

TEST(ConsoleReporter, NotesAndWarningsAreNamedLines) {
  CapturedConsole console;
  ConsoleReporter reporter(Progress::Mode::kLines, "fasttrain launch", console.file());
  reporter.note("2 ranks of 'fasttrain'");
  reporter.warning("rank 1 exited with code 3");
  reporter.note("batch  fits\n    16   yes\n");  // a table: its last newline is not doubled
  EXPECT_EQ(console.text(),
            "fasttrain launch: 2 ranks of 'fasttrain'\n"
            "fasttrain launch: warning: rank 1 exited with code 3\n"
            "fasttrain launch: batch  fits\n    16   yes\n");
}

TEST(ConsoleReporter, ProgressInLinesModeAndNotesBetween) {
  CapturedConsole console;
  ConsoleReporter reporter(Progress::Mode::kLines, "fasttrain", console.file());
  reporter.training_started(20);
  reporter.training_progress({10, 1, 0.5, 0.01, 1000, 0.25, 2.0});
  reporter.note("step 10 epoch 1: test accuracy 0.9000");
  reporter.training_finished();
  reporter.note("run written to runs/a");
  const std::string text = console.text();
  EXPECT_NE(
      text.find("step 10/20 epoch 1 | loss 0.5000 | lr 0.01 | 1000 samples/s | data-wait 25.0% | ETA 2s\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("fasttrain: step 10 epoch 1: test accuracy 0.9000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fasttrain: run written to runs/a\n"), std::string::npos) << text;
}

TEST(ConsoleReporter, ModeNoneShowsNoProgressButNotesOutsideTraining) {
  CapturedConsole console;
  ConsoleReporter reporter(Progress::Mode::kNone, "fasttrain", console.file());
  reporter.note("model mlp, 100 parameters");
  reporter.training_started(5);
  reporter.training_progress({1, 0, 1.0, 0.1, 10, 0, 0.1});
  reporter.note("step 1: test accuracy 0.5");  // as the progress: silent while training in kNone
  reporter.training_finished();
  EXPECT_EQ(console.text(), "fasttrain: model mlp, 100 parameters\n");
}

TEST(Reporter, NullIsTheQuietReporter) {
  std::shared_ptr<Reporter> none;
  EXPECT_EQ(&reporter_or_quiet(none), &quiet_reporter());
  auto console = std::make_shared<ConsoleReporter>(Progress::Mode::kNone);
  EXPECT_EQ(&reporter_or_quiet(console), console.get());
  quiet_reporter().note("nothing happens");  // the base class: every event is a no-op
}

}  // namespace
}  // namespace fasttrain
