// memory.cpu_huge_pages (util/huge_pages.h): a long-lived block is advised as huge pages only where the
// switch is on (a block from the retained heap: tests/memory/heap_test.cpp).
#include "fasttrain/util/huge_pages.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support.h"

namespace fasttrain {
namespace {

// memory.cpu_huge_pages: a long-lived block is advised as huge pages only where the switch is on, and holds
// what is written to it either way.
TEST(CpuHugePages, LongLivedBlocksAreAdvisedOnlyWhereSet) {
  if (!testing::kernel_records_huge_page_advice())
    GTEST_SKIP() << "this kernel keeps no huge-page advice in smaps";
  for (const bool enabled : {false, true}) {
    set_cpu_huge_pages(enabled);
    torch::Tensor block = empty_long_lived_cpu({16 << 20}, torch::kFloat);  // 64 MiB
    const float* middle = block.data_ptr<float>() + (8 << 20);
    EXPECT_EQ(advised_huge_pages(middle), enabled) << "huge pages " << enabled;
    block.copy_(torch::arange(16 << 20, torch::kFloat));
    EXPECT_EQ(*middle, static_cast<float>(8 << 20));
  }
  set_cpu_huge_pages(false);
  EXPECT_FALSE(advised_huge_pages(torch::ones({16}).data_ptr())) << "a small tensor";
}

}  // namespace
}  // namespace fasttrain
