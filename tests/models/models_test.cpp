#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/util/check.h"
#include "kernels/compare.h"
#include "memory/peak_cpu_memory.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::kFashion;

using testing::contains_all;
using testing::error_message;

// `model`'s one output for `inputs`.
torch::Tensor forward(const Model& model, const torch::Tensor& inputs) {
  Batch batch;
  batch.inputs = inputs;
  return model.forward(batch).tensor();
}

TEST(Models, EveryImageModelMapsImagesToLogits) {
  const DataShape shape = DataShape::images(3, 16, 16, 7);
  for (const std::string name : {"cnn", "mlp", "resnet"}) {
    SCOPED_TRACE(name);
    Model model = make_model(name, shape);
    EXPECT_EQ(model.name(), name);
    EXPECT_EQ(forward(model, torch::randn({5, 3, 16, 16})).sizes(), (std::vector<int64_t>{5, 7}));
    EXPECT_GT(model.parameter_count(), 0);
    EXPECT_NE(model.describe().find("parameters"), std::string::npos);
  }
}

// Values instead of classes: the image models end in one output per target value.
TEST(Models, RegressionTargetsSizeTheOutputLayer) {
  DataShape shape;
  shape.input = {13};
  shape.target = {2};
  shape.target_dtype = torch::kFloat;
  EXPECT_EQ(forward(make_mlp(MlpOptions(), shape), torch::randn({4, 13})).sizes(),
            (std::vector<int64_t>{4, 2}));
  DataShape unsized = DataShape::images(1, 8, 8, 0);  // class ids, but how many is unknown
  EXPECT_TRUE(
      contains_all(error_message([&] { make_mlp(MlpOptions(), unsized); }), {"mlp", "how many classes"}));
}

TEST(Models, ClassicCnnHasTheTextbookParameterCount) {
  // conv 1->32 (320) + conv 32->64 (18496) + fc 3136->128 (401536) + fc 128->10 (1290)
  Model model = make_cnn(CnnOptions().widths({32, 64}).hidden({128}), kFashion);
  EXPECT_EQ(model.parameter_count(), 320 + 18496 + 401536 + 1290);
}

TEST(Models, PoolFirstCommutesWithReluWithoutBatchNorm) {
  // Without BatchNorm, pooling before or after the ReLU is the same function.
  torch::manual_seed(3);
  Model pooled_last = make_cnn(CnnOptions().widths({4, 8}).hidden({16}), kFashion);
  torch::manual_seed(3);
  Model pooled_first = make_cnn(CnnOptions().widths({4, 8}).hidden({16}).pool_first(true), kFashion);
  auto input = torch::randn({3, 1, 28, 28});
  EXPECT_TRUE(torch::allclose(forward(pooled_last, input), forward(pooled_first, input), 1e-5, 1e-6));
  // With BatchNorm it normalises the pooled maps: [B, C, H/2, W/2] running stats still per channel.
  Model normalised = make_cnn(CnnOptions().widths({4, 8}).batchnorm(true).pool_first(true), kFashion);
  EXPECT_EQ(forward(normalised, input).sizes(), (std::vector<int64_t>{3, 10}));
}

TEST(Models, ChannelsLastComputesTheSameFunctionAndGradients) {
  const DataShape shape = DataShape::images(3, 16, 16, 10);
  auto build = [&](const std::string& name) {
    torch::manual_seed(7);
    return name == "cnn" ? make_cnn(CnnOptions().widths({8, 16}).batchnorm(true), shape)
                         : make_resnet(ResnetOptions().widths({8, 16}), shape);
  };
  for (const std::string name : {"cnn", "resnet"}) {
    SCOPED_TRACE(name);
    Model nchw = build(name), nhwc = build(name);
    nhwc.to_channels_last();
    bool converted = false;
    for (const auto& p : nhwc.module().parameters()) {
      if (p.dim() == 4) converted = p.is_contiguous(torch::MemoryFormat::ChannelsLast) && p.size(1) > 1;
    }
    EXPECT_TRUE(converted);
    auto input = torch::randn({4, 3, 16, 16});
    auto out_a = forward(nchw, input);
    auto out_b = forward(nhwc, input.contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(torch::allclose(out_a, out_b, 1e-4, 1e-5));
    out_a.sum().backward();
    out_b.sum().backward();
    auto pa = nchw.module().parameters(), pb = nhwc.module().parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(torch::allclose(pa[i].grad(), pb[i].grad(), 1e-3, 1e-4)) << "parameter " << i;
    }
  }
  // Over one input channel a kernel counts as channels_last in either layout; it gets channels_last's own
  // strides, those its gradient comes with (what DDP's bucket views need: tests/dist, the stride warning).
  torch::manual_seed(7);
  Model gray = make_cnn(CnnOptions().widths({8}), DataShape::images(1, 8, 8, 4));
  gray.to_channels_last();
  for (const auto& p : gray.module().parameters()) {
    if (p.dim() != 4) continue;
    const auto expected =
        torch::empty(p.sizes(), torch::TensorOptions().memory_format(torch::MemoryFormat::ChannelsLast));
    EXPECT_EQ(p.strides(), expected.strides()) << p.sizes();
    forward(gray, torch::randn({2, 1, 8, 8}).contiguous(torch::MemoryFormat::ChannelsLast)).sum().backward();
    EXPECT_EQ(p.grad().strides(), p.strides()) << "the gradient's layout is the parameter's";
  }
  // A model without 4-d weights: the switch says what is missing.
  EXPECT_TRUE(contains_all(error_message([&] { make_mlp(MlpOptions(), shape).to_channels_last(); }),
                           {"train.channels_last", "4-d"}));
}

