// fasttrain's cross-entropy kernel against LibTorch's label-smoothed cross_entropy computed in fp64: the
// loss and the logits' gradient, in fp32 and bf16, with and without ignored targets, on every CPU
// capability this machine runs, over class counts that fill no vector evenly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "fasttrain/kernels/cpu.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::max_error;

namespace F = torch::nn::functional;

constexpr int64_t kIgnored = -100;

struct CrossEntropyResult {
  torch::Tensor loss, grad;
};

// The loss times 1.7, so the gradient's scale is checked too.
template <typename Op>
CrossEntropyResult run_cross_entropy(const torch::Tensor& logits_in, Op op) {
  auto logits = logits_in.detach().requires_grad_(true);
  torch::Tensor loss = op(logits);
  (loss * 1.7).backward();
  return {loss.detach(), logits.grad()};
}

CrossEntropyResult cross_entropy_reference(const torch::Tensor& logits, const torch::Tensor& targets,
                                           double smoothing) {
  return run_cross_entropy(logits.to(torch::kDouble), [&](const torch::Tensor& x) {
    return F::cross_entropy(x, targets,
                            F::CrossEntropyFuncOptions().label_smoothing(smoothing).ignore_index(kIgnored));
  });
}

CrossEntropyResult kernel(const torch::Tensor& logits, const torch::Tensor& targets, double smoothing,
                          kernels::CpuCapability capability) {
  return run_cross_entropy(logits, [&](const torch::Tensor& x) {
    return kernels::cross_entropy(x, targets, smoothing, kIgnored, capability);
  });
}

TEST(CpuCrossEntropy, MatchesATenInValuesAndGradientsOnEveryCapability) {
  torch::manual_seed(0);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (int64_t classes : {1, 7, 10, 16, 33, 256}) {
        for (double smoothing : {0.0, 0.1}) {
          for (bool ignored : {false, true}) {
            SCOPED_TRACE(kernels::to_string(capability) + " " + c10::toString(dtype) + " classes " +
                         std::to_string(classes) + " smoothing " + std::to_string(smoothing) +
                         (ignored ? " some ignored" : ""));
            // Logits of a trained net's range, one row far out (a large shift: lse must subtract the max).
            torch::Tensor logits = 3 * torch::randn({37, classes});
            logits[5] += 500;
            logits = logits.to(dtype);
            torch::Tensor targets = torch::randint(0, classes, {37}, torch::kLong);
            if (ignored) targets.index_put_({torch::indexing::Slice(0, 37, 4)}, kIgnored);
            const CrossEntropyResult want = cross_entropy_reference(logits, targets, smoothing);
            const CrossEntropyResult got = kernel(logits, targets, smoothing, capability);
            ASSERT_EQ(got.loss.scalar_type(), torch::kFloat);
            ASSERT_EQ(got.loss.dim(), 0);
            ASSERT_EQ(got.grad.scalar_type(), dtype);
            // The same bf16 inputs on both sides: fp32 arithmetic differs from fp64's by a few ulp of the
            // row's terms (lse ~ 500 in row 5); the bf16 gradient by its one rounding (2^-8 relative).
            EXPECT_LE(max_error(got.loss, want.loss), 2e-5 * (1 + want.loss.abs().item<double>()));
            const double grad_scale = want.grad.abs().max().item<double>();
            const bool bf16 = dtype == torch::kBFloat16;
            // (One class: the gradient is p - e - (1 - e) = 0 up to fp32's rounding of those terms.)
            EXPECT_LE(max_error(got.grad, want.grad), (bf16 ? 4e-3 : 2e-6) * grad_scale + 1e-8);
            if (ignored) {
              EXPECT_EQ(got.grad.index({torch::indexing::Slice(0, 37, 4)}).abs().max().item<double>(), 0.0);
            }
          }
        }
      }
    }
  }
}

TEST(CpuCrossEntropy, EveryTargetIgnoredIsZeroLossAndGradient) {
  const auto logits = torch::randn({4, 6});
  const auto targets = torch::full({4}, kIgnored, torch::kLong);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    SCOPED_TRACE(kernels::to_string(capability));
    const CrossEntropyResult got = kernel(logits, targets, 0.1, capability);
    EXPECT_EQ(got.loss.item<double>(), 0.0);
    EXPECT_EQ(got.grad.abs().max().item<double>(), 0.0);
  }
}

TEST(CpuCrossEntropy, ANonFiniteLogitMakesItsRowAndTheLossNaN) {
  torch::Tensor logits = torch::randn({3, 20});
  logits[1][7] = std::numeric_limits<float>::quiet_NaN();
  const auto targets = torch::tensor({1, 2, 3}, torch::kLong);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    SCOPED_TRACE(kernels::to_string(capability));
    const CrossEntropyResult got = kernel(logits, targets, 0.1, capability);
    EXPECT_TRUE(std::isnan(got.loss.item<float>()));
    EXPECT_TRUE(torch::isnan(got.grad[1]).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(got.grad[0]).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(got.grad[2]).all().item<bool>());
  }
}

TEST(CpuCrossEntropy, RefusesWhatItDoesNotTakeAndNamesABadTarget) {
  const auto logits = torch::randn({4, 5});
  const auto targets = torch::tensor({0, 4, 2, 1}, torch::kLong);
  EXPECT_TRUE(kernels::cross_entropy_takes(logits, targets));
  EXPECT_TRUE(kernels::cross_entropy_takes(logits.to(torch::kBFloat16), targets));
  EXPECT_FALSE(kernels::cross_entropy_takes(logits.to(torch::kDouble), targets));
  EXPECT_FALSE(kernels::cross_entropy_takes(logits.reshape({2, 2, 5}), targets));
  EXPECT_FALSE(kernels::cross_entropy_takes(logits, targets.to(torch::kInt)));
  EXPECT_FALSE(kernels::cross_entropy_takes(logits, targets.slice(0, 0, 3)));
  EXPECT_FALSE(kernels::cross_entropy_takes(logits, torch::Tensor()));
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { kernels::cross_entropy(logits, targets.slice(0, 0, 3), 0.0); }),
      {"cross_entropy takes logits", "[4, 5]", "targets [3]"}));
  for (int64_t bad : {5, -1}) {
    const auto wrong = torch::tensor({int64_t{0}, bad, int64_t{2}, int64_t{1}});
    EXPECT_TRUE(
        testing::contains_all(testing::error_message([&] { kernels::cross_entropy(logits, wrong, 0.1); }),
                              {"target " + std::to_string(bad), "row 1", "[0, 5)"}));
  }
  EXPECT_TRUE(
      testing::contains_all(testing::error_message([&] { kernels::cross_entropy(logits, targets, 1.0); }),
                            {"label_smoothing", "1"}));
}

}  // namespace
}  // namespace fasttrain
