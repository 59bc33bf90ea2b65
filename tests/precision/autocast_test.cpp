#include "fasttrain/precision/autocast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/hardware.h"

namespace fasttrain {
namespace {

const torch::Device kCpu(torch::kCPU);

// The autocast nesting depth of this thread, read without changing it.
int nesting_depth() {
  int depth = at::autocast::increment_nesting() - 1;
  at::autocast::decrement_nesting();
  return depth;
}

bool cpu_autocast_on() {
  return compat::autocast_enabled(c10::DeviceType::CPU);
}

TEST(ParsePrecision, NamesMapToDtypes) {
  EXPECT_EQ(parse_precision("fp32", kCpu), torch::kFloat);
  EXPECT_EQ(parse_precision("bf16", kCpu), torch::kBFloat16);
  torch::Device cuda(torch::kCUDA, 0);  // only the type matters: no CUDA needed
  EXPECT_EQ(parse_precision("fp16", cuda), torch::kHalf);
  EXPECT_EQ(parse_precision("bf16", cuda), torch::kBFloat16);
  EXPECT_EQ(precision_name(torch::kHalf), "fp16");
  EXPECT_EQ(precision_name(parse_precision("bf16", kCpu)), "bf16");
  EXPECT_THROW(precision_name(torch::kDouble), Error);
  // "auto" is the run layer's to resolve (run/auto.h): the library takes dtypes.
  EXPECT_THROW(parse_precision("auto", kCpu), ConfigError);
  check_precision(torch::kBFloat16, kCpu);
  EXPECT_THROW(check_precision(torch::kHalf, kCpu), ConfigError);
  EXPECT_THROW(check_precision(torch::kDouble, kCpu), ConfigError);
}

TEST(ParsePrecision, ErrorsNameKeyValueAndChoices) {
  try {
    parse_precision("fp8", kCpu);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("train.precision"), std::string::npos) << message;
    EXPECT_NE(message.find("'fp8'"), std::string::npos) << message;
    EXPECT_NE(message.find("fp32, bf16, fp16"), std::string::npos) << message;
  }
  try {
    parse_precision("fp16", kCpu);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("train.precision"), std::string::npos) << message;
    EXPECT_NE(message.find("use bf16"), std::string::npos) << message;
  }
}

TEST(AutocastGuard, LinearMatmulConvRunInBf16InsideAndFp32Outside) {
  torch::manual_seed(0);
  torch::nn::Linear linear(16, 8);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3));
  torch::Tensor x = torch::randn({4, 16});
  torch::Tensor image = torch::randn({2, 3, 8, 8});
  torch::Tensor target = torch::randn({4, 8});
  {
    AutocastGuard autocast(kCpu, torch::kBFloat16);
    EXPECT_TRUE(autocast.active());
    EXPECT_TRUE(cpu_autocast_on());
    torch::Tensor y = linear->forward(x);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(torch::matmul(x, x.t()).scalar_type(), torch::kBFloat16);
    EXPECT_EQ(torch::mm(x, x.t()).scalar_type(), torch::kBFloat16);
    EXPECT_EQ(conv->forward(image).scalar_type(), torch::kBFloat16);
    // Parameters stay fp32: autocast casts per op.
    EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat);
    // Losses run in fp32 (CPU autocast's fp32 list).
    EXPECT_EQ(torch::mse_loss(y, target).scalar_type(), torch::kFloat);
  }
  EXPECT_FALSE(cpu_autocast_on());
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(conv->forward(image).scalar_type(), torch::kFloat);
  EXPECT_EQ(torch::matmul(x, x.t()).scalar_type(), torch::kFloat);
}

TEST(AutocastGuard, BackwardGivesFp32GradientsToFp32Parameters) {
  torch::manual_seed(0);
  torch::nn::Linear linear(16, 8);
  torch::Tensor loss;
  {
    AutocastGuard autocast(kCpu, torch::kBFloat16);
    loss = linear->forward(torch::randn({4, 16})).to(torch::kFloat).pow(2).mean();
  }
  loss.backward();
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::isfinite(linear->weight.grad()).all().item<bool>());
}

