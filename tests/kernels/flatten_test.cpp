// fasttrain's flatten of channels_last maps against ATen's maps.flatten(1): the same values and gradients
// bit for bit (it only moves values), in fp32 and bf16, on every CPU capability this machine runs, with
// channel counts odd and even (bf16 moves two channels a gather) and positions that fill no vector evenly;
// the gradient comes back channels_last.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "compare.h"
#include "fasttrain/kernels/cpu.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

TEST(CpuFlatten, EqualsATensFlattenBitForBitInValuesAndGradientsOnEveryCapability) {
  torch::manual_seed(0);
  struct Size {
    int64_t batch, channels, height, width;
  };
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (const Size s : {Size{128, 32, 7, 7}, Size{3, 2, 2, 2}, Size{5, 3, 5, 7}, Size{2, 37, 4, 5},
                           Size{1, 16, 17, 1}, Size{4, 33, 1, 18}}) {
        SCOPED_TRACE(kernels::to_string(capability) + " " + c10::toString(dtype) + " " +
                     std::to_string(s.batch) + "x" + std::to_string(s.channels) + "x" +
                     std::to_string(s.height) + "x" + std::to_string(s.width));
        const auto maps = torch::randn({s.batch, s.channels, s.height, s.width})
                              .to(dtype)
                              .contiguous(torch::MemoryFormat::ChannelsLast);
        ASSERT_TRUE(kernels::flatten_channels_last_takes(maps));
        const auto grad_y = torch::randn({s.batch, s.channels * s.height * s.width});
        const testing::OutputAndGrad want =
            testing::output_and_grad(maps, grad_y, [](const torch::Tensor& x) { return x.flatten(1); });
        const testing::OutputAndGrad got = testing::output_and_grad(
            maps, grad_y,
            [&](const torch::Tensor& x) { return kernels::flatten_channels_last(x, capability); });
        EXPECT_TRUE(got.y.is_contiguous());
        EXPECT_TRUE(got.grad.is_contiguous(torch::MemoryFormat::ChannelsLast));
        EXPECT_EQ(got.y.scalar_type(), dtype);
        EXPECT_EQ(got.grad.scalar_type(), dtype);
        EXPECT_TRUE(torch::equal(got.y, want.y));
        EXPECT_TRUE(torch::equal(got.grad, want.grad));
      }
    }
  }
}

TEST(CpuFlatten, TakesOnlyMapsWhoseFlattenIsACopyAndRefusesByName) {
  const auto nhwc = torch::randn({2, 8, 6, 6}).contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(kernels::flatten_channels_last_takes(nhwc));
  EXPECT_TRUE(kernels::flatten_channels_last_takes(nhwc.to(torch::kBFloat16)));
  EXPECT_FALSE(kernels::flatten_channels_last_takes(torch::randn({2, 8, 6, 6})));  // NCHW: a view already
  EXPECT_FALSE(kernels::flatten_channels_last_takes(torch::randn({2, 1, 6, 6})));  // one channel: a view
  EXPECT_FALSE(kernels::flatten_channels_last_takes(
      torch::randn({2, 8, 1, 1}).contiguous(torch::MemoryFormat::ChannelsLast)));  // one position: a view
  EXPECT_FALSE(kernels::flatten_channels_last_takes(nhwc.to(torch::kDouble)));
  EXPECT_FALSE(kernels::flatten_channels_last_takes(torch::randn({8, 6, 6})));
  EXPECT_FALSE(kernels::flatten_channels_last_takes(torch::Tensor()));
  EXPECT_TRUE(
      testing::contains_all(testing::error_message([&] {
                              kernels::flatten_channels_last(torch::randn({2, 8, 6, 6}));
                            }),
                            {"flatten_channels_last takes maps", "[2, 8, 6, 6]", "not in channels_last"}));
}

TEST(CpuFlatten, RefusesASecondDerivativeByName) {
  // Its backward is not itself differentiable: a backward with create_graph says so, where it would
  // otherwise give a second derivative of zero.
  auto maps = torch::randn({2, 4, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
  const auto y = kernels::flatten_channels_last(maps);
  const std::string message = testing::second_derivative_error(y, maps);
  EXPECT_TRUE(testing::contains_all(message, {"flatten_channels_last", "not itself differentiable"}))
      << message;
}

}  // namespace
}  // namespace fasttrain
