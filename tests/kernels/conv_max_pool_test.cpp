// fasttrain's fused 3x3 conv + 2x2 max-pool kernel against ATen's conv2d and max_pool2d run in double on the
// same values: outputs and the gradients of the weight, the bias and the input, computed in fp32 and in
// bf16 (from fp32 images, as under autocast, and from bf16 ones), on every CPU capability this machine
// runs, past 4 input channels by Winograd's F(2x2, 3x3) and by oneDNN's conv. The values are chosen so that
// every sum is exact in fp32 (integers, and fractions of 1/1024 that bf16 cannot hold; Winograd's transforms
// add halves and quarters, still exact at these sizes): the kernel and the reference then agree exactly,
// windows tie often (the first wins in both), and a bf16 path that forgot to round the input, or the conv's
// outputs before comparing them, gives other values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>

#include "amx_conv.h"  // src/kernels: whether the AMX forward ran
#include "fasttrain/kernels/cpu.h"
#include "kernels/compare.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::close;
using testing::kChannelsLast;

struct Case {
  int64_t batch, in_channels, height, width, out_channels;
  bool bias;
};

std::string describe(const Case& c) {
  return "[" + std::to_string(c.batch) + ", " + std::to_string(c.in_channels) + ", " +
         std::to_string(c.height) + ", " + std::to_string(c.width) + "] -> " +
         std::to_string(c.out_channels) + (c.bias ? " with bias" : "");
}

struct ConvMaxPoolInputs {
  torch::Tensor images, weight, bias, grad_y;
};

// Integers in [-range, range] as fp32.
torch::Tensor integers(c10::IntArrayRef sizes, int64_t range) {
  return torch::randint(-range, range + 1, sizes).to(torch::kFloat);
}

// Images of integers plus -1, 0 or 1 1024ths (which bf16 rounds off); weights up to 8, so the conv's sums
// reach past 256, where bf16 rounds them; integer gradients.
ConvMaxPoolInputs make_inputs(const Case& c, torch::ScalarType images_dtype) {
  ConvMaxPoolInputs in;
  in.images = (integers({c.batch, c.in_channels, c.height, c.width}, 3) +
               integers({c.batch, c.in_channels, c.height, c.width}, 1) / 1024)
                  .to(images_dtype)
                  .contiguous(kChannelsLast);
  in.weight = integers({c.out_channels, c.in_channels, 3, 3}, 8);
  in.bias = c.bias ? integers({c.out_channels}, 4) : torch::Tensor();
  in.grad_y = integers({c.batch, c.out_channels, c.height / 2, c.width / 2}, 3);
  return in;
}

struct ConvMaxPoolResult {
  torch::Tensor y, grad_images, grad_weight, grad_bias;
};

using kernels::WideConvForward;

ConvMaxPoolResult run_kernel(const ConvMaxPoolInputs& in, torch::ScalarType dtype,
                             kernels::CpuCapability capability, WideConvForward wide,
                             bool input_gradient = true) {
  auto images = in.images.detach().requires_grad_(input_gradient);
  auto weight = in.weight.clone().requires_grad_(true);
  auto bias = in.bias.defined() ? in.bias.clone().requires_grad_(true) : torch::Tensor();
  auto y = kernels::conv3x3_max_pool2x2(images, weight, bias, dtype, capability, wide);
  y.backward(in.grad_y.to(dtype).contiguous(kChannelsLast));
  return {y.detach(), images.grad(), weight.grad(), bias.defined() ? bias.grad() : torch::Tensor()};
}

// ATen in double on the values rounded to `dtype` (images, weight, bias), each conv output rounded to
// `dtype` before max_pool2d (the gradient passes the rounding unchanged, as a bf16 conv's does), and the
// weight's and bias's gradients rounded to `dtype`, as a conv's backward in it gives them.
ConvMaxPoolResult run_reference(const ConvMaxPoolInputs& in, torch::ScalarType dtype) {
  auto in_dtype = [&](const torch::Tensor& t) { return t.to(dtype).to(torch::kDouble); };
  auto images = in_dtype(in.images).requires_grad_(true);
  auto weight = in_dtype(in.weight).requires_grad_(true);
  auto bias = in.bias.defined() ? in_dtype(in.bias).requires_grad_(true) : torch::Tensor();
  const auto conv = torch::conv2d(images, weight, bias, 1, 1);
  const auto rounded = conv + (in_dtype(conv.detach()) - conv.detach());
  auto y = torch::max_pool2d(rounded, 2);
  y.backward(in.grad_y.to(torch::kDouble));
  return {y.detach(), images.grad(), in_dtype(weight.grad()),
          bias.defined() ? in_dtype(bias.grad()) : torch::Tensor()};
}

