#pragma once
// Peak CPU tensor memory of a scope, measured exactly: the guard puts a counting allocator in front
// of LibTorch's CPU allocator (c10::SetCPUAllocator), so every CPU tensor created inside the scope is
// counted when allocated and uncounted when freed, whichever thread frees it. Tensors that existed
// before the scope (weights, inputs) are not counted. Unlike the process's resident-set high-water
// mark, this does not depend on what malloc keeps from earlier tests, so two runs in one process
// compare fairly.
//
//   {
//     fasttrain::testing::PeakCpuMemory peak;
//     model->forward(x).sum().backward();
//     bytes = peak.peak_bytes();
//   }
//
// Not nestable; one guard at a time per process.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace fasttrain::testing {

namespace detail {

// Data pointers must keep data == context (raw_allocate() and oneDNN's scratch buffers check it), so
// the size and the inner deleter of each allocation are kept in a table keyed by the pointer.
struct AllocationCounter {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  c10::Allocator* inner = nullptr;
  std::mutex mutex;
  std::unordered_map<void*, std::pair<int64_t, c10::DeleterFnPtr>> allocations;

  void add(int64_t bytes) {
    int64_t now = live.fetch_add(bytes) + bytes;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

inline AllocationCounter& counter() {
  static auto* instance = new AllocationCounter;  // never destroyed: tensors may outlive main()
  return *instance;
}

inline void delete_counted(void* data) {
  AllocationCounter& c = counter();
  std::pair<int64_t, c10::DeleterFnPtr> entry;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto found = c.allocations.find(data);
    if (found == c.allocations.end()) {
      // Allocated before the guard through raw_allocate() and handed back through raw_deallocate(),
      // which asks the allocator current at that moment: the inner allocator's memory.
      entry = {0, c.inner->raw_deleter()};
    } else {
      entry = found->second;
      c.allocations.erase(found);
    }
  }
  c.live.fetch_sub(entry.first);
  entry.second(data);
}

inline c10::DataPtr allocate_counted(size_t bytes) {
  AllocationCounter& c = counter();
  c10::DataPtr inner = c.inner->allocate(bytes);
  void* data = inner.get();
  if (data == nullptr) return inner;  // zero bytes
  if (inner.get_context() != data) {
    throw std::logic_error("PeakCpuMemory: the CPU allocator's data pointers carry a separate context");
  }
  c10::DeleterFnPtr deleter = inner.get_deleter();
  inner.release_context();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.allocations[data] = {static_cast<int64_t>(bytes), deleter};
  }
  c.add(static_cast<int64_t>(bytes));
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

inline c10::Allocator& counting_allocator() {
  static CountingAllocator<kConstAllocate> instance;
  return instance;
}

}  // namespace detail

class PeakCpuMemory {
 public:
  PeakCpuMemory() : previous_(c10::GetCPUAllocator()) {
    detail::counter().inner = previous_;
    // Tensors counted by an earlier guard may still be alive (and be freed in this scope): measure
    // from what is live now.
    base_ = detail::counter().live.load();
    detail::counter().peak = base_;
    c10::SetCPUAllocator(&detail::counting_allocator(), kPriority);
  }
  ~PeakCpuMemory() { c10::SetCPUAllocator(previous_, kPriority); }
  PeakCpuMemory(const PeakCpuMemory&) = delete;
  PeakCpuMemory& operator=(const PeakCpuMemory&) = delete;

  // Most bytes allocated in the scope and alive at the same time.
  int64_t peak_bytes() const { return detail::counter().peak.load() - base_; }
  // Bytes allocated in the scope and still alive.
  int64_t live_bytes() const { return detail::counter().live.load() - base_; }

 private:
  static constexpr uint8_t kPriority = 255;  // SetCPUAllocator ignores lower priorities than the current
  c10::Allocator* previous_;
  int64_t base_ = 0;
};

}  // namespace fasttrain::testing
