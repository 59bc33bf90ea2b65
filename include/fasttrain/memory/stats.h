#pragma once
// Memory accounting: what the tensors of a run occupy, from the allocator, and what the process
// occupies, from the kernel.
//
//   fasttrain::track_cpu_allocations();                 // once, before the tensors to count exist
//   fasttrain::reset_peak_memory(torch::kCPU);
//   ... train ...
//   fasttrain::MemoryStats stats = fasttrain::memory_stats(torch::kCPU);
//   stats.peak_allocated_bytes;                         // the most tensor bytes alive at once
//
// CPU: LibTorch's CPU allocator has no statistics, so track_cpu_allocations() installs a counting
// wrapper around it (c10::SetCPUAllocator); tensors allocated before it are not counted. CUDA: the
// caching allocator's own statistics, including reserved bytes, allocation retries (a retry means
// the cache had to be flushed: fragmentation or a batch at the memory limit) and cudaMalloc calls.
#include <torch/types.h>

#include <cstdint>
#include <exception>
#include <vector>

namespace fasttrain {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // tensor bytes alive now
  int64_t peak_allocated_bytes = 0;  // since the last reset_peak_memory
  int64_t allocations = 0;           // allocator calls since the process started
  // CUDA only (0 on CPU):
  int64_t reserved_bytes = 0;  // held by the caching allocator
  int64_t peak_reserved_bytes = 0;
  int64_t alloc_retries = 0;   // allocations that failed once and succeeded after freeing the cache
  int64_t device_mallocs = 0;  // cudaMalloc calls (LibTorch >= 2.1)
};

// memory.cpu_heap = "retain": freed CPU blocks stay in the process's heap instead of going back to the
// kernel (glibc: mallopt's mmap threshold at its maximum, trimming off), so a step's tensors reuse the
// last step's pages without page faults. Process-wide and once; nothing where the C library is not glibc.
// Returns whether the heap now retains.
bool retain_cpu_heap();

// Installs the counting CPU allocator; later calls do nothing. Thread-safe.
void track_cpu_allocations();
bool tracking_cpu_allocations();

// The allocator statistics of `device` (CPU: zeros until track_cpu_allocations()).
MemoryStats memory_stats(torch::Device device);
// Starts a new peak at the current allocation.
void reset_peak_memory(torch::Device device);

// While alive, a CPU allocation that would take the counted bytes above `bytes` fails with
// c10::OutOfMemoryError, as a GPU allocation past the device's memory does: find_batch_size
// searches against memory.budget this way on CPU. Needs track_cpu_allocations(); one at a time.
class CpuMemoryLimit {
 public:
  explicit CpuMemoryLimit(int64_t bytes);
  ~CpuMemoryLimit();
  CpuMemoryLimit(const CpuMemoryLimit&) = delete;
  CpuMemoryLimit& operator=(const CpuMemoryLimit&) = delete;
};

// The CPU allocator's timeline: while recording, every counted allocation and free appends
// (seconds since the start, tensor bytes alive after it). At most `capacity` samples are kept; the
// rest are counted as dropped. Needs track_cpu_allocations(); one recording at a time.
struct MemorySample {
  double time_s = 0;
  int64_t allocated_bytes = 0;
};
void start_memory_timeline(size_t capacity = size_t{1} << 20);
// Ends the recording; `dropped` (optional) receives the samples that did not fit.
std::vector<MemorySample> stop_memory_timeline(int64_t* dropped = nullptr);

// An allocation failure of any device (c10::OutOfMemoryError, also when a loader worker or a scripted
// model's TorchScript interpreter hit it).
bool is_out_of_memory(const std::exception& error);

// Peak resident set size of this process in bytes (the kernel's VmHWM; 0 where /proc is unavailable).
int64_t peak_resident_bytes();

}  // namespace fasttrain
