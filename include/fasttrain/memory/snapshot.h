#pragma once
// memory.snapshot: the CUDA caching allocator's history of allocations and frees, written in the
// format of torch.cuda.memory._dump_snapshot, which https://pytorch.org/memory_viz draws.
//
//   fasttrain::CudaMemoryHistory history(torch::Device("cuda"));  // records from here
//   ... train ...
//   history.write(run_dir);   // run_dir/memory_snapshot.pickle and memory_snapshot.json
#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace fasttrain {

// What a written snapshot holds (memory_snapshot.json beside the pickle, which the report shows).
struct MemorySnapshotSummary {
  int64_t events = 0;       // the device's allocator events kept (at most kMaxEvents), snapshot marks aside
  int64_t allocations = 0;  // "alloc" entries among them
  int64_t largest_allocation = 0;  // bytes
  int64_t segments = 0;            // the allocator's segments when it was written
  int64_t reserved_bytes = 0;      // their total size
  nlohmann::json to_json() const;
};

// Records every allocation and free of the caching allocator from construction to destruction; the
// oldest events go once kMaxEvents are kept. No stacks are gathered (there is no Python to gather
// them from, and C++ unwinding per allocation would slow the step). Needs a CUDA device: on any
// other, the constructor's ConfigError names memory.snapshot and the device.
class CudaMemoryHistory {
 public:
  static constexpr size_t kMaxEvents = 100000;
  static constexpr const char* kPickle = "memory_snapshot.pickle";
  static constexpr const char* kSummary = "memory_snapshot.json";

  explicit CudaMemoryHistory(torch::Device device);
  ~CudaMemoryHistory();
  CudaMemoryHistory(const CudaMemoryHistory&) = delete;
  CudaMemoryHistory& operator=(const CudaMemoryHistory&) = delete;

  // Writes <dir>/memory_snapshot.pickle and <dir>/memory_snapshot.json; recording goes on.
  MemorySnapshotSummary write(const std::string& dir) const;

 private:
  torch::Device device_;
};

}  // namespace fasttrain
