#include "fasttrain/log/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include "fasttrain/util/check.h"

namespace fasttrain {

Progress::Mode Progress::parse_mode(const std::string& mode) {
  if (mode == "auto") return isatty(fileno(stderr)) ? Mode::kBar : Mode::kLines;
  if (mode == "bar") return Mode::kBar;
  if (mode == "lines") return Mode::kLines;
  if (mode == "none") return Mode::kNone;
  throw ConfigError(fmt::format("log.progress '{}' is not allowed; valid: auto, bar, lines, none", mode));
}

Progress::Progress(Mode mode, int64_t total_steps, std::FILE* out)
    : mode_(mode), total_steps_(total_steps), out_(out) {}

std::string Progress::format(const ProgressState& s) const {
  double eta = s.step > 0 ? s.elapsed_s / s.step * (total_steps_ - s.step) : 0;
  return fmt::format(
      "step {}/{} epoch {} | loss {:.4f} | lr {:.3g} | {:.0f} samples/s | data-wait {:.1f}% | "
      "ETA {:.0f}s",
      s.step, total_steps_, s.epoch, s.loss, s.lr, s.samples_per_s, 100 * s.data_wait_fraction, eta);
}

void Progress::update(const ProgressState& state) {
  if (mode_ == Mode::kNone) return;
  if (mode_ == Mode::kLines) {
    fmt::print(out_, "{}\n", format(state));
    return;
  }
  int width = 24;
  int filled = total_steps_ > 0 ? static_cast<int>(width * state.step / total_steps_) : 0;
  fmt::print(out_, "\r\033[K[{}{}] {}", std::string(filled, '#'), std::string(width - filled, '.'),
             format(state));
  std::fflush(out_);
  bar_drawn_ = true;
}

void Progress::message(const std::string& line) {
  if (mode_ == Mode::kNone) return;
  if (bar_drawn_) fmt::print(out_, "\r\033[K");
  fmt::print(out_, "{}\n", line);
  bar_drawn_ = false;
}

void Progress::finish() {
  if (bar_drawn_) fmt::print(out_, "\n");
  bar_drawn_ = false;
}

}  // namespace fasttrain
