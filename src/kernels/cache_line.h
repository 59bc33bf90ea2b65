#pragma once
// Blocks that start on a cache line, for the kernels' scratch: the capability builds' rows (cpu/vectors.h's
// AlignedFloats) and the AMX kernels' tile operands (amx_conv.cpp).
#include <cstddef>
#include <new>

namespace fasttrain::kernels::detail {

// An allocator whose blocks start on a cache line. malloc's start on 16 bytes, so a vector load from a row
// whose length is a whole number of vectors straddled two lines at one offset in two (AVX2) or three
// (AVX512) depending on where the heap put the block, and each such load costs two: the conv kernels'
// scratch rows are read a vector at a time at such offsets, nine loads to each nine multiply-adds.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kLine{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kLine)); }
  void deallocate(T* block, std::size_t) { ::operator delete(block, kLine); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const {
    return false;
  }
};

}  // namespace fasttrain::kernels::detail