void expect_matches_double(const ConvMaxPoolInputs& in, torch::ScalarType dtype,
                           kernels::CpuCapability capability, WideConvForward wide) {
  const torch::ScalarType images_dtype = in.images.scalar_type();
  const ConvMaxPoolResult got = run_kernel(in, dtype, capability, wide);
  const ConvMaxPoolResult want = run_reference(in, dtype);
  EXPECT_EQ(got.y.scalar_type(), dtype);
  EXPECT_TRUE(got.y.is_contiguous(kChannelsLast));
  // Every sum below is exact in fp32, so the kernel's values are the reference's.
  EXPECT_TRUE(close("y", got.y, want.y, 0, 0));
  EXPECT_TRUE(close("grad_weight", got.grad_weight, want.grad_weight, 0, 0));
  EXPECT_EQ(got.grad_weight.scalar_type(), torch::kFloat);
  if (in.bias.defined()) {
    EXPECT_TRUE(close("grad_bias", got.grad_bias, want.grad_bias, 0, 0));
  }
  // The input's gradient (ATen's transposed conv over few channels, the winners' sums over more) in `dtype`,
  // returned in the images' dtype: bf16 in either rounds its sums.
  EXPECT_EQ(got.grad_images.scalar_type(), images_dtype);
  const bool rounded = dtype == torch::kBFloat16 || images_dtype == torch::kBFloat16;
  EXPECT_TRUE(close("grad_images", got.grad_images, want.grad_images, rounded ? 1.0 / 128 : 0, 0));
  // Without the input's gradient (the winners' pass then leaves it out) the weight's is the same.
  const ConvMaxPoolResult weight_only = run_kernel(in, dtype, capability, wide, /*input_gradient=*/false);
  EXPECT_TRUE(close("grad_weight without the input's", weight_only.grad_weight, want.grad_weight, 0, 0));
}

std::string to_string(WideConvForward wide) {
  return wide == WideConvForward::winograd ? "Winograd" : wide == WideConvForward::onednn ? "oneDNN" : "AMX";
}

// Over each of the wide forwards (the direct path over few channels ignores `wide`; AMX's runs only in bf16
// where the tiles are lent and the channels fit, and is oneDNN's path elsewhere).
void expect_matches_double(const ConvMaxPoolInputs& in, torch::ScalarType dtype,
                           kernels::CpuCapability capability) {
  for (const WideConvForward wide :
       {WideConvForward::winograd, WideConvForward::onednn, WideConvForward::amx}) {
    SCOPED_TRACE(to_string(wide));
    expect_matches_double(in, dtype, capability, wide);
  }
}

void expect_matches_double(const Case& c, torch::ScalarType images_dtype, torch::ScalarType dtype,
                           kernels::CpuCapability capability) {
  expect_matches_double(make_inputs(c, images_dtype), dtype, capability);
}

TEST(CpuConvMaxPool, MatchesConvThenMaxPoolInDoubleOnEveryCapability) {
  torch::manual_seed(0);
  // [128, 1, 28, 28] -> 16: the main job's first conv; channel counts that fill no vector evenly, odd
  // heights and widths (the conv's last row or column, which the max-pool leaves out), one window. Past
  // kConvMaxPoolInChannels (oneDNN's conv forward, the winners' backward): the main job's second conv
  // ([N, 16, 14, 14] -> 32), input channels that fill no vector evenly (5, 20), odd sizes, one window, and
  // output channels past the 64 whose winners the input's gradient takes at a time (70).
  const Case cases[] = {{8, 1, 28, 28, 16, false}, {3, 3, 7, 9, 5, true},      {2, 4, 6, 5, 37, true},
                        {2, 2, 2, 2, 1, true},     {1, 1, 5, 4, 16, true},     {4, 1, 28, 28, 32, false},
                        {2, 1, 6, 11, 16, true},   {4, 16, 14, 14, 32, false}, {3, 5, 7, 9, 6, true},
                        {2, 20, 6, 5, 3, true},    {2, 8, 2, 2, 1, true},      {2, 6, 6, 7, 70, true}};
  struct Precision {
    torch::ScalarType images, compute;
  };
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (const Precision precision :
         {Precision{torch::kFloat, torch::kFloat}, Precision{torch::kFloat, torch::kBFloat16},
          Precision{torch::kBFloat16, torch::kBFloat16}, Precision{torch::kBFloat16, torch::kFloat}}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(kernels::to_string(capability) + " images " + c10::toString(precision.images) + " in " +
                     c10::toString(precision.compute) + " " + describe(c));
        expect_matches_double(c, precision.images, precision.compute, capability);
      }
    }
  }
}

bool amx_conv_runs_here() {
  return kernels::conv3x3_max_pool2x2_runs_on_amx(16, 32, torch::kBFloat16);
}

