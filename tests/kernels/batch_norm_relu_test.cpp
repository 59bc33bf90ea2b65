// fasttrain's BatchNorm + ReLU kernel against ATen's batch_norm and relu run in double on the same inputs:
// values, the gradients of x, weight and bias, and the running statistics, in training and in evaluation,
// fp32 and bf16, on every CPU capability this machine runs, with channel counts that fill no vector
// evenly and maps too large for one block or one thread's chunk.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "fasttrain/kernels/cpu.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::close;
using testing::kChannelsLast;

struct Norm {
  torch::Tensor weight, bias, running_mean, running_var;
};

struct BatchNormReluResult {
  torch::Tensor y, grad_x, grad_weight, grad_bias, running_mean, running_var;
};

Norm make_norm(int64_t channels) {
  return {torch::rand({channels}) + 0.5, torch::randn({channels}), 0.1 * torch::randn({channels}),
          torch::rand({channels}) + 0.5};
}

// The kernel on leaves x (its dtype) and weight, bias (fp32); y.backward(grad_y).
BatchNormReluResult run_kernel(const torch::Tensor& x_in, const Norm& norm, const torch::Tensor& grad_y,
                               bool training, double momentum, kernels::CpuCapability capability) {
  auto x = x_in.contiguous(kChannelsLast).detach().requires_grad_(true);
  auto weight = norm.weight.clone().requires_grad_(true), bias = norm.bias.clone().requires_grad_(true);
  auto running_mean = norm.running_mean.clone(), running_var = norm.running_var.clone();
  auto y = kernels::batch_norm_relu(x, weight, bias, running_mean, running_var, training, momentum, 1e-5,
                                    capability);
  y.backward(grad_y.contiguous(kChannelsLast));
  return {y.detach(), x.grad(), weight.grad(), bias.grad(), running_mean, running_var};
}

// ATen's batch_norm in double on the same values, and relu. Its backward takes ReLU's mask from `positive`
// (where the kernel's y is positive): a pre-activation within fp32's rounding of zero may fall either
// way, and one such value moves the bias's gradient by a whole grad_y. The kernel's y is checked against
// relu of the double pre-activation everywhere, so the mask is the kernel's own only where that is ~0.
BatchNormReluResult run_reference(const torch::Tensor& x_in, const Norm& norm, const torch::Tensor& grad_y,
                                  bool training, double momentum, const torch::Tensor& positive) {
  auto x = x_in.to(torch::kDouble).detach().requires_grad_(true);
  auto weight = norm.weight.to(torch::kDouble).requires_grad_(true);
  auto bias = norm.bias.to(torch::kDouble).requires_grad_(true);
  auto running_mean = norm.running_mean.to(torch::kDouble), running_var = norm.running_var.to(torch::kDouble);
  auto pre = torch::batch_norm(x, weight, bias, running_mean, running_var, training, momentum, 1e-5, false);
  pre.backward(grad_y.to(torch::kDouble) * positive.to(torch::kDouble));
  return {torch::relu(pre).detach(), x.grad(), weight.grad(), bias.grad(), running_mean, running_var};
}

// `atol_scale` widens the absolute tolerances where fp32's rounding of the mean itself shows (a far mean).
void expect_matches_double(const torch::Tensor& x, bool training, kernels::CpuCapability capability,
                           double momentum = 0.1, double atol_scale = 1) {
  const Norm norm = make_norm(x.size(1));
  const auto grad_y = torch::randn(x.sizes()).to(x.scalar_type());
  const BatchNormReluResult got = run_kernel(x, norm, grad_y, training, momentum, capability);
  const BatchNormReluResult want = run_reference(x, norm, grad_y, training, momentum, got.y > 0);
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  EXPECT_EQ(got.y.scalar_type(), x.scalar_type());
  EXPECT_TRUE(got.y.is_contiguous(kChannelsLast));
  EXPECT_TRUE(got.grad_x.is_contiguous(kChannelsLast));
  // bf16 outputs: half an ulp of rounding (2^-9 relative) over fp32's error.
  const double rtol = bf16 ? 1.0 / 256 : 1e-5;
  EXPECT_TRUE(close("y", got.y, want.y, rtol, 1e-5 * atol_scale));
  EXPECT_TRUE(close("grad_x", got.grad_x, want.grad_x, rtol, 1e-4 * atol_scale));
  EXPECT_TRUE(close("grad_weight", got.grad_weight, want.grad_weight, 1e-4, 1e-3 * atol_scale));
  EXPECT_TRUE(close("grad_bias", got.grad_bias, want.grad_bias, 1e-4, 1e-3));
  EXPECT_TRUE(close("running_mean", got.running_mean, want.running_mean, 1e-5, 1e-6));
  EXPECT_TRUE(close("running_var", got.running_var, want.running_var, 1e-5, 1e-6));
}

