#include "fasttrain/memory/stats.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// Counts the bytes LibTorch's CPU allocator hands out. Data pointers must keep data == context
// (raw_allocate() and oneDNN's scratch buffers check it), so the size and the wrapped allocator's
// deleter of each allocation are kept in a table keyed by the pointer.
struct AllocationCounter {
  std::atomic<int64_t> live{0}, peak{0}, allocations{0};
  std::atomic<int64_t> limit{0};  // CpuMemoryLimit; 0 = none
  // The timeline (start_memory_timeline), under `mutex`.
  bool recording = false;
  size_t capacity = 0;
  int64_t dropped = 0;
  std::chrono::steady_clock::time_point recording_start;
  std::vector<MemorySample> timeline;

  // With `mutex` held, after `live` changed to `now`.
  void record(int64_t now) {
    if (!recording) return;
    if (timeline.size() >= capacity) {
      ++dropped;
      return;
    }
    timeline.push_back(
        {std::chrono::duration<double>(std::chrono::steady_clock::now() - recording_start).count(), now});
  }
  c10::Allocator* inner = nullptr;
  std::mutex mutex;
  std::unordered_map<void*, std::pair<int64_t, c10::DeleterFnPtr>> table;
};

AllocationCounter& counter() {
  static auto* instance = new AllocationCounter;  // never destroyed: tensors may outlive main()
  return *instance;
}

void delete_counted(void* data) {
  AllocationCounter& c = counter();
  std::pair<int64_t, c10::DeleterFnPtr> entry;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto found = c.table.find(data);
    if (found == c.table.end()) {
      // Allocated before the counter through raw_allocate() and handed back through raw_deallocate(),
      // which asks the allocator current at that moment: the inner allocator's memory.
      entry = {0, c.inner->raw_deleter()};
    } else {
      entry = found->second;
      c.table.erase(found);
    }
    c.record(c.live.fetch_sub(entry.first) - entry.first);
  }
  entry.second(data);
}

c10::DataPtr allocate_counted(size_t bytes) {
  AllocationCounter& c = counter();
  const int64_t limit = c.limit.load();
  if (limit > 0 && c.live.load() + static_cast<int64_t>(bytes) > limit) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU memory budget exceeded: allocating ", bytes,
                     " bytes with ", c.live.load(), " in use would pass the limit of ", limit,
                     " bytes (memory.budget)");
  }
  c10::DataPtr inner = c.inner->allocate(bytes);
  void* data = inner.get();
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  if (data == nullptr) return inner;  // zero bytes
  FT_CHECK(inner.get_context() == data,
           "the CPU allocator's data pointers carry a separate context: memory accounting cannot wrap it");
  c10::DeleterFnPtr deleter = inner.get_deleter();
  inner.release_context();
  int64_t now = 0;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.table[data] = {static_cast<int64_t>(bytes), deleter};
    now = c.live.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    c.record(now);
  }
  int64_t seen = c.peak.load();
  while (now > seen && !c.peak.compare_exchange_weak(seen, now)) {
  }
  return c10::DataPtr(data, data, &delete_counted, c10::Device(c10::kCPU));
}

// LibTorch 1.13's Allocator::allocate is const; later releases make it non-const and add a pure
// copy_data. Detected from the declaration rather than from version numbers; the unused
// specialisation is never instantiated.
constexpr bool kConstAllocate =
    std::is_same_v<decltype(&c10::Allocator::allocate), c10::DataPtr (c10::Allocator::*)(size_t) const>;

template <bool ConstAllocate, typename Base = c10::Allocator>
class CountingAllocator;