// Two conv stages with BatchNorm, for the kernel switches' tests.
CnnOptions small_batchnorm_cnn(bool pool_first) {
  return CnnOptions().widths({8, 16}).hidden({32}).batchnorm(true).pool_first(pool_first);
}

TEST(Models, CnnOwnMaxPoolKernelGivesATensStepBitForBit) {
  // model.kernels decides which max-pool runs; both give the same function and gradients exactly (the
  // kernel's reference tests: tests/kernels/max_pool_test.cpp), in fp32 and under bf16 autocast.
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  for (const bool bf16 : {false, true}) {
    for (const bool pool_first : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + (pool_first ? " pool_first" : ""));
      auto step = [&](const std::string& kernels) {
        torch::manual_seed(5);
        // The BatchNorm + ReLU, the conv + max-pool and the Linear kernels sum in their own order:
        // CnnOwnBatchNormReluKernelMatchesATensStep, CnnOwnConvMaxPoolKernelMatchesATensStep,
        // CnnOwnLinearKernelsMatchATensStep.
        Model model =
            make_cnn(small_batchnorm_cnn(pool_first)
                         .kernels(kernels)
                         .aten_kernels({"batch_norm_relu", "conv_max_pool", "amx_linear", "narrow_linear"}),
                     shape);
        model.to_channels_last();
        torch::manual_seed(6);
        const auto input = torch::randn({4, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast);
        torch::Tensor loss;
        {
          AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
          loss = forward(model, input).to(torch::kFloat).pow(2).sum();
        }
        loss.backward();
        std::vector<torch::Tensor> result{loss.detach()};
        for (const auto& p : model.module().parameters()) result.push_back(p.grad());
        return result;
      };
      const auto own = step("fasttrain"), aten = step("aten");
      ASSERT_EQ(own.size(), aten.size());
      for (size_t i = 0; i < own.size(); ++i) EXPECT_TRUE(torch::equal(own[i], aten[i])) << "tensor " << i;
    }
  }
  EXPECT_TRUE(contains_all(error_message([] { make_cnn(CnnOptions().kernels("mine"), kFashion); }),
                           {"model.kernels", "mine"}));
}

// What a cnn's kernel switch may change only to rounding: two training steps' losses, then every
// parameter's gradient, every buffer and an evaluation's output (seeded; fp32 or bf16 autocast).
std::vector<torch::Tensor> two_steps_and_an_evaluation(const CnnOptions& options, const DataShape& shape,
                                                       bool bf16) {
  torch::manual_seed(5);
  Model model = make_cnn(options, shape);
  model.to_channels_last();
  torch::manual_seed(6);
  std::vector<torch::Tensor> result;
  for (int step = 0; step < 2; ++step) {
    const auto input = torch::randn({6, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast);
    torch::Tensor loss;
    {
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
      loss = forward(model, input).to(torch::kFloat).pow(2).sum();
    }
    loss.backward();
    result.push_back(loss.detach());
  }
  for (const auto& p : model.module().parameters()) result.push_back(p.grad());
  for (const auto& b : model.module().named_buffers()) result.push_back(b.value().to(torch::kFloat));
  model.module().eval();
  torch::NoGradGuard no_grad;
  result.push_back(
      forward(model, torch::randn({3, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast)));
  return result;
}

// Each of `own`'s tensors equal to `aten`'s to fp32's rounding, element by element; in bf16 within 4% of the
// tensor's largest value, not of each element's: LibTorch 1.13's bf16 conv on a CPU without native bf16 (an
// AVX2-only EPYC) gave a conv weight's gradient 0.117 from fasttrain's where its largest value was 5.02 (its
// sums rounded in bf16 along the way; 2.11's agree with fasttrain's to bf16's rounding). The kernels' own
// tests hold them to fp64's sums.
void expect_close_to_rounding(const std::vector<torch::Tensor>& own, const std::vector<torch::Tensor>& aten,
                              bool bf16) {
  ASSERT_EQ(own.size(), aten.size());
  for (size_t i = 0; i < own.size(); ++i) {
    const std::string what = "tensor " + std::to_string(i);
    if (bf16) {
      testing::expect_close(own[i], aten[i], 4e-2, what, 1e-2);
      continue;
    }
    const torch::Tensor got = own[i].to(torch::kFloat), want = aten[i].to(torch::kFloat);
    EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-4))
        << what << ": max |difference| " << (got - want).abs().max().item<double>();
  }
}

