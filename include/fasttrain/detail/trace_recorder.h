#pragma once
// Records a Chrome trace (chrome://tracing, Perfetto) of what runs between start and the
// recorder's destruction: LibTorch's Kineto profiler where the build has it (CPU operators, and on
// a CUDA device its kernels and memory copies), the legacy profiler elsewhere (CPU operators).
// fasttrain's phase scopes (fasttrain::forward, ::backward, ...) appear in both.
//
//   {
//     fasttrain::TraceRecorder trace("runs/default/trace.json", device);
//     ... steps ...
//   }                                   // the trace is written here
#include <torch/types.h>

#include <memory>
#include <string>

namespace fasttrain {

class TraceRecorder {
 public:
  TraceRecorder(std::string path, torch::Device device);
  ~TraceRecorder();  // writes the trace
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // "kineto (CPU + CUDA)", "kineto (CPU)" or "legacy (CPU)": what records, for reports.
  const std::string& kind() const { return kind_; }

 private:
  struct Legacy;
  std::string path_;
  std::string kind_;
  std::unique_ptr<Legacy> legacy_;  // set when the legacy profiler records
};

}  // namespace fasttrain
