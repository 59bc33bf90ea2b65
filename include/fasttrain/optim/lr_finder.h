#pragma once
// LR range test (Smith; fastai's lr_find): raises the LR exponentially from start_lr to end_lr
// over `steps` optimizer steps (lr_i = start_lr * (end_lr / start_lr)^(i / (steps - 1))), tracks an
// exponentially smoothed, bias-corrected loss
//   avg_i = smoothing * avg_{i-1} + (1 - smoothing) * loss_i,  smoothed_i = avg_i / (1 - smoothing^(i+1))
// and stops when smoothed_i > divergence x its best so far (best + (divergence - 1) * |best|, the
// same for positive losses) or when a loss is not finite (that point is not recorded).
//
// Suggested max LR: the LR at the steepest descent of the smoothed loss against log(lr) (central
// differences), searched from point max(1, n/10) (skipping the smoothing's start-up) up to the
// point of minimum smoothed loss (so the blow-up after it never counts), and capped at a tenth of
// the minimum's LR, so it stays well below the LR where training stops improving. When fewer than
// two points lie in that window, or the loss never falls, the suggestion is min-loss LR / 10.
//
//   auto result = fasttrain::find_lr(options, [&](double lr) { return train_one_step(lr); });
//   result.suggested_lr; result.points  // (lr, loss, smoothed)
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fasttrain/util/arg.h"

namespace fasttrain {

struct LrFinderOptions {
  FT_ARG(double, start_lr) = 1e-7;
  FT_ARG(double, end_lr) = 10.0;
  FT_ARG(int64_t, steps) = 100;
  FT_ARG(double, smoothing) = 0.98;
  FT_ARG(double, divergence) = 4.0;
};

struct LrFinderPoint {
  double lr = 0;
  double loss = 0;
  double smoothed_loss = 0;
};

struct LrFinderResult {
  std::vector<LrFinderPoint> points;
  double suggested_lr = 0;
  bool diverged = false;
  // The curve as a text table of about 20 evenly sampled rows plus the suggested and min-loss rows.
  std::string table() const;
  // lr,loss,smoothed_loss with a header row; an unwritable path is an Error naming it.
  void write_csv(const std::string& path) const;
};

// `step(lr)` runs one optimizer step at `lr` and returns its loss. Invalid options throw
// ConfigError naming lr_finder.<key>; exceptions from `step` propagate.
LrFinderResult find_lr(const LrFinderOptions& options, const std::function<double(double)>& step);

}  // namespace fasttrain
