// fasttrain's own fp32 matmul, plain (tiled_matmul) and as gelu_mlp (the fc matmul with bias + tanh-GELU in
// its epilogue, the projection's input gradient with GELU's derivative in its), against the same sums in
// fp64: residual + proj(gelu_tanh(fc(x))) and the gradients of all six inputs, on every CPU capability this
// machine runs, at sizes that fill no register tile, row block or panel evenly, with fc's outputs reaching
// far out on both sides of the GELU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fasttrain/kernels/cpu.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::max_error;

struct MlpInputs {
  torch::Tensor x, fc_weight, fc_bias, proj_weight, proj_bias, residual;
};

struct MlpResult {
  torch::Tensor y;
  std::vector<torch::Tensor> grads;  // x, fc_weight, fc_bias, proj_weight, proj_bias, residual
};

// loss = sum(y * weights) in fp64, so every element's gradient differs.
template <typename Op>
MlpResult run_mlp(const MlpInputs& in, const torch::Tensor& weights, torch::ScalarType dtype, Op op) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : {in.x, in.fc_weight, in.fc_bias, in.proj_weight, in.proj_bias, in.residual})
    leaves.push_back(t.to(dtype).detach().requires_grad_(true));
  auto y = op(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5]);
  (y.to(torch::kDouble) * weights).sum().backward();
  MlpResult result{y.detach(), {}};
  for (const auto& leaf : leaves) result.grads.push_back(leaf.grad());
  return result;
}

torch::Tensor reference_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight,
                            const torch::Tensor& fc_bias, const torch::Tensor& proj_weight,
                            const torch::Tensor& proj_bias, const torch::Tensor& residual) {
  const auto h = torch::gelu(torch::matmul(x, fc_weight.t()) + fc_bias, "tanh");
  return residual + torch::matmul(h, proj_weight.t()) + proj_bias;
}

// x [rows..., channels] through hidden units; a few rows scaled so that fc's outputs reach |u| ~ 30.
MlpInputs mlp_inputs(std::vector<int64_t> shape, int64_t hidden) {
  const int64_t channels = shape.back();
  MlpInputs in;
  in.x = torch::randn(shape);
  in.x.view({-1, channels}).slice(0, 0, 2).mul_(12);
  in.fc_weight = torch::randn({hidden, channels}) / std::sqrt(static_cast<double>(channels));
  in.fc_bias = torch::randn({hidden});
  in.proj_weight = torch::randn({channels, hidden}) / std::sqrt(static_cast<double>(hidden));
  in.proj_bias = torch::randn({channels});
  in.residual = torch::randn(shape);
  return in;
}

const char* const kGradNames[] = {"grad x",           "grad fc_weight", "grad fc_bias",
                                  "grad proj_weight", "grad proj_bias", "grad residual"};

TEST(CpuGeluMlp, MatchesTheBlockInDoubleInValuesAndGradientsOnEveryCapability) {
  torch::manual_seed(0);
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
      {{37, 33}, 70}, {{3, 5, 24}, 100}, {{1, 17}, 29}, {{53, 128}, 512}};
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (const auto& [shape, hidden] : cases) {
      SCOPED_TRACE(::testing::Message() << kernels::to_string(capability) << " x " << c10::IntArrayRef(shape)
                                        << ", hidden " << hidden);
      const MlpInputs in = mlp_inputs(shape, hidden);
      const auto weights = torch::randn(shape, torch::kDouble);
      const MlpResult want = run_mlp(in, weights, torch::kDouble, reference_mlp);
      const MlpResult got =
          run_mlp(in, weights, torch::kFloat,
                  [&](const torch::Tensor& x, const torch::Tensor& fw, const torch::Tensor& fb,
                      const torch::Tensor& pw, const torch::Tensor& pb, const torch::Tensor& r) {
                    return kernels::gelu_mlp(x, fw, fb, pw, pb, r, capability);
                  });
      ASSERT_EQ(got.y.sizes(), want.y.sizes());
      ASSERT_EQ(got.y.scalar_type(), torch::kFloat);
      // fp32 sums of up to `hidden` products and a GELU within a few ulp: a fraction of a per mille of the
      // largest value. A missing term, a transposed operand or GELU's derivative off by a factor is O(1).
      testing::expect_close(got.y, want.y, 2e-5, "y");
      for (size_t i = 0; i < got.grads.size(); ++i) {
        ASSERT_TRUE(got.grads[i].defined()) << kGradNames[i];
        testing::expect_close(got.grads[i], want.grads[i], 2e-5, kGradNames[i]);
      }
      // The rows past the two far-out ones on their own scale, which those two set for the whole tensor.
      const int64_t rows = got.y.numel() / shape.back();
      if (rows > 2) {
        const auto ordinary = [&](const torch::Tensor& t) { return t.reshape({rows, -1}).slice(0, 2); };
        testing::expect_close(ordinary(got.y), ordinary(want.y), 2e-5, "y, ordinary rows");
        testing::expect_close(ordinary(got.grads[0]), ordinary(want.grads[0]), 2e-5, "grad x, ordinary rows");
      }
    }
  }
}

