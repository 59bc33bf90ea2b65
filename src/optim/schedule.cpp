#include "fasttrain/optim/schedule.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

constexpr double kPi = 3.14159265358979323846;

bool finite(double value) {
  return std::isfinite(value);
}

int64_t checked_step(int64_t step) {
  FT_CHECK(step >= 0, "schedule step must be >= 0, got {}", step);
  return step;
}

class ConstantSchedule : public Schedule {
 public:
  explicit ConstantSchedule(double lr) : lr_(lr) {}
  double lr(int64_t step) const override {
    checked_step(step);
    return lr_;
  }

 private:
  double lr_;
};

// StepLR: lr * gamma^(step // step_size).
class StepSchedule : public Schedule {
 public:
  StepSchedule(double max_lr, int64_t step_size, double gamma)
      : max_lr_(max_lr), step_size_(step_size), gamma_(gamma) {}
  double lr(int64_t step) const override {
    return max_lr_ * std::pow(gamma_, static_cast<double>(checked_step(step) / step_size_));
  }

 private:
  double max_lr_;
  int64_t step_size_;
  double gamma_;
};

// Linear warm-up then cosine annealing. Exactly PyTorch's
//   SequentialLR([LinearLR(start_factor=1/W, end_factor=1, total_iters=W-1),
//                 CosineAnnealingLR(T_max=total-W, eta_min=min_lr)], milestones=[W])
// (CosineAnnealingLR(T_max=total, eta_min=min_lr) alone when W = 0):
//   step < W:  max_lr * (step + 1) / W            (reaches max_lr at step W-1, never trains at 0)
//   step >= W: min_lr + (max_lr - min_lr) * (1 + cos(pi * (step - W) / (total - W))) / 2
// which reaches min_lr at step == total and holds it after.
class CosineSchedule : public Schedule {
 public:
  CosineSchedule(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
      : max_lr_(max_lr), min_lr_(min_lr), warmup_(warmup_steps), total_(total_steps) {}
  double lr(int64_t step) const override {
    checked_step(step);
    if (step < warmup_) return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    if (step >= total_) return min_lr_;
    const double t = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
    return min_lr_ + (max_lr_ - min_lr_) * (1 + std::cos(kPi * t)) / 2;
  }

 private:
  double max_lr_, min_lr_;
  int64_t warmup_, total_;
};

// OneCycleLR, phase by phase as PyTorch computes it (phase ends are fractional steps).
// Steps at or past total_steps hold the final LR: PyTorch extrapolates at total_steps and throws
// after it, but the LR after the last step trains nothing and holding keeps lr() total.
class OneCycleSchedule : public Schedule {
 public:
  OneCycleSchedule(const ScheduleOptions& o, double max_lr, int64_t total_steps)
      : total_(total_steps), cos_(o.anneal() == "cos"), cycle_momentum_(o.cycle_momentum()) {
    const double initial_lr = max_lr / o.div_factor();
    const double min_lr = initial_lr / o.final_div_factor();
    const double pct_steps = o.pct_start() * static_cast<double>(total_steps);
    const double last = static_cast<double>(total_steps - 1);
    const double base_m = o.base_momentum(), max_m = o.max_momentum();
    if (o.three_phase()) {
      phases_ = {{pct_steps - 1, initial_lr, max_lr, max_m, base_m},
                 {2 * pct_steps - 2, max_lr, initial_lr, base_m, max_m},
                 {last, initial_lr, min_lr, max_m, max_m}};
    } else {
      phases_ = {{pct_steps - 1, initial_lr, max_lr, max_m, base_m}, {last, max_lr, min_lr, base_m, max_m}};
    }
  }

  double lr(int64_t step) const override {
    const Point p = locate(step);
    return anneal(p.phase->start_lr, p.phase->end_lr, p.pct);
  }

  std::optional<double> momentum(int64_t step) const override {
    if (!cycle_momentum_) return std::nullopt;
    const Point p = locate(step);
    return anneal(p.phase->start_momentum, p.phase->end_momentum, p.pct);
  }

