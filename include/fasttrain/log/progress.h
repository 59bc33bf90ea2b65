#pragma once
// Progress on the console: a single redrawn bar on a terminal (step, loss, lr, samples/s,
// data-wait %, ETA), plain lines otherwise (logs, CI), or nothing.
//
//   fasttrain::Progress progress(fasttrain::Progress::parse_mode("auto"), total_steps);
//   progress.update({.step = 10, ...});
//   progress.message("epoch 1: test accuracy 0.91");   // a line that survives the bar
#include <cstdint>
#include <cstdio>
#include <string>

namespace fasttrain {

struct ProgressState {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0;
  double lr = 0;
  double samples_per_s = 0;
  double data_wait_fraction = 0;
  double elapsed_s = 0;
};

class Progress {
 public:
  enum class Mode { kBar, kLines, kNone };
  // "auto" picks kBar when stderr is a terminal, kLines otherwise.
  static Mode parse_mode(const std::string& mode);

  Progress(Mode mode, int64_t total_steps, std::FILE* out = stderr);
  void update(const ProgressState& state);
  void message(const std::string& line);
  void finish();

 private:
  std::string format(const ProgressState& state) const;
  Mode mode_;
  int64_t total_steps_;
  std::FILE* out_;
  bool bar_drawn_ = false;
};

}  // namespace fasttrain
