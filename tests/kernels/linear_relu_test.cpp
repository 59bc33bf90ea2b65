// fasttrain's linear_relu (an fp32 Linear + ReLU whose backward multiplies only the gradients the ReLU
// passes) against the same sums in fp64, values and all three gradients, on every capability this CPU runs,
// by its sparse path and its dense one, at sizes that fill no vector and at the main job's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/precision/autocast.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::layer_gradients;
using testing::LayerGradients;

// Whole multiples of 1/8 in [-limit, limit] / 8: every product and sum below is exact in fp32, so fp32's
// sums in any order equal fp64's.
torch::Tensor eighths(std::vector<int64_t> sizes, int64_t limit) {
  return torch::randint(-limit, limit + 1, sizes).to(torch::kFloat) / 8;
}

struct Case {
  int64_t rows, inputs, outputs;
  double bias_shift;  // lower: fewer outputs pass the ReLU
};

TEST(LinearRelu, MatchesLinearThenReluInDoubleOnEveryCapabilityByBothPaths) {
  torch::manual_seed(0);
  for (const auto capability : kernels::runnable_cpu_capabilities()) {
    for (const Case& c : {Case{128, 1568, 256, -4}, Case{7, 37, 3, 0}, Case{33, 200, 64, -2},
                          Case{1, 5, 1, 1}, Case{20, 300, 9, -1}}) {
      for (const double sparse_up_to : {0.0, 1.0}) {
        SCOPED_TRACE(::testing::Message()
                     << kernels::to_string(capability) << " [" << c.rows << ", " << c.inputs << "] -> "
                     << c.outputs << ", sparse up to " << sparse_up_to);
        const auto x = eighths({c.rows, c.inputs}, 8), weight = eighths({c.outputs, c.inputs}, 2);
        const auto bias = eighths({c.outputs}, 8) + c.bias_shift;
        const auto weights = torch::randint(-4, 5, {c.rows, c.outputs}).to(torch::kDouble);
        const LayerGradients got =
            layer_gradients(x, weight, bias, weights, false, [&](auto& a, auto& w, auto& b) {
              return kernels::linear_relu(a, w, b, capability, sparse_up_to);
            });
        const auto xd = x.to(torch::kDouble), wd = weight.to(torch::kDouble), bd = bias.to(torch::kDouble);
        const auto z = xd.mm(wd.t()) + bd;
        const auto dz = weights * (z > 0).to(torch::kDouble);
        EXPECT_TRUE(torch::equal(got.y.to(torch::kDouble), z.relu()));
        EXPECT_TRUE(torch::equal(got.grad_x.to(torch::kDouble), dz.mm(wd))) << "grad x";
        EXPECT_TRUE(torch::equal(got.grad_weight.to(torch::kDouble), dz.t().mm(xd))) << "grad weight";
        EXPECT_TRUE(torch::equal(got.grad_bias.to(torch::kDouble), dz.sum(0))) << "grad bias";
        EXPECT_EQ(got.grad_x.scalar_type(), torch::kFloat);
        if (c.rows == 128) {  // the main job's case is what the sparse path is for: most of dz is zero
          EXPECT_LT((z > 0).to(torch::kDouble).mean().item<double>(), 0.3);
        }
      }
    }
  }
}

TEST(LinearRelu, AgreesWithATensLinearAndReluOnNormalValues) {
  torch::manual_seed(1);
  const auto x = torch::randn({64, 300}).relu(), weight = torch::randn({40, 300}) * 0.06;
  const auto bias = torch::randn({40}) * 0.1 - 0.2, weights = torch::randn({64, 40}, torch::kDouble);
  const LayerGradients own = layer_gradients(x, weight, bias, weights, false, [](auto& a, auto& w, auto& b) {
    return kernels::linear_relu(a, w, b);
  });
  const LayerGradients aten = layer_gradients(x, weight, bias, weights, false, [](auto& a, auto& w, auto& b) {
    return torch::linear(a, w, b).relu();
  });
  testing::expect_close(own.y, aten.y.to(torch::kDouble), 1e-5, "y");
  testing::expect_close(own.grad_x, aten.grad_x.to(torch::kDouble), 1e-5, "grad x");
  testing::expect_close(own.grad_weight, aten.grad_weight.to(torch::kDouble), 1e-5, "grad weight");
  testing::expect_close(own.grad_bias, aten.grad_bias.to(torch::kDouble), 1e-5, "grad bias");
}

