// fasttrain's amx_linear (a Linear and its ReLU in bf16 on AMX's tiles) against the same sums in fp64 from
// the bf16-rounded operands, values and all three gradients, with and without the ReLU, for bf16 inputs and
// fp32 ones under autocast, at batch sizes that fill the 32-row blocks and that do not; and beside autocast's
// own linear + relu. These run only on a CPU with AMX-BF16 (elsewhere the cnn keeps ATen's linear).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

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

TEST(AmxLinear, MatchesTheSumsInDoubleInValuesAndGradients) {
  if (!kernels::amx_linear_runs_here()) GTEST_SKIP() << "no AMX-BF16 tiles on this CPU";
  torch::manual_seed(0);
  const int64_t k = 96, n = 64;
  for (const int64_t m : {64, 45}) {
    for (const bool relu : {true, false}) {
      for (const bool fp32_input : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "M " << m << (relu ? " relu" : "")
                                          << (fp32_input ? " fp32 x under autocast" : " bf16 x"));
        const auto x = fp32_input ? torch::randn({m, k}) : torch::randn({m, k}).to(torch::kBFloat16);
        // A bias read through strides where M does not fill the blocks (its own contiguous copy is read).
        const auto weight = torch::randn({n, k}) * 0.2,
                   bias = m % 32 == 0 ? torch::randn({n}) : torch::randn({2 * n}).slice(0, 0, 2 * n, 2);
        const auto weights = torch::randn({m, n}, torch::kDouble);
        const LayerGradients got =
            layer_gradients(x, weight, bias, weights, fp32_input,
                            [&](auto& a, auto& w, auto& b) { return kernels::amx_linear(a, w, b, relu); });
        EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
        EXPECT_EQ(got.grad_x.scalar_type(), x.scalar_type());
        EXPECT_EQ(got.grad_weight.scalar_type(), torch::kFloat);
        // The reference: the operands as autocast rounds them, sums in fp64.
        const auto xb = bf16_in_double(x), wb = bf16_in_double(weight), bb = bf16_in_double(bias);
        auto z = xb.mm(wb.t()) + bb;
        if (relu) z = z.clamp_min(0);
        testing::expect_rounded_once(got.y, z, "y");
        // The gradient reaching y is the loss's weights in y's dtype; the ReLU's mask is the kernel's own y.
        auto dz = bf16_in_double(weights);
        if (relu) dz = dz * (got.y.to(torch::kDouble) > 0).to(torch::kDouble);
        testing::expect_rounded_once(got.grad_x, dz.mm(wb), "grad x");
        expect_close(got.grad_weight, dz.t().mm(xb), 1e-5, "grad weight");  // fp32 sums, not rounded to bf16
        expect_close(got.grad_bias, dz.sum(0), 1e-5, "grad bias");
      }
    }
  }
}

TEST(AmxLinear, AgreesWithAutocastsLinearAndRelu) {
  if (!kernels::amx_linear_runs_here()) GTEST_SKIP() << "no AMX-BF16 tiles on this CPU";
  torch::manual_seed(1);
  const auto x = torch::randn({128, 1568}).to(torch::kBFloat16), weight = torch::randn({256, 1568}) * 0.03;
  const auto bias = torch::randn({256}) * 0.1, weights = torch::randn({128, 256}, torch::kDouble);
  const LayerGradients own = layer_gradients(x, weight, bias, weights, true, [](auto& a, auto& w, auto& b) {
    return kernels::amx_linear(a, w, b, true);
  });
  const LayerGradients aten = layer_gradients(x, weight, bias, weights, true, [](auto& a, auto& w, auto& b) {
    return torch::relu(torch::linear(a, w, b));
  });
  expect_close(own.y, aten.y.to(torch::kDouble), 1.0 / 64, "y");
  expect_close(own.grad_x, aten.grad_x.to(torch::kDouble), 1.0 / 64, "grad x");
  expect_close(own.grad_weight, aten.grad_weight.to(torch::kDouble), 1.0 / 64, "grad weight");
  expect_close(own.grad_bias, aten.grad_bias.to(torch::kDouble), 1.0 / 64, "grad bias");
}