TEST(CpuConvMaxPool, AmxForwardMatchesDoubleWhereTheTilesAreLent) {
  if (!amx_conv_runs_here()) GTEST_SKIP() << "this CPU lends no AMX-BF16 tiles: the AMX forward never runs";
  // The main job's second conv ([N, 16, 14, 14] -> 32); 48 output channels (a pair of channel tiles, then one
  // alone); odd heights and widths (the conv's last row or column, which the max-pool leaves out); one
  // window; 34 conv columns (tiles of 16, 16 and 2 x's); 32 and 64 input channels (a tap's 32 channels per
  // tile row, where 16 channels put two taps in one); the weight's gradient on the tiles where the output
  // channels are a multiple of 32, over odd heights and widths (a grid of 38 columns for 35). Every sum is
  // exact (make_inputs), so the pooled maps, the winners and the weight's gradient (oneDNN's bf16 backward,
  // one rounding of an exact sum) equal the reference's; the tie rule is tested where windows tie, as integer
  // maps often do. One input channel (a window's 4x4 patch per tile row): the main job's first conv ([N, 1,
  // 28, 28] -> 16), 18 windows a row (a tile of 16, then one overlapping it), one window, odd sizes with
  // three channel tiles, and 68 patch columns (built 32 at a time).
  torch::manual_seed(12);
  const Case cases[] = {{4, 16, 14, 14, 32, false}, {2, 16, 5, 7, 48, true},   {1, 16, 2, 2, 16, true},
                        {2, 32, 6, 35, 32, true},   {2, 64, 3, 4, 16, false},  {2, 16, 7, 9, 64, true},
                        {4, 1, 28, 28, 16, false},  {2, 1, 35, 37, 32, true},  {3, 1, 2, 2, 16, true},
                        {2, 1, 7, 9, 48, true},     {1, 1, 70, 66, 16, false}, {2, 16, 3, 5, 32, true},
                        {3, 16, 2, 2, 32, false}};
  int weight_gradients = 0;  // cases whose weight and input gradients the tiles take (Cout a multiple of 32)
  for (const auto images_dtype : {torch::kBFloat16, torch::kFloat}) {
    for (const Case& c : cases) {
      SCOPED_TRACE("images " + std::string(c10::toString(images_dtype)) + " " + describe(c));
      EXPECT_TRUE(kernels::conv3x3_max_pool2x2_runs_on_amx(c.in_channels, c.out_channels, torch::kBFloat16));
      const ConvMaxPoolInputs in = make_inputs(c, images_dtype);
      expect_matches_double(in, torch::kBFloat16, kernels::cpu_capability(), WideConvForward::amx);
      // The AMX forward itself gives these maps (and does not decline the images), and where the output
      // channels are a multiple of 32, the weight's gradient on the tiles is the reference's (rounded once).
      const auto amx = kernels::detail::amx_conv_max_pool(in.images, in.weight, in.bias);
      ASSERT_TRUE(amx.has_value());
      const ConvMaxPoolResult want = run_reference(in, torch::kBFloat16);
      EXPECT_TRUE(close("AMX's y", amx->output, want.y, 0, 0));
      if (kernels::detail::amx_conv_weight_gradient_takes(c.in_channels, c.out_channels)) {
        const auto grad_weight = kernels::detail::amx_conv_weight_gradient(
            in.images, in.grad_y.to(torch::kBFloat16).contiguous(kChannelsLast), amx->argmax, c.out_channels);
        ASSERT_TRUE(grad_weight.has_value());
        EXPECT_TRUE(close("AMX's grad_weight", *grad_weight, want.grad_weight, 0, 0));
        ASSERT_TRUE(kernels::detail::amx_conv_input_gradient_takes(c.in_channels, c.out_channels));
        const auto grad_images =
            kernels::detail::amx_conv_input_gradient(in.grad_y.to(torch::kBFloat16).contiguous(kChannelsLast),
                                                     amx->argmax, in.weight, in.images.sizes());
        ASSERT_TRUE(grad_images.has_value());
        EXPECT_TRUE(grad_images->is_contiguous(kChannelsLast));
        EXPECT_TRUE(close("AMX's grad_images", *grad_images, want.grad_images.to(torch::kBFloat16), 0, 0));
        ++weight_gradients;
      }
    }
  }
  EXPECT_EQ(weight_gradients, 10);
  // Where it does not run, the same call is oneDNN's path: fp32, and channels the tiles do not fit.
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_runs_on_amx(16, 32, torch::kFloat));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_runs_on_amx(24, 32, torch::kBFloat16));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_runs_on_amx(16, 40, torch::kBFloat16));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_runs_on_amx(4, 32, torch::kBFloat16));  // the direct path's
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_runs_on_amx(1, 8, torch::kBFloat16));
  expect_matches_double(make_inputs(Case{2, 24, 6, 6, 40, true}, torch::kFloat), torch::kBFloat16,
                        kernels::cpu_capability(), WideConvForward::amx);
}

// The AMX kernels build an image's operands at a time in a task's scratch: at one thread, tasks of several
// images each (the forward's starting mid-image), whose scratch is reused from one image to the next, still
// give the exact sums; a NaN in the last image's last row declines the forward as one in the first does.
TEST(CpuConvMaxPool, AmxKernelsMatchDoubleOverTasksOfSeveralImages) {
  if (!amx_conv_runs_here()) GTEST_SKIP() << "this CPU lends no AMX-BF16 tiles: the AMX forward never runs";
  const int saved_threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::manual_seed(14);
  for (const Case& c :
       {Case{9, 16, 14, 14, 32, false}, Case{6, 32, 6, 35, 32, true}, Case{5, 16, 7, 9, 64, false}}) {
    SCOPED_TRACE(describe(c));
    ConvMaxPoolInputs in = make_inputs(c, torch::kBFloat16);
    const auto amx = kernels::detail::amx_conv_max_pool(in.images, in.weight, in.bias);
    ASSERT_TRUE(amx.has_value());
    const ConvMaxPoolResult want = run_reference(in, torch::kBFloat16);
    EXPECT_TRUE(close("AMX's y", amx->output, want.y, 0, 0));
    const auto grad_y = in.grad_y.to(torch::kBFloat16).contiguous(kChannelsLast);
    const auto grad_weight =
        kernels::detail::amx_conv_weight_gradient(in.images, grad_y, amx->argmax, c.out_channels);
    ASSERT_TRUE(grad_weight.has_value());
    EXPECT_TRUE(close("AMX's grad_weight", *grad_weight, want.grad_weight, 0, 0));
    const auto grad_images =
        kernels::detail::amx_conv_input_gradient(grad_y, amx->argmax, in.weight, in.images.sizes());
    ASSERT_TRUE(grad_images.has_value());
    EXPECT_TRUE(close("AMX's grad_images", *grad_images, want.grad_images.to(torch::kBFloat16), 0, 0));
    in.images.index_put_({c.batch - 1, 0, c.height - 1, c.width - 1},
                         std::numeric_limits<float>::quiet_NaN());
    EXPECT_FALSE(kernels::detail::amx_conv_max_pool(in.images, in.weight, in.bias).has_value());
  }
  at::set_num_threads(saved_threads);
}

