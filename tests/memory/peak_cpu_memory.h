#pragma once
// Peak CPU tensor memory of a scope, measured exactly with the library's counting CPU allocator
// (fasttrain/memory/stats.h): every CPU tensor created inside the scope is counted when allocated
// and uncounted when freed, whichever thread frees it. Unlike the process's resident-set high-water
// mark, this does not depend on what malloc keeps from earlier tests, so two runs in one process
// compare fairly.
//
//   {
//     fasttrain::testing::PeakCpuMemory peak;
//     model->forward(x).sum().backward();
//     bytes = peak.peak_bytes();
//   }
//
// Not nestable (each guard resets the process-wide peak).
#include "fasttrain/memory/stats.h"

namespace fasttrain::testing {

class PeakCpuMemory {
 public:
  PeakCpuMemory() {
    track_cpu_allocations();
    // Tensors counted earlier may still be alive (and be freed in this scope): measure from now.
    base_ = memory_stats(torch::kCPU).allocated_bytes;
    reset_peak_memory(torch::kCPU);
  }
  PeakCpuMemory(const PeakCpuMemory&) = delete;
  PeakCpuMemory& operator=(const PeakCpuMemory&) = delete;

  // Most bytes allocated in the scope and alive at the same time.
  int64_t peak_bytes() const { return memory_stats(torch::kCPU).peak_allocated_bytes - base_; }
  // Bytes allocated in the scope and still alive.
  int64_t live_bytes() const { return memory_stats(torch::kCPU).allocated_bytes - base_; }

 private:
  int64_t base_ = 0;
};

}  // namespace fasttrain::testing