 private:
  struct Phase {
    double end_step, start_lr, end_lr, start_momentum, end_momentum;
  };
  struct Point {
    const Phase* phase;
    double pct;
  };

  Point locate(int64_t step) const {
    const double s = static_cast<double>(std::min(checked_step(step), total_ - 1));
    double start = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (s <= phase.end_step || i + 1 == phases_.size()) {
        return {&phase, (s - start) / (phase.end_step - start)};
      }
      start = phase.end_step;
    }
    FT_FAIL("one-cycle schedule has no phases");  // unreachable: the constructor makes 2 or 3
  }

  double anneal(double start, double end, double pct) const {
    if (cos_) return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
    return (end - start) * pct + start;
  }

  int64_t total_;
  bool cos_;
  bool cycle_momentum_;
  std::vector<Phase> phases_;
};

// CyclicLR mode="triangular": up from base_lr to max_lr in step_size_up steps, down in
// step_size_down; momentum moves the opposite way between max_momentum and base_momentum.
class CyclicSchedule : public Schedule {
 public:
  CyclicSchedule(const ScheduleOptions& o, double max_lr)
      : base_lr_(o.base_lr()),
        max_lr_(max_lr),
        cycle_momentum_(o.cycle_momentum()),
        base_momentum_(o.base_momentum()),
        max_momentum_(o.max_momentum()) {
    const double up = static_cast<double>(o.step_size_up());
    const double down = o.step_size_down() > 0 ? static_cast<double>(o.step_size_down()) : up;
    total_size_ = up + down;
    step_ratio_ = up / total_size_;
  }

  double lr(int64_t step) const override { return base_lr_ + (max_lr_ - base_lr_) * scale(step); }

  std::optional<double> momentum(int64_t step) const override {
    if (!cycle_momentum_) return std::nullopt;
    return max_momentum_ - (max_momentum_ - base_momentum_) * scale(step);
  }

 private:
  // Same floating-point operations as CyclicLR.get_lr, so the results match it bit for bit.
  double scale(int64_t step) const {
    const double e = static_cast<double>(checked_step(step));
    const double cycle = std::floor(1 + e / total_size_);
    const double x = 1. + e / total_size_ - cycle;
    return x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  }

  double base_lr_, max_lr_;
  bool cycle_momentum_;
  double base_momentum_, max_momentum_;
  double total_size_ = 0, step_ratio_ = 0;
};

void check_total_steps(const std::string& name, int64_t total_steps) {
  FT_CONFIG_CHECK(total_steps >= 1,
                  "schedule '{}' needs total_steps >= 1 (the run's optimizer steps), got {}", name,
                  total_steps);
}

std::unique_ptr<Schedule> make_constant(const ScheduleOptions&, double max_lr, int64_t) {
  return std::make_unique<ConstantSchedule>(max_lr);
}

std::unique_ptr<Schedule> make_step(const ScheduleOptions& o, double max_lr, int64_t) {
  return std::make_unique<StepSchedule>(max_lr, o.step_size(), o.gamma());
}

std::unique_ptr<Schedule> make_cosine(const ScheduleOptions& o, double max_lr, int64_t total_steps) {
  check_total_steps("cosine", total_steps);
  FT_CONFIG_CHECK(o.warmup_steps() < total_steps,
                  "schedule.warmup_steps must be in [0, total_steps = {}), got {}", total_steps,
                  o.warmup_steps());
  FT_CONFIG_CHECK(o.min_lr() <= max_lr, "schedule.min_lr must be in [0, max lr = {}], got {}", max_lr,
                  o.min_lr());
  return std::make_unique<CosineSchedule>(max_lr, o.min_lr(), o.warmup_steps(), total_steps);
}