// A conv stage's inputs for the evaluation epilogue's tests: random images, weight, bias (where c.bias) and
// BatchNorm terms, with channel 0's BatchNorm weight `tiny` (its outputs subnormal in the dtype under test)
// and channel 1's pre-activations all negative.
struct EvaluationStage {
  torch::Tensor images, weight, bias, norm_weight, norm_bias, running_mean, running_var;
};

EvaluationStage make_evaluation_stage(const Case& c, float tiny) {
  EvaluationStage s;
  s.images = torch::randn({c.batch, c.in_channels, c.height, c.width}).contiguous(kChannelsLast);
  s.weight = torch::randn({c.out_channels, c.in_channels, 3, 3}) / 3;
  s.bias = c.bias ? torch::randn({c.out_channels}) : torch::Tensor();
  s.norm_weight = torch::randn({c.out_channels});
  s.norm_bias = torch::randn({c.out_channels});
  s.running_mean = torch::randn({c.out_channels}) / 4;
  s.running_var = torch::rand({c.out_channels}) + 0.1;
  s.norm_weight[0] = tiny;
  s.norm_bias[0] = 0.f;
  s.norm_weight[1] = 1e-3f;
  s.norm_bias[1] = -100.f;
  return s;
}

// An evaluation's BatchNorm + ReLU in the AMX forward's epilogue: batch_norm_relu's maps of the pooled maps
// bit for bit, on normal values whose sums round, with negative scales, a channel whose outputs are bf16
// subnormals (c10's rounding keeps them where AVX-512 BF16's conversion flushes them: the epilogue rounding
// so fails this test) and one whose pre-activations are all negative; one input channel, 16, 32 with a bias,
// odd sizes. (An fp32 multiply and add in place of the fused multiply-add changes a value's last fp32 bit,
// which the bf16 rounding hides on these values: the epilogue's arithmetic is the kernel's by reading.) A NaN
// in the images declines it; asked for a gradient, it does not take the conv.
TEST(CpuConvMaxPool, AmxEvaluationEpilogueGivesBatchNormReluOfThePooledMapsBitForBit) {
  if (!amx_conv_runs_here() || kernels::cpu_capability() != kernels::CpuCapability::avx512)
    GTEST_SKIP() << "this CPU lends no AMX-BF16 tiles (or runs below avx512): the fused kernel never runs";
  torch::NoGradGuard no_grad;
  torch::manual_seed(15);
  for (const Case& c : {Case{4, 1, 28, 28, 16, false}, Case{3, 16, 14, 14, 32, false},
                        Case{2, 32, 6, 35, 32, true}, Case{3, 16, 7, 9, 48, false}}) {
    SCOPED_TRACE(describe(c));
    const auto [images, weight, bias, norm_weight, norm_bias, running_mean, running_var] =
        make_evaluation_stage(c, 1e-39f);  // channel 0's outputs under 2^-126
    const double eps = 1e-5;
    ASSERT_TRUE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(
        images, weight, bias, torch::kBFloat16, norm_weight, norm_bias, running_mean, running_var));
    const auto fused = kernels::conv3x3_max_pool2x2_batch_norm_relu(
        images, weight, bias, torch::kBFloat16, norm_weight, norm_bias, running_mean, running_var, eps);
    ASSERT_TRUE(fused.has_value());
    const torch::Tensor pooled =
        kernels::conv3x3_max_pool2x2(images, weight, bias, torch::kBFloat16, kernels::CpuCapability::avx512,
                                     kernels::WideConvForward::amx);
    const torch::Tensor want =
        kernels::batch_norm_relu(pooled, norm_weight, norm_bias, running_mean, running_var, false, 0.1, eps,
                                 kernels::CpuCapability::avx512);
    EXPECT_EQ(fused->scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(fused->is_contiguous(kChannelsLast));
    EXPECT_TRUE(torch::equal(*fused, want));
    EXPECT_GT(want.select(1, 0).gt(0).sum().item<int64_t>(), 0);  // the subnormal channel holds some
    EXPECT_GT(want.gt(0).sum().item<int64_t>(), want.numel() / 4);
    torch::Tensor with_nan = images.clone();
    with_nan.index_put_({c.batch - 1, 0, c.height - 1, 0}, std::numeric_limits<float>::quiet_NaN());
    EXPECT_FALSE(kernels::conv3x3_max_pool2x2_batch_norm_relu(with_nan, weight, bias, torch::kBFloat16,
                                                              norm_weight, norm_bias, running_mean,
                                                              running_var, eps)
                     .has_value());
  }
  // Asked for a gradient, it does not take the conv.
  torch::AutoGradMode grad(true);
  const torch::Tensor images = torch::randn({2, 16, 8, 8}).contiguous(kChannelsLast);
  const torch::Tensor weight = torch::randn({32, 16, 3, 3}).requires_grad_();
  const torch::Tensor ones = torch::ones({32}), zeros = torch::zeros({32});
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(images, weight, {}, torch::kBFloat16, ones,
                                                                  zeros, zeros, ones));
  EXPECT_TRUE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(images, weight.detach(), {},
                                                                 torch::kBFloat16, ones, zeros, zeros, ones));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(
      images, weight.detach(), {}, torch::kBFloat16, torch::ones({16}), zeros, zeros, ones));
}

