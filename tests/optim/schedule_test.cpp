// Schedules against PyTorch's own lr_scheduler sequences (schedule_references.json, made by
// make_schedule_references.py), plus option validation.
#include "fasttrain/optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

ScheduleOptions options_from_json(const std::string& name, const nlohmann::json& json) {
  ScheduleOptions o(name);
  for (const auto& [key, value] : json.items()) {
    if (key == "step_size")
      o.step_size(value.get<int64_t>());
    else if (key == "gamma")
      o.gamma(value.get<double>());
    else if (key == "warmup_steps")
      o.warmup_steps(value.get<int64_t>());
    else if (key == "min_lr")
      o.min_lr(value.get<double>());
    else if (key == "pct_start")
      o.pct_start(value.get<double>());
    else if (key == "div_factor")
      o.div_factor(value.get<double>());
    else if (key == "final_div_factor")
      o.final_div_factor(value.get<double>());
    else if (key == "anneal")
      o.anneal(value.get<std::string>());
    else if (key == "cycle_momentum")
      o.cycle_momentum(value.get<bool>());
    else if (key == "base_momentum")
      o.base_momentum(value.get<double>());
    else if (key == "max_momentum")
      o.max_momentum(value.get<double>());
    else if (key == "three_phase")
      o.three_phase(value.get<bool>());
    else if (key == "base_lr")
      o.base_lr(value.get<double>());
    else if (key == "step_size_up")
      o.step_size_up(value.get<int64_t>());
    else if (key == "step_size_down")
      o.step_size_down(value.get<int64_t>());
    else
      ADD_FAILURE() << "reference option '" << key << "' has no ScheduleOptions counterpart";
  }
  return o;
}

// 1e-9 relative; the floor only matters for values within rounding of 0.
void expect_close(double actual, double expected, double scale, const std::string& what) {
  const double tolerance = 1e-9 * std::max(std::abs(expected), 1e-6 * scale);
  EXPECT_NEAR(actual, expected, tolerance) << what;
}

TEST(Schedule, MatchesPyTorchReferences) {
  const nlohmann::json references = testing::read_reference_json("optim/schedule_references.json");
  std::map<std::string, int> cases_per_schedule;
  int momentum_cases = 0, adam_momentum_cases = 0;
  for (const auto& c : references.at("cases")) {
    const std::string name = c.at("name");
    const std::string schedule_name = c.at("schedule");
    const double max_lr = c.at("max_lr");
    const int64_t total_steps = c.at("total_steps");
    const auto schedule =
        make_schedule(options_from_json(schedule_name, c.at("options")), max_lr, 0.9, total_steps);
    const auto& lrs = c.at("lr");
    const auto& momenta = c.at("momentum");
    ASSERT_GE(lrs.size(), 7u) << name;
    for (size_t k = 0; k < lrs.size(); ++k) {
      const auto step = static_cast<int64_t>(k);
      expect_close(schedule->lr(step), lrs[k].get<double>(), max_lr,
                   name + " lr at step " + std::to_string(k));
      const std::optional<double> m = schedule->momentum(step);
      if (momenta.is_null()) {
        EXPECT_FALSE(m.has_value()) << name << " momentum at step " << k;
      } else {
        ASSERT_TRUE(m.has_value()) << name << " momentum at step " << k;
        expect_close(*m, momenta[k].get<double>(), 1.0, name + " momentum at step " + std::to_string(k));
      }
    }
    ++cases_per_schedule[schedule_name];
    if (!momenta.is_null()) {
      ++momentum_cases;
      if (c.at("optimizer") == "adam") ++adam_momentum_cases;
    }
  }
  // The reference file covers every schedule, and momentum for SGD and for Adam's beta1.
  for (const auto& name : schedule_names()) EXPECT_GE(cases_per_schedule[name], 1) << name;
  EXPECT_GE(momentum_cases, 4);
  EXPECT_GE(adam_momentum_cases, 1);
}

TEST(Schedule, HoldsTheFinalValueAfterTheRun) {
  const auto one_cycle = make_schedule(ScheduleOptions("one-cycle"), 0.1, 0.9, 100);
  EXPECT_DOUBLE_EQ(one_cycle->lr(99), 0.1 / 25 / 1e4);
  EXPECT_EQ(one_cycle->lr(100), one_cycle->lr(99));
  EXPECT_EQ(one_cycle->lr(1000), one_cycle->lr(99));
  EXPECT_EQ(*one_cycle->momentum(1000), *one_cycle->momentum(99));

  const auto cosine = make_schedule(ScheduleOptions("cosine").warmup_steps(5).min_lr(1e-3), 0.1, 0.9, 50);
  EXPECT_DOUBLE_EQ(cosine->lr(50), 1e-3);  // PyTorch's value at T_max too
  EXPECT_DOUBLE_EQ(cosine->lr(5000), 1e-3);
  EXPECT_GT(cosine->lr(49), 1e-3);
  EXPECT_FALSE(cosine->momentum(3).has_value());
}

