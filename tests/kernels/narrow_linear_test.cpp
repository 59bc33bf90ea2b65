// fasttrain's narrow_linear (a Linear with few outputs in bf16, as CPU autocast's linear rounds it) against
// the same sums in fp64 from the bf16-rounded operands, values and all three gradients, on every capability
// this CPU runs, for bf16 inputs and fp32 ones under autocast, at sizes that fill no vector; and beside
// autocast's own linear.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/precision/autocast.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::bf16_in_double;
using testing::expect_close;
using testing::layer_gradients;
using testing::LayerGradients;

TEST(NarrowLinear, MatchesTheSumsInDoubleInValuesAndGradientsOnEveryCapability) {
  torch::manual_seed(0);
  for (const auto capability : kernels::runnable_cpu_capabilities()) {
    for (const auto& [rows, inputs, outputs] :
         {std::tuple<int64_t, int64_t, int64_t>{128, 256, 10}, {7, 37, 3}, {33, 16, 64}, {1, 5, 1}}) {
      for (const bool fp32_input : {false, true}) {
        SCOPED_TRACE(::testing::Message() << kernels::to_string(capability) << " [" << rows << ", " << inputs
                                          << "] -> " << outputs << (fp32_input ? " fp32 x" : " bf16 x"));
        const auto x =
            fp32_input ? torch::randn({rows, inputs}) : torch::randn({rows, inputs}).to(torch::kBFloat16);
        const auto weight = torch::randn({outputs, inputs}) * 0.2, bias = torch::randn({outputs});
        const auto weights = torch::randn({rows, outputs}, torch::kDouble);
        const LayerGradients got = layer_gradients(
            x, weight, bias, weights, fp32_input,
            [&](auto& a, auto& w, auto& b) { return kernels::narrow_linear(a, w, b, capability); });
        EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
        EXPECT_EQ(got.grad_x.scalar_type(), x.scalar_type());
        EXPECT_EQ(got.grad_weight.scalar_type(), torch::kFloat);
        EXPECT_EQ(got.grad_bias.scalar_type(), torch::kFloat);
        // The reference: the operands as autocast rounds them, sums in fp64; y and x's gradient rounded once.
        const auto xb = bf16_in_double(x), wb = bf16_in_double(weight), bb = bf16_in_double(bias);
        testing::expect_rounded_once(got.y, xb.mm(wb.t()) + bb, "y");
        const auto dy = bf16_in_double(weights);  // the gradient reaching y, in y's dtype
        testing::expect_rounded_once(got.grad_x, dy.mm(wb), "grad x");
        // Every value of x's gradient is a bf16 value, also where x is fp32 (autocast's cast back).
        EXPECT_TRUE(torch::equal(got.grad_x.to(torch::kBFloat16).to(got.grad_x.scalar_type()), got.grad_x));
        expect_close(got.grad_weight, dy.t().mm(xb), 1e-5, "grad weight");  // fp32 sums, not rounded to bf16
        expect_close(got.grad_bias, dy.sum(0), 1e-5, "grad bias");
      }
    }
  }
}

TEST(NarrowLinear, AgreesWithAutocastsLinear) {
  torch::manual_seed(1);
  const auto x = torch::randn({128, 256}).to(torch::kBFloat16), weight = torch::randn({10, 256}) * 0.06;
  const auto bias = torch::randn({10}) * 0.1, weights = torch::randn({128, 10}, torch::kDouble);
  const LayerGradients own = layer_gradients(x, weight, bias, weights, true, [](auto& a, auto& w, auto& b) {
    return kernels::narrow_linear(a, w, b);
  });
  const LayerGradients aten = layer_gradients(
      x, weight, bias, weights, true, [](auto& a, auto& w, auto& b) { return torch::linear(a, w, b); });
  expect_close(own.y, aten.y.to(torch::kDouble), 1.0 / 64, "y");
  expect_close(own.grad_x, aten.grad_x.to(torch::kDouble), 1.0 / 64, "grad x");
  // LibTorch 1.13's bf16 linear on a CPU without native bf16 (an AVX2-only EPYC) gave a weight gradient 2.1%
  // of the largest value from this kernel's, which the test above holds to fp64's sums.
  expect_close(own.grad_weight, aten.grad_weight.to(torch::kDouble), 1.0 / 32, "grad weight");
  expect_close(own.grad_bias, aten.grad_bias.to(torch::kDouble), 1.0 / 64, "grad bias");
}

TEST(NarrowLinear, GivesTheWeightGradientsAloneWhereXTakesNone) {
  torch::manual_seed(2);
  const auto x = torch::randn({16, 40}).to(torch::kBFloat16), weights = torch::randn({16, 6}, torch::kDouble);
  auto weight = torch::randn({6, 40}).requires_grad_(true), bias = torch::randn({6}).requires_grad_(true);
  (kernels::narrow_linear(x, weight, bias).to(torch::kDouble) * weights).sum().backward();
  const auto dy = bf16_in_double(weights);
  expect_close(weight.grad(), dy.t().mm(bf16_in_double(x)), 1e-5, "grad weight");
  expect_close(bias.grad(), dy.sum(0), 1e-5, "grad bias");
}

TEST(NarrowLinear, RefusesASecondDerivativeByName) {
  auto x = torch::randn({4, 8}).to(torch::kBFloat16).requires_grad_(true);
  const auto y = kernels::narrow_linear(x, torch::randn({3, 8}), torch::randn({3}));
  const std::string message = testing::second_derivative_error(y, x);
  EXPECT_TRUE(testing::contains_all(message, {"narrow_linear", "not itself differentiable"})) << message;
}

TEST(NarrowLinear, TakesOnlyWhatItComputesAndRefusesByName) {
  const auto x = torch::randn({8, 64}).to(torch::kBFloat16), weight = torch::randn({10, 64}),
             bias = torch::randn({10});
  EXPECT_TRUE(kernels::narrow_linear_takes(x, weight, bias));
  // Never what it does not compute: fp32 outside autocast, more outputs than it takes, a bf16 weight, no
  // bias, a 3-d input, mismatched inputs.
  EXPECT_FALSE(kernels::narrow_linear_takes(x.to(torch::kFloat), weight, bias));
  EXPECT_FALSE(kernels::narrow_linear_takes(x, torch::randn({kernels::kNarrowLinearMaxOutputs + 1, 64}),
                                            torch::randn({kernels::kNarrowLinearMaxOutputs + 1})));
  EXPECT_FALSE(kernels::narrow_linear_takes(x, weight.to(torch::kBFloat16), bias));
  EXPECT_FALSE(kernels::narrow_linear_takes(x, weight, {}));
  EXPECT_FALSE(kernels::narrow_linear_takes(x.view({2, 4, 64}), weight, bias));
  EXPECT_FALSE(kernels::narrow_linear_takes(x.narrow(1, 0, 32), weight, bias));
  {
    const AutocastStateGuard guard(testing::cpu_bf16_autocast());
    EXPECT_TRUE(kernels::narrow_linear_takes(x.to(torch::kFloat), weight, bias));
  }
  const std::string message =
      testing::error_message([&] { kernels::narrow_linear(x, weight.narrow(1, 0, 32), bias); });
  EXPECT_TRUE(testing::contains_all(message, {"narrow_linear", "[10, 32]", "[8, 64]"})) << message;
}

}  // namespace
}  // namespace fasttrain
