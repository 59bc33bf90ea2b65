#include "fasttrain/train/phases.h"

namespace fasttrain {

const char* phase_name(Phase phase) {
  static const char* const names[kPhaseCount] = {"data_wait", "host_to_device", "forward",
                                                 "backward",  "optimizer",      "other"};
  return names[static_cast<int>(phase)];
}

double StepPhases::total() const {
  double sum = 0;
  for (double s : seconds_) sum += s;
  return sum;
}

StepPhases StepPhases::operator-(const StepPhases& earlier) const {
  StepPhases difference;
  for (int i = 0; i < kPhaseCount; ++i) difference.seconds_[i] = seconds_[i] - earlier.seconds_[i];
  return difference;
}

StepPhases& StepPhases::operator+=(const StepPhases& other) {
  for (int i = 0; i < kPhaseCount; ++i) seconds_[i] += other.seconds_[i];
  return *this;
}

nlohmann::json StepPhases::to_json() const {
  nlohmann::json json = nlohmann::json::object();
  for (int i = 0; i < kPhaseCount; ++i) json[phase_name(static_cast<Phase>(i))] = seconds_[i];
  return json;
}

namespace {

// Profiler scope names: string literals, since RecordFunction keeps the pointer.
const char* scope_name(Phase phase) {
  static const char* const names[kPhaseCount] = {"fasttrain::data_wait", "fasttrain::host_to_device",
                                                 "fasttrain::forward",   "fasttrain::backward",
                                                 "fasttrain::optimizer", "fasttrain::other"};
  return names[static_cast<int>(phase)];
}

}  // namespace

PhaseScope::PhaseScope(StepPhases& phases, Phase phase)
    : phases_(phases), phase_(phase), start_(std::chrono::steady_clock::now()) {
  record_.emplace(at::RecordScope::USER_SCOPE);
  if (record_->isActive()) {
    record_->before(scope_name(phase), c10::ArrayRef<const c10::IValue>());
  } else {
    record_.reset();
  }
}

PhaseScope::~PhaseScope() {
  record_.reset();  // ends the profiler scope first
  phases_.add(phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

}  // namespace fasttrain
