#include "fasttrain/detail/trace_recorder.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include "fasttrain/detail/compat.h"
#if FASTTRAIN_HAS_KINETO
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include <set>

#include "fasttrain/util/check.h"

namespace fasttrain {

struct TraceRecorder::Legacy {
  explicit Legacy(const std::string& path) : profile(path) {}
  torch::autograd::profiler::RecordProfile profile;
};

TraceRecorder::TraceRecorder(std::string path, torch::Device device) : path_(std::move(path)) {
#if !FASTTRAIN_HAS_KINETO
  (void)device;
  legacy_ = std::make_unique<Legacy>(path_);
  kind_ = "legacy (CPU)";
#else
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  kind_ = device.is_cuda() ? "kineto (CPU + CUDA)" : "kineto (CPU)";
#endif
}

TraceRecorder::~TraceRecorder() {
#if FASTTRAIN_HAS_KINETO
  try {
    auto result = torch::autograd::profiler::disableProfiler();
    if (result) result->save(path_);
  } catch (const std::exception& error) {
    // A destructor must not throw; the profile's reader reports the missing or partial file.
    fmt::print(stderr, "fasttrain: warning: the trace could not be written to {}: {}\n", path_, error.what());
  }
#endif
  // The legacy profiler (legacy_) writes its file when it is destroyed, after this body.
}

}  // namespace fasttrain
