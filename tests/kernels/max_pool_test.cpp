// fasttrain's 2x2 max-pool kernel against ATen's max_pool2d(x, 2) on channels_last images: the same
// values and input gradients bit for bit, in fp32 and bf16, on every CPU capability this machine runs,
// with channel counts that fill no vector evenly, odd heights and widths (the left-out last row and
// column get zero gradients), ties (ReLU's zeros: the window's first value wins) and NaN and -inf.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "compare.h"
#include "fasttrain/kernels/cpu.h"
#include "support.h"

namespace fasttrain {
namespace {

// Equal values with NaN where the other has NaN.
bool same(const torch::Tensor& got, const torch::Tensor& want) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  const auto got_nan = got.isnan(), want_nan = want.isnan();
  return torch::equal(got_nan, want_nan) &&
         torch::equal(got.masked_fill(got_nan, 0), want.masked_fill(want_nan, 0));
}

// Small integers (many ties within a window), a ReLU's zeros, and a few NaN and -inf.
torch::Tensor images(int64_t batch, int64_t channels, int64_t height, int64_t width,
                     torch::ScalarType dtype) {
  auto x = torch::randint(-3, 4, {batch, channels, height, width}).to(torch::kFloat).clamp_min(0);
  x += 0.25 * torch::randn_like(x).round();
  x.view(-1)[3] = std::numeric_limits<float>::quiet_NaN();
  x.view(-1)[x.numel() / 2] = -std::numeric_limits<float>::infinity();
  return x.to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
}

TEST(CpuMaxPool, EqualsATenBitForBitInValuesAndGradientsOnEveryCapability) {
  torch::manual_seed(0);
  struct Size {
    int64_t channels, height, width;
  };
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (const Size s :
           {Size{1, 28, 28}, Size{5, 7, 9}, Size{16, 28, 28}, Size{37, 6, 5}, Size{32, 14, 14}}) {
        SCOPED_TRACE(kernels::to_string(capability) + " " + c10::toString(dtype) + " C " +
                     std::to_string(s.channels) + " " + std::to_string(s.height) + "x" +
                     std::to_string(s.width));
        const auto input = images(3, s.channels, s.height, s.width, dtype);
        const auto grad_y = torch::randn({3, s.channels, s.height / 2, s.width / 2});
        const testing::OutputAndGrad want = testing::output_and_grad(
            input, grad_y, [](const torch::Tensor& x) { return torch::max_pool2d(x, 2); });
        const testing::OutputAndGrad got = testing::output_and_grad(
            input, grad_y, [&](const torch::Tensor& x) { return kernels::max_pool2x2(x, capability); });
        EXPECT_TRUE(got.y.is_contiguous(torch::MemoryFormat::ChannelsLast));
        EXPECT_TRUE(got.grad.is_contiguous(torch::MemoryFormat::ChannelsLast));
        EXPECT_TRUE(same(got.y, want.y));
        EXPECT_TRUE(same(got.grad, want.grad));
        if (s.height % 2 == 1) {  // the left-out last row: zero, not left as the allocator found it
          EXPECT_EQ(got.grad.select(2, s.height - 1).abs().sum().item<double>(), 0.0);
        }
      }
    }
  }
}

TEST(CpuMaxPool, TakesOnlyChannelsLastImagesAndRefusesByName) {
  const auto nhwc = torch::randn({2, 8, 6, 6}).contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(kernels::max_pool2x2_takes(nhwc));
  EXPECT_TRUE(kernels::max_pool2x2_takes(torch::randn({2, 1, 6, 6})));   // one channel: NCHW is NHWC
  EXPECT_FALSE(kernels::max_pool2x2_takes(torch::randn({2, 8, 6, 6})));  // NCHW
  EXPECT_FALSE(kernels::max_pool2x2_takes(nhwc.to(torch::kDouble)));
  EXPECT_FALSE(kernels::max_pool2x2_takes(torch::randn({8, 6, 6})));
  EXPECT_FALSE(kernels::max_pool2x2_takes(
      torch::randn({2, 8, 1, 6}).contiguous(torch::MemoryFormat::ChannelsLast)));  // no whole window
  EXPECT_FALSE(kernels::max_pool2x2_takes(torch::Tensor()));
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] {
                                      kernels::max_pool2x2(torch::randn({2, 8, 6, 6}));
                                    }),
                                    {"max_pool2x2 takes images", "[2, 8, 6, 6]", "not in channels_last"}));
}

}  // namespace
}  // namespace fasttrain