// An evaluation's BatchNorm + ReLU in the fp32 forwards' epilogue (the direct forward over few input
// channels, Winograd's over more): batch_norm_relu's maps of conv3x3_max_pool2x2's pooled maps bit for bit,
// with negative scales, a channel whose outputs are fp32 subnormals, one whose pre-activations are all
// negative, odd sizes and an odd channel count (a partial vector). A NaN in the images reaches the maps where
// the two kernels put it. Asked for a gradient, or in bf16 without AMX's tiles, it does not take the conv.
TEST(CpuConvMaxPool, Fp32EvaluationEpilogueGivesBatchNormReluOfThePooledMapsBitForBit) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(16);
  for (const Case& c :
       {Case{4, 1, 28, 28, 16, false}, Case{3, 3, 9, 7, 5, true}, Case{2, 2, 8, 10, 37, true},
        Case{3, 16, 14, 14, 32, false}, Case{2, 32, 6, 35, 32, true}, Case{3, 6, 7, 9, 21, true}}) {
    SCOPED_TRACE(describe(c));
    auto [images, weight, bias, norm_weight, norm_bias, running_mean, running_var] =
        make_evaluation_stage(c, 1e-40f);  // channel 0's outputs under 2^-126
    const double eps = 1e-5;
    ASSERT_TRUE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(
        images, weight, bias, torch::kFloat, norm_weight, norm_bias, running_mean, running_var));
    for (bool with_nan : {false, true}) {
      if (with_nan) {
        images = images.clone();
        images.index_put_({c.batch - 1, 0, c.height / 2, c.width / 2},
                          std::numeric_limits<float>::quiet_NaN());
      }
      for (auto capability : kernels::runnable_cpu_capabilities()) {
        SCOPED_TRACE(kernels::to_string(capability) +
                     (with_nan ? ", a NaN in the images" : ", finite images"));
        const auto fused = kernels::conv3x3_max_pool2x2_batch_norm_relu(images, weight, bias, torch::kFloat,
                                                                        norm_weight, norm_bias, running_mean,
                                                                        running_var, eps, capability);
        ASSERT_TRUE(fused.has_value());
        const torch::Tensor pooled = kernels::conv3x3_max_pool2x2(
            images, weight, bias, torch::kFloat, capability, kernels::WideConvForward::winograd);
        const torch::Tensor want = kernels::batch_norm_relu(pooled, norm_weight, norm_bias, running_mean,
                                                            running_var, false, 0.1, eps, capability);
        EXPECT_EQ(fused->scalar_type(), torch::kFloat);
        EXPECT_TRUE(fused->is_contiguous(kChannelsLast));
        EXPECT_TRUE(torch::allclose(*fused, want, 0, 0, /*equal_nan=*/true));
        EXPECT_EQ(want.isnan().any().item<bool>(), with_nan);
        EXPECT_GT(want.select(1, 0).gt(0).sum().item<int64_t>(), 0);  // the subnormal channel holds some
        EXPECT_EQ(want.select(1, 1).gt(0).sum().item<int64_t>(), 0);
        EXPECT_GT(want.gt(0).sum().item<int64_t>(), want.numel() / 4);
      }
    }
  }
  torch::AutoGradMode grad(true);
  const torch::Tensor images = torch::randn({2, 16, 8, 8}).contiguous(kChannelsLast);
  const torch::Tensor weight = torch::randn({32, 16, 3, 3}).requires_grad_();
  const torch::Tensor ones = torch::ones({32}), zeros = torch::zeros({32});
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(images, weight, {}, torch::kFloat, ones,
                                                                  zeros, zeros, ones));
  EXPECT_TRUE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(images, weight.detach(), {}, torch::kFloat,
                                                                 ones, zeros, zeros, ones));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(images, weight.detach(), {}, torch::kFloat,
                                                                  torch::ones({16}), zeros, zeros, ones));
  EXPECT_EQ(kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(images, weight.detach(), {}, torch::kBFloat16,
                                                               ones, zeros, zeros, ones),
            amx_conv_runs_here() && kernels::cpu_capability() == kernels::CpuCapability::avx512);
}

