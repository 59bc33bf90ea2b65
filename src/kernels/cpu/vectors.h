#pragma once
// What the kernel bodies share, in the namespace of the capability each is compiled for.
#include <ATen/cpu/vec/vec.h>

#include <cstdint>

namespace fasttrain::kernels::CPU_CAPABILITY {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

inline float lanes_sum(const Vec& v) {
  float lanes[kLanes];
  v.store(lanes);
  float total = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
