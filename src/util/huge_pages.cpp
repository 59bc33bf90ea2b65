#include "fasttrain/util/huge_pages.h"

#include <atomic>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#ifdef __linux__
#include <sys/mman.h>
#endif
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define FASTTRAIN_HUGE_PAGE_ADVICE 1
#endif

namespace fasttrain {

namespace {
std::atomic<bool> g_cpu_huge_pages{false};
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
}  // namespace

void set_cpu_huge_pages(bool enabled) {
  g_cpu_huge_pages.store(enabled);
}

torch::Tensor empty_long_lived_cpu(at::IntArrayRef sizes, torch::ScalarType dtype) {
  torch::Tensor block = torch::empty(sizes, torch::TensorOptions().dtype(dtype));
#ifdef FASTTRAIN_HUGE_PAGE_ADVICE
  const auto begin = reinterpret_cast<uintptr_t>(block.data_ptr());
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + block.nbytes()) & ~(kHugePage - 1);
  // Advice only: where the kernel has no transparent huge pages madvise fails and the pages stay small.
  if (g_cpu_huge_pages.load() && last > first)
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#endif
  return block;
}

bool advised_huge_pages(const void* data) {
  std::ifstream smaps("/proc/self/smaps");
  const auto address = reinterpret_cast<uintptr_t>(data);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    // A mapping's first line: "start-end perms ..." in hex; its fields ("Name:   value") follow, VmFlags
    // last. A field whose name starts with hex digits stops at a letter, not at "-" and then a space.
    if (range >> std::hex >> start >> dash >> end && dash == '-' && range.peek() == ' ') {
      inside = start <= address && address < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return (line + " ").find(" hg ") != std::string::npos;
    }
  }
  return false;
}

}  // namespace fasttrain