std::unique_ptr<Schedule> make_one_cycle(const ScheduleOptions& o, double max_lr, int64_t total_steps) {
  check_total_steps("one-cycle", total_steps);
  FT_CONFIG_CHECK(!o.three_phase() || o.pct_start() <= 0.5,
                  "schedule.pct_start must be <= 0.5 with schedule.three_phase = true (warm-up and "
                  "cool-down each take pct_start of the run), got {}",
                  o.pct_start());
  // OneCycleLR divides by the warm-up's length, pct_start * total_steps - 1 steps.
  FT_CONFIG_CHECK(o.pct_start() * static_cast<double>(total_steps) - 1 != 0,
                  "schedule.pct_start = {} with total_steps = {} gives a one-cycle warm-up of zero "
                  "length (pct_start * total_steps must not be 1); choose another pct_start",
                  o.pct_start(), total_steps);
  return std::make_unique<OneCycleSchedule>(o, max_lr, total_steps);
}

std::unique_ptr<Schedule> make_cyclic(const ScheduleOptions& o, double max_lr, int64_t) {
  FT_CONFIG_CHECK(o.base_lr() <= max_lr, "schedule.base_lr must be in [0, max lr = {}], got {}", max_lr,
                  o.base_lr());
  return std::make_unique<CyclicSchedule>(o, max_lr);
}

}  // namespace

Registry<ScheduleRecipe>& schedule_registry() {
  static Registry<ScheduleRecipe> registry = [] {
    Registry<ScheduleRecipe> schedules("schedule.name");
    schedules.add("constant", "optim.lr throughout", make_constant);
    schedules.add("step", "StepLR: optim.lr * gamma^floor(step / step_size)", make_step);
    schedules.add("cosine", "linear warm-up, then cosine to min_lr", make_cosine);
    schedules.add("one-cycle", "OneCycleLR: up to optim.lr over pct_start of the run, then down",
                  make_one_cycle);
    schedules.add("cyclic", "CyclicLR, triangular, between base_lr and optim.lr", make_cyclic);
    return schedules;
  }();
  return registry;
}

std::vector<std::string> schedule_names() {
  return schedule_registry().names();
}

std::unique_ptr<Schedule> make_schedule(const ScheduleOptions& o, double max_lr, double base_momentum,
                                        int64_t total_steps) {
  check_keys(o, "schedule");
  const ScheduleRecipe& recipe = schedule_registry().at(o.name());
  FT_CONFIG_CHECK(finite(max_lr) && max_lr >= 0,
                  "schedule '{}' needs a finite max lr (optim.lr) >= 0, got {}", o.name(), max_lr);
  // The optimizer's own momentum: schedules that do not cycle momentum leave it as it is.
  FT_CONFIG_CHECK(finite(base_momentum) && base_momentum >= 0 && base_momentum < 1,
                  "schedule '{}': the optimizer momentum must be in [0, 1), got {}", o.name(), base_momentum);
  // The momentum options are unused unless the schedule cycles momentum.
  FT_CONFIG_CHECK(!o.cycle_momentum() || o.max_momentum() >= o.base_momentum(),
                  "schedule.max_momentum must be >= schedule.base_momentum = {}, got {}", o.base_momentum(),
                  o.max_momentum());
  return recipe(o, max_lr, total_steps);
}

LrTable::LrTable(const Schedule& schedule, int64_t total_steps, torch::Device device) {
  FT_CHECK(total_steps >= 0, "LrTable needs total_steps >= 0, got {}", total_steps);
  std::vector<double> lrs(static_cast<size_t>(total_steps + 1));
  for (int64_t step = 0; step <= total_steps; ++step) lrs[static_cast<size_t>(step)] = schedule.lr(step);
  values_ = torch::tensor(lrs, torch::kDouble).to(device);
}

torch::Tensor LrTable::at(int64_t step) const {
  FT_CHECK(step >= 0, "LrTable::at: step must be >= 0, got {}", step);
  return values_.select(0, std::min(step, values_.size(0) - 1));
}

torch::Tensor LrTable::at(const torch::Tensor& step) const {
  return values_.index_select(0, step.clamp_max(values_.size(0) - 1).reshape({1})).reshape({});
}

}  // namespace fasttrain