TEST(CpuBatchNormRelu, MatchesATensOpsInDoubleOnEveryCapability) {
  struct Size {
    int64_t batch, channels, height, width;
  };
  torch::manual_seed(0);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      // [128, 16, 14, 14] and [128, 32, 7, 7]: the main job's; 7,500 rows of 37: many blocks and chunks.
      for (const Size s : {Size{3, 1, 5, 5}, Size{2, 5, 3, 7}, Size{128, 16, 14, 14}, Size{128, 32, 7, 7},
                           Size{12, 37, 25, 25}, Size{1, 16, 1, 2}}) {
        for (const bool training : {true, false}) {
          SCOPED_TRACE(kernels::to_string(capability) + " " + c10::toString(dtype) + " [" +
                       std::to_string(s.batch) + ", " + std::to_string(s.channels) + ", " +
                       std::to_string(s.height) + ", " + std::to_string(s.width) + "]" +
                       (training ? " training" : " eval"));
          const auto x = (2 * torch::randn({s.batch, s.channels, s.height, s.width}) + 0.5).to(dtype);
          expect_matches_double(x, training, capability);
        }
      }
    }
  }
}

TEST(CpuBatchNormRelu, StatisticsHoldAFarMeanAndTheCumulativeMomentum) {
  // A mean 400 standard deviations away: one pass of sum and sum of squares would lose the variance in
  // fp32; the chunks' two passes and their merge keep it. Momentum 1 replaces the running statistics.
  torch::manual_seed(1);
  const auto x = (40 + 0.1 * torch::randn({64, 8, 9, 9})).contiguous(kChannelsLast);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    SCOPED_TRACE(kernels::to_string(capability));
    expect_matches_double(x, true, capability, 1.0, 10);
  }
}

TEST(CpuBatchNormRelu, ChunksPastTheLastRowReadNothing) {
  // 16 threads over 75 and 17 rows: row_chunks gives 38 chunks of 2 rows (the last of 1) and 17 of 1, more
  // chunks than threads and the last one short; no chunk may read past the last row (the sanitizer build runs
  // this too).
  const int threads = at::get_num_threads();
  at::set_num_threads(16);
  torch::manual_seed(3);
  for (const auto& sizes : {std::vector<int64_t>{3, 4, 5, 5}, std::vector<int64_t>{1, 3, 1, 17}}) {
    SCOPED_TRACE(c10::str(c10::IntArrayRef(sizes)));
    expect_matches_double(torch::randn(sizes), true, kernels::cpu_capability());
  }
  at::set_num_threads(threads);
}

TEST(CpuBatchNormRelu, PassesTheGradientAtANaNAsThresholdBackwardDoes) {
  // ReLU's backward in ATen is `result <= 0 ? 0 : grad`: a NaN result passes its gradient on. In evaluation
  // one NaN input stays one NaN pre-activation, so its input gradient is grad_y * scale, finite.
  torch::manual_seed(4);
  auto x = torch::randn({2, 3, 4, 4}).contiguous(kChannelsLast);
  x.select(1, 1).select(1, 2).select(1, 3)[0] = std::numeric_limits<float>::quiet_NaN();
  const Norm norm = make_norm(3);
  const auto grad_y = torch::randn(x.sizes());
  const BatchNormReluResult got = run_kernel(x, norm, grad_y, false, 0.1, kernels::cpu_capability());
  auto xx = x.detach().requires_grad_(true);
  torch::relu(torch::batch_norm(xx, norm.weight, norm.bias, norm.running_mean, norm.running_var, false, 0.1,
                                1e-5, false))
      .backward(grad_y);
  EXPECT_TRUE(torch::equal(got.y.isnan(), x.isnan()));
  EXPECT_TRUE(torch::allclose(got.grad_x, xx.grad(), 1e-5, 1e-6))
      << "the NaN's gradient passes, the rest as ATen's";
  EXPECT_TRUE(std::isfinite(got.grad_x.select(1, 1).select(1, 2).select(1, 3)[0].item<double>()));
}

