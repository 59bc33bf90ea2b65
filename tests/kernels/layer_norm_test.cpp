// fasttrain's residual add + LayerNorm kernel against ATen's ops: values and gradients of x, the branch,
// weight and bias, in fp32 and bf16 (and y written in bf16 from fp32, as under autocast), on every
// CPU capability this machine runs, widths that fill no vector evenly; and the CUDA kernel the same way.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "fasttrain/kernels/cpu.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::expect_close;

// The absolute floor of every comparison: at width 1 every value is 0 and its gradients are rounding noise.
constexpr double kLayerNormFloor = 1e-9;

struct Grads {
  torch::Tensor sum, y, x, branch, weight, bias;
};

struct Dtypes {
  torch::ScalarType x, branch, y;
};

// Leaves for x, branch, weight, bias; loss = sum(y * wy) + sum(sum * ws) (ws undefined: the sum unused).
struct LayerNormInputs {
  torch::Tensor x, branch, weight, bias, wy, ws;
};

LayerNormInputs make_inputs(int64_t rows, int64_t width, const Dtypes& dtypes, bool branch, bool sum_used) {
  LayerNormInputs in;
  in.x = (3 * torch::randn({rows, width}) + 1).to(dtypes.x);
  if (branch) in.branch = torch::randn({rows, width}).to(dtypes.branch);
  in.weight = torch::randn({width});
  in.bias = torch::randn({width});
  in.wy = torch::randn({rows, width}, torch::kDouble);
  if (branch && sum_used) in.ws = torch::randn({rows, width}, torch::kDouble);
  return in;
}

// Runs `norm` on `device` (results back on the CPU).
template <typename Norm>
Grads run_layer_norm(const LayerNormInputs& in, torch::ScalarType as, Norm norm,
                     torch::Device device = torch::kCPU) {
  auto leaf = [&](const torch::Tensor& t) {
    return t.defined() ? t.detach()
                             .to(device, as == torch::kDouble ? torch::kDouble : t.scalar_type())
                             .requires_grad_(true)
                       : t;
  };
  auto x = leaf(in.x), branch = leaf(in.branch), weight = leaf(in.weight), bias = leaf(in.bias);
  auto [sum, y] = norm(x, branch, weight, bias);
  auto loss = (y.to(torch::kDouble) * in.wy.to(device)).sum();
  if (in.ws.defined()) loss = loss + (sum.to(torch::kDouble) * in.ws.to(device)).sum();
  loss.backward();
  const auto cpu = [](const torch::Tensor& t) { return t.defined() ? t.detach().cpu() : t; };
  return {cpu(sum),           cpu(y),
          cpu(x.grad()),      branch.defined() ? cpu(branch.grad()) : torch::Tensor(),
          cpu(weight.grad()), cpu(bias.grad())};
}

std::pair<torch::Tensor, torch::Tensor> aten_norm(const torch::Tensor& x, const torch::Tensor& branch,
                                                  const torch::Tensor& weight, const torch::Tensor& bias) {
  auto sum = branch.defined() ? x + branch : torch::Tensor();
  auto y = torch::layer_norm(branch.defined() ? sum : x, {x.size(-1)}, weight, bias, 1e-5);
  return {sum, y};
}

// x passed on by pass_layer_norm on `device`: loss = sum(y wy) + sum(x' ws), so x's gradient is ws plus the
// norm's. Values and every gradient against ATen's ops in double.
void expect_passes_x_on(const LayerNormInputs& in, torch::ScalarType y_dtype,
                        kernels::CpuCapability capability, torch::Device device, double tolerance,
                        const std::string& what) {
  const Grads want = run_layer_norm(in, torch::kDouble, [&](auto x, auto, auto w, auto bias) {
    return std::make_pair(x, aten_norm(x, torch::Tensor(), w, bias).second);
  });
  const Grads got = run_layer_norm(
      in, torch::kFloat,
      [&](auto x, auto, auto w, auto bias) {
        return kernels::pass_layer_norm(x, w, bias, 1e-5, y_dtype, capability);
      },
      device);
  EXPECT_TRUE(torch::equal(got.sum, in.x)) << what << " passed on";
  expect_close(got.y, want.y, tolerance, what + " pass y", kLayerNormFloor);
  expect_close(got.x, want.x, tolerance, what + " pass grad x", kLayerNormFloor);
  expect_close(got.weight, want.weight, tolerance, what + " pass grad weight", kLayerNormFloor);
  expect_close(got.bias, want.bias, tolerance, what + " pass grad bias", kLayerNormFloor);
}