TEST(LinearRelu, GivesTheWeightGradientsAloneWhereXTakesNone) {
  torch::manual_seed(2);
  const auto x = eighths({16, 40}, 8), weights = torch::randint(-4, 5, {16, 6}).to(torch::kDouble);
  auto weight = eighths({6, 40}, 2).requires_grad_(true), bias = (eighths({6}, 8) - 1).requires_grad_(true);
  (kernels::linear_relu(x, weight, bias, kernels::cpu_capability(), 1.0).to(torch::kDouble) * weights)
      .sum()
      .backward();
  const auto z =
      x.to(torch::kDouble).mm(weight.detach().to(torch::kDouble).t()) + bias.detach().to(torch::kDouble);
  const auto dz = weights * (z > 0).to(torch::kDouble);
  EXPECT_TRUE(torch::equal(weight.grad().to(torch::kDouble), dz.t().mm(x.to(torch::kDouble))));
  EXPECT_TRUE(torch::equal(bias.grad().to(torch::kDouble), dz.sum(0)));
}

// NaN and empty cases by the sparse path and the dense one, each against ATen's linear + relu: NaNs equal
// where ATen's are, every other value equal.
class LinearReluEdges : public ::testing::Test {
 protected:
  static bool same(const torch::Tensor& a, const torch::Tensor& b) {
    return torch::allclose(a, b, /*rtol=*/0, /*atol=*/0, /*equal_nan=*/true);
  }

  static void expect_atens(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                           const torch::Tensor& weights) {
    const LayerGradients aten =
        layer_gradients(x, weight, bias, weights, false,
                        [](auto& a, auto& w, auto& b) { return torch::linear(a, w, b).relu(); });
    for (const double sparse_up_to : {0.0, 1.0}) {
      SCOPED_TRACE(::testing::Message() << "sparse up to " << sparse_up_to);
      const LayerGradients own =
          layer_gradients(x, weight, bias, weights, false, [&](auto& a, auto& w, auto& b) {
            return kernels::linear_relu(a, w, b, kernels::cpu_capability(), sparse_up_to);
          });
      EXPECT_TRUE(same(own.y, aten.y)) << "y";
      EXPECT_TRUE(same(own.grad_x, aten.grad_x)) << "grad x";
      EXPECT_TRUE(same(own.grad_weight, aten.grad_weight)) << "grad weight";
      EXPECT_TRUE(same(own.grad_bias, aten.grad_bias)) << "grad bias";
    }
  }
};

// A NaN in y's gradient passes where the ReLU passes it (its row of x's gradient and its output's row of the
// weight's turn NaN) and stops where the ReLU stops it; the sparse path's mask keeps it (NaN != 0).
TEST_F(LinearReluEdges, ANaNGradientPassesWhereTheReluPassesIt) {
  torch::manual_seed(3);
  const auto x = eighths({12, 40}, 8), weight = eighths({6, 40}, 2), bias = eighths({6}, 8) - 1;
  const auto z = x.mm(weight.t()) + bias;
  const auto passed = (z > 0).nonzero(), stopped = (z <= 0).nonzero();
  ASSERT_GT(passed.size(0), 0);
  ASSERT_GT(stopped.size(0), 0);
  auto weights = torch::randint(-4, 5, {12, 6}).to(torch::kDouble);
  const int64_t row = passed[0][0].item<int64_t>(), output = passed[0][1].item<int64_t>();
  weights[row][output] = std::nan("");
  weights[stopped[0][0].item<int64_t>()][stopped[0][1].item<int64_t>()] = std::nan("");
  expect_atens(x, weight, bias, weights);
  const LayerGradients own = layer_gradients(x, weight, bias, weights, false, [](auto& a, auto& w, auto& b) {
    return kernels::linear_relu(a, w, b, kernels::cpu_capability(), 1.0);
  });
  EXPECT_TRUE(own.grad_x[row].isnan().all().item<bool>());
  EXPECT_EQ(own.grad_x.isnan().sum().item<int64_t>(), x.size(1)) << "only the NaN's row";
}