TEST(AmxLinear, GivesTheSameWeightGradientsWhereXTakesNone) {
  // Where x's gradient is asked for, the forward packs the weight for backward's dz W in the same pass; where
  // it is not (x a constant), that pack is skipped and backward computes the weight's and bias's alone.
  if (!kernels::amx_linear_runs_here()) GTEST_SKIP() << "no AMX-BF16 tiles on this CPU";
  torch::manual_seed(2);
  const auto x = torch::randn({64, 96}).to(torch::kBFloat16),
             weights = torch::randn({64, 32}, torch::kDouble);
  auto weight = torch::randn({32, 96}).requires_grad_(true), bias = torch::randn({32}).requires_grad_(true);
  (kernels::amx_linear(x, weight, bias, true).to(torch::kDouble) * weights).sum().backward();
  const torch::Tensor grad_weight = weight.grad().clone(), grad_bias = bias.grad().clone();
  weight.mutable_grad().zero_();
  bias.mutable_grad().zero_();
  const auto x_with_grad = x.clone().requires_grad_(true);
  (kernels::amx_linear(x_with_grad, weight, bias, true).to(torch::kDouble) * weights).sum().backward();
  EXPECT_TRUE(torch::equal(weight.grad(), grad_weight));
  EXPECT_TRUE(torch::equal(bias.grad(), grad_bias));
  EXPECT_TRUE(x_with_grad.grad().defined());
}

TEST(AmxLinear, LetsANanThroughTheReluAsATensReluDoes) {
  if (!kernels::amx_linear_runs_here()) GTEST_SKIP() << "no AMX-BF16 tiles on this CPU";
  torch::manual_seed(3);
  auto x = torch::randn({32, 64}).to(torch::kBFloat16);
  x[5][7] = std::numeric_limits<float>::quiet_NaN();
  const auto weight = torch::randn({32, 64}), bias = torch::randn({32});
  const auto weights = torch::randn({32, 32}, torch::kDouble);
  const LayerGradients got = layer_gradients(x, weight, bias, weights, false, [](auto& a, auto& w, auto& b) {
    return kernels::amx_linear(a, w, b, true);
  });
  EXPECT_TRUE(got.y[5].isnan().all().item<bool>()) << "row 5 sums a NaN: NaN through the ReLU";
  EXPECT_FALSE(got.y.narrow(0, 0, 5).isnan().any().item<bool>());
  // threshold_backward passes the gradient where y is NaN: row 5's gradient is dy W, every output counted.
  EXPECT_TRUE(torch::allclose(got.grad_x[5].to(torch::kDouble),
                              bf16_in_double(weights[5].unsqueeze(0)).mm(bf16_in_double(weight))[0], 1e-2,
                              1e-2));
}

TEST(AmxLinear, RefusesASecondDerivativeByName) {
  if (!kernels::amx_linear_runs_here()) GTEST_SKIP() << "no AMX-BF16 tiles on this CPU";
  auto x = torch::randn({32, 32}).to(torch::kBFloat16).requires_grad_(true);
  const auto y = kernels::amx_linear(x, torch::randn({32, 32}), torch::randn({32}), true);
  const std::string message = testing::second_derivative_error(y, x);
  EXPECT_TRUE(testing::contains_all(message, {"amx_linear", "not itself differentiable"})) << message;
}

TEST(AmxLinear, TakesOnlyWhatItComputesAndRefusesByName) {
  const auto x = torch::randn({8, 64}).to(torch::kBFloat16), weight = torch::randn({32, 64}),
             bias = torch::randn({32});
  // Never what it does not compute, on any machine: fp32 outside autocast, sizes off the tiles, a bf16
  // weight, no bias, a 3-d input.
  EXPECT_FALSE(kernels::amx_linear_takes(x.to(torch::kFloat), weight, bias));
  EXPECT_FALSE(kernels::amx_linear_takes(x.narrow(1, 0, 48), weight.narrow(1, 0, 48), bias));
  EXPECT_FALSE(kernels::amx_linear_takes(x, weight.narrow(0, 0, 16), bias.narrow(0, 0, 16)));
  EXPECT_FALSE(kernels::amx_linear_takes(x, weight.to(torch::kBFloat16), bias));
  EXPECT_FALSE(kernels::amx_linear_takes(x, weight, {}));
  EXPECT_FALSE(kernels::amx_linear_takes(x.view({2, 4, 64}), weight, bias));
  EXPECT_EQ(kernels::amx_linear_takes(x, weight, bias), kernels::amx_linear_runs_here());
  {
    const AutocastStateGuard guard(testing::cpu_bf16_autocast());
    EXPECT_EQ(kernels::amx_linear_takes(x.to(torch::kFloat), weight, bias), kernels::amx_linear_runs_here());
  }
  const std::string message =
      testing::error_message([&] { kernels::amx_linear(x, weight.narrow(0, 0, 16), bias, true); });
  EXPECT_TRUE(testing::contains_all(
      message, {"amx_linear", kernels::amx_linear_runs_here() ? "[16, 64]" : "AMX-BF16"}))
      << message;
}

}  // namespace
}  // namespace fasttrain
