// fasttrain's cuBLASLt MLP and linear (kernels::gpu_mlp, gpu_linear) against ATen's ops: values and gradients
// of x, the parameters and the MLP's residual, under bf16 autocast on the GPU, with x in fp32 (ATen's
// LayerNorm before it) and in bf16 (fasttrain's), against fp64 on the CPU and against ATen's own bf16 run on
// the GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <optional>

#include "fasttrain/kernels/gpu.h"
#include "fasttrain/precision/autocast.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::expect_close;

// bf16 autocast on `device` for a scope (the header-only guard: the kernels' tests link no precision/).
AutocastState bf16_autocast(torch::Device device) {
  AutocastState state = AutocastState::current();
  if (device.is_cuda()) {
    state.cuda_enabled = true, state.cuda_dtype = torch::kBFloat16;
  } else {
    state.cpu_enabled = true, state.cpu_dtype = torch::kBFloat16;
  }
  return state;
}

struct MlpParameters {
  torch::Tensor fc_weight, fc_bias, proj_weight, proj_bias;
};

struct MlpRun {
  torch::Tensor y, x, fc_weight, fc_bias, proj_weight, proj_bias;  // the output and the gradients, on the CPU
  torch::Tensor residual;                                          // its gradient, where there was one
};

// loss = sum(y * wy) in fp64 through `mlp` on `device`, under bf16 autocast where `bf16`.
// `residual_in` may be undefined (the MLP alone).
template <typename Mlp>
MlpRun run_mlp(const torch::Tensor& x_in, const MlpParameters& p, const torch::Tensor& residual_in,
               const torch::Tensor& wy, torch::Device device, torch::ScalarType as, bool bf16, Mlp mlp) {
  const auto leaf = [&](const torch::Tensor& t, torch::ScalarType dtype) {
    return t.detach().to(device, dtype).requires_grad_(true);
  };
  const auto parameter_dtype = as == torch::kDouble ? torch::kDouble : torch::kFloat;
  auto x = leaf(x_in, as == torch::kDouble ? torch::kDouble : x_in.scalar_type());
  auto fc_weight = leaf(p.fc_weight, parameter_dtype), fc_bias = leaf(p.fc_bias, parameter_dtype);
  auto proj_weight = leaf(p.proj_weight, parameter_dtype), proj_bias = leaf(p.proj_bias, parameter_dtype);
  torch::Tensor residual;
  if (residual_in.defined())
    residual = leaf(residual_in, as == torch::kDouble ? torch::kDouble : residual_in.scalar_type());
  torch::Tensor y;
  {
    std::optional<AutocastStateGuard> autocast;
    if (bf16) autocast.emplace(bf16_autocast(device));
    y = mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, residual);
  }
  (y.to(torch::kDouble) * wy.to(device)).sum().backward();
  const auto cpu = [](const torch::Tensor& t) { return t.detach().cpu(); };
  return {cpu(y),
          cpu(x.grad()),
          cpu(fc_weight.grad()),
          cpu(fc_bias.grad()),
          cpu(proj_weight.grad()),
          cpu(proj_bias.grad()),
          residual.defined() ? cpu(residual.grad()) : torch::Tensor()};
}

torch::Tensor aten_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                       const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                       const torch::Tensor& residual) {
  const auto y =
      torch::linear(torch::gelu(torch::linear(x, fc_weight, fc_bias), "tanh"), proj_weight, proj_bias);
  return residual.defined() ? residual + y : y;
}

void expect_all_close(const MlpRun& got, const MlpRun& want, double tolerance, const std::string& what) {
  expect_close(got.y, want.y, tolerance, what + " y");
  expect_close(got.x, want.x, tolerance, what + " grad x");
  expect_close(got.fc_weight, want.fc_weight, tolerance, what + " grad fc weight");
  expect_close(got.fc_bias, want.fc_bias, tolerance, what + " grad fc bias");
  expect_close(got.proj_weight, want.proj_weight, tolerance, what + " grad proj weight");
  expect_close(got.proj_bias, want.proj_bias, tolerance, what + " grad proj bias");
  if (want.residual.defined()) expect_close(got.residual, want.residual, tolerance, what + " grad residual");
}

