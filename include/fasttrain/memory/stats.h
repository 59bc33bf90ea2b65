#pragma once
// Memory accounting. On CPU the peak resident set of the process (the kernel's high-water mark,
// VmHWM) is what a run really cost; CUDA allocator statistics join here with the GPU path.
#include <cstdint>

namespace fasttrain {

// Peak resident set size of this process in bytes (0 where /proc is unavailable).
int64_t peak_resident_bytes();

}  // namespace fasttrain
