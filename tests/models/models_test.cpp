#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "fasttrain/models/registry.h"
#include "fasttrain/util/check.h"
#include "memory/peak_cpu_memory.h"

namespace fasttrain {
namespace {

TEST(Models, EveryModelMapsImagesToLogits) {
  for (const auto& name : model_names()) {
    if (name == "gpt") continue;  // tokens, not images: the Gpt tests
    SCOPED_TRACE(name);
    auto model =
        make_model(ModelOptions(name).in_channels(3).height(16).width(16).num_classes(7).widths({8, 16}));
    auto logits = model->forward(torch::randn({5, 3, 16, 16}));
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{5, 7}));
    EXPECT_GT(model->parameter_count(), 0);
    EXPECT_NE(model->describe().find("parameters"), std::string::npos);
  }
}

TEST(Models, ClassicCnnHasTheTextbookParameterCount) {
  // conv 1->32 (320) + conv 32->64 (18496) + fc 3136->128 (401536) + fc 128->10 (1290)
  auto model = make_model(ModelOptions("cnn").widths({32, 64}).hidden({128}));
  EXPECT_EQ(model->parameter_count(), 320 + 18496 + 401536 + 1290);
}

TEST(Models, PoolFirstCommutesWithReluWithoutBatchNorm) {
  // Without BatchNorm, pooling before or after the ReLU is the same function.
  torch::manual_seed(3);
  auto pooled_last = make_model(ModelOptions("cnn").widths({4, 8}).hidden({16}));
  torch::manual_seed(3);
  auto pooled_first = make_model(ModelOptions("cnn").widths({4, 8}).hidden({16}).pool_first(true));
  auto input = torch::randn({3, 1, 28, 28});
  EXPECT_TRUE(torch::allclose(pooled_last->forward(input), pooled_first->forward(input), 1e-5, 1e-6));
  // With BatchNorm it normalises the pooled maps: [B, C, H/2, W/2] running stats still per channel.
  auto normalised = make_model(ModelOptions("cnn").widths({4, 8}).batchnorm(true).pool_first(true));
  EXPECT_EQ(normalised->forward(input).sizes(), (std::vector<int64_t>{3, 10}));
}

TEST(Models, ChannelsLastComputesTheSameFunctionAndGradients) {
  for (const std::string name : {"cnn", "resnet"}) {
    SCOPED_TRACE(name);
    auto options = ModelOptions(name).in_channels(3).height(16).width(16).widths({8, 16}).batchnorm(true);
    torch::manual_seed(7);
    auto nchw = make_model(options);
    torch::manual_seed(7);
    auto nhwc = make_model(options);
    to_channels_last(*nhwc);
    bool converted = false;
    for (const auto& p : nhwc->parameters()) {
      if (p.dim() == 4) converted = p.is_contiguous(torch::MemoryFormat::ChannelsLast) && p.size(1) > 1;
    }
    EXPECT_TRUE(converted);
    auto input = torch::randn({4, 3, 16, 16});
    auto out_a = nchw->forward(input);
    auto out_b = nhwc->forward(input.contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(torch::allclose(out_a, out_b, 1e-4, 1e-5));
    out_a.sum().backward();
    out_b.sum().backward();
    auto pa = nchw->parameters(), pb = nhwc->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(torch::allclose(pa[i].grad(), pb[i].grad(), 1e-3, 1e-4)) << "parameter " << i;
    }
  }
}

TEST(Models, ConvsBeforeBatchNormHaveNoBias) {
  for (const std::string name : {"cnn", "resnet"}) {
    auto model = make_model(ModelOptions(name).widths({8, 16}).batchnorm(true));
    for (const auto& module : model->modules(/*include_self=*/false)) {
      if (auto* conv = module->as<torch::nn::Conv2d>()) {
        EXPECT_FALSE(conv->options.bias()) << name << ": conv with bias before BatchNorm";
      }
    }
  }
}