TEST(GpuMlp, MatchesATenInValuesAndGradients_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int64_t batch, length, width, hidden;
  };
  // The gpt's 768 x 3072; a hidden width past 256 columns and not a multiple of them, over rows that
  // GELU's backward sums in several partials; small and odd ones.
  for (const Shape& s :
       {Shape{3, 37, 64, 256}, Shape{2, 256, 768, 3072}, Shape{2, 300, 64, 1000}, Shape{1, 5, 8, 24}}) {
    for (auto x_dtype : {torch::kFloat, torch::kBFloat16}) {
      // Without a residual, and with one in fp32 (the residual stream's under autocast, beside a bf16 x from
      // fasttrain's norm) or bf16, which the last matmul adds and writes in its dtype.
      for (const std::optional<torch::ScalarType> residual_dtype :
           {std::optional<torch::ScalarType>(), std::optional(torch::kFloat),
            std::optional(torch::kBFloat16)}) {
        const bool with_residual = residual_dtype.has_value();
        const std::string what = fmt::format("x [{}, {}, {}] {}, hidden {}, residual {}", s.batch, s.length,
                                             s.width, c10::toString(x_dtype), s.hidden,
                                             with_residual ? c10::toString(*residual_dtype) : "none");
        torch::manual_seed(s.width + s.length);
        const torch::Tensor x = torch::randn({s.batch, s.length, s.width}).to(x_dtype);
        const double fc_scale = 2.0 / std::sqrt(static_cast<double>(s.width));  // pre-activations of about 2
        const MlpParameters p{fc_scale * torch::randn({s.hidden, s.width}), torch::randn({s.hidden}),
                              torch::randn({s.width, s.hidden}) / std::sqrt(static_cast<double>(s.hidden)),
                              torch::randn({s.width})};
        const torch::Tensor residual =
            with_residual ? torch::randn({s.batch, s.length, s.width}).to(*residual_dtype) : torch::Tensor();
        const torch::Tensor wy = torch::randn({s.batch, s.length, s.width}, torch::kDouble);
        const MlpRun want = run_mlp(x, p, residual, wy, torch::kCPU, torch::kDouble, false, aten_mlp);
        const MlpRun aten = run_mlp(x, p, residual, wy, torch::kCUDA, torch::kFloat, true, aten_mlp);
        const MlpRun mine = run_mlp(x, p, residual, wy, torch::kCUDA, torch::kFloat, true,
                                    [](auto... args) { return kernels::gpu_mlp(args...); });
        // As autocast's Linear returns, or ATen's residual + Linear.
        ASSERT_EQ(mine.y.scalar_type(), with_residual ? *residual_dtype : torch::kBFloat16) << what;
        ASSERT_EQ(mine.x.scalar_type(), x_dtype) << what;
        ASSERT_EQ(mine.fc_weight.scalar_type(), torch::kFloat) << what;
        if (with_residual) {
          ASSERT_EQ(mine.residual.scalar_type(), *residual_dtype) << what;
        }
        // bf16's 8 bits in the inputs, the pre-activation and the activation: ATen's bf16 run is as far off.
        expect_all_close(aten, want, 3e-2, what + " (ATen bf16 against fp64)");
        expect_all_close(mine, want, 3e-2, what + " (gpu_mlp against fp64)");
      }
    }
  }
}

