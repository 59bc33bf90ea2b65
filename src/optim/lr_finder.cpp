#include "fasttrain/optim/lr_finder.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

void validate(const LrFinderOptions& o) {
  FT_CONFIG_CHECK(std::isfinite(o.start_lr()) && o.start_lr() > 0,
                  "lr_finder.start_lr must be finite and > 0, got {}", o.start_lr());
  FT_CONFIG_CHECK(std::isfinite(o.end_lr()) && o.end_lr() > o.start_lr(),
                  "lr_finder.end_lr must be finite and > lr_finder.start_lr = {}, got {}", o.start_lr(),
                  o.end_lr());
  FT_CONFIG_CHECK(o.steps() >= 2, "lr_finder.steps must be >= 2, got {}", o.steps());
  FT_CONFIG_CHECK(std::isfinite(o.smoothing()) && o.smoothing() >= 0 && o.smoothing() < 1,
                  "lr_finder.smoothing must be in [0, 1), got {}", o.smoothing());
  FT_CONFIG_CHECK(std::isfinite(o.divergence()) && o.divergence() > 1,
                  "lr_finder.divergence must be finite and > 1, got {}", o.divergence());
}

// The rule documented in lr_finder.h.
double suggest(const std::vector<LrFinderPoint>& points) {
  const size_t n = points.size();
  if (n == 0) return 0;
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (points[i].smoothed_loss < points[best].smoothed_loss) best = i;
  }
  const double cap = points[best].lr / 10;
  // The first points carry the smoothing's start-up transient, so they are not searched.
  const size_t skip = std::max<size_t>(1, n / 10);
  if (best < skip + 2) return cap;  // too few points before the minimum to read a slope from
  double steepest_slope = 0;
  size_t steepest = 0;
  for (size_t i = skip; i < best; ++i) {
    // Central difference against log(lr): the sweep is geometric, so the spacing is even.
    const double slope = (points[i + 1].smoothed_loss - points[i - 1].smoothed_loss) /
                         (std::log(points[i + 1].lr) - std::log(points[i - 1].lr));
    if (slope < steepest_slope) {
      steepest_slope = slope;
      steepest = i;
    }
  }
  if (steepest_slope >= 0) return cap;
  return std::min(points[steepest].lr, cap);
}

}  // namespace

LrFinderResult find_lr(const LrFinderOptions& options, const std::function<double(double)>& step) {
  validate(options);
  LrFinderResult result;
  const double beta = options.smoothing();
  const double ratio = std::log(options.end_lr() / options.start_lr());
  double average = 0;
  double best = 0;
  for (int64_t i = 0; i < options.steps(); ++i) {
    const double lr = options.start_lr() *
                      std::exp(ratio * static_cast<double>(i) / static_cast<double>(options.steps() - 1));
    const double loss = step(lr);
    if (!std::isfinite(loss)) {  // kept out of the curve: one inf would poison every later average
      result.diverged = true;
      break;
    }
    average = beta * average + (1 - beta) * loss;
    // Bias correction: the average starts at 0, which would otherwise drag the first points down.
    const double smoothed = average / (1 - std::pow(beta, static_cast<double>(i + 1)));
    result.points.push_back({lr, loss, smoothed});
    if (i == 0 || smoothed < best) best = smoothed;
    // divergence x best for positive losses; the |best| form also holds for negative ones.
    if (smoothed > best + (options.divergence() - 1) * std::abs(best)) {
      result.diverged = true;
      break;
    }
  }
  result.suggested_lr = suggest(result.points);
  return result;
}

std::string LrFinderResult::table() const {
  std::string out = fmt::format("lr finder: {} points{}, suggested lr {:.3g}\n", points.size(),
                                diverged ? " (stopped: loss diverged)" : "", suggested_lr);
  if (points.empty()) return out;
  size_t best = 0;
  size_t nearest = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].smoothed_loss < points[best].smoothed_loss) best = i;
    if (std::abs(std::log(points[i].lr / suggested_lr)) <
        std::abs(std::log(points[nearest].lr / suggested_lr))) {
      nearest = i;
    }
  }
  out += fmt::format("{:>12}  {:>12}  {:>12}\n", "lr", "loss", "smoothed");
  // About 20 evenly spaced rows, plus the suggestion and the minimum, plus the last point.
  constexpr size_t kRows = 20;
  const size_t stride = std::max<size_t>(1, (points.size() + kRows - 1) / kRows);
  for (size_t i = 0; i < points.size(); ++i) {
    const bool last = i + 1 == points.size();
    if (i % stride != 0 && i != best && i != nearest && !last) continue;
    const auto& p = points[i];
    std::string note;
    if (i == nearest) note += "  <- suggested";
    if (i == best) note += "  <- min loss";
    out += fmt::format("{:>12.4e}  {:>12.6g}  {:>12.6g}{}\n", p.lr, p.loss, p.smoothed_loss, note);
  }
  return out;
}

void LrFinderResult::write_csv(const std::string& path) const {
  std::ofstream file(path);
  FT_CHECK(file.is_open(), "cannot open '{}' to write the lr finder curve: {}", path, std::strerror(errno));
  file << "lr,loss,smoothed_loss\n";
  for (const auto& p : points) file << fmt::format("{},{},{}\n", p.lr, p.loss, p.smoothed_loss);
  file.flush();
  FT_CHECK(file.good(), "writing the lr finder curve to '{}' failed: {}", path, std::strerror(errno));
}

}  // namespace fasttrain