TEST(CpuConvMaxPool, AmxForwardAgreesWithOneDnnsOnGeneralValues) {
  if (!amx_conv_runs_here()) GTEST_SKIP() << "this CPU lends no AMX-BF16 tiles: the AMX forward never runs";
  // Normal values, whose sums round: the tiles sum in another order than oneDNN's conv, so a conv output may
  // round to the next bf16 value, and the weight's gradient sums in another order. A NaN in the image reaches
  // each output whose 3x3 field holds it and the max-pool passes it on, through oneDNN's conv: the AMX
  // forward declines images holding a NaN or an infinity (over 16 channels its tile rows read a fourth column
  // times zero weights, and the weight gradient's grid reads past each row times zero gradients: either would
  // spread it; over one channel a tile row is a window's whole 4x4 patch, times zero weights off each
  // position's kernel). oneDNN's path over one channel is the direct forward.
  torch::manual_seed(13);
  for (const Case& c : {Case{4, 16, 14, 14, 32, false}, Case{2, 32, 7, 9, 48, true},
                        Case{4, 1, 28, 28, 16, false}, Case{2, 1, 9, 11, 32, true}}) {
    SCOPED_TRACE(describe(c));
    ConvMaxPoolInputs in;
    in.images = torch::randn({c.batch, c.in_channels, c.height, c.width}).contiguous(kChannelsLast);
    in.weight = torch::randn({c.out_channels, c.in_channels, 3, 3}) / 3;
    in.bias = c.bias ? torch::randn({c.out_channels}) : torch::Tensor();
    in.grad_y = torch::randn({c.batch, c.out_channels, c.height / 2, c.width / 2});
    const ConvMaxPoolResult amx =
        run_kernel(in, torch::kBFloat16, kernels::cpu_capability(), WideConvForward::amx);
    const ConvMaxPoolResult onednn =
        run_kernel(in, torch::kBFloat16, kernels::cpu_capability(), WideConvForward::onednn);
    EXPECT_TRUE(close("y", amx.y, onednn.y, 1.0 / 64, 1.0 / 64));
    EXPECT_TRUE(close("grad_weight", amx.grad_weight, onednn.grad_weight, 1.0 / 64, 1.0 / 64));
    EXPECT_TRUE(close("grad_images", amx.grad_images, onednn.grad_images, 1.0 / 64, 1.0 / 64));
    in.images.index_put_({0, 0, 2, 3}, std::numeric_limits<float>::quiet_NaN());
    const auto with_nan = kernels::conv3x3_max_pool2x2(in.images, in.weight, in.bias, torch::kBFloat16,
                                                       kernels::cpu_capability(), WideConvForward::amx);
    const auto want = torch::max_pool2d(torch::conv2d(in.images, in.weight, in.bias, 1, 1), 2);
    EXPECT_TRUE(torch::equal(with_nan.isnan(), want.isnan()));
    EXPECT_GT(with_nan.isnan().sum().item<int64_t>(), 0);
    EXPECT_FALSE(kernels::detail::amx_conv_max_pool(in.images, in.weight, in.bias).has_value());
    in.images.index_put_({0, 0, 2, 3}, std::numeric_limits<float>::infinity());
    EXPECT_FALSE(kernels::detail::amx_conv_max_pool(in.images, in.weight, in.bias).has_value());
    // An infinite weight (the zero border times it) and an infinite gradient (the weight gradient's grid
    // times it) are declined too; finite ones are not.
    in.images.index_put_({0, 0, 2, 3}, 0.5);
    const auto finite = kernels::detail::amx_conv_max_pool(in.images, in.weight, in.bias);
    ASSERT_TRUE(finite.has_value());
    auto infinite_weight = in.weight.clone();
    infinite_weight.index_put_({0, 0, 0, 0}, std::numeric_limits<float>::infinity());
    EXPECT_FALSE(kernels::detail::amx_conv_max_pool(in.images, infinite_weight, in.bias).has_value());
    if (kernels::detail::amx_conv_weight_gradient_takes(c.in_channels, c.out_channels)) {
      const auto grad = in.grad_y.to(torch::kBFloat16).contiguous(kChannelsLast);
      EXPECT_TRUE(kernels::detail::amx_conv_weight_gradient(in.images, grad, finite->argmax, c.out_channels));
      auto infinite_grad = grad.clone();
      infinite_grad.index_put_({0, 0, 1, 1}, std::numeric_limits<float>::infinity());
      EXPECT_FALSE(kernels::detail::amx_conv_weight_gradient(in.images, infinite_grad, finite->argmax,
                                                             c.out_channels));
      // The input's gradient declines an infinite weight (the zero border times it), not a finite one.
      EXPECT_TRUE(
          kernels::detail::amx_conv_input_gradient(grad, finite->argmax, in.weight, in.images.sizes()));
      EXPECT_FALSE(
          kernels::detail::amx_conv_input_gradient(grad, finite->argmax, infinite_weight, in.images.sizes()));
    }
  }
}