TEST(GpuMlp, TakesOnlyWhatItComputes) {
  const auto x = torch::zeros({4, 16}), fc_w = torch::zeros({32, 16}), fc_b = torch::zeros({32});
  const auto proj_w = torch::zeros({16, 32}), proj_b = torch::zeros({16});
  EXPECT_FALSE(kernels::gpu_mlp_takes(x, fc_w, fc_b, proj_w, proj_b));  // the CPU
  const std::string message =
      testing::error_message([&] { kernels::gpu_mlp(x, fc_w, fc_b, proj_w, proj_b); });
  EXPECT_TRUE(testing::contains_all(message, {"gpu_mlp", "CUDA", "[4, 16]"})) << message;
  if (!torch::cuda::is_available()) return;
  const auto cuda = [](const torch::Tensor& t) { return t.to(torch::kCUDA); };
  {
    const AutocastStateGuard autocast(bf16_autocast(torch::kCUDA));
    EXPECT_TRUE(kernels::gpu_mlp_takes(cuda(x), cuda(fc_w), cuda(fc_b), cuda(proj_w), cuda(proj_b)));
    EXPECT_FALSE(kernels::gpu_mlp_takes(cuda(torch::zeros({4, 12})), cuda(torch::zeros({32, 12})), cuda(fc_b),
                                        cuda(torch::zeros({12, 32})), cuda(torch::zeros({12}))));  // 12 % 8
    EXPECT_FALSE(kernels::gpu_mlp_takes(cuda(x), fc_w, fc_b, proj_w, proj_b));  // parameters elsewhere
    EXPECT_FALSE(
        kernels::gpu_mlp_takes(cuda(x), cuda(fc_w), cuda(fc_b), cuda(fc_w), cuda(proj_b)));  // shapes
    EXPECT_TRUE(kernels::gpu_mlp_takes(cuda(x), cuda(fc_w), cuda(fc_b), cuda(proj_w), cuda(proj_b), cuda(x)));
    EXPECT_FALSE(kernels::gpu_mlp_takes(cuda(x), cuda(fc_w), cuda(fc_b), cuda(proj_w), cuda(proj_b),
                                        cuda(torch::zeros({2, 16}))));  // a residual of other sizes
    EXPECT_FALSE(
        kernels::gpu_mlp_takes(cuda(x), cuda(fc_w), cuda(fc_b), cuda(proj_w), cuda(proj_b), x));  // elsewhere
    const std::string residual_message = testing::error_message([&] {
      kernels::gpu_mlp(cuda(x), cuda(fc_w), cuda(fc_b), cuda(proj_w), cuda(proj_b),
                       cuda(torch::zeros({2, 16})));
    });
    EXPECT_TRUE(testing::contains_all(residual_message, {"gpu_mlp", "residual [2, 16]"})) << residual_message;
  }
  EXPECT_FALSE(kernels::gpu_mlp_takes(cuda(x), cuda(fc_w), cuda(fc_b), cuda(proj_w), cuda(proj_b)));  // fp32
  EXPECT_TRUE(kernels::gpu_mlp_takes(cuda(x).to(torch::kBFloat16), cuda(fc_w), cuda(fc_b), cuda(proj_w),
                                     cuda(proj_b)));  // bf16 itself
}

// loss = sum(y * wy) in fp64 through `linear` on `device`, under bf16 autocast where `bf16`: y and the
// gradients of x, weight and bias, on the CPU.
template <typename Linear>
std::vector<torch::Tensor> run_linear(const torch::Tensor& x_in, const torch::Tensor& weight_in,
                                      const torch::Tensor& bias_in, const torch::Tensor& wy,
                                      torch::Device device, bool bf16, Linear linear) {
  const bool reference = !bf16;
  const auto leaf = [&](const torch::Tensor& t, torch::ScalarType dtype) {
    return t.detach().to(device, reference ? torch::kDouble : dtype).requires_grad_(true);
  };
  auto x = leaf(x_in, x_in.scalar_type()), weight = leaf(weight_in, torch::kFloat),
       bias = leaf(bias_in, torch::kFloat);
  torch::Tensor y;
  {
    std::optional<AutocastStateGuard> autocast;
    if (bf16) autocast.emplace(bf16_autocast(device));
    y = linear(x, weight, bias);
  }
  (y.to(torch::kDouble) * wy.to(device)).sum().backward();
  return {y.detach().cpu(), x.grad().cpu(), weight.grad().cpu(), bias.grad().cpu()};
}

