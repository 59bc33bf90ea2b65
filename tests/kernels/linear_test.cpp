// fasttrain's linear (oneDNN's matmul for the input gradient, and for the forward without a bias or with a
// residual) against the same sum in fp64: residual + x weight^T + bias and the gradients of all four, with
// and without each optional input, on 2-d and 3-d inputs of sizes that fill no vector or block evenly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/precision/autocast.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::max_error;

// Whether this LibTorch and CPU give oneDNN fp32 matmuls (LibTorch 2.4+, AVX512 BW/VL/DQ); elsewhere the
// gpt keeps torch::linear and these tests have nothing to run.
bool onednn_fp32_here() {
  return kernels::linear_takes(torch::ones({1, 1}), torch::ones({1, 1}), {});
}

struct LinearResult {
  torch::Tensor y, grad_x, grad_weight, grad_bias, grad_residual;
};

// loss = sum(y * weights) in fp64, so every element's gradient differs. Undefined bias or residual: left out.
template <typename Op>
LinearResult run_linear(const torch::Tensor& x_in, const torch::Tensor& weight_in,
                        const torch::Tensor& bias_in, const torch::Tensor& residual_in,
                        const torch::Tensor& weights, Op op) {
  const auto leaf = [](const torch::Tensor& t) {
    return t.defined() ? t.detach().requires_grad_(true) : torch::Tensor();
  };
  auto x = leaf(x_in), weight = leaf(weight_in), bias = leaf(bias_in), residual = leaf(residual_in);
  auto y = op(x, weight, bias, residual);
  (y.to(torch::kDouble) * weights).sum().backward();
  const auto grad = [](const torch::Tensor& t) { return t.defined() ? t.grad() : torch::Tensor(); };
  return {y.detach(), x.grad(), weight.grad(), grad(bias), grad(residual)};
}

torch::Tensor reference_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& residual) {
  auto y = torch::matmul(x, weight.t());
  if (bias.defined()) y = y + bias;
  if (residual.defined()) y = y + residual;
  return y;
}

TEST(CpuLinear, MatchesTheSumInDoubleInValuesAndGradients) {
  if (!onednn_fp32_here()) GTEST_SKIP() << "no oneDNN fp32 matmul in this LibTorch or on this CPU";
  torch::manual_seed(0);
  const std::vector<std::vector<int64_t>> input_shapes = {{37, 33}, {3, 5, 130}, {1, 17}};
  for (const auto& shape : input_shapes) {
    const int64_t in = shape.back(), out = in == 130 ? 70 : 29;
    for (bool with_bias : {false, true}) {
      for (bool with_residual : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "x " << c10::IntArrayRef(shape) << " -> " << out << (with_bias ? " bias" : "")
                     << (with_residual ? " residual" : ""));
        const auto x = torch::randn(shape);
        const auto weight = torch::randn({out, in});
        std::vector<int64_t> out_shape = shape;
        out_shape.back() = out;
        const auto bias = with_bias ? torch::randn({out}) : torch::Tensor();
        const auto residual = with_residual ? torch::randn(out_shape) : torch::Tensor();
        const auto weights = torch::randn(out_shape, torch::kDouble);
        const auto to_double = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kDouble) : t; };
        const LinearResult want = run_linear(to_double(x), to_double(weight), to_double(bias),
                                             to_double(residual), weights, reference_linear);
        const LinearResult got = run_linear(x, weight, bias, residual, weights, kernels::linear);
        ASSERT_EQ(got.y.sizes(), want.y.sizes());
        ASSERT_EQ(got.y.scalar_type(), torch::kFloat);
        // fp32 sums of K products: within K * 2^-24 of the sum of their magnitudes, here bounded by a
        // fraction of the largest value; a missing term or a transposed operand is off by O(1).
        const double scale = in * 1e-6;
        EXPECT_LE(max_error(got.y, want.y), scale * want.y.abs().max().item<double>());
        EXPECT_LE(max_error(got.grad_x, want.grad_x), scale * want.grad_x.abs().max().item<double>());
        EXPECT_LE(max_error(got.grad_weight, want.grad_weight),
                  scale * 40 * want.grad_weight.abs().max().item<double>());
        if (with_bias) {
          EXPECT_LE(max_error(got.grad_bias, want.grad_bias),
                    1e-4 * want.grad_bias.abs().max().item<double>());
        }
        // The residual's gradient is grad_y itself: the loss's fp64 weights rounded to fp32.
        if (with_residual) {
          EXPECT_TRUE(torch::equal(got.grad_residual, want.grad_residual.to(torch::kFloat)));
        }
      }
    }
  }
}