TEST(CpuBatchNormRelu, TellsAWrongGradientApart) {
  // The double reference is strict enough to catch the gradient through the batch statistics left out:
  // the evaluation-mode backward of the same forward, its running statistics the batch's (the biased
  // variance: what training normalises by).
  torch::manual_seed(2);
  const auto x = torch::randn({8, 4, 6, 6}).contiguous(kChannelsLast);
  Norm norm = make_norm(4);
  const auto grad_y = torch::randn(x.sizes());
  const BatchNormReluResult training = run_kernel(x, norm, grad_y, true, 0.1, kernels::cpu_capability());
  const BatchNormReluResult want = run_reference(x, norm, grad_y, true, 0.1, training.y > 0);
  norm.running_mean = x.mean({0, 2, 3});
  norm.running_var = x.var({0, 2, 3}, /*unbiased=*/false);
  const BatchNormReluResult eval = run_kernel(x, norm, grad_y, false, 0.1, kernels::cpu_capability());
  EXPECT_TRUE(close("y", eval.y, want.y, 1e-5, 1e-5)) << "the same forward";
  EXPECT_TRUE(close("grad_x", training.grad_x, want.grad_x, 1e-5, 1e-4));
  EXPECT_FALSE(close("grad_x", eval.grad_x, want.grad_x, 1e-5, 1e-4)) << "another backward";
}

TEST(CpuBatchNormRelu, TakesOnlyChannelsLastMapsWithFp32StatisticsAndRefusesByName) {
  const auto nhwc = torch::randn({2, 8, 6, 6}).contiguous(kChannelsLast);
  const Norm norm = make_norm(8);
  auto takes = [&](const torch::Tensor& x, bool training = true) {
    return kernels::batch_norm_relu_takes(x, norm.weight, norm.bias, norm.running_mean, norm.running_var,
                                          training);
  };
  EXPECT_TRUE(takes(nhwc));
  EXPECT_TRUE(takes(nhwc.to(torch::kBFloat16)));
  EXPECT_FALSE(takes(torch::randn({2, 8, 6, 6})));  // NCHW
  EXPECT_FALSE(takes(nhwc.to(torch::kDouble)));
  EXPECT_FALSE(takes(torch::randn({8, 6, 6})));
  EXPECT_FALSE(takes(torch::randn({1, 8, 1, 1}).contiguous(kChannelsLast)));  // one value per channel
  EXPECT_TRUE(takes(torch::randn({1, 8, 1, 1}).contiguous(kChannelsLast), /*training=*/false));
  EXPECT_FALSE(kernels::batch_norm_relu_takes(nhwc, norm.weight.to(torch::kBFloat16), norm.bias,
                                              norm.running_mean, norm.running_var, true));
  EXPECT_FALSE(
      kernels::batch_norm_relu_takes(nhwc, norm.weight, norm.bias, torch::Tensor(), torch::Tensor(), true));
  EXPECT_FALSE(kernels::batch_norm_relu_takes(nhwc, torch::randn({4}), norm.bias, norm.running_mean,
                                              norm.running_var, true));
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] {
                                      kernels::batch_norm_relu(torch::randn({2, 8, 6, 6}), norm.weight,
                                                               norm.bias, norm.running_mean, norm.running_var,
                                                               true, 0.1, 1e-5);
                                    }),
                                    {"batch_norm_relu takes maps", "[2, 8, 6, 6]", "not in channels_last"}));
}

}  // namespace
}  // namespace fasttrain