template <typename Base>
class CountingAllocator<true, Base> : public Base {
 public:
  c10::DataPtr allocate(size_t bytes) const override { return allocate_counted(bytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }
};

template <typename Base>
class CountingAllocator<false, Base> : public Base {
 public:
  c10::DataPtr allocate(size_t bytes) override { return allocate_counted(bytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

std::once_flag g_allocator_install;
std::atomic<bool> g_allocator_installed{false};

}  // namespace

bool retain_cpu_heap() {
#ifdef __GLIBC__
  static const bool retained = [] {
    // glibc's limits on 64-bit Linux: a larger mmap threshold is refused (mallopt returns 0).
    constexpr int kMaxMmapThreshold = 32 << 20;
    constexpr int kNeverTrim = std::numeric_limits<int>::max();
    return mallopt(M_MMAP_THRESHOLD, kMaxMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kNeverTrim) == 1;
  }();
  return retained;
#else
  return false;
#endif
}

void track_cpu_allocations() {
  std::call_once(g_allocator_install, [] {
    static CountingAllocator<kConstAllocate> allocator;  // static: tensors freed during exit call into it
    counter().inner = c10::GetCPUAllocator();
    // SetCPUAllocator ignores priorities lower than the current allocator's.
    c10::SetCPUAllocator(&allocator, /*priority=*/UINT8_MAX);
    g_allocator_installed.store(true);
  });
}

bool tracking_cpu_allocations() {
  return g_allocator_installed.load();
}

MemoryStats memory_stats(torch::Device device) {
  if (device.is_cuda()) {
    const compat::CudaAllocatorCounters c = compat::cuda_allocator_counters(device);
    MemoryStats stats;
    stats.allocated_bytes = c.allocated_bytes;
    stats.peak_allocated_bytes = c.peak_allocated_bytes;
    stats.allocations = c.allocations;
    stats.reserved_bytes = c.reserved_bytes;
    stats.peak_reserved_bytes = c.peak_reserved_bytes;
    stats.alloc_retries = c.alloc_retries;
    stats.device_mallocs = c.device_mallocs;
    return stats;
  }
  MemoryStats stats;
  if (!tracking_cpu_allocations()) return stats;
  stats.allocated_bytes = counter().live.load();
  stats.peak_allocated_bytes = counter().peak.load();
  stats.allocations = counter().allocations.load();
  return stats;
}

void reset_peak_memory(torch::Device device) {
  if (device.is_cuda()) return compat::reset_cuda_peak_memory(device);
  if (tracking_cpu_allocations()) counter().peak.store(counter().live.load());
}

CpuMemoryLimit::CpuMemoryLimit(int64_t bytes) {
  FT_CHECK(tracking_cpu_allocations(), "CpuMemoryLimit needs track_cpu_allocations() first");
  FT_CHECK(bytes > 0, "CpuMemoryLimit: the limit must be > 0 bytes, got {}", bytes);
  int64_t none = 0;
  FT_CHECK(counter().limit.compare_exchange_strong(none, bytes),
           "CpuMemoryLimit: a limit of {} bytes is already set", none);
}

CpuMemoryLimit::~CpuMemoryLimit() {
  counter().limit.store(0);
}

void start_memory_timeline(size_t capacity) {
  FT_CHECK(tracking_cpu_allocations(), "start_memory_timeline needs track_cpu_allocations() first");
  AllocationCounter& c = counter();
  std::lock_guard<std::mutex> lock(c.mutex);
  FT_CHECK(!c.recording, "start_memory_timeline: a recording is already running");
  c.recording = true;
  c.capacity = capacity;
  c.dropped = 0;
  c.timeline.clear();
  c.timeline.reserve(std::min<size_t>(capacity, size_t{1} << 16));
  c.recording_start = std::chrono::steady_clock::now();
  c.timeline.push_back({0.0, c.live.load()});
}

std::vector<MemorySample> stop_memory_timeline(int64_t* dropped) {
  AllocationCounter& c = counter();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.recording = false;
  if (dropped) *dropped = c.dropped;
  return std::move(c.timeline);
}

bool is_out_of_memory(const std::exception& error) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) return true;
  // The TorchScript interpreter rethrows whatever an op raised as a std::runtime_error carrying its
  // message (torch/csrc/jit/runtime/interpreter.cpp, handleError): an allocation failure inside a
  // scripted model's forward or backward is known by its words.
  const std::string message = error.what();
  if (message.find("failed in the TorchScript interpreter") == std::string::npos) return false;
  for (const char* words :
       {"memory budget exceeded", "out of memory", "not enough memory", "can't allocate memory"}) {
    if (message.find(words) != std::string::npos) return true;
  }
  return false;
}

int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // reported in kB
  }
  return 0;
}

}  // namespace fasttrain