// The kernel's outputs in the dtypes asked for, and within rounding of the reference: fp32 the arithmetic's,
// bf16 8 bits of mantissa in what is read and written.
void expect_matches(const Grads& got, const Grads& want, const Dtypes& dtypes, bool branch,
                    const std::string& what) {
  ASSERT_EQ(got.y.scalar_type(), dtypes.y) << what;
  ASSERT_EQ(got.x.scalar_type(), dtypes.x) << what;
  if (branch) {
    ASSERT_EQ(got.branch.scalar_type(), dtypes.branch) << what;
  }
  const bool any_bf16 = dtypes.x == torch::kBFloat16 || dtypes.y == torch::kBFloat16 ||
                        (branch && dtypes.branch == torch::kBFloat16);
  const double tolerance = any_bf16 ? 2e-2 : 5e-5;
  expect_close(got.sum, want.sum, tolerance, what + " sum", kLayerNormFloor);
  expect_close(got.y, want.y, tolerance, what + " y", kLayerNormFloor);
  expect_close(got.x, want.x, tolerance, what + " grad x", kLayerNormFloor);
  expect_close(got.branch, want.branch, tolerance, what + " grad branch", kLayerNormFloor);
  expect_close(got.weight, want.weight, tolerance, what + " grad weight", kLayerNormFloor);
  expect_close(got.bias, want.bias, tolerance, what + " grad bias", kLayerNormFloor);
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
            const LayerNormInputs in = make_inputs(37, width, dtypes, branch, sum_used);
            const std::string what = fmt::format(
                "{} x {} branch {} y {} width {}{}{}", kernels::to_string(capability),
                c10::toString(dtypes.x), branch ? c10::toString(dtypes.branch) : "none",
                c10::toString(dtypes.y), width, branch ? " add" : "", sum_used ? " sum used" : "");
            const Grads want = run_layer_norm(in, torch::kDouble, aten_norm);
            const Grads got = run_layer_norm(in, torch::kFloat, [&](auto x, auto b, auto w, auto bias) {
              if (!b.defined())
                return std::make_pair(torch::Tensor(),
                                      kernels::layer_norm(x, w, bias, 1e-5, dtypes.y, capability));
              return kernels::add_layer_norm(x, b, w, bias, 1e-5, dtypes.y, capability);
            });
            expect_matches(got, want, dtypes, branch, what);
          }
        }
      }
    }
  }
}

// Every dtype the kernel reads and writes, widths on each side of its register tiers (256, 512, 768,
// 1024: past them a row is read again each pass), rows over one and several partial sums of the
// parameters' gradients.
TEST(GpuLayerNorm, MatchesATenInValuesAndGradients_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Dtypes kDtypes[] = {{torch::kFloat, torch::kFloat, torch::kFloat},
                            {torch::kFloat, torch::kBFloat16, torch::kBFloat16},
                            {torch::kFloat, torch::kFloat, torch::kBFloat16},
                            {torch::kBFloat16, torch::kBFloat16, torch::kBFloat16},
                            {torch::kBFloat16, torch::kFloat, torch::kFloat}};
  for (const Dtypes& dtypes : kDtypes) {
    for (int64_t width : {1, 7, 33, 300, 768, 1000, 1500}) {
      for (int64_t rows : {37, 1000}) {
        for (bool branch : {false, true}) {
          for (bool sum_used : {false, true}) {
            if (!branch && sum_used) continue;
            torch::manual_seed(width + rows);
            const LayerNormInputs in = make_inputs(rows, width, dtypes, branch, sum_used);
            const std::string what =
                fmt::format("cuda x {} branch {} y {} rows {} width {}{}{}", c10::toString(dtypes.x),
                            branch ? c10::toString(dtypes.branch) : "none", c10::toString(dtypes.y), rows,
                            width, branch ? " add" : "", sum_used ? " sum used" : "");
            const Grads want = run_layer_norm(in, torch::kDouble, aten_norm);
            const Grads got = run_layer_norm(
                in, torch::kFloat,
                [&](auto x, auto b, auto w, auto bias) {
                  if (!b.defined())
                    return std::make_pair(torch::Tensor(), kernels::layer_norm(x, w, bias, 1e-5, dtypes.y));
                  return kernels::add_layer_norm(x, b, w, bias, 1e-5, dtypes.y);
                },
                torch::kCUDA);
            expect_matches(got, want, dtypes, branch, what);
          }
        }
      }
    }
  }
}

// x passed on by pass_layer_norm, its later gradient added inside the norm's backward on the GPU (the gpt's
// ln1): values and every gradient against ATen's ops in double.
TEST(GpuLayerNorm, PassesXOnWithItsGradient_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Dtypes kDtypes[] = {{torch::kFloat, torch::kFloat, torch::kFloat},
                            {torch::kFloat, torch::kBFloat16, torch::kBFloat16},
                            {torch::kBFloat16, torch::kBFloat16, torch::kBFloat16}};
  for (const Dtypes& dtypes : kDtypes) {
    for (int64_t width : {7, 768, 1000}) {
      torch::manual_seed(width);
      const LayerNormInputs in = make_inputs(1000, width, dtypes, /*branch=*/true, /*sum_used=*/true);
      const std::string what = fmt::format("cuda pass x {} y {} width {}", c10::toString(dtypes.x),
                                           c10::toString(dtypes.y), width);
      const double tolerance = dtypes.x == torch::kBFloat16 || dtypes.y == torch::kBFloat16 ? 2e-2 : 5e-5;
      expect_passes_x_on(in, dtypes.y, kernels::cpu_capability(), torch::kCUDA, tolerance, what);
    }
  }
}

