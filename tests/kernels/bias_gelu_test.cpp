// fasttrain's bias + tanh-GELU kernel against ATen's gelu(pre + bias, "tanh") computed in fp64: values
// and the gradients of pre and bias, in fp32 and bf16, on every CPU capability this machine runs, at
// widths that fill no vector evenly and over the whole range of the tanh (|u| past its clamp at 7.9).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "fasttrain/kernels/cpu.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::max_error;

struct BiasGeluResult {
  torch::Tensor y, grad_pre, grad_bias;
};

// loss = sum(y * weights) in fp64, so every element's gradient differs.
template <typename Op>
BiasGeluResult run_bias_gelu(const torch::Tensor& pre_in, const torch::Tensor& bias_in,
                             const torch::Tensor& weights, Op op) {
  auto pre = pre_in.detach().requires_grad_(true), bias = bias_in.detach().requires_grad_(true);
  auto y = op(pre, bias);
  (y.to(torch::kDouble) * weights).sum().backward();
  return {y.detach(), pre.grad(), bias.grad()};
}

BiasGeluResult bias_gelu_reference(const torch::Tensor& pre, const torch::Tensor& bias,
                                   const torch::Tensor& weights) {
  return run_bias_gelu(
      pre.to(torch::kDouble), bias.to(torch::kDouble), weights,
      [](const torch::Tensor& p, const torch::Tensor& b) { return torch::gelu(p + b, "tanh"); });
}

double max_abs(const torch::Tensor& t) {
  return t.to(torch::kDouble).abs().max().item<double>();
}

TEST(CpuBiasGelu, MatchesATenInValuesAndGradientsOnEveryCapability) {
  torch::manual_seed(0);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (int64_t width : {1, 7, 16, 33, 130}) {
        SCOPED_TRACE(kernels::to_string(capability) + " " + c10::toString(dtype) + " width " +
                     std::to_string(width));
        // Most values where GELU bends, some far out on both sides, where tanh is +-1.
        auto pre = 2 * torch::randn({37, width});
        pre.index_put_({torch::indexing::Slice(0, 3)}, 12 * torch::randn({3, width}));
        pre = pre.to(dtype);
        const auto bias = torch::randn({width});
        const auto weights = torch::randn({37, width}, torch::kDouble);
        const BiasGeluResult want = bias_gelu_reference(pre, bias, weights);
        const BiasGeluResult got =
            run_bias_gelu(pre, bias, weights, [&](const torch::Tensor& p, const torch::Tensor& b) {
              return kernels::bias_gelu(p, b, capability);
            });
        ASSERT_EQ(got.y.scalar_type(), dtype);
        ASSERT_EQ(got.grad_pre.scalar_type(), dtype);
        ASSERT_EQ(got.grad_bias.scalar_type(), torch::kFloat);
        // fp32: the rational tanh is within a few ulp. bf16: one rounding of y and of grad_pre (2^-8
        // relative at most, as ATen's bf16 ops round; grad_y arrives rounded to bf16 too).
        const bool bf16 = dtype == torch::kBFloat16;
        EXPECT_LE(max_error(got.y, want.y), (bf16 ? 4e-3 : 2e-6) * max_abs(want.y));
        EXPECT_LE(max_error(got.grad_pre, want.grad_pre), (bf16 ? 8e-3 : 2e-6) * max_abs(want.grad_pre));
        // grad_bias sums a column: its error is at most the terms' relative error times the sum of |terms|.
        const double column_scale = want.grad_pre.abs().sum(0).max().item<double>();
        EXPECT_LE(max_error(got.grad_bias, want.grad_bias), (bf16 ? 8e-3 : 2e-6) * column_scale);
      }
    }
  }
}

TEST(CpuBiasGelu, KeepsNaNAndMatchesTheDerivativesShapeFarOut) {
  const auto bias = torch::zeros({5});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto pre = torch::tensor({nan, -30.f, -7.f, 7.f, 30.f});
  const auto weights = torch::ones({5}, torch::kDouble);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    SCOPED_TRACE(kernels::to_string(capability));
    const BiasGeluResult got = run_bias_gelu(
        pre, bias, weights,
        [&](const torch::Tensor& p, const torch::Tensor& b) { return kernels::bias_gelu(p, b, capability); });
    EXPECT_TRUE(std::isnan(got.y[0].item<float>()));
    EXPECT_TRUE(std::isnan(got.grad_pre[0].item<float>()));
    // Far out GELU is 0 on the left (derivative 0) and the identity on the right (derivative 1).
    EXPECT_NEAR(got.y[1].item<float>(), 0.f, 1e-6);
    EXPECT_NEAR(got.y[4].item<float>(), 30.f, 1e-5);
    EXPECT_NEAR(got.grad_pre[1].item<float>(), 0.f, 1e-6);
    EXPECT_NEAR(got.grad_pre[4].item<float>(), 1.f, 1e-6);
    const BiasGeluResult want = bias_gelu_reference(pre.slice(0, 1), bias.slice(0, 1), weights.slice(0, 1));
    EXPECT_LE(max_error(got.y.slice(0, 1), want.y), 1e-5);
    EXPECT_LE(max_error(got.grad_pre.slice(0, 1), want.grad_pre), 1e-5);
  }
}

TEST(CpuBiasGelu, RefusesWhatItDoesNotTakeByName) {
  const auto pre = torch::randn({4, 8});
  EXPECT_TRUE(kernels::bias_gelu_takes(pre, torch::zeros({8})));
  EXPECT_FALSE(kernels::bias_gelu_takes(pre, torch::zeros({7})));
  EXPECT_FALSE(kernels::bias_gelu_takes(pre, torch::zeros({8}, torch::kDouble)));
  EXPECT_FALSE(kernels::bias_gelu_takes(pre.to(torch::kDouble), torch::zeros({8})));
  EXPECT_FALSE(kernels::bias_gelu_takes(pre, torch::Tensor()));
  EXPECT_TRUE(
      testing::contains_all(testing::error_message([&] { kernels::bias_gelu(pre, torch::zeros({7})); }),
                            {"bias_gelu takes pre", "[4, 8]", "bias [7]"}));
}

}  // namespace
}  // namespace fasttrain
