// fasttrain's residual add + LayerNorm kernel against ATen's ops: values and gradients of x, the branch,
// weight and bias, in fp32 and bf16 (and y written in bf16 from fp32, as under autocast), on every
// CPU capability this machine runs, widths that fill no vector evenly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/kernels/cpu.h"
#include "support.h"

namespace fasttrain {
namespace {

struct Grads {
  torch::Tensor sum, y, x, branch, weight, bias;
};

struct Dtypes {
  torch::ScalarType x, branch, y;
};

// Leaves for x, branch, weight, bias; loss = sum(y * wy) + sum(sum * ws) (ws undefined: the sum unused).
struct Inputs {
  torch::Tensor x, branch, weight, bias, wy, ws;
};

Inputs make_inputs(int64_t rows, int64_t width, const Dtypes& dtypes, bool branch, bool sum_used) {
  Inputs in;
  in.x = (3 * torch::randn({rows, width}) + 1).to(dtypes.x);
  if (branch) in.branch = torch::randn({rows, width}).to(dtypes.branch);
  in.weight = torch::randn({width});
  in.bias = torch::randn({width});
  in.wy = torch::randn({rows, width}, torch::kDouble);
  if (branch && sum_used) in.ws = torch::randn({rows, width}, torch::kDouble);
  return in;
}

template <typename Norm>
Grads run(const Inputs& in, torch::ScalarType as, Norm norm) {
  auto leaf = [&](const torch::Tensor& t) {
    return t.defined()
               ? t.detach().to(as == torch::kDouble ? torch::kDouble : t.scalar_type()).requires_grad_(true)
               : t;
  };
  auto x = leaf(in.x), branch = leaf(in.branch), weight = leaf(in.weight), bias = leaf(in.bias);
  auto [sum, y] = norm(x, branch, weight, bias);
  auto loss = (y.to(torch::kDouble) * in.wy).sum();
  if (in.ws.defined()) loss = loss + (sum.to(torch::kDouble) * in.ws).sum();
  loss.backward();
  return {sum.defined() ? sum.detach() : sum,
          y.detach(),
          x.grad(),
          branch.defined() ? branch.grad() : torch::Tensor(),
          weight.grad(),
          bias.grad()};
}

std::pair<torch::Tensor, torch::Tensor> aten_norm(const torch::Tensor& x, const torch::Tensor& branch,
                                                  const torch::Tensor& weight, const torch::Tensor& bias) {
  auto sum = branch.defined() ? x + branch : torch::Tensor();
  auto y = torch::layer_norm(branch.defined() ? sum : x, {x.size(-1)}, weight, bias, 1e-5);
  return {sum, y};
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!got.defined()) return;
  const double error = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
  // Plus a floor: at width 1 every value is 0 and its gradients are rounding noise.
  const double scale = want.to(torch::kDouble).abs().max().item<double>();
  EXPECT_LE(error, tolerance * scale + 1e-9)
      << what << ": max |error| " << error << " of max |value| " << scale;
}

TEST(CpuLayerNorm, MatchesATenInValuesAndGradientsOnEveryCapability) {
  const Dtypes kDtypes[] = {
      {torch::kFloat, torch::kFloat, torch::kFloat},
      {torch::kFloat, torch::kBFloat16, torch::kBFloat16},  // autocast's residual stream
      {torch::kBFloat16, torch::kBFloat16, torch::kBFloat16}};
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (const Dtypes& dtypes : kDtypes) {
      for (int64_t width : {1, 7, 16, 33, 128}) {
        for (bool branch : {false, true}) {
          for (bool sum_used : {false, true}) {
            if (!branch && sum_used) continue;
            torch::manual_seed(width);
            const Inputs in = make_inputs(37, width, dtypes, branch, sum_used);
            const std::string what = fmt::format(
                "{} x {} branch {} y {} width {}{}{}", kernels::to_string(capability),
                c10::toString(dtypes.x), branch ? c10::toString(dtypes.branch) : "none",
                c10::toString(dtypes.y), width, branch ? " add" : "", sum_used ? " sum used" : "");
            const Grads want = run(in, torch::kDouble, aten_norm);
            const Grads got = run(in, torch::kFloat, [&](auto x, auto b, auto w, auto bias) {
              if (!b.defined())
                return std::make_pair(torch::Tensor(),
                                      kernels::layer_norm(x, w, bias, 1e-5, dtypes.y, capability));
              return kernels::add_layer_norm(x, b, w, bias, 1e-5, dtypes.y, capability);
            });
            ASSERT_EQ(got.y.scalar_type(), dtypes.y) << what;
            ASSERT_EQ(got.x.scalar_type(), dtypes.x) << what;
            const bool any_bf16 = dtypes.x == torch::kBFloat16 || dtypes.y == torch::kBFloat16 ||
                                  (branch && dtypes.branch == torch::kBFloat16);
            // fp32: the arithmetic's rounding; bf16: 8 bits of mantissa in what is read and written.
            const double tolerance = any_bf16 ? 2e-2 : 5e-5;
            expect_close(got.sum, want.sum, tolerance, what + " sum");
            expect_close(got.y, want.y, tolerance, what + " y");
            expect_close(got.x, want.x, tolerance, what + " grad x");
            expect_close(got.branch, want.branch, tolerance, what + " grad branch");
            expect_close(got.weight, want.weight, tolerance, what + " grad weight");
            expect_close(got.bias, want.bias, tolerance, what + " grad bias");
          }
        }
      }
    }
  }
}