// The CUDA kernel rounds as the CPU bodies do: the same fp32 inputs give the same values to fp32's last
// few bits (the sums run in another order), bf16 outputs within one bf16 step.
TEST(GpuLayerNorm, AgreesWithTheCpuKernel_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(5);
  const LayerNormInputs in =
      make_inputs(513, 768, {torch::kFloat, torch::kBFloat16, torch::kBFloat16}, true, true);
  const auto norm = [](auto x, auto b, auto w, auto bias) {
    return kernels::add_layer_norm(x, b, w, bias, 1e-5, torch::kBFloat16);
  };
  const Grads cpu = run_layer_norm(in, torch::kFloat, norm),
              gpu = run_layer_norm(in, torch::kFloat, norm, torch::kCUDA);
  EXPECT_TRUE(torch::equal(cpu.sum, gpu.sum));  // one rounding of the same two numbers
  expect_close(gpu.y, cpu.y, 1e-2, "y", kLayerNormFloor);
  expect_close(gpu.x, cpu.x, 1e-5, "grad x", kLayerNormFloor);
  expect_close(gpu.branch, cpu.branch, 1e-2, "grad branch", kLayerNormFloor);
  expect_close(gpu.weight, cpu.weight, 1e-4, "grad weight", kLayerNormFloor);
  expect_close(gpu.bias, cpu.bias, 1e-4, "grad bias", kLayerNormFloor);
}

// The Linear's bias the norm adds with the branch (the Linear run without it), and x passed on by
// pass_layer_norm with its later gradient added inside the norm's backward: values and every gradient
// against ATen's ops in double, on every capability, fp32 and autocast's dtypes, odd widths.
TEST(CpuLayerNorm, AddsTheBranchsBiasAndPassesXOnWithTheirGradients) {
  const Dtypes kDtypes[] = {{torch::kFloat, torch::kFloat, torch::kFloat},
                            {torch::kFloat, torch::kBFloat16, torch::kBFloat16},
                            {torch::kBFloat16, torch::kBFloat16, torch::kBFloat16}};
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (const Dtypes& dtypes : kDtypes) {
      for (int64_t width : {7, 33, 128}) {
        torch::manual_seed(width);
        const LayerNormInputs in = make_inputs(37, width, dtypes, /*branch=*/true, /*sum_used=*/true);
        const torch::Tensor branch_bias = torch::randn({width});
        const auto what = [&](const char* which) {
          return fmt::format("{} {} x {} branch {} y {} width {}", which, kernels::to_string(capability),
                             c10::toString(dtypes.x), c10::toString(dtypes.branch), c10::toString(dtypes.y),
                             width);
        };
        // The branch's bias: a leaf beside the others, whose gradient the reference's autograd sums too.
        torch::Tensor bias_want = branch_bias.to(torch::kDouble).requires_grad_(true);
        const Grads want = run_layer_norm(in, torch::kDouble, [&](auto x, auto b, auto w, auto bias) {
          return aten_norm(x, b + bias_want, w, bias);
        });
        torch::Tensor bias_got = branch_bias.clone().requires_grad_(true);
        const Grads got = run_layer_norm(in, torch::kFloat, [&](auto x, auto b, auto w, auto bias) {
          return kernels::add_layer_norm(x, b, w, bias, 1e-5, dtypes.y, capability, bias_got);
        });
        expect_matches(got, want, dtypes, /*branch=*/true, what("branch bias"));
        const double tolerance =
            dtypes.x == torch::kBFloat16 || dtypes.branch == torch::kBFloat16 ? 2e-2 : 5e-5;
        expect_close(bias_got.grad(), bias_want.grad(), tolerance, what("branch bias grad"), kLayerNormFloor);

        expect_passes_x_on(in, dtypes.y, capability, torch::kCPU, tolerance, what("x"));
      }
    }
  }
}

TEST(CpuLayerNorm, RefusesABranchBiasItCannotAdd) {
  const auto x = torch::zeros({4, 8}), branch = torch::zeros({4, 8}), w = torch::ones({8}),
             b = torch::zeros({8});
  for (const torch::Tensor& wrong : {torch::zeros({7}), torch::zeros({8}, torch::kDouble)}) {
    const std::string message = testing::error_message([&] {
      kernels::add_layer_norm(x, branch, w, b, 1e-5, torch::kFloat, kernels::cpu_capability(), wrong);
    });
    EXPECT_TRUE(testing::contains_all(message, {"branch_bias", "fp32 [C] = [8]"})) << message;
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
