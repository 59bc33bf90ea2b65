// memory.cpu_heap = "retain": after retain_cpu_heap(), a tensor of 16 MiB comes from the heap, not from
// a mapping of its own, and freeing it gives nothing back to the kernel. Each test runs in a process
// of its own (gtest_discover_tests), where glibc starts at its defaults: a 128 KiB mmap threshold, so
// without the policy the tensor would be mapped (hblks + 1) and its pages faulted in afresh on each use.
#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/torch.h>

#include "fasttrain/memory/stats.h"
#include "fasttrain/util/huge_pages.h"
#include "support.h"

namespace fasttrain {
namespace {

#ifdef __GLIBC__
TEST(CpuHeap, RetainKeepsFreedTensorMemoryInTheHeap) {
  ASSERT_TRUE(retain_cpu_heap());
  ASSERT_TRUE(retain_cpu_heap()) << "a second call keeps the policy";
  const struct mallinfo2 before = mallinfo2();
  size_t heap_with_tensor = 0;
  {
    torch::Tensor t = torch::ones({4 << 20});  // 16 MiB of fp32
    const struct mallinfo2 with = mallinfo2();
    EXPECT_EQ(with.hblks, before.hblks) << "the tensor got a mapping of its own";
    EXPECT_GE(with.uordblks, before.uordblks + (16u << 20)) << "the tensor is not in the heap";
    heap_with_tensor = with.arena;
  }
  EXPECT_EQ(mallinfo2().arena, heap_with_tensor) << "freeing the tensor trimmed the heap";
}

// Under memory.cpu_heap = "retain" a 16 MiB block comes from the heap, not a mapping of its own: advised all
// the same.
TEST(CpuHugePages, BlocksFromTheRetainedHeapAreAdvisedToo) {
  if (!testing::kernel_records_huge_page_advice())
    GTEST_SKIP() << "this kernel keeps no huge-page advice in smaps";
  ASSERT_TRUE(retain_cpu_heap());
  set_cpu_huge_pages(true);
  torch::Tensor block = empty_long_lived_cpu({4 << 20}, torch::kFloat);
  EXPECT_TRUE(advised_huge_pages(block.data_ptr<float>() + (2 << 20)));
  set_cpu_huge_pages(false);
}
#endif

}  // namespace
}  // namespace fasttrain
