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
#include <type_traits>

namespace fasttrain::testing {

namespace detail {

struct AllocationCounter {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  c10::Allocator* inner = nullptr;

  void add(int64_t bytes) {
    int64_t now = live.fetch_add(bytes) + bytes;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

inline AllocationCounter& counter() {
  static AllocationCounter instance;  // outlives every tensor it counted
  return instance;
}

struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};

inline void delete_counted(void* context) {
  auto* counted = static_cast<Counted*>(context);
  counter().live.fetch_sub(counted->bytes);
  delete counted;  // frees the memory through the inner allocator's deleter
}

inline c10::DataPtr allocate_counted(size_t bytes) {
  c10::DataPtr inner = counter().inner->allocate(bytes);
  void* data = inner.get();
  counter().add(static_cast<int64_t>(bytes));
  return c10::DataPtr(data, new Counted{std::move(inner), static_cast<int64_t>(bytes)}, &delete_counted,
                      c10::Device(c10::kCPU));
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
};

template <typename Base>
class CountingAllocator<false, Base> : public Base {
 public:
  c10::DataPtr allocate(size_t bytes) override { return allocate_counted(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
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
    detail::counter().live = 0;
    detail::counter().peak = 0;
    c10::SetCPUAllocator(&detail::counting_allocator(), kPriority);
  }
  ~PeakCpuMemory() { c10::SetCPUAllocator(previous_, kPriority); }
  PeakCpuMemory(const PeakCpuMemory&) = delete;
  PeakCpuMemory& operator=(const PeakCpuMemory&) = delete;

  // Most bytes allocated in the scope and alive at the same time.
  int64_t peak_bytes() const { return detail::counter().peak.load(); }
  // Bytes allocated in the scope and still alive.
  int64_t live_bytes() const { return detail::counter().live.load(); }

 private:
  static constexpr uint8_t kPriority = 255;  // SetCPUAllocator ignores lower priorities than the current
  c10::Allocator* previous_;
};

}  // namespace fasttrain::testing