TEST(CpuLayerNorm, TakesOnlyWhatItComputes) {
  const auto x = torch::zeros({4, 8}), w = torch::ones({8}), b = torch::zeros({8});
  EXPECT_TRUE(kernels::layer_norm_takes(x, torch::Tensor(), w, b));
  EXPECT_TRUE(kernels::layer_norm_takes(x, torch::zeros({4, 8}, torch::kBFloat16), w, b));
  EXPECT_FALSE(kernels::layer_norm_takes(x.to(torch::kDouble), torch::Tensor(), w, b));
  EXPECT_FALSE(kernels::layer_norm_takes(x, torch::zeros({4, 7}), w, b));
  EXPECT_FALSE(kernels::layer_norm_takes(x, torch::Tensor(), torch::ones({7}), b));
  EXPECT_FALSE(kernels::layer_norm_takes(x, torch::Tensor(), w.to(torch::kBFloat16), b));
  const std::string message =
      testing::error_message([&] { kernels::layer_norm(x, torch::ones({7}), b, 1e-5, torch::kFloat); });
  EXPECT_TRUE(testing::contains_all(message, {"layer_norm", "weight [7]"})) << message;
  const std::string dtype = testing::error_message([&] { kernels::layer_norm(x, w, b, 1e-5, torch::kHalf); });
  EXPECT_TRUE(testing::contains_all(dtype, {"fp32 or bf16", "Half"})) << dtype;
}

TEST(CpuLayerNorm, RowsAreIndependentOfEachOtherAndOfTheThreadCount) {
  torch::manual_seed(3);
  auto x = torch::randn({301, 96}), branch = torch::randn({301, 96});
  auto w = torch::randn({96}), b = torch::randn({96});
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  auto [sum1, y1] = kernels::add_layer_norm(x, branch, w, b, 1e-5, torch::kFloat);
  torch::set_num_threads(2);
  auto [sum2, y2] = kernels::add_layer_norm(x, branch, w, b, 1e-5, torch::kFloat);
  torch::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(y1, y2));
  EXPECT_TRUE(torch::equal(sum1, sum2));
  auto [sum_row, y_row] =
      kernels::add_layer_norm(x.slice(0, 100, 101), branch.slice(0, 100, 101), w, b, 1e-5, torch::kFloat);
  EXPECT_TRUE(torch::equal(y_row, y1.slice(0, 100, 101)));
}

}  // namespace
}  // namespace fasttrain