TEST(CpuConvMaxPool, SumsTheSameOverMoreThreadsThanRows) {
  // 16 threads over 18 and 17 output rows: row_chunks gives chunks of one row, taken in turn by more
  // threads than chunks, each adding only its own row to the weight's gradient (and reading no row past the
  // images). Past kConvMaxPoolInChannels the winners' backward splits the images: 3 over 16 threads.
  const int threads = at::get_num_threads();
  at::set_num_threads(16);
  torch::manual_seed(1);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (const Case& c :
         {Case{2, 1, 18, 6, 16, true}, Case{1, 2, 34, 3, 8, false}, Case{3, 6, 6, 6, 4, true}}) {
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        SCOPED_TRACE(kernels::to_string(capability) + " in " + c10::toString(dtype) + " " + describe(c));
        expect_matches_double(c, torch::kFloat, dtype, capability);
      }
    }
  }
  at::set_num_threads(threads);
}

TEST(CpuConvMaxPool, RoundsTheWeightAndBiasAsABf16ConvDoes) {
  // Weights and a bias that bf16 cannot hold (257 rounds to 256, -259 to -260), on integer images so that
  // every sum stays exact: a path that used the fp32 weight or bias anywhere in bf16 (the forward's conv,
  // the input's gradient) gives other values. On the direct path (1 and 3 channels) and the winners' (6, 16).
  torch::manual_seed(7);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (const Case& c : {Case{2, 1, 6, 6, 8, true}, Case{2, 3, 5, 7, 5, true}, Case{2, 6, 6, 6, 4, true},
                          Case{2, 16, 4, 4, 3, true}}) {
      SCOPED_TRACE(kernels::to_string(capability) + " " + describe(c));
      ConvMaxPoolInputs in = make_inputs(c, torch::kFloat);
      in.images = integers({c.batch, c.in_channels, c.height, c.width}, 3).contiguous(kChannelsLast);
      const auto odd = torch::tensor({257.f, -259.f, 515.f});
      in.weight = in.weight + odd.index({torch::randint(3, in.weight.sizes())}) *
                                  (torch::rand(in.weight.sizes()) < 0.3).to(torch::kFloat);
      in.bias = in.bias + 257;
      expect_matches_double(in, torch::kBFloat16, capability);
    }
  }
}

TEST(CpuConvMaxPool, PropagatesNaNAsConvAndMaxPoolDo) {
  // A NaN in the image reaches each conv output whose 3x3 field holds it, and the max-pool passes it on:
  // through the direct forward (one channel), Winograd's (six) and oneDNN's conv and the max-pool kernel
  // (six). Winograd's transforms carry a patch's NaN to exactly the outputs whose 3x3 field holds it (B^T's
  // and A^T's rows pair up so), as a direct conv does.
  torch::manual_seed(2);
  for (const int64_t channels : {1, 6}) {
    for (const WideConvForward wide : {WideConvForward::winograd, WideConvForward::onednn}) {
      auto in = make_inputs(Case{2, channels, 8, 8, 4, true}, torch::kFloat);
      in.images.index_put_({0, 0, 2, 3}, std::numeric_limits<float>::quiet_NaN());
      const auto got = kernels::conv3x3_max_pool2x2(in.images, in.weight, in.bias, torch::kFloat,
                                                    kernels::cpu_capability(), wide);
      const auto want = torch::max_pool2d(torch::conv2d(in.images, in.weight, in.bias, 1, 1), 2);
      EXPECT_TRUE(torch::equal(got.isnan(), want.isnan())) << channels << " channels";
      EXPECT_GT(got.isnan().sum().item<int64_t>(), 0);
      EXPECT_TRUE(torch::allclose(got.nan_to_num(0), want.nan_to_num(0)));
    }
  }
}

TEST(CpuConvMaxPool, WinogradsForwardAgreesWithOneDnnsOnGeneralValues) {
  // Normal values, whose sums round: Winograd's transforms round otherwise than oneDNN's conv, so the pooled
  // maps agree to fp32's few ulps and not bit for bit, and a window whose two largest outputs are that close
  // may pick another winner. Drawn so none is: the gradients, summed at the winners, then agree as closely.
  // The main job's second conv and sizes that fill no vector evenly, in fp32 and in bf16.
  torch::manual_seed(11);
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (const Case& c :
         {Case{4, 16, 14, 14, 32, false}, Case{3, 5, 7, 9, 37, true}, Case{2, 20, 6, 5, 3, true}}) {
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        SCOPED_TRACE(kernels::to_string(capability) + " in " + c10::toString(dtype) + " " + describe(c));
        ConvMaxPoolInputs in;
        in.images = torch::randn({c.batch, c.in_channels, c.height, c.width}).contiguous(kChannelsLast);
        in.weight = torch::randn({c.out_channels, c.in_channels, 3, 3}) / 3;
        in.bias = c.bias ? torch::randn({c.out_channels}) : torch::Tensor();
        in.grad_y = torch::randn({c.batch, c.out_channels, c.height / 2, c.width / 2});
        const ConvMaxPoolResult winograd = run_kernel(in, dtype, capability, WideConvForward::winograd);
        const ConvMaxPoolResult onednn = run_kernel(in, dtype, capability, WideConvForward::onednn);
        // bf16 rounds each conv output, so a few ulps of fp32 may move it by one bf16 step.
        const double tolerance = dtype == torch::kFloat ? 1e-5 : 1.0 / 64;
        EXPECT_TRUE(close("y", winograd.y, onednn.y, tolerance, tolerance));
        if (dtype == torch::kFloat) {
          EXPECT_TRUE(close("grad_weight", winograd.grad_weight, onednn.grad_weight, 1e-5, 1e-5));
          EXPECT_TRUE(close("grad_images", winograd.grad_images, onednn.grad_images, 1e-5, 1e-5));
          if (c.bias) {
            EXPECT_TRUE(close("grad_bias", winograd.grad_bias, onednn.grad_bias, 1e-5, 1e-5));
          }
        }
      }
    }
  }
}

