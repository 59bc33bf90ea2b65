#pragma once
// Long-lived CPU blocks on 2 MiB transparent huge pages (memory.cpu_huge_pages).
//
//   fasttrain::set_cpu_huge_pages(true);                                  // once, before the data loads
//   torch::Tensor images = fasttrain::empty_long_lived_cpu({60000, 1, 784}, torch::kFloat);
//   images.copy_(...);                                                  // faulted in as huge pages
#include <torch/types.h>

namespace fasttrain {

// memory.cpu_huge_pages: large CPU blocks that live the whole run (the device-resident data set) are
// advised into 2 MiB transparent huge pages. A batch gathers rows from all over such a block, and with 4 KiB
// pages nearly every row costs a TLB miss (the main job's gather took 1.1-2.8x as long: BENCHMARKS.md).
// Process-wide, off until set; set it before the data loads.
void set_cpu_huge_pages(bool enabled);

// An uninitialised CPU tensor for such a block. Where set_cpu_huge_pages(true) and it spans a whole aligned
// 2 MiB extent, the aligned extents are advised as huge (madvise MADV_HUGEPAGE) before this writes them; the
// kernel follows the advice where its transparent huge pages are in "madvise" or "always" mode (Linux). A
// block that gets a mapping of its own (glibc: above the mmap threshold, 32 MiB under memory.cpu_heap =
// "retain") is untouched then, so its pages are faulted in huge; a smaller one from the heap may hold pages
// faulted in before, which stay small until the kernel collapses them, and the advice stays on those heap
// pages after the block is freed. Otherwise it is torch::empty's.
torch::Tensor empty_long_lived_cpu(at::IntArrayRef sizes, torch::ScalarType dtype);

// Whether the memory at `data` is advised as huge pages (Linux: its mapping's VmFlags in /proc/self/smaps
// hold "hg"); false where there is no such file or it has no VmFlags (Linux before 3.8).
bool advised_huge_pages(const void* data);

}  // namespace fasttrain