TEST(Models, CnnOwnBatchNormReluKernelMatchesATensStep) {
  // model.aten_kernels = ["batch_norm_relu"] runs ATen's BatchNorm2d and ReLU; fasttrain's kernel gives the
  // same loss, gradients, running statistics and batch count to fp32's (or bf16's) rounding, in training
  // and in evaluation, and the same parameter and buffer names (a checkpoint of one loads in the other).
  // The kernel's reference tests: tests/kernels/batch_norm_relu_test.cpp.
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  for (const bool bf16 : {false, true}) {
    for (const bool pool_first : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + (pool_first ? " pool_first" : ""));
      const CnnOptions options = small_batchnorm_cnn(pool_first);
      expect_close_to_rounding(
          two_steps_and_an_evaluation(options, shape, bf16),
          two_steps_and_an_evaluation(CnnOptions(options).aten_kernels({"batch_norm_relu"}), shape, bf16),
          bf16);
    }
  }
  // The same buffer names either way (a checkpoint of one loads in the other).
  EXPECT_EQ(make_cnn(small_batchnorm_cnn(true), shape).module().named_buffers().keys(),
            make_cnn(small_batchnorm_cnn(true).aten_kernels({"batch_norm_relu"}), shape)
                .module()
                .named_buffers()
                .keys());
  Model model = make_cnn(CnnOptions().batchnorm(true), kFashion);
  const auto names = model.module().named_parameters().keys();
  Model aten = make_cnn(CnnOptions().batchnorm(true).kernels("aten"), kFashion);
  EXPECT_EQ(names, aten.module().named_parameters().keys());
  EXPECT_TRUE(contains_all(error_message([] { make_cnn(CnnOptions().aten_kernels({"conv"}), kFashion); }),
                           {"model.aten_kernels", "conv"}));
}

TEST(Models, CnnOwnFlattenKernelGivesATensStepBitForBit) {
  // The last maps (channels_last) reach the classifier through fasttrain's transpose, or with
  // model.aten_kernels = ["flatten"] through ATen's strided copy: the same values moved, so the same losses,
  // gradients, buffers and evaluation exactly, in fp32 and under bf16 autocast. The kernel's reference
  // tests: tests/kernels/flatten_test.cpp.
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  for (const bool bf16 : {false, true}) {
    for (const bool pool_first : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + (pool_first ? " pool_first" : ""));
      const CnnOptions options = small_batchnorm_cnn(pool_first);
      const auto own = two_steps_and_an_evaluation(options, shape, bf16);
      const auto aten =
          two_steps_and_an_evaluation(CnnOptions(options).aten_kernels({"flatten"}), shape, bf16);
      ASSERT_EQ(own.size(), aten.size());
      for (size_t i = 0; i < own.size(); ++i) EXPECT_TRUE(torch::equal(own[i], aten[i])) << "tensor " << i;
    }
  }
  // The switch decides which runs (else the comparison above would compare ATen with itself).
  auto runs_kernel = [&](const std::vector<std::string>& aten_kernels, bool channels_last) {
    Model model = make_cnn(small_batchnorm_cnn(true).aten_kernels(aten_kernels), shape);
    auto input = torch::randn({2, 1, 14, 14});
    if (channels_last) {
      model.to_channels_last();
      input = input.contiguous(torch::MemoryFormat::ChannelsLast);
    }
    return testing::graph_has_node(forward(model, input), "FlattenChannelsLast");
  };
  EXPECT_TRUE(runs_kernel({}, true));
  EXPECT_FALSE(runs_kernel({"flatten"}, true));
  EXPECT_FALSE(runs_kernel({}, false));  // NCHW maps: flatten is a view
}