TEST(CpuLinear, AnInputWithoutGradientGetsNoneAndTheWeightStillItsOwn) {
  if (!onednn_fp32_here()) GTEST_SKIP() << "no oneDNN fp32 matmul in this LibTorch or on this CPU";
  torch::manual_seed(1);
  const auto x = torch::randn({6, 9});
  auto weight = torch::randn({5, 9}).requires_grad_(true);
  auto bias = torch::randn({5}).requires_grad_(true);
  const auto residual = torch::randn({6, 5});
  kernels::linear(x, weight, bias, residual).pow(2).sum().backward();
  const auto want = (2 * (torch::linear(x, weight, bias) + residual)).detach();
  EXPECT_LE(max_error(weight.grad(), want.t().mm(x)), 1e-4);
  EXPECT_LE(max_error(bias.grad(), want.sum(0)), 1e-4);
  EXPECT_FALSE(x.grad().defined());
}

TEST(CpuLinear, TakesAResidualOfAnyStrides) {
  if (!onednn_fp32_here()) GTEST_SKIP() << "no oneDNN fp32 matmul in this LibTorch or on this CPU";
  torch::manual_seed(2);
  const auto x = torch::randn({2, 6, 9}), weight = torch::randn({5, 9}), bias = torch::randn({5});
  const auto residual = torch::randn({6, 2, 5}).transpose(0, 1);  // [2, 6, 5], not contiguous
  for (const auto& b : {bias, torch::Tensor()}) {
    const auto y = kernels::linear(x, weight, b, residual);
    const auto want = reference_linear(x, weight, b, residual);
    EXPECT_LE(max_error(y, want), 1e-4 * want.abs().max().item<double>());
  }
}

TEST(CpuLinear, RefusesASecondDerivativeByName) {
  if (!onednn_fp32_here()) GTEST_SKIP() << "no oneDNN fp32 matmul in this LibTorch or on this CPU";
  auto x = torch::randn({4, 3}).requires_grad_(true);
  const auto weight = torch::randn({2, 3});
  const auto y = kernels::linear(x, weight, {});
  const std::string message = testing::second_derivative_error(y, x);
  EXPECT_TRUE(testing::contains_all(message, {"linear", "not itself differentiable"})) << message;
}

TEST(CpuLinear, TakesOnlyWhatItComputesAndRefusesByName) {
  const auto x = torch::randn({4, 8}), weight = torch::randn({3, 8}), bias = torch::randn({3});
  const auto residual = torch::randn({4, 3});
  // Never what oneDNN's fp32 matmul is not for, on any machine.
  EXPECT_FALSE(kernels::linear_takes(x.to(torch::kBFloat16), weight, bias));
  EXPECT_FALSE(kernels::linear_takes(x, weight.to(torch::kDouble), bias));
  EXPECT_FALSE(kernels::linear_takes(x, torch::randn({3, 7}), bias));
  EXPECT_FALSE(kernels::linear_takes(x, weight, torch::randn({4})));
  EXPECT_FALSE(kernels::linear_takes(x, weight, bias, torch::randn({4, 4})));
  EXPECT_FALSE(kernels::linear_takes(torch::empty({0, 8}), weight, bias));
  {
    // Under CPU autocast the matmul is autocast's bf16 one.
    AutocastState bf16 = AutocastState::current();
    bf16.cpu_enabled = true;
    bf16.cpu_dtype = torch::kBFloat16;
    const AutocastStateGuard autocast(bf16);
    EXPECT_FALSE(kernels::linear_takes(x, weight, bias));
  }
  const std::string message = testing::error_message([&] {
    kernels::linear(x, weight, bias, torch::randn({4, 4}));
  });
  EXPECT_TRUE(testing::contains_all(message, {"linear takes", "x [4, 8] Float", "residual [4, 4] Float"}))
      << message;
  if (onednn_fp32_here()) {
    EXPECT_TRUE(kernels::linear_takes(x, weight, bias, residual));
  }
}

}  // namespace
}  // namespace fasttrain