TEST(GpuLinear, MatchesATenInValuesAndGradients_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int64_t batch, length, in, out;
  };
  // The gpt's qkv (768 -> 2304) and attention projection shapes, a small one and one of a single row.
  for (const Shape& s : {Shape{2, 256, 768, 2304}, Shape{3, 37, 64, 64}, Shape{1, 1, 8, 24}}) {
    for (auto x_dtype : {torch::kFloat, torch::kBFloat16}) {
      const std::string what =
          fmt::format("x [{}, {}, {}] {} -> {}", s.batch, s.length, s.in, c10::toString(x_dtype), s.out);
      torch::manual_seed(s.in + s.out);
      const torch::Tensor x = torch::randn({s.batch, s.length, s.in}).to(x_dtype);
      const torch::Tensor weight = torch::randn({s.out, s.in}) / std::sqrt(static_cast<double>(s.in));
      const torch::Tensor bias = torch::randn({s.out});
      const torch::Tensor wy = torch::randn({s.batch, s.length, s.out}, torch::kDouble);
      const auto aten_linear = [](auto... args) { return torch::linear(args...); };
      const auto want = run_linear(x, weight, bias, wy, torch::kCPU, false, aten_linear);
      const auto aten = run_linear(x, weight, bias, wy, torch::kCUDA, true, aten_linear);
      const auto mine = run_linear(x, weight, bias, wy, torch::kCUDA, true,
                                   [](auto... args) { return kernels::gpu_linear(args...); });
      ASSERT_EQ(mine[0].scalar_type(), torch::kBFloat16) << what;  // as autocast's Linear returns
      ASSERT_EQ(mine[1].scalar_type(), x_dtype) << what;
      ASSERT_EQ(mine[2].scalar_type(), torch::kFloat) << what;
      const char* names[] = {" y", " grad x", " grad weight", " grad bias"};
      for (int i = 0; i < 4; ++i) {
        expect_close(aten[i], want[i], 3e-2, what + names[i] + " (ATen bf16 against fp64)");
        expect_close(mine[i], want[i], 3e-2, what + names[i] + " (gpu_linear against fp64)");
      }
    }
  }
}

TEST(GpuLinear, TakesOnlyWhatItComputes) {
  const auto x = torch::zeros({4, 16}), weight = torch::zeros({32, 16}), bias = torch::zeros({32});
  EXPECT_FALSE(kernels::gpu_linear_takes(x, weight, bias));  // the CPU
  const std::string message = testing::error_message([&] { kernels::gpu_linear(x, weight, bias); });
  EXPECT_TRUE(testing::contains_all(message, {"gpu_linear", "CUDA", "[4, 16]", "[32, 16]"})) << message;
  if (!torch::cuda::is_available()) return;
  const auto cuda = [](const torch::Tensor& t) { return t.to(torch::kCUDA); };
  const auto x_bf16 = cuda(x).to(torch::kBFloat16);
  EXPECT_TRUE(kernels::gpu_linear_takes(x_bf16, cuda(weight), cuda(bias)));
  EXPECT_FALSE(kernels::gpu_linear_takes(cuda(x), cuda(weight), cuda(bias)));  // fp32
  EXPECT_FALSE(kernels::gpu_linear_takes(x_bf16, cuda(weight), {}));           // no bias
  EXPECT_FALSE(
      kernels::gpu_linear_takes(x_bf16, cuda(torch::zeros({12, 16})), cuda(torch::zeros({12}))));  // 12 % 8
  EXPECT_FALSE(kernels::gpu_linear_takes(x_bf16, cuda(weight), cuda(torch::zeros({16}))));  // bias size
  EXPECT_FALSE(kernels::gpu_linear_takes(x_bf16, weight, bias));                            // elsewhere
}

}  // namespace
}  // namespace fasttrain
