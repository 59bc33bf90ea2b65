#pragma once
// LR range test (Smith; fastai's lr_find): raises the LR exponentially from start_lr to end_lr
// over `steps` optimizer steps, tracks an exponentially smoothed (bias-corrected) loss and stops
// when it exceeds `divergence` x its best. The suggested max LR is the one at the steepest descent
// of the smoothed curve, capped at a tenth of the LR of the minimum loss.
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
  std::string table() const;                        // the curve as a text table
  void write_csv(const std::string& path) const;    // lr,loss,smoothed_loss
};

// `step(lr)` runs one optimizer step at `lr` and returns its loss.
LrFinderResult find_lr(const LrFinderOptions& options, const std::function<double(double)>& step);

}  // namespace fasttrain