TEST(Schedule, NegativeStepIsAnError) {
  for (const auto& name : schedule_names()) {
    const auto schedule = make_schedule(ScheduleOptions(name).step_size_up(3), 0.1, 0.9, 100);
    EXPECT_THROW(schedule->lr(-1), Error) << name;
  }
}

struct BadOption {
  ScheduleOptions options;
  double max_lr;
  int64_t total_steps;
  std::vector<std::string> needles;  // all must appear in the message
};

TEST(Schedule, InvalidOptionsNameTheKeyAndValue) {
  const std::vector<BadOption> cases = {
      {ScheduleOptions("linear-warmup"), 0.1, 100, {"schedule.name", "'linear-warmup'", "one-cycle, cyclic"}},
      {ScheduleOptions("one-cycle").pct_start(0.0), 0.1, 100, {"schedule.pct_start", "(0, 1)", "got 0"}},
      {ScheduleOptions("one-cycle").pct_start(1.0), 0.1, 100, {"schedule.pct_start", "got 1"}},
      {ScheduleOptions("one-cycle").pct_start(1.5), 0.1, 100, {"schedule.pct_start", "got 1.5"}},
      {ScheduleOptions("one-cycle").pct_start(0.6).three_phase(true),
       0.1,
       100,
       {"schedule.pct_start", "three_phase", "0.6"}},
      {ScheduleOptions("one-cycle").pct_start(0.1),
       0.1,
       10,
       {"schedule.pct_start", "0.1", "total_steps = 10"}},
      {ScheduleOptions("one-cycle"), 0.1, 0, {"total_steps", "got 0"}},
      {ScheduleOptions("one-cycle").anneal("exp"), 0.1, 100, {"schedule.anneal", "'exp'", "cos, linear"}},
      {ScheduleOptions("one-cycle").div_factor(0), 0.1, 100, {"schedule.div_factor", "got 0"}},
      {ScheduleOptions("one-cycle").final_div_factor(-1), 0.1, 100, {"schedule.final_div_factor", "got -1"}},
      {ScheduleOptions("one-cycle").base_momentum(0.99),
       0.1,
       100,
       {"schedule.max_momentum", "0.99", "got 0.95"}},
      {ScheduleOptions("one-cycle").max_momentum(1.0), 0.1, 100, {"schedule.max_momentum", "got 1"}},
      {ScheduleOptions("one-cycle").base_momentum(-0.1), 0.1, 100, {"schedule.base_momentum", "got -0.1"}},
      {ScheduleOptions("one-cycle"), std::nan(""), 100, {"max lr", "nan"}},
      {ScheduleOptions("step").step_size(0), 0.1, 100, {"schedule.step_size", "got 0"}},
      {ScheduleOptions("step").gamma(-0.5), 0.1, 100, {"schedule.gamma", "got -0.5"}},
      {ScheduleOptions("cosine").warmup_steps(100), 0.1, 100, {"schedule.warmup_steps", "got 100"}},
      {ScheduleOptions("cosine").warmup_steps(-1), 0.1, 100, {"schedule.warmup_steps", "got -1"}},
      {ScheduleOptions("cosine").min_lr(0.2), 0.1, 100, {"schedule.min_lr", "got 0.2"}},
      {ScheduleOptions("cosine"), 0.1, -5, {"total_steps", "got -5"}},
      {ScheduleOptions("cyclic").base_lr(0.5), 0.1, 100, {"schedule.base_lr", "got 0.5"}},
      {ScheduleOptions("cyclic").step_size_up(0), 0.1, 100, {"schedule.step_size_up", "got 0"}},
      {ScheduleOptions("cyclic").step_size_down(-2), 0.1, 100, {"schedule.step_size_down", "got -2"}},
  };
  for (const auto& c : cases) {
    std::string message;
    try {
      make_schedule(c.options, c.max_lr, 0.9, c.total_steps);
    } catch (const ConfigError& e) {
      message = e.what();
    }
    ASSERT_FALSE(message.empty()) << "no ConfigError for " << c.needles.front();
    for (const auto& needle : c.needles) EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
}

TEST(Schedule, MomentumBoundsOnlyCheckedWhenCycling) {
  // With cycle_momentum off the momentum options are unused, so odd values there are no error.
  EXPECT_NO_THROW(
      make_schedule(ScheduleOptions("one-cycle").cycle_momentum(false).base_momentum(0.99), 0.1, 0.9, 100));
  EXPECT_THROW(make_schedule(ScheduleOptions("one-cycle").base_momentum(0.99), 0.1, 0.9, 100), ConfigError);
}

}  // namespace
}  // namespace fasttrain