TEST(Models, BadOptionsAreNamed) {
  auto message = [](const ModelOptions& options) {
    try {
      make_model(options);
    } catch (const ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(ModelOptions("transformer")).find("cnn, gpt, mlp, resnet"), std::string::npos)
      << message(ModelOptions("transformer"));
  EXPECT_NE(message(ModelOptions("cnn").widths({8, 0})).find("model.widths"), std::string::npos);
  EXPECT_NE(message(ModelOptions("cnn").widths({})).find("model.widths"), std::string::npos);
  EXPECT_NE(message(ModelOptions("cnn").widths({4, 4, 4, 4, 4, 4})).find("pooling stages"),
            std::string::npos);
  EXPECT_NE(message(ModelOptions("mlp").dropout(1.5)).find("model.dropout"), std::string::npos);
}

TEST(Models, DropoutIsOffInEvalMode) {
  auto model = make_model(ModelOptions("mlp").hidden({32}).dropout(0.5));
  auto input = torch::randn({4, 1, 28, 28});
  model->eval();
  EXPECT_TRUE(torch::equal(model->forward(input), model->forward(input)));
  model->train();
  EXPECT_FALSE(torch::equal(model->forward(input), model->forward(input)));
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

// One training forward and backward of a model built from `options` under seed 21, with `policy`.
ForwardBackward forward_backward(const ModelOptions& options, const CheckpointPolicy& policy,
                                 const torch::Tensor& images) {
  torch::manual_seed(21);
  auto model = make_model(options);
  model->set_checkpointing(policy);
  ForwardBackward result;
  torch::manual_seed(22);  // dropout masks
  {
    testing::PeakCpuMemory memory;
    result.logits = model->forward(images);
    torch::Tensor weights = torch::linspace(-1, 1, result.logits.numel()).view(result.logits.sizes());
    (result.logits * weights).sum().backward();
    result.peak_bytes = memory.peak_bytes();
  }
  for (const auto& parameter : model->parameters()) result.grads.push_back(parameter.grad());
  for (const auto& buffer : model->buffers()) result.buffers.push_back(buffer.clone());
  return result;
}

// memory.checkpoint on each model: the same logits, gradients (1e-6) and BatchNorm statistics as
// without it, with dropout and in-place ReLUs in the checkpointed blocks.
TEST(Models, CheckpointedModelsMatchTheirPlainGradients) {
  const std::vector<ModelOptions> models = {
      ModelOptions("mlp").hidden({64, 64, 32}).dropout(0.2),
      ModelOptions("cnn").widths({8, 16}).hidden({32}).batchnorm(true).dropout(0.1),
      ModelOptions("cnn").widths({8, 16}).hidden({32}).batchnorm(true).pool_first(true),
      ModelOptions("resnet").widths({8, 16}).blocks(2).hidden({16}).dropout(0.1),
  };
  const torch::Tensor images = torch::randn({6, 1, 28, 28});
  for (const auto& options : models) {
    for (const std::string mode : {"blocks", "every_k"}) {
      SCOPED_TRACE(options.name() + " " + mode + (options.pool_first() ? " pool_first" : ""));
      auto plain = forward_backward(options, CheckpointPolicy(), images);
      auto checkpointed =
          forward_backward(options, CheckpointPolicy::parse(CheckpointOptions().mode(mode).every(2)), images);
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
  const auto options = ModelOptions("resnet").widths({16, 32}).blocks(6);
  const torch::Tensor images = torch::randn({64, 1, 28, 28});
  forward_backward(options, CheckpointPolicy(), images);  // warm-up: lazily created state is not counted
  const int64_t plain = forward_backward(options, CheckpointPolicy(), images).peak_bytes;
  const int64_t blocks =
      forward_backward(options, CheckpointPolicy::parse(CheckpointOptions().mode("blocks")), images)
          .peak_bytes;
  std::cout << "resnet 2x6 blocks, batch 64: peak " << plain << " bytes plain, " << blocks
            << " checkpointed\n";
  EXPECT_LT(blocks * 2, plain);
}

}  // namespace
}  // namespace fasttrain