TEST(Models, CnnOwnLinearKernelsMatchATensStep) {
  // In bf16 the hidden Linear and its ReLU run kernels::amx_linear (on a CPU with AMX-BF16) and the output
  // Linear kernels::narrow_linear, each summing its weight's and bias's gradients in fp32 where autocast's
  // backward rounds them to bf16; model.aten_kernels = [name] runs ATen's linear (and relu) instead. The same
  // losses, gradients, buffers and evaluation to bf16's rounding, and the same parameter names. The kernels'
  // reference tests: tests/kernels/amx_linear_test.cpp, narrow_linear_test.cpp.
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  const CnnOptions options =
      CnnOptions().widths({8, 32}).hidden({64}).batchnorm(true).pool_first(true);  // 288 -> 64 -> 10
  for (const auto& [kernel, graph_node] :
       {std::pair<std::string, std::string>{"amx_linear", "AmxLinear"}, {"narrow_linear", "NarrowLinear"}}) {
    const std::string name = kernel, node = graph_node;  // copies: a lambda below captures them (C++17)
    SCOPED_TRACE(name);
    if (name == "amx_linear" && !kernels::amx_linear_runs_here()) continue;  // no AMX-BF16 tiles here
    expect_close_to_rounding(
        two_steps_and_an_evaluation(options, shape, true),
        two_steps_and_an_evaluation(CnnOptions(options).aten_kernels({name}), shape, true), true);
    EXPECT_EQ(make_cnn(options, shape).module().named_parameters().keys(),
              make_cnn(CnnOptions(options).aten_kernels({name}), shape).module().named_parameters().keys());
    // The switch decides which runs, and only in bf16.
    auto runs_kernel = [&](const std::vector<std::string>& aten_kernels, bool bf16) {
      Model model = make_cnn(CnnOptions(options).aten_kernels(aten_kernels), shape);
      model.to_channels_last();
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
      return testing::graph_has_node(
          forward(model, torch::randn({2, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast)), node);
    };
    EXPECT_TRUE(runs_kernel({}, true));
    EXPECT_FALSE(runs_kernel({name}, true));
    EXPECT_FALSE(runs_kernel({}, false));
  }
}

TEST(Models, CnnOwnLinearReluKernelMatchesATensStepInFp32) {
  // In fp32 the hidden Linear and its ReLU run kernels::linear_relu, whose backward multiplies only the
  // gradients the ReLU passes (or ATen's dense matmuls where most pass); model.aten_kernels = ["linear_relu"]
  // runs ATen's linear and relu. The same losses, gradients, buffers and evaluation to fp32's rounding, and
  // the same parameter names. The kernel's reference tests, by both paths:
  // tests/kernels/linear_relu_test.cpp.
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  const CnnOptions options = CnnOptions().widths({8, 32}).hidden({64}).batchnorm(true).pool_first(true);
  expect_close_to_rounding(
      two_steps_and_an_evaluation(options, shape, false),
      two_steps_and_an_evaluation(CnnOptions(options).aten_kernels({"linear_relu"}), shape, false), false);
  EXPECT_EQ(
      make_cnn(options, shape).module().named_parameters().keys(),
      make_cnn(CnnOptions(options).aten_kernels({"linear_relu"}), shape).module().named_parameters().keys());
  // The switch decides which runs, and only in fp32.
  auto runs_kernel = [&](const std::vector<std::string>& aten_kernels, bool bf16) {
    Model model = make_cnn(CnnOptions(options).aten_kernels(aten_kernels), shape);
    model.to_channels_last();
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
    return testing::graph_has_node(
        forward(model, torch::randn({2, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast)),
        "LinearReluFunction");
  };
  EXPECT_TRUE(runs_kernel({}, false));
  EXPECT_FALSE(runs_kernel({"linear_relu"}, false));
  EXPECT_FALSE(runs_kernel({}, true));
}

TEST(Models, CnnOwnConvMaxPoolKernelMatchesATensStep) {
  // With pool_first each conv and its max-pool run fasttrain's fused kernel (the second, over 8 channels,
  // in fp32 only: its winners' backward does not pay in bf16; its forward by Winograd's F(2x2, 3x3));
  // model.aten_kernels = ["conv_max_pool"] runs
  // ATen's conv2d and then the max-pool. The same loss,
  // gradients, running statistics and evaluation to fp32's (or bf16's) rounding, and the same parameter
  // names. The kernel's reference tests: tests/kernels/conv_max_pool_test.cpp.
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  for (const bool bf16 : {false, true}) {
    for (const bool bias : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + (bias ? " conv bias" : ""));
      const CnnOptions options = small_batchnorm_cnn(true).bias_before_norm(bias);
      expect_close_to_rounding(
          two_steps_and_an_evaluation(options, shape, bf16),
          two_steps_and_an_evaluation(CnnOptions(options).aten_kernels({"conv_max_pool"}), shape, bf16),
          bf16);
      EXPECT_EQ(make_cnn(options, shape).module().named_parameters().keys(),
                make_cnn(CnnOptions(options).aten_kernels({"conv_max_pool"}), shape)
                    .module()
                    .named_parameters()
                    .keys());
    }
  }
  // model.aten_kernels = ["winograd_conv"]: the second conv's forward (8 input channels, fp32) by oneDNN's
  // conv and the max-pool kernel instead of Winograd's: the same steps to fp32's rounding, and not bit for
  // bit, so the switch reaches the kernel.
  {
    const CnnOptions options = small_batchnorm_cnn(true);
    const auto winograd = two_steps_and_an_evaluation(options, shape, false);
    const auto onednn =
        two_steps_and_an_evaluation(CnnOptions(options).aten_kernels({"winograd_conv"}), shape, false);
    expect_close_to_rounding(winograd, onednn, false);
    bool differs = false;
    for (size_t i = 0; i < winograd.size(); ++i) differs = differs || !torch::equal(winograd[i], onednn[i]);
    EXPECT_TRUE(differs) << "winograd_conv left to oneDNN changed no value";
  }
  // Each conv whose max-pool comes straight after it (pool_first) is fused; an Identity holds its max-pool's
  // place, as one holds the ReLU's after each BatchNorm + ReLU and after the hidden Linear (amx_linear or
  // linear_relu).
  auto identities = [&](bool pool_first, const std::vector<std::string>& aten_kernels) {
    Model model = make_cnn(small_batchnorm_cnn(pool_first).aten_kernels(aten_kernels), shape);
    int64_t count = 0;
    for (const auto& module : model.module().modules()) count += module->as<torch::nn::Identity>() ? 1 : 0;
    return count;
  };
  EXPECT_EQ(identities(true, {}), 5);
  EXPECT_EQ(identities(true, {"conv_max_pool"}), 3);
  EXPECT_EQ(identities(false, {}), 3);
  EXPECT_EQ(identities(false, {"amx_linear"}), 3);
  EXPECT_EQ(identities(false, {"amx_linear", "linear_relu"}), 2);
}

TEST(Models, CnnOwnAmxConvMatchesOneDnnsStepInBf16) {
  // In bf16 on a CPU that lends AMX-BF16 tiles, a conv over 16 input channels (the main job's second) and its
  // max-pool run the fused kernel's AMX forward (backward: the weight's gradient on the tiles too, the
  // input's oneDNN's conv backward from the winners' gradient); model.aten_kernels = ["amx_conv"] runs
  // oneDNN's conv and the max-pool kernel. The same losses, gradients, buffers and evaluation to bf16's
  // rounding, and the same parameter names. The kernel's reference tests:
  // tests/kernels/conv_max_pool_test.cpp (CpuConvMaxPool.Amx*).
  if (!kernels::conv3x3_max_pool2x2_runs_on_amx(16, 32, torch::kBFloat16)) {
    GTEST_SKIP() << "this CPU lends no AMX-BF16 tiles: the AMX forward never runs";
  }
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  const CnnOptions options = CnnOptions().widths({16, 32}).hidden({32}).batchnorm(true).pool_first(true);
  expect_close_to_rounding(
      two_steps_and_an_evaluation(options, shape, true),
      two_steps_and_an_evaluation(CnnOptions(options).aten_kernels({"amx_conv"}), shape, true), true);
  EXPECT_EQ(
      make_cnn(options, shape).module().named_parameters().keys(),
      make_cnn(CnnOptions(options).aten_kernels({"amx_conv"}), shape).module().named_parameters().keys());
  // The switch decides which runs, and only in bf16: with it, no ATen conv is left in the graph (the first
  // conv, over one channel, is the fused kernel's direct path either way).
  auto runs_aten_conv = [&](const std::vector<std::string>& aten_kernels, bool bf16) {
    Model model = make_cnn(CnnOptions(options).aten_kernels(aten_kernels), shape);
    model.to_channels_last();
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
    const auto y = forward(model, torch::randn({2, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast));
    return testing::graph_has_node(y, "ConvolutionBackward");
  };
  EXPECT_FALSE(runs_aten_conv({}, true));
  EXPECT_TRUE(runs_aten_conv({"amx_conv"}, true));
  EXPECT_FALSE(runs_aten_conv({}, false));  // fp32: Winograd's forward, the winners' backward
}

// Calls on this thread of the RecordFunction `name` while `body` runs.
int64_t record_function_calls(const char* name, const std::function<void()>& body) {
  static thread_local const char* wanted = nullptr;
  static thread_local int64_t calls = 0;
  wanted = name;
  calls = 0;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::string(fn.name()) == wanted) ++calls;
        return nullptr;
      }));
  body();
  at::removeCallback(handle);
  return calls;
}

