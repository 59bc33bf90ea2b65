#pragma once
// Step-phase timers: where the wall time of training steps goes (data wait, host-to-device copy,
// forward, backward, optimizer, other), kept in every run without synchronising the device.
//
//   fasttrain::StepPhases phases;
//   {
//     fasttrain::PhaseScope scope(phases, fasttrain::Phase::kForward);   // also a profiler scope
//     logits = model->forward(x);
//   }
//   phases.seconds(fasttrain::Phase::kForward);
//
// Host clocks only: on CUDA a phase's time is what the host spent in it — launching kernels, or
// waiting where it needs a result — so device work that overlaps later phases is counted where the
// host first waits for it (usually at the log step's loss read). On CPU the times are exact.
// Each PhaseScope is also a user scope of LibTorch's profiler ("fasttrain::forward", ...), so traces
// from `fasttrain profile` show the phases around the operators.
#include <ATen/record_function.h>

#include <array>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace fasttrain {

enum class Phase { kDataWait, kHostToDevice, kForward, kBackward, kOptimizer, kOther };
constexpr int kPhaseCount = 6;

// "data_wait", "host_to_device", "forward", "backward", "optimizer", "other".
const char* phase_name(Phase phase);

class StepPhases {
 public:
  void add(Phase phase, double seconds) { seconds_[static_cast<int>(phase)] += seconds; }
  double seconds(Phase phase) const { return seconds_[static_cast<int>(phase)]; }
  double total() const;
  // Phase-wise difference (the times of an interval between two snapshots).
  StepPhases operator-(const StepPhases& earlier) const;
  StepPhases& operator+=(const StepPhases& other);
  // {"data_wait": s, "host_to_device": s, ...}
  nlohmann::json to_json() const;

 private:
  std::array<double, kPhaseCount> seconds_{};
};

// Adds the wall time of its scope to one phase; a profiler user scope named fasttrain::<phase>.
class PhaseScope {
 public:
  PhaseScope(StepPhases& phases, Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  StepPhases& phases_;
  Phase phase_;
  std::chrono::steady_clock::time_point start_;
  std::optional<at::RecordFunction> record_;
};

}  // namespace fasttrain