TEST(AutocastGuard, NestingRestoresStateAndDepth) {
  ASSERT_FALSE(cpu_autocast_on());
  ASSERT_EQ(nesting_depth(), 0);
  {
    AutocastGuard outer(kCpu, torch::kBFloat16);
    EXPECT_EQ(nesting_depth(), 1);
    {
      AutocastGuard inner(kCpu, torch::kBFloat16);
      EXPECT_EQ(nesting_depth(), 2);
      EXPECT_TRUE(cpu_autocast_on());
    }
    EXPECT_EQ(nesting_depth(), 1);
    EXPECT_TRUE(cpu_autocast_on());
    EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(nesting_depth(), 0);
  EXPECT_FALSE(cpu_autocast_on());
}

TEST(AutocastGuard, RestoresPreviousCudaFlagAndDtype) {
  // The CUDA autocast state is a thread-local flag: it can be set and checked without a GPU.
  AutocastState before = AutocastState::current();
  compat::set_autocast_dtype(c10::DeviceType::CUDA, torch::kBFloat16);
  compat::set_autocast_enabled(c10::DeviceType::CUDA, false);
  {
    AutocastGuard autocast(torch::Device(torch::kCUDA, 0), torch::kHalf);
    EXPECT_TRUE(compat::autocast_enabled(c10::DeviceType::CUDA));
    EXPECT_EQ(compat::autocast_dtype(c10::DeviceType::CUDA), torch::kHalf);
    EXPECT_FALSE(cpu_autocast_on());  // the other device type is untouched
  }
  EXPECT_FALSE(compat::autocast_enabled(c10::DeviceType::CUDA));
  EXPECT_EQ(compat::autocast_dtype(c10::DeviceType::CUDA), torch::kBFloat16);
  compat::set_autocast_dtype(c10::DeviceType::CUDA, before.cuda_dtype);
  compat::set_autocast_enabled(c10::DeviceType::CUDA, before.cuda_enabled);
}

TEST(AutocastGuard, DisabledGuardIsANoOp) {
  torch::nn::Linear linear(4, 4);
  {
    AutocastGuard off(kCpu, torch::kBFloat16, /*enabled=*/false);
    AutocastGuard fp32(kCpu, torch::kFloat);
    EXPECT_FALSE(off.active());
    EXPECT_FALSE(fp32.active());
    EXPECT_FALSE(cpu_autocast_on());
    EXPECT_EQ(nesting_depth(), 0);
    EXPECT_EQ(linear->forward(torch::ones({1, 4})).scalar_type(), torch::kFloat);
  }
  {
    // Inside an enabled region a disabled guard leaves autocast on (unlike torch.autocast(enabled=False)).
    AutocastGuard on(kCpu, torch::kBFloat16);
    {
      AutocastGuard off(kCpu, torch::kBFloat16, /*enabled=*/false);
      EXPECT_TRUE(cpu_autocast_on());
      EXPECT_EQ(nesting_depth(), 1);
    }
    EXPECT_TRUE(cpu_autocast_on());
  }
  EXPECT_FALSE(cpu_autocast_on());
}

TEST(AutocastGuard, UnsupportedDtypeForDeviceThrows) {
  EXPECT_THROW(AutocastGuard(kCpu, torch::kHalf), Error);
  EXPECT_THROW(AutocastGuard(kCpu, torch::kDouble), Error);
  EXPECT_THROW(AutocastGuard(torch::Device(torch::kCUDA, 0), torch::kDouble), Error);
  EXPECT_FALSE(cpu_autocast_on());
  EXPECT_EQ(nesting_depth(), 0);
}

// Autocast caches the bf16 copy of an fp32 leaf that requires grad (a weight) for the whole region,
// so a weight changed in place inside the region is still seen in its old value; the cache is cleared
// only when the outermost guard exits.
TEST(AutocastGuard, WeightCastCacheLivesUntilTheOutermostGuardExits) {
  torch::Tensor weight = torch::full({2, 2}, 1.0, torch::requires_grad());
  torch::Tensor x = torch::ones({2, 2});
  auto bump_weight = [&] {
    torch::NoGradGuard no_grad;
    weight.add_(1.0);
  };
  {
    AutocastGuard outer(kCpu, torch::kBFloat16);
    EXPECT_EQ(torch::mm(x, weight)[0][0].item<float>(), 2.0f);
    bump_weight();  // weight = 2, but the cached bf16 copy still holds 1
    EXPECT_EQ(torch::mm(x, weight)[0][0].item<float>(), 2.0f);
    {
      AutocastGuard inner(kCpu, torch::kBFloat16);
      EXPECT_EQ(torch::mm(x, weight)[0][0].item<float>(), 2.0f);
    }
    // The inner guard's exit did not clear the cache.
    EXPECT_EQ(torch::mm(x, weight)[0][0].item<float>(), 2.0f);
  }
  {
    // The outer exit did: a new region casts the current weight.
    AutocastGuard again(kCpu, torch::kBFloat16);
    EXPECT_EQ(torch::mm(x, weight)[0][0].item<float>(), 4.0f);
  }
}

TEST(AutocastGuard, IsThreadLocal) {
  AutocastGuard autocast(kCpu, torch::kBFloat16);
  bool other_thread_on = true;
  torch::ScalarType other_dtype = torch::kBFloat16;
  std::thread other([&] {
    other_thread_on = cpu_autocast_on();
    other_dtype = torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type();
  });
  other.join();
  EXPECT_FALSE(other_thread_on);
  EXPECT_EQ(other_dtype, torch::kFloat);
  EXPECT_TRUE(cpu_autocast_on());
}

TEST(AutocastStateGuard, InstallsAndRestoresTheWholeState) {
  AutocastState bf16 = AutocastState::current();
  bf16.cpu_enabled = true;
  bf16.cpu_dtype = torch::kBFloat16;
  bf16.cache_enabled = false;
  {
    AutocastStateGuard guard(bf16);
    AutocastState now = AutocastState::current();
    EXPECT_TRUE(now.cpu_enabled);
    EXPECT_FALSE(now.cache_enabled);
    EXPECT_EQ(nesting_depth(), 1);
  }
  AutocastState after = AutocastState::current();
  EXPECT_FALSE(after.cpu_enabled);
  EXPECT_TRUE(after.cache_enabled);
  EXPECT_EQ(nesting_depth(), 0);
}

// train.fp32_precision = "bf16" (oneDNN's implicit bf16, LibTorch >= 2.9): an fp32 Linear or Conv then
// computes what fp32 arithmetic gives on inputs rounded to bfloat16, forward and backward; "ieee" gives
// fp32 arithmetic back. Without AMX oneDNN keeps fp32 kernels: bf16 then gives fp32's values (within
// the rounding of another fp32 kernel: oneDNN's instead of the BLAS's). With AMX (the Xeon host of an
// H200, LibTorch 2.11, 2026-11-26) the conv computed in bf16 but this small Linear kept fp32's values:
// a matmul may take either form there, a conv must take bf16's.
TEST(Fp32Precision, Bf16RoundsTheInputsOfLinearAndConvAndIeeeRestoresFp32) {
  if (!compat::has_cpu_fp32_precision()) GTEST_SKIP() << "LibTorch " << compat::torch_version() << " < 2.9";
  torch::manual_seed(0);
  torch::nn::Linear linear(67, 33);  // odd sizes: no kernel's tail is spared
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(5, 7, 3).padding(1));
  const torch::Tensor x = torch::randn({9, 67});
  const torch::Tensor image = torch::randn({3, 5, 11, 11});
  auto rounded = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  // Output and the input's gradient of `layer` on `input`, with parameters as they are.
  auto run = [](auto& layer, const torch::Tensor& input) {
    torch::Tensor leaf = input.clone().requires_grad_(true);
    torch::Tensor out = layer->forward(leaf);
    out.pow(2).sum().backward();
    layer->zero_grad();
    return std::make_pair(out.detach(), leaf.grad());
  };
  const auto fp32_linear = run(linear, x);
  const auto fp32_conv = run(conv, image);

  compat::set_cpu_fp32_precision(true);
  const auto bf16_linear = run(linear, x);
  const auto bf16_conv = run(conv, image);
  compat::set_cpu_fp32_precision(false);
  EXPECT_TRUE(run(linear, x).first.equal(fp32_linear.first)) << "ieee does not restore fp32 arithmetic";
  EXPECT_TRUE(run(conv, image).first.equal(fp32_conv.first));

  EXPECT_EQ(bf16_linear.first.scalar_type(), torch::kFloat);
  // The reference: fp32 arithmetic on bf16-rounded inputs and weights.
  const torch::Tensor linear_reference =
      torch::nn::functional::linear(rounded(x), rounded(linear->weight), linear->bias).detach();
  const torch::Tensor conv_reference =
      torch::nn::functional::conv2d(rounded(image), rounded(conv->weight),
                                    torch::nn::functional::Conv2dFuncOptions().bias(conv->bias).padding(1))
          .detach();
  if (!detect_hardware(kCpu).cpu_amx_bf16) {
    EXPECT_TRUE(torch::allclose(bf16_linear.first, fp32_linear.first, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(bf16_conv.first, fp32_conv.first, 1e-5, 1e-5));
    EXPECT_FALSE(torch::allclose(bf16_linear.first, linear_reference, 1e-4, 1e-4));
    EXPECT_TRUE(torch::allclose(bf16_linear.second, fp32_linear.second, 1e-5, 1e-5));
    return;
  }
  const bool linear_in_bf16 = torch::allclose(bf16_linear.first, linear_reference, 5e-4, 5e-4) &&
                              !torch::allclose(bf16_linear.first, fp32_linear.first, 1e-5, 1e-5);
  EXPECT_TRUE(linear_in_bf16 || torch::allclose(bf16_linear.first, fp32_linear.first, 1e-5, 1e-5))
      << "the Linear is neither fp32's nor bf16-rounded inputs' result";
  EXPECT_TRUE(torch::allclose(bf16_conv.first, conv_reference, 5e-4, 5e-4));
  EXPECT_FALSE(torch::allclose(bf16_conv.first, fp32_conv.first, 1e-5, 1e-5)) << "bf16 changed nothing";
  // Backward: close to fp32's at bf16's resolution (8 bits of mantissa), and not equal to it.
  const double linear_error = (bf16_linear.second - fp32_linear.second).abs().max().item<double>() /
                              fp32_linear.second.abs().max().item<double>();
  const double conv_error = (bf16_conv.second - fp32_conv.second).abs().max().item<double>() /
                            fp32_conv.second.abs().max().item<double>();
  EXPECT_LT(linear_error, 2e-2);
  EXPECT_LT(conv_error, 2e-2);
  EXPECT_GT(linear_error + conv_error, 1e-6) << "bf16 left the backward in fp32";
}

}  // namespace
}  // namespace fasttrain