TEST(Models, CnnEvaluationRunsEachConvStageInOnePassWithTheSameOutputs) {
  // In evaluation each stage's conv + max-pool and its BatchNorm + ReLU run as one kernel (the BatchNorm in
  // the conv's epilogue): in fp32 on every CPU, in bf16 on a CPU that lends AMX-BF16 tiles;
  // model.aten_kernels = ["conv_batch_norm_relu"] runs them as two. Training is not touched, and the
  // evaluation's output is the same bit for bit, after two steps have moved the running statistics, and with
  // a NaN image (which sends the AMX stages to the two kernels). The kernel's reference tests:
  // CpuConvMaxPool.{Fp32,Amx}EvaluationEpilogueGivesBatchNormReluOfThePooledMapsBitForBit.
  const bool amx = kernels::conv3x3_max_pool2x2_runs_on_amx(16, 32, torch::kBFloat16) &&
                   kernels::cpu_capability() == kernels::CpuCapability::avx512;
  const DataShape shape = DataShape::images(1, 14, 14, 10);
  const CnnOptions options = CnnOptions().widths({16, 32}).hidden({32}).batchnorm(true).pool_first(true);
  constexpr const char* kFused = "fasttrain::conv3x3_max_pool2x2_batch_norm_relu";
  // Two training steps, then evaluations in fp32 and (with AMX) in bf16 autocast, each of finite images and
  // of images with a NaN; the fused kernel's calls in each.
  auto evaluations = [&](const CnnOptions& cnn, std::vector<int64_t>& fused_calls) {
    std::vector<torch::Tensor> result = two_steps_and_an_evaluation(cnn, shape, true);
    torch::manual_seed(5);
    Model model = make_cnn(cnn, shape);
    model.to_channels_last();
    torch::manual_seed(6);
    for (int step = 0; step < 2; ++step) {
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
      forward(model, torch::randn({6, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast));
    }
    model.module().eval();
    torch::NoGradGuard no_grad;
    const auto images = torch::randn({5, 1, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast);
    torch::Tensor with_nan = images.clone();
    with_nan.index_put_({3, 0, 5, 7}, std::numeric_limits<float>::quiet_NaN());
    std::vector<std::pair<torch::Tensor, bool>> batches = {{images, false}, {with_nan, false}};
    if (amx) batches.insert(batches.end(), {{images, true}, {with_nan, true}});
    for (const auto& [batch, bf16] : batches) {
      fused_calls.push_back(record_function_calls(kFused, [&, bf16 = bf16, batch = batch] {
        AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
        result.push_back(forward(model, batch));
      }));
    }
    return result;
  };
  std::vector<int64_t> on_calls, off_calls;
  const auto fused = evaluations(options, on_calls);
  const auto apart = evaluations(CnnOptions(options).aten_kernels({"conv_batch_norm_relu"}), off_calls);
  // Both stages fused in fp32, a NaN image included; in bf16 both stages ask the AMX kernel on the NaN image
  // too, which declines (the NaN passes through the first stage's ReLU into the second's images) and the two
  // kernels run instead.
  EXPECT_EQ(on_calls, std::vector<int64_t>(amx ? 4 : 2, 2));
  EXPECT_EQ(off_calls, std::vector<int64_t>(on_calls.size(), 0));
  ASSERT_EQ(fused.size(), apart.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(torch::allclose(fused[i], apart[i], 0, 0, /*equal_nan=*/true)) << "tensor " << i;
  }
  const size_t first = fused.size() - on_calls.size();  // the evaluations after the training steps' tensors
  for (size_t i = first; i < fused.size(); i += 2) {
    EXPECT_TRUE(fused[i].isfinite().all().item<bool>()) << "tensor " << i;
    EXPECT_FALSE(fused[i + 1].isfinite().all().item<bool>()) << "tensor " << i + 1;
  }
}

TEST(Models, ConvsBeforeBatchNormHaveNoBias) {
  for (const Model& model : {make_cnn(CnnOptions().widths({8, 16}).batchnorm(true), kFashion),
                             make_resnet(ResnetOptions().widths({8, 16}), kFashion)}) {
    for (const auto& module : model.module().modules(/*include_self=*/false)) {
      if (auto* conv = module->as<torch::nn::Conv2d>()) {
        EXPECT_FALSE(conv->options.bias()) << model.name() << ": conv with bias before BatchNorm";
      }
    }
  }
}

TEST(Models, BadOptionsAndDataAreNamed) {
  EXPECT_TRUE(contains_all(error_message([] { make_model("transformer", kFashion); }),
                           {"model.name 'transformer'", "cnn, gpt, mlp, resnet"}));
  EXPECT_TRUE(contains_all(error_message([] {
                             make_cnn(CnnOptions().widths({8, 0}), kFashion);
                           }),
                           {"model.widths"}));
  EXPECT_TRUE(
      contains_all(error_message([] { make_cnn(CnnOptions().widths({}), kFashion); }), {"model.widths"}));
  EXPECT_TRUE(contains_all(error_message([] {
                             make_cnn(CnnOptions().widths({4, 4, 4, 4, 4, 4}), kFashion);
                           }),
                           {"pooling stages"}));
  EXPECT_TRUE(
      contains_all(error_message([] { make_mlp(MlpOptions().dropout(1.0), kFashion); }), {"model.dropout"}));
  EXPECT_TRUE(contains_all(error_message([] { make_cnn(CnnOptions(), DataShape::tokens(16, 256)); }),
                           {"model 'cnn'", "images", "[16] Long"}));
  EXPECT_TRUE(contains_all(error_message([] { make_gpt(GptOptions(), kFashion); }),
                           {"model 'gpt'", "token sequences", "[1, 28, 28]"}));
}

TEST(Models, DropoutIsOffInEvalMode) {
  Model model = make_mlp(MlpOptions().hidden({32}).dropout(0.5), kFashion);
  auto input = torch::randn({4, 1, 28, 28});
  model.module().eval();
  EXPECT_TRUE(torch::equal(forward(model, input), forward(model, input)));
  model.module().train();
  EXPECT_FALSE(torch::equal(forward(model, input), forward(model, input)));
}

// ---- a program's own module ----

struct TwoTowersImpl : torch::nn::Module {
  TwoTowersImpl()
      : left(register_module("left", torch::nn::Linear(3, 2))),
        right(register_module("right", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& a, const torch::Tensor& b) { return left(a) + right(b); }
  torch::nn::Linear left, right;
};
TORCH_MODULE(TwoTowers);

TEST(Model, AnyModuleWithHowABatchEntersIt) {
  TwoTowers towers;
  Model model(towers, [](TwoTowersImpl& net, const Batch& batch) {
    return net.forward(batch.inputs, batch.at("side"));
  });
  Batch batch;
  batch.inputs = torch::randn({5, 3});
  batch.fields["side"] = torch::randn({5, 4});
  EXPECT_TRUE(
      torch::allclose(model.forward(batch).tensor(), towers->forward(batch.inputs, batch.fields["side"])));
  EXPECT_NE(model.name().find("TwoTowers"), std::string::npos) << model.name();
  EXPECT_EQ(model.parameter_count(), 3 * 2 + 2 + 4 * 2 + 2);
  // A module's own forward(inputs), from a holder or a shared_ptr.
  Model linear(torch::nn::Linear(3, 2));
  Model shared(std::make_shared<torch::nn::LinearImpl>(3, 2));
  EXPECT_EQ(linear.forward(batch).tensor().sizes(), (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(shared.forward(batch).tensor().sizes(), (std::vector<int64_t>{5, 2}));
  // Named outputs: a task picks what it needs by name.
  Model heads(towers, [](TwoTowersImpl& net, const Batch& batch) {
    return std::map<std::string, torch::Tensor>{{"left", net.left(batch.inputs)},
                                                {"right", net.right(batch.at("side"))}};
  });
  const ModelOutput output = heads.forward(batch);
  EXPECT_EQ(output.names(), (std::vector<std::string>{"left", "right"}));
  EXPECT_TRUE(contains_all(error_message([&] { output.at("middle"); }), {"middle", "left, right"}));
  EXPECT_TRUE(contains_all(error_message([&] { output.tensor(); }), {"named outputs", "left, right"}));
}

// The switches that need blocks find them in the module's Stages, wherever they are; a module without
// any says so when checkpointing is asked for.
TEST(Model, StagesAreTheBlocksTheSwitchesUse) {
  Model gpt = make_gpt(GptOptions().layers(3).embed(16).heads(2).context(8), DataShape::tokens(8, 256));
  ASSERT_EQ(gpt.stages().size(), 1u);
  EXPECT_EQ(gpt.stages().front()->size(), 3u);
  gpt.set_checkpointing(CheckpointPolicy::blocks());
  EXPECT_TRUE(gpt.stages().front()->checkpointing().enabled());
  Model plain(torch::nn::Linear(3, 2));
  plain.set_checkpointing(CheckpointPolicy::none());  // nothing asked, nothing needed
  EXPECT_TRUE(contains_all(error_message([&] { plain.set_checkpointing(CheckpointPolicy::blocks()); }),
                           {"memory.checkpoint", "fasttrain::Stage", "none"}));
}

// A program registers its model once; a config then names it, with keys of its own.
struct WideOptions {
  FT_KEYS(WideOptions);
  FT_KEY(int64_t, width, "Hidden width", at_least(1)) = 8;
};

TEST(ModelRegistry, AProgramsModelIsBuiltByNameWithItsOwnKeys) {
  if (!model_registry().contains("test_wide")) {
    model_registry().add(
        "test_wide", "a test's model",
        model_recipe<WideOptions>([](const WideOptions& options, const DataShape& shape) {
          return Model(torch::nn::Sequential(
              torch::nn::Flatten(),
              torch::nn::Linear(shape.input[0] * shape.input[1] * shape.input[2], options.width()),
              torch::nn::Linear(options.width(), shape.classes)));
        }));
  }
  AnyOptions options = AnyOptions::of(WideOptions().width(5));
  Model model = make_model("test_wide", kFashion, &options);
  EXPECT_EQ(model.name(), "test_wide");
  EXPECT_EQ(model.parameter_count(), 784 * 5 + 5 + 5 * 10 + 10);
  AnyOptions bad = AnyOptions::of(WideOptions().width(0));
  EXPECT_TRUE(
      contains_all(error_message([&] { make_model("test_wide", kFashion, &bad); }), {"model.width", "0"}));
  EXPECT_TRUE(
      contains_all(error_message([] { model_registry().add("cnn", "again", model_registry().at("cnn")); }),
                   {"model.name 'cnn' is already registered"}));
}

}  // namespace
}  // namespace fasttrain

namespace fasttrain {
namespace {

struct ForwardBackward {
  torch::Tensor logits;
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> buffers;
  int64_t peak_bytes = 0;
};

// One training forward and backward of a model `build` makes under seed 21, with `policy`.
ForwardBackward forward_backward(const std::function<Model()>& build, const CheckpointPolicy& policy,
                                 const torch::Tensor& images) {
  torch::manual_seed(21);
  Model model = build();
  model.set_checkpointing(policy);
  ForwardBackward result;
  torch::manual_seed(22);  // dropout masks
  {
    testing::PeakCpuMemory memory;
    result.logits = forward(model, images);
    torch::Tensor weights = torch::linspace(-1, 1, result.logits.numel()).view(result.logits.sizes());
    (result.logits * weights).sum().backward();
    result.peak_bytes = memory.peak_bytes();
  }
  for (const auto& parameter : model.module().parameters()) result.grads.push_back(parameter.grad());
  for (const auto& buffer : model.module().buffers()) result.buffers.push_back(buffer.clone());
  return result;
}

// memory.checkpoint on each model: the same logits, gradients (1e-6) and BatchNorm statistics as
// without it, with dropout and in-place ReLUs in the checkpointed blocks.
TEST(Models, CheckpointedModelsMatchTheirPlainGradients) {
  const std::vector<std::pair<std::string, std::function<Model()>>> models = {
      {"mlp",
       [] {
         return make_mlp(MlpOptions().hidden({64, 64, 32}).dropout(0.2), kFashion);
       }},
      {"cnn",
       [] {
         return make_cnn(CnnOptions().widths({8, 16}).hidden({32}).batchnorm(true).dropout(0.1), kFashion);
       }},
      {"cnn pool_first",
       [] {
         return make_cnn(CnnOptions().widths({8, 16}).hidden({32}).batchnorm(true).pool_first(true),
                         kFashion);
       }},
      {"resnet",
       [] {
         return make_resnet(ResnetOptions().widths({8, 16}).blocks(2).hidden({16}).dropout(0.1), kFashion);
       }},
  };
  const torch::Tensor images = torch::randn({6, 1, 28, 28});
  for (const auto& [name, build] : models) {
    for (const std::string mode : {"blocks", "every_k"}) {
      SCOPED_TRACE(name + " " + mode);
      auto plain = forward_backward(build, CheckpointPolicy(), images);
      auto checkpointed = forward_backward(build, CheckpointPolicy::parse(mode, 2), images);
      EXPECT_TRUE(torch::allclose(plain.logits, checkpointed.logits, 0, 1e-6));
      ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
      for (size_t i = 0; i < plain.grads.size(); ++i) {
        ASSERT_TRUE(checkpointed.grads[i].defined()) << "parameter " << i << " got no gradient";
        EXPECT_TRUE(torch::allclose(plain.grads[i], checkpointed.grads[i], 0, 1e-6))
            << "parameter " << i << " differs by " << (plain.grads[i] - checkpointed.grads[i]).abs().max();
      }
      for (size_t i = 0; i < plain.buffers.size(); ++i) {
        EXPECT_TRUE(torch::allclose(plain.buffers[i].to(torch::kDouble),
                                    checkpointed.buffers[i].to(torch::kDouble), 0, 1e-6))
            << "buffer " << i;
      }
    }
  }
}

// The point of it: a deep ResNet's forward and backward peaks far lower with every block checkpointed.
TEST(Models, CheckpointedResNetPeaksLower) {
  auto build = [] { return make_resnet(ResnetOptions().widths({16, 32}).blocks(6), kFashion); };
  const torch::Tensor images = torch::randn({64, 1, 28, 28});
  forward_backward(build, CheckpointPolicy(), images);  // warm-up: lazily created state is not counted
  const int64_t plain = forward_backward(build, CheckpointPolicy(), images).peak_bytes;
  const int64_t blocks = forward_backward(build, CheckpointPolicy::blocks(), images).peak_bytes;
  std::cout << "resnet 2x6 blocks, batch 64: peak " << plain << " bytes plain, " << blocks
            << " checkpointed\n";
  EXPECT_LT(blocks * 2, plain);
}

}  // namespace
}  // namespace fasttrain
