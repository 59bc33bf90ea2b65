#pragma once
// Learning-rate (and momentum) schedules as pure functions of the optimizer step, with the
// semantics of PyTorch's torch.optim.lr_scheduler classes (tests compare against them):
//   constant, step (StepLR), cosine (linear warmup, then CosineAnnealingLR to min_lr),
//   one-cycle (OneCycleLR: pct_start, div_factor, final_div_factor, cos/linear annealing,
//   momentum cycling), cyclic (CyclicLR triangular, optional momentum cycling).
//
//   auto schedule = fasttrain::make_schedule(fasttrain::ScheduleOptions("one-cycle").pct_start(0.25),
//                                            /*max_lr=*/0.01, /*base_momentum=*/0.9, /*total_steps=*/1000);
//   double lr = schedule->lr(step);                   // step = optimizer steps taken so far
//   std::optional<double> m = schedule->momentum(step);
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/util/arg.h"

namespace fasttrain {

struct ScheduleOptions {
  explicit ScheduleOptions(std::string name) : name_(std::move(name)) {}
  FT_ARG(std::string, name);
  // step
  FT_ARG(int64_t, step_size) = 1000;
  FT_ARG(double, gamma) = 0.1;
  // cosine
  FT_ARG(int64_t, warmup_steps) = 0;
  FT_ARG(double, min_lr) = 0.0;
  // one-cycle
  FT_ARG(double, pct_start) = 0.3;
  FT_ARG(double, div_factor) = 25.0;
  FT_ARG(double, final_div_factor) = 1e4;
  FT_ARG(std::string, anneal) = "cos";  // "cos" | "linear"
  FT_ARG(bool, cycle_momentum) = true;
  FT_ARG(double, base_momentum) = 0.85;
  FT_ARG(double, max_momentum) = 0.95;
  FT_ARG(bool, three_phase) = false;
  // cyclic (triangular); the max is the optimizer's lr
  FT_ARG(double, base_lr) = 1e-4;
  FT_ARG(int64_t, step_size_up) = 2000;
  FT_ARG(int64_t, step_size_down) = 0;  // 0 = same as step_size_up
};

const std::vector<std::string>& schedule_names();

class Schedule {
 public:
  virtual ~Schedule() = default;
  // Learning rate for the optimizer step that follows `step` completed steps.
  virtual double lr(int64_t step) const = 0;
  // Momentum (SGD) or beta1 (Adam) for that step, when the schedule cycles it.
  virtual std::optional<double> momentum(int64_t step) const { (void)step; return std::nullopt; }
};

// `max_lr` is the optimizer's configured lr; `total_steps` the optimizer steps of the whole run.
// Invalid options are an error naming the key (schedule.<key>) and the value.
std::unique_ptr<Schedule> make_schedule(const ScheduleOptions& options, double max_lr, double base_momentum,
                                        int64_t total_steps);

}  // namespace fasttrain
