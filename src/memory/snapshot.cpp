#include "fasttrain/memory/snapshot.h"

#ifdef FASTTRAIN_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include <algorithm>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/log/metrics.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

nlohmann::json MemorySnapshotSummary::to_json() const {
  return {{"file", CudaMemoryHistory::kPickle},
          {"events", events},
          {"allocations", allocations},
          {"largest_allocation_bytes", largest_allocation},
          {"segments", segments},
          {"reserved_bytes", reserved_bytes},
          {"max_events", CudaMemoryHistory::kMaxEvents}};
}

#ifdef FASTTRAIN_CUDA

CudaMemoryHistory::CudaMemoryHistory(torch::Device device) : device_(device) {
  FT_CONFIG_CHECK(device.is_cuda(),
                  "memory.snapshot = true records the CUDA caching allocator, but the run's device is {}: on "
                  "the CPU, `fasttrain profile CONFIG --run-dir DIR` writes memory_timeline.csv instead",
                  device.str());
  // enabled "all": the allocator's state and every alloc/free; context none: no stacks gathered.
  torch::cuda::_record_memory_history(std::string("all"), std::nullopt, "python", kMaxEvents);
}

CudaMemoryHistory::~CudaMemoryHistory() {
  try {
    torch::cuda::_record_memory_history(std::nullopt, std::nullopt, "python", kMaxEvents);
  } catch (const std::exception&) {  // a destructor throws nothing; the history just stays on
  }
}

MemorySnapshotSummary CudaMemoryHistory::write(const std::string& dir) const {
  const std::string pickled = torch::cuda::_memory_snapshot_pickled();
  write_file_atomically(dir + "/" + kPickle, pickled.data(), pickled.size());

  const auto index = device_.has_index() ? device_.index() : c10::cuda::current_device();
  const auto info = c10::cuda::CUDACachingAllocator::snapshot();
  MemorySnapshotSummary summary;
  for (const auto& segment : info.segments) {
    if (segment.device != index) continue;
    ++summary.segments;
    summary.reserved_bytes += static_cast<int64_t>(segment.total_size);
  }
  if (static_cast<size_t>(index) < info.device_traces.size()) {
    using Entry = c10::cuda::CUDACachingAllocator::TraceEntry;
    for (const auto& entry : info.device_traces[static_cast<size_t>(index)]) {
      // Each snapshot taken, this one included, marks the trace: not an allocator event.
      if (entry.action_ == Entry::SNAPSHOT) continue;
      ++summary.events;
      if (entry.action_ != Entry::ALLOC) continue;
      ++summary.allocations;
      summary.largest_allocation = std::max(summary.largest_allocation, static_cast<int64_t>(entry.size_));
    }
  }
  write_json_file(dir + "/" + kSummary, summary.to_json());
  return summary;
}

#else

CudaMemoryHistory::CudaMemoryHistory(torch::Device device) : device_(device) {
  FT_CONFIG_CHECK(false,
                  "memory.snapshot = true records the CUDA caching allocator, but the run's device is {} and "
                  "this fasttrain is built against a LibTorch without CUDA: on the CPU, `fasttrain profile "
                  "CONFIG --run-dir DIR` writes memory_timeline.csv instead",
                  device.str());
}

CudaMemoryHistory::~CudaMemoryHistory() = default;

MemorySnapshotSummary CudaMemoryHistory::write(const std::string& dir) const {
  (void)dir;
  return {};
}

#endif

}  // namespace fasttrain