// A NaN in x makes its row of y NaN, which the ReLU passes (relu(NaN) is NaN, and ATen's backward passes dy
// where y is not <= 0): dy reaches x's gradient there, and the weight's gradient takes the NaN.
TEST_F(LinearReluEdges, ANaNOutputPassesItsGradientAsATensReluDoes) {
  torch::manual_seed(4);
  auto x = eighths({12, 40}, 8);
  x[5][7] = std::nan("");
  expect_atens(x, eighths({6, 40}, 2), eighths({6}, 8) - 1, torch::randint(1, 5, {12, 6}).to(torch::kDouble));
}

// Nothing passes the ReLU (every output below zero), or every gradient is zero: the sparse path's lists are
// empty and every gradient is zero.
TEST_F(LinearReluEdges, NoSurvivorsGiveZeroGradients) {
  torch::manual_seed(5);
  const auto x = eighths({9, 30}, 8), weight = eighths({5, 30}, 2);
  const auto weights = torch::randint(-4, 5, {9, 5}).to(torch::kDouble);
  expect_atens(x, weight, torch::full({5}, -1000.f), weights);
  expect_atens(x, weight, eighths({5}, 8), torch::zeros({9, 5}, torch::kDouble));
  const LayerGradients own =
      layer_gradients(x, weight, torch::full({5}, -1000.f), weights, false, [](auto& a, auto& w, auto& b) {
        return kernels::linear_relu(a, w, b, kernels::cpu_capability(), 1.0);
      });
  EXPECT_EQ(own.grad_x.count_nonzero().item<int64_t>(), 0);
  EXPECT_EQ(own.grad_weight.count_nonzero().item<int64_t>(), 0);
}

TEST(LinearRelu, RefusesASecondDerivativeByName) {
  auto x = torch::randn({4, 8}).requires_grad_(true);
  const auto y = kernels::linear_relu(x, torch::randn({3, 8}), torch::randn({3}));
  const std::string message = testing::second_derivative_error(y, x);
  EXPECT_TRUE(testing::contains_all(message, {"linear_relu", "not itself differentiable"})) << message;
}

TEST(LinearRelu, TakesOnlyWhatItComputesAndRefusesByName) {
  const auto x = torch::randn({8, 64}), weight = torch::randn({10, 64}), bias = torch::randn({10});
  EXPECT_TRUE(kernels::linear_relu_takes(x, weight, bias));
  // Never what it does not compute: bf16, fp32 under bf16 autocast (amx_linear's or ATen's), no bias, a 3-d
  // input, mismatched inputs.
  EXPECT_FALSE(kernels::linear_relu_takes(x.to(torch::kBFloat16), weight, bias));
  EXPECT_FALSE(kernels::linear_relu_takes(x, weight.to(torch::kBFloat16), bias));
  EXPECT_FALSE(kernels::linear_relu_takes(x, weight, {}));
  EXPECT_FALSE(kernels::linear_relu_takes(x.view({2, 4, 64}), weight, bias));
  EXPECT_FALSE(kernels::linear_relu_takes(x.narrow(1, 0, 32), weight, bias));
  {
    const AutocastStateGuard guard(testing::cpu_bf16_autocast());
    EXPECT_FALSE(kernels::linear_relu_takes(x, weight, bias));
  }
  std::string message =
      testing::error_message([&] { kernels::linear_relu(x, weight.narrow(1, 0, 32), bias); });
  EXPECT_TRUE(testing::contains_all(message, {"linear_relu", "[10, 32]", "[8, 64]"})) << message;
  message =
      testing::error_message([&] { kernels::linear_relu(x, weight, bias, kernels::cpu_capability(), 1.5); });
  EXPECT_TRUE(testing::contains_all(message, {"sparse_up_to", "1.5"})) << message;
}

}  // namespace
}  // namespace fasttrain