TEST(CpuConvMaxPool, GivesEachGradientInItsParametersLayoutAndDtype) {
  // A channels_last weight gets a channels_last gradient (DDP's bucket views expect the parameter's strides),
  // on the direct path (3 channels) and the winners' (6).
  torch::manual_seed(3);
  for (const int64_t channels : {3, 6}) {
    SCOPED_TRACE(std::to_string(channels) + " channels");
    auto images = torch::randn({2, channels, 6, 6}).contiguous(kChannelsLast);
    auto weight = torch::randn({8, channels, 3, 3}).contiguous(kChannelsLast).requires_grad_(true);
    kernels::conv3x3_max_pool2x2(images, weight, {}, torch::kFloat).sum().backward();
    EXPECT_EQ(weight.grad().strides(), weight.strides());
    EXPECT_FALSE(images.requires_grad());
    // Each gradient in its own parameter's dtype: a bf16 weight beside an fp32 bias.
    auto bf16_weight = torch::randn({8, channels, 3, 3}).to(torch::kBFloat16).requires_grad_(true);
    auto bias = torch::randn({8}).requires_grad_(true);
    kernels::conv3x3_max_pool2x2(images, bf16_weight, bias, torch::kFloat).sum().backward();
    EXPECT_EQ(bf16_weight.grad().scalar_type(), torch::kBFloat16);
    EXPECT_EQ(bias.grad().scalar_type(), torch::kFloat);
  }
}

TEST(CpuConvMaxPool, RefusesASecondDerivativeByName) {
  // Its backward is not itself differentiable: a backward with create_graph says so, where it would
  // otherwise give a second derivative of zero.
  torch::manual_seed(4);
  const auto images = torch::randn({2, 1, 6, 6});
  auto weight = torch::randn({4, 1, 3, 3}).requires_grad_(true);
  const auto y = kernels::conv3x3_max_pool2x2(images, weight, {}, torch::kFloat);
  const std::string message = testing::second_derivative_error(y, weight);
  EXPECT_TRUE(testing::contains_all(message, {"conv3x3_max_pool2x2", "not itself differentiable", "aten"}))
      << message;
  kernels::conv3x3_max_pool2x2(images, weight, {}, torch::kFloat).sum().backward();  // first order runs
  EXPECT_TRUE(weight.grad().defined());
}

TEST(CpuConvMaxPool, TakesOnlyWhatItComputesAndRefusesByName) {
  const auto nhwc = torch::randn({2, 3, 6, 6}).contiguous(kChannelsLast);
  const auto weight = torch::randn({8, 3, 3, 3}), bias = torch::randn({8});
  EXPECT_TRUE(kernels::conv3x3_max_pool2x2_takes(nhwc, weight, bias, torch::kFloat));
  EXPECT_TRUE(kernels::conv3x3_max_pool2x2_takes(nhwc, weight, {}, torch::kBFloat16));
  EXPECT_TRUE(kernels::conv3x3_max_pool2x2_takes(torch::randn({2, 1, 6, 6}), torch::randn({4, 1, 3, 3}), {},
                                                 torch::kFloat));  // one channel: NCHW is NHWC
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(torch::randn({2, 3, 6, 6}), weight, bias, torch::kFloat));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(nhwc, weight, bias, torch::kHalf));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(nhwc.to(torch::kDouble), weight, bias, torch::kFloat));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(nhwc, torch::randn({8, 3, 5, 5}), bias, torch::kFloat));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(nhwc, torch::randn({8, 2, 3, 3}), bias, torch::kFloat));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(nhwc, weight, torch::randn({7}), torch::kFloat));
  const auto wide = torch::randn({2, 5, 6, 6}).contiguous(kChannelsLast);
  EXPECT_TRUE(kernels::conv3x3_max_pool2x2_takes(wide, torch::randn({8, 5, 3, 3}), bias, torch::kFloat));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(wide, torch::randn({8, 5, 3, 3}), bias, torch::kDouble));
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(torch::randn({2, 3, 1, 6}).contiguous(kChannelsLast),
                                                  weight, bias, torch::kFloat));  // no whole window
  EXPECT_FALSE(kernels::conv3x3_max_pool2x2_takes(torch::Tensor(), weight, bias, torch::kFloat));
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] {
        kernels::conv3x3_max_pool2x2(torch::randn({2, 3, 6, 6}), weight, bias, torch::kFloat);
      }),
      {"conv3x3_max_pool2x2 takes images", "[2, 3, 6, 6]", "not in channels_last"}));
}

}  // namespace
}  // namespace fasttrain