TEST(CpuGeluMlp, GivesGradientsOnlyWhereAskedAndTakesAnyStrides) {
  torch::manual_seed(1);
  const MlpInputs in = mlp_inputs({9, 12}, 40);
  const auto reference = [&](const std::vector<bool>& wanted, bool own) {
    std::vector<torch::Tensor> t;
    for (const auto& input : {in.x, in.fc_weight, in.fc_bias, in.proj_weight, in.proj_bias, in.residual})
      t.push_back(input.detach().requires_grad_(wanted[t.size()]));
    auto y = own ? kernels::gelu_mlp(t[0], t[1], t[2], t[3], t[4], t[5])
                 : reference_mlp(t[0], t[1], t[2], t[3], t[4], t[5]);
    y.pow(2).sum().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& leaf : t) grads.push_back(leaf.grad());
    return grads;
  };
  // Only the projection's (the GELU's backward skipped), only fc's weight and the projection's bias, only x.
  for (const std::vector<bool>& wanted :
       std::vector<std::vector<bool>>{{false, false, false, true, true, false},
                                      {false, true, false, false, true, false},
                                      {true, false, false, false, false, true}}) {
    const auto got = reference(wanted, true), want = reference(wanted, false);
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(kGradNames[i]);
      ASSERT_EQ(got[i].defined(), static_cast<bool>(wanted[i]));
      if (wanted[i]) testing::expect_close(got[i], want[i], 1e-4, kGradNames[i]);
    }
  }
  // x, a weight and the residual as transposed views: read by their strides, y contiguous.
  const auto x_t = in.x.t().contiguous().t(), residual_t = in.residual.t().contiguous().t();
  const auto fc_t = in.fc_weight.t().contiguous().t();
  ASSERT_FALSE(residual_t.is_contiguous());
  const auto y = kernels::gelu_mlp(x_t, fc_t, in.fc_bias, in.proj_weight, in.proj_bias, residual_t);
  testing::expect_close(
      y, reference_mlp(in.x, in.fc_weight, in.fc_bias, in.proj_weight, in.proj_bias, in.residual), 1e-5,
      "y of strided inputs");
}

// The plain product on every capability: a @ b and a @ weight^T against fp64, over row counts around the
// tile's 6 and the block's 24, depths 1 to 128 and widths around a vector and a panel.
TEST(CpuTiledMatmul, MatchesTheProductInDoubleOnEveryCapability) {
  torch::manual_seed(2);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (int64_t rows : {1, 5, 6, 7, 25, 53}) {
      for (int64_t depth : {1, 17, 128}) {
        for (int64_t width : {1, 15, 17, 64, 65, 130}) {
          for (bool transposed : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << kernels::to_string(capability) << " " << rows << " x " << depth << " @ " << width
                         << (transposed ? " transposed" : ""));
            const auto a = torch::randn({rows, depth});
            const auto b = transposed ? torch::randn({width, depth}) : torch::randn({depth, width});
            const auto want =
                a.to(torch::kDouble).mm(transposed ? b.t().to(torch::kDouble) : b.to(torch::kDouble));
            const auto got = kernels::tiled_matmul(a, b, transposed, capability);
            ASSERT_EQ(got.sizes(), want.sizes());
            // fp32 sums of `depth` products: within depth 2^-24 of the sum of their magnitudes.
            const auto bound =
                a.abs()
                    .to(torch::kDouble)
                    .mm(transposed ? b.t().abs().to(torch::kDouble) : b.abs().to(torch::kDouble));
            EXPECT_TRUE(((got.to(torch::kDouble) - want).abs() <= bound * (depth * 1.2e-7) + 1e-30)
                            .all()
                            .item<bool>());
          }
        }
      }
    }
  }
  const std::string message = testing::error_message([] {
    kernels::tiled_matmul(torch::randn({4, 8}), torch::randn({7, 3}), false);
  });
  EXPECT_TRUE(testing::contains_all(message, {"tiled_matmul takes", "a [4, 8] Float", "b [7, 3] Float"}))
      << message;
}

TEST(CpuGeluMlp, RefusesWhatItDoesNotTakeAndASecondDerivativeByName) {
  const MlpInputs in = mlp_inputs({4, 8}, 6);
  const auto takes = [](const MlpInputs& m) {
    return kernels::gelu_mlp_takes(m.x, m.fc_weight, m.fc_bias, m.proj_weight, m.proj_bias, m.residual);
  };
  EXPECT_TRUE(takes(in));
  for (int wrong = 0; wrong < 6; ++wrong) {
    SCOPED_TRACE(wrong);
    MlpInputs bad = in;
    if (wrong == 0) bad.x = in.x.to(torch::kBFloat16);
    if (wrong == 1) bad.fc_weight = torch::randn({6, 7});
    if (wrong == 2) bad.fc_bias = torch::randn({5});
    if (wrong == 3) bad.proj_weight = torch::randn({6, 8});
    if (wrong == 4) bad.proj_bias = torch::Tensor();
    if (wrong == 5) bad.residual = torch::randn({4, 6});
    EXPECT_FALSE(takes(bad));
  }
  {
    const AutocastStateGuard autocast(testing::cpu_bf16_autocast());  // the matmuls are autocast's bf16 ones
    EXPECT_FALSE(takes(in));
  }
  const std::string message = testing::error_message([&] {
    kernels::gelu_mlp(in.x, in.fc_weight, torch::randn({5}), in.proj_weight, in.proj_bias, in.residual);
  });
  EXPECT_TRUE(testing::contains_all(message, {"gelu_mlp takes", "x [4, 8] Float", "fc_bias [5] Float"}))
      << message;

  auto x = in.x.detach().requires_grad_(true);
  const auto y = kernels::gelu_mlp(x, in.fc_weight, in.fc_bias, in.proj_weight, in.proj_bias, in.residual);
  const std::string second = testing::second_derivative_error(y, x);
  EXPECT_TRUE(testing::contains_all(second, {"gelu_mlp", "not itself differentiable"})) << second;
}

}  // namespace
}  // namespace fasttrain
