#pragma once
// Learning-rate (and momentum) schedules as pure functions of the optimizer step, with the
// semantics of PyTorch's torch.optim.lr_scheduler classes (tests compare against them):
//   constant  max_lr.
//   step      StepLR: max_lr * gamma^floor(step / step_size).
//   cosine    linear warm-up, then cosine to min_lr; exactly
//               SequentialLR([LinearLR(start_factor=1/W, total_iters=W-1),
//                             CosineAnnealingLR(T_max=total_steps-W, eta_min=min_lr)], milestones=[W])
//             with W = warmup_steps (plain CosineAnnealingLR(T_max=total_steps) when W = 0):
//               step < W:  max_lr * (step + 1) / W        (max_lr at step W-1; never trains at lr 0)
//               step >= W: min_lr + (max_lr - min_lr) * (1 + cos(pi * (step - W) / (total_steps - W))) / 2
//             reaching min_lr at step == total_steps and holding it after.
//   one-cycle OneCycleLR(max_lr, total_steps, pct_start, div_factor, final_div_factor, anneal,
//             cycle_momentum, base_momentum, max_momentum, three_phase); steps >= total_steps hold
//             the final LR (PyTorch extrapolates at total_steps and throws after).
//   cyclic    CyclicLR(mode="triangular", base_lr, max_lr, step_size_up, step_size_down,
//             cycle_momentum, base_momentum, max_momentum); momentum falls while the LR rises.
// tests/optim/make_schedule_references.py records PyTorch's sequences for the tests.
//
//   auto schedule = fasttrain::make_schedule(fasttrain::ScheduleOptions("one-cycle").pct_start(0.25),
//                                            /*max_lr=*/0.01, /*base_momentum=*/0.9, /*total_steps=*/1000);
//   double lr = schedule->lr(step);                   // step = optimizer steps taken so far
//   std::optional<double> m = schedule->momentum(step);
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"
#include "fasttrain/util/registry.h"

namespace fasttrain {

// The registered schedules' names (constant, step, cosine, one-cycle, cyclic, then any a program added).
std::vector<std::string> schedule_names();

// [schedule]
struct ScheduleOptions {
  FT_KEYS(ScheduleOptions);
  explicit ScheduleOptions(std::string name = "constant") : name_(std::move(name)) {}
  FT_KEY(std::string, name,
         "Schedule: constant, step, cosine, one-cycle, cyclic, or one a program registered",
         one_of(schedule_names));
  // ---- step ----
  FT_KEY(int64_t, step_size, "step: optimizer steps between decays", at_least(1)) = 1000;
  FT_KEY(double, gamma, "step: decay factor", above(0)) = 0.1;
  // ---- cosine ----
  FT_KEY(int64_t, warmup_steps, "cosine: linear warmup steps", at_least(0)) = 0;
  FT_KEY(double, min_lr, "cosine: final learning rate", at_least(0)) = 0.0;
  // ---- one-cycle ----
  FT_KEY(double, pct_start, "one-cycle: fraction of the steps spent rising to optim.lr",
         in_open_unit_interval()) = 0.3;
  FT_KEY(double, div_factor, "one-cycle: initial lr = optim.lr / div_factor", above(0)) = 25.0;
  FT_KEY(double, final_div_factor, "one-cycle: final lr = initial lr / final_div_factor", above(0)) = 1e4;
  FT_KEY(std::string, anneal, "one-cycle: annealing shape, cos or linear", one_of({"cos", "linear"})) = "cos";
  FT_KEY(bool, cycle_momentum,
         "one-cycle and cyclic: cycle momentum (sgd) or beta1 (adam) inversely to the lr") = true;
  FT_KEY(double, base_momentum, "Lowest momentum of the cycle", below_one()) = 0.85;
  FT_KEY(double, max_momentum, "Highest momentum of the cycle (>= base_momentum)", below_one()) = 0.95;
  FT_KEY(bool, three_phase, "one-cycle: fastai-style third phase that annihilates the lr") = false;
  // ---- cyclic (triangular; the highest lr is the optimizer's) ----
  FT_KEY(double, base_lr, "cyclic: lowest lr (the highest is optim.lr)", above(0)) = 1e-4;
  FT_KEY(int64_t, step_size_up, "cyclic: steps rising", at_least(1)) = 2000;
  FT_KEY(int64_t, step_size_down, "cyclic: steps falling (0 = step_size_up)", at_least(0)) = 0;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  // Learning rate for the optimizer step that follows `step` completed steps (what PyTorch's
  // scheduler.get_last_lr() returns after `step` scheduler.step() calls). step < 0 is an error.
  virtual double lr(int64_t step) const = 0;
  // Momentum (SGD) or beta1 (Adam) for that step, when the schedule cycles it.
  virtual std::optional<double> momentum(int64_t step) const {
    (void)step;
    return std::nullopt;
  }
};

// A registered schedule: built from its options, the peak LR and the run's optimizer steps.
using ScheduleRecipe = std::function<std::unique_ptr<Schedule>(const ScheduleOptions& options, double max_lr,
                                                               int64_t total_steps)>;
// The registry behind schedule.name, with the built-in schedules.
Registry<ScheduleRecipe>& schedule_registry();

// `max_lr` is the optimizer's configured lr; `total_steps` the optimizer steps of the whole run
// (used by cosine and one-cycle only). `base_momentum` is the optimizer's configured momentum (SGD
// momentum or Adam beta1): schedules that do not cycle momentum return nullopt from momentum() and
// leave it as it is; the cycling ones move between options.base_momentum() and max_momentum().
// Invalid options throw ConfigError naming the key (schedule.<key>), the value and what is allowed.
std::unique_ptr<Schedule> make_schedule(const ScheduleOptions& options, double max_lr, double base_momentum,
                                        int64_t total_steps);

// A schedule's learning rates for steps 0 .. total_steps on the device (fp64), so that a step looks
// its LR up instead of sending it from the host: by step number (a view, no kernel) or by a step
// counter kept on the device (an index kernel, which a CUDA graph can capture). Steps past the
// table take its last entry, as the schedules hold their last value.
class LrTable {
 public:
  LrTable(const Schedule& schedule, int64_t total_steps, torch::Device device);
  // 0-dim: the LR of the step that follows `step` completed steps.
  torch::Tensor at(int64_t step) const;
  // The same for a 0-dim int64 step count on the table's device.
  torch::Tensor at(const torch::Tensor& step) const;
  int64_t size() const { return values_.size(0); }

 private:
  torch::Tensor values_;  // [total_steps + 1]
};

}  // namespace fasttrain
