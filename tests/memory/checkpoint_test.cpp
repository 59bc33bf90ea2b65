#include "fasttrain/memory/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <vector>

#include "fasttrain/precision/autocast.h"
#include "fasttrain/util/check.h"
#include "memory/peak_cpu_memory.h"

namespace fasttrain {
namespace {

// An MLP block: Linear(width, 4 width), GELU, Dropout, Linear(4 width, width).
struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t width, double dropout)
      : up(register_module("up", torch::nn::Linear(width, 4 * width))),
        drop(register_module("drop", torch::nn::Dropout(dropout))),
        down(register_module("down", torch::nn::Linear(4 * width, width))) {}
  torch::Tensor forward(torch::Tensor x) { return down->forward(drop->forward(torch::gelu(up->forward(x)))); }
  torch::nn::Linear up;
  torch::nn::Dropout drop;
  torch::nn::Linear down;
};
TORCH_MODULE(MlpBlock);

// A conv block: 3x3 conv, ReLU, channel dropout.
struct ConvBlockImpl : torch::nn::Module {
  explicit ConvBlockImpl(int64_t channels)
      : conv(register_module("conv",
                             torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))),
        drop(register_module("drop", torch::nn::Dropout2d(0.25))) {}
  torch::Tensor forward(torch::Tensor x) { return drop->forward(torch::relu(conv->forward(x))); }
  torch::nn::Conv2d conv;
  torch::nn::Dropout2d drop;
};
TORCH_MODULE(ConvBlock);

// `count` MLP blocks; the parameters depend only on `seed`, so two calls give identical models.
torch::nn::Sequential mlp_blocks(int64_t count, int64_t width, double dropout, uint64_t seed = 1) {
  torch::manual_seed(seed);
  torch::nn::Sequential blocks;
  for (int64_t i = 0; i < count; ++i) blocks->push_back(MlpBlock(width, dropout));
  return blocks;
}

torch::nn::Sequential cnn_blocks(int64_t count, int64_t channels, uint64_t seed = 1) {
  torch::manual_seed(seed);
  torch::nn::Sequential blocks;
  for (int64_t i = 0; i < count; ++i) blocks->push_back(ConvBlock(channels));
  return blocks;
}

struct RunResult {
  torch::Tensor output;
  torch::Tensor input_grad;
  std::vector<torch::Tensor> parameter_grads;
  torch::Tensor next_random;  // a draw after backward: the RNG stream must be where plain training leaves it
};

// Forward (plain or checkpointed with `policy`) under a fixed seed, a loss that weighs every output
// differently, backward.
RunResult run(torch::nn::Sequential& model, const torch::Tensor& input, const CheckpointPolicy& policy,
              uint64_t seed = 1234) {
  torch::manual_seed(seed);
  torch::Tensor x = input.detach().clone().requires_grad_(input.requires_grad());
  torch::Tensor output = policy.enabled() ? checkpoint_sequential(*model, x, policy) : model->forward(x);
  torch::Tensor weights = torch::linspace(-1, 1, output.numel()).view(output.sizes());
  (output.to(torch::kFloat) * weights).sum().backward();
  RunResult result;
  result.output = output.detach();
  if (x.requires_grad()) result.input_grad = x.grad();
  for (const auto& parameter : model->parameters()) result.parameter_grads.push_back(parameter.grad());
  result.next_random = torch::rand({8});
  return result;
}

void expect_same(const RunResult& expected, const RunResult& actual, double tolerance = 1e-6) {
  EXPECT_TRUE(torch::allclose(expected.output, actual.output, 0, tolerance));
  ASSERT_EQ(expected.input_grad.defined(), actual.input_grad.defined());
  if (expected.input_grad.defined()) {
    EXPECT_TRUE(torch::allclose(expected.input_grad, actual.input_grad, 0, tolerance))
        << "input grad max diff " << (expected.input_grad - actual.input_grad).abs().max().item<double>();
  }
  ASSERT_EQ(expected.parameter_grads.size(), actual.parameter_grads.size());
  for (size_t i = 0; i < expected.parameter_grads.size(); ++i) {
    ASSERT_TRUE(actual.parameter_grads[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TRUE(torch::allclose(expected.parameter_grads[i], actual.parameter_grads[i], 0, tolerance))
        << "parameter " << i << " max diff "
        << (expected.parameter_grads[i] - actual.parameter_grads[i]).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(expected.next_random, actual.next_random));
}

CheckpointPolicy blocks_policy() {
  return CheckpointPolicy::blocks();
}

TEST(Checkpoint, MlpWithDropoutMatchesUncheckpointedGradients) {
  torch::Tensor x = torch::randn({32, 16}).requires_grad_(true);
  auto plain = mlp_blocks(6, 16, 0.3);
  auto checkpointed = mlp_blocks(6, 16, 0.3);
  RunResult expected = run(plain, x, CheckpointPolicy());
  RunResult actual = run(checkpointed, x, blocks_policy());
  expect_same(expected, actual);
  // Other dropout masks give other gradients: matching them is what the RNG replay is for.
  auto other = mlp_blocks(6, 16, 0.3);
  RunResult other_masks = run(other, x, CheckpointPolicy(), /*seed=*/4321);
  EXPECT_GT((expected.input_grad - other_masks.input_grad).abs().max().item<double>(),
            1e-2 * expected.input_grad.abs().max().item<double>());
}

TEST(Checkpoint, DataInputThatNeedsNoGradStillGivesParameterGradients) {
  torch::Tensor x = torch::randn({32, 16});  // like a batch of data
  auto plain = mlp_blocks(4, 16, 0.5);
  auto checkpointed = mlp_blocks(4, 16, 0.5);
  expect_same(run(plain, x, CheckpointPolicy()), run(checkpointed, x, blocks_policy()));
}

TEST(Checkpoint, CnnWithDropout2dMatches) {
  torch::Tensor x = torch::randn({4, 6, 10, 10}).requires_grad_(true);
  auto plain = cnn_blocks(5, 6);
  auto checkpointed = cnn_blocks(5, 6);
  expect_same(run(plain, x, CheckpointPolicy()), run(checkpointed, x, blocks_policy()));
}

TEST(Checkpoint, EveryKthBlockMatches) {
  torch::Tensor x = torch::randn({16, 8}).requires_grad_(true);
  auto plain = mlp_blocks(7, 8, 0.2);
  for (int64_t k : {1, 2, 3, 7, 100}) {
    SCOPED_TRACE("every " + std::to_string(k));
    auto checkpointed = mlp_blocks(7, 8, 0.2);
    RunResult expected = run(plain, x, CheckpointPolicy());
    for (auto& p : plain->parameters()) p.mutable_grad() = torch::Tensor();
    expect_same(expected, run(checkpointed, x, CheckpointPolicy::parse("every_k", k)));
  }
}

// What each call of the block saw: forward runs without grad, the recompute with grad, with the same
// random draws and the same autocast dtype as forward.
TEST(Checkpoint, RecomputeReplaysRngAndAutocastWithGradEnabled) {
  torch::nn::Linear linear(8, 8);
  std::vector<bool> grad_enabled;
  std::vector<torch::ScalarType> matmul_dtype;
  std::vector<torch::Tensor> draws;
  CheckpointBlock block = [&](const torch::Tensor& x) {
    grad_enabled.push_back(torch::GradMode::is_enabled());
    draws.push_back(torch::rand({4}));
    torch::Tensor y = linear->forward(x);
    matmul_dtype.push_back(y.scalar_type());
    return y;
  };
  torch::manual_seed(5);
  torch::Tensor x = torch::randn({4, 8});
  torch::Tensor y;
  {
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    y = checkpoint(block, x, linear->parameters());
  }
  ASSERT_EQ(grad_enabled.size(), 1u);
  y.to(torch::kFloat).sum().backward();  // outside the autocast region, as the Trainer does
  torch::Tensor after_backward = torch::rand({4});
  ASSERT_EQ(grad_enabled.size(), 2u);
  EXPECT_FALSE(grad_enabled[0]);
  EXPECT_TRUE(grad_enabled[1]);
  EXPECT_TRUE(torch::equal(draws[0], draws[1]));
  EXPECT_EQ(matmul_dtype[0], torch::kBFloat16);
  EXPECT_EQ(matmul_dtype[1], torch::kBFloat16);
  EXPECT_FALSE(compat::autocast_enabled(c10::DeviceType::CPU));  // the recompute's guard restored it
  // The recompute's draw did not advance the RNG: the next draw continues right after forward's.
  torch::manual_seed(5);
  torch::randn({4, 8});
  torch::rand({4});
  EXPECT_TRUE(torch::equal(torch::rand({4}), after_backward));
}

TEST(Checkpoint, AutocastGradientsMatchUncheckpointedAutocast) {
  torch::Tensor x = torch::randn({32, 16});
  auto plain = mlp_blocks(4, 16, 0.3);
  auto checkpointed = mlp_blocks(4, 16, 0.3);
  auto run_autocast = [&](torch::nn::Sequential& model, const CheckpointPolicy& policy) {
    torch::manual_seed(99);
    torch::Tensor out;
    {
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      out = policy.enabled() ? checkpoint_sequential(*model, x, policy) : model->forward(x);
    }
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    out.to(torch::kFloat).pow(2).mean().backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(p.grad());
    return grads;
  };
  auto expected = run_autocast(plain, CheckpointPolicy());
  auto actual = run_autocast(checkpointed, blocks_policy());
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(expected[i], actual[i], 0, 1e-6))
        << "parameter " << i << " max diff " << (expected[i] - actual[i]).abs().max().item<double>();
  }
}

TEST(Checkpoint, FunctionFormWithParameters) {
  torch::manual_seed(3);
  torch::nn::Linear a(6, 12), b(12, 6);
  torch::nn::Linear a2(6, 12), b2(12, 6);
  {
    torch::NoGradGuard no_grad;
    a2->weight.copy_(a->weight), a2->bias.copy_(a->bias), b2->weight.copy_(b->weight),
        b2->bias.copy_(b->bias);
  }
  torch::Tensor x = torch::randn({5, 6});
  b->forward(torch::tanh(a->forward(x))).sum().backward();
  std::vector<torch::Tensor> params = a2->parameters();
  for (auto& p : b2->parameters()) params.push_back(p);
  int calls = 0;
  torch::Tensor y = checkpoint(
      [&](const torch::Tensor& t) {
        ++calls;
        return b2->forward(torch::tanh(a2->forward(t)));
      },
      x, params);
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(torch::allclose(a->weight.grad(), a2->weight.grad(), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(b->bias.grad(), b2->bias.grad(), 0, 1e-6));
}

TEST(Checkpoint, NothingRequiringGradIsAnError) {
  torch::nn::Linear linear(4, 4);
  CheckpointBlock block = [&](const torch::Tensor& t) { return linear->forward(t); };
  try {
    checkpoint(block, torch::ones({2, 4}));
    FAIL() << "expected Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("pass the block's parameters"), std::string::npos)
        << error.what();
  }
  // Frozen parameters are not enough either.
  for (auto& p : linear->parameters()) p.requires_grad_(false);
  EXPECT_THROW(checkpoint(block, torch::ones({2, 4}), linear->parameters()), Error);
}

TEST(Checkpoint, UnderNoGradTheBlockJustRuns) {
  torch::nn::Linear linear(4, 4);
  int calls = 0;
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::ones({2, 4});
  torch::Tensor y = checkpoint(
      [&](const torch::Tensor& t) {
        ++calls;
        return linear->forward(t);
      },
      x, linear->parameters());
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(y, linear->forward(x)));
  auto blocks = mlp_blocks(2, 4, 0.0);
  EXPECT_TRUE(torch::equal(checkpoint_sequential(*blocks, x, blocks_policy()), blocks->forward(x)));
}

TEST(Checkpoint, BlockModifyingItsInputInPlaceIsReported) {
  torch::nn::Linear linear(4, 4);
  torch::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  torch::Tensor hidden = x * 2;  // not a leaf, so in-place ops on it are legal
  try {
    checkpoint([&](const torch::Tensor& t) { return linear->forward(t.relu_()); }, hidden,
               linear->parameters());
    FAIL() << "expected Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("in place"), std::string::npos) << error.what();
  }
}

// Blocks start at weighted layers and take the norm, activation and pooling after them, so the
// in-place ReLU of conv -> BN -> ReLU never begins a block (which checkpointing would refuse).
TEST(Checkpoint, BlocksStartAtWeightedLayers) {
  using namespace torch::nn;
  Sequential layers(Dropout(0.1), Conv2d(Conv2dOptions(1, 4, 3)), BatchNorm2d(4),
                    ReLU(ReLUOptions().inplace(true)), MaxPool2d(2), Conv2d(Conv2dOptions(4, 4, 3)), ReLU(),
                    Flatten(), Linear(4, 2));
  const std::vector<std::pair<size_t, size_t>> expected = {{0, 1}, {1, 5}, {5, 8}, {8, 9}};
  EXPECT_EQ(checkpoint_blocks(*layers), expected);
  // And such a stage checkpoints without the in-place error, with the plain run's gradients.
  torch::manual_seed(5);
  Sequential plain(Conv2d(Conv2dOptions(1, 4, 3)), BatchNorm2d(4), ReLU(ReLUOptions().inplace(true)),
                   Conv2d(Conv2dOptions(4, 4, 3)), BatchNorm2d(4), ReLU(ReLUOptions().inplace(true)));
  torch::manual_seed(5);
  Sequential checkpointed(Conv2d(Conv2dOptions(1, 4, 3)), BatchNorm2d(4), ReLU(ReLUOptions().inplace(true)),
                          Conv2d(Conv2dOptions(4, 4, 3)), BatchNorm2d(4), ReLU(ReLUOptions().inplace(true)));
  torch::Tensor x = torch::randn({6, 1, 12, 12});
  expect_same(run(plain, x, CheckpointPolicy()), run(checkpointed, x, blocks_policy()));
}

// PyTorch's checkpoint updates BatchNorm's running statistics twice (forward and recompute); here
// the recompute's update is undone, so they equal the plain run's after any number of steps.
TEST(Checkpoint, BatchNormStatisticsAdvanceOncePerForward) {
  using namespace torch::nn;
  auto make = [] {
    torch::manual_seed(9);
    return Sequential(Linear(8, 16), BatchNorm1d(16), ReLU(), Linear(16, 16), BatchNorm1d(16), ReLU());
  };
  Sequential plain = make(), checkpointed = make();
  for (int step = 0; step < 3; ++step) {
    torch::Tensor x = torch::randn({32, 8}) * (step + 1) + step;
    run(plain, x, CheckpointPolicy());
    run(checkpointed, x, blocks_policy());
  }
  auto a = plain->buffers(), b = checkpointed->buffers();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i].to(torch::kDouble), b[i].to(torch::kDouble), 0, 1e-6))
        << "buffer " << i << ": " << a[i] << " vs " << b[i];
  }
  EXPECT_EQ(b[2].item<int64_t>(), 3) << "num_batches_tracked counts each forward once";
}

TEST(CheckpointPolicy, ParsesModesAndNamesKeysInErrors) {
  EXPECT_FALSE(CheckpointPolicy::parse("none", 2).enabled());
  CheckpointPolicy blocks = CheckpointPolicy::blocks();
  EXPECT_TRUE(blocks.applies(0) && blocks.applies(1) && blocks.applies(5));
  CheckpointPolicy every3 = CheckpointPolicy::parse("every_k", 3);
  EXPECT_TRUE(every3.applies(0));
  EXPECT_FALSE(every3.applies(1));
  EXPECT_FALSE(every3.applies(2));
  EXPECT_TRUE(every3.applies(3));
  try {
    CheckpointPolicy::parse("all", 2);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("memory.checkpoint must be one of none, blocks, every_k; got 'all'"),
              std::string::npos)
        << message;
  }
  try {
    CheckpointPolicy::parse("every_k", 0);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("memory.checkpoint_every"), std::string::npos) << error.what();
  }
}

// The point of checkpointing: a deep model's forward+backward peaks far lower. Counted exactly with
// a counting CPU allocator (peak_cpu_memory.h). Per block the plain run keeps the block input (1 unit),
// the first Linear's output (4 units, saved by GELU) and GELU's output (4 units, saved by the second
// Linear): about 9 units x 16 blocks; checkpointing every block keeps 16 block inputs plus one
// block's internals during its recompute. Both also hold the weight gradients (16 x 2 x 128 x 512
// fp32 = 16 units at this batch size).
TEST(Checkpoint, PeakMemoryIsLowerForADeepModel) {
  const int64_t depth = 16, width = 128, batch = 1024;
  torch::Tensor x = torch::randn({batch, width});
  auto peak_of = [&](const CheckpointPolicy& policy) {
    auto model = mlp_blocks(depth, width, 0.0);
    int64_t peak = 0;
    model->forward(x);  // warm-up: whatever LibTorch creates lazily is not counted below
    {
      testing::PeakCpuMemory memory;
      torch::Tensor out = policy.enabled() ? checkpoint_sequential(*model, x, policy) : model->forward(x);
      out.pow(2).mean().backward();
      peak = memory.peak_bytes();
    }
    return peak;
  };
  const int64_t unit = batch * width * 4;
  int64_t plain = peak_of(CheckpointPolicy());
  int64_t every4 = peak_of(CheckpointPolicy::parse("every_k", 4));
  int64_t blocks = peak_of(blocks_policy());
  std::cout << "peak bytes, 16 blocks: none " << plain << " (" << plain / unit
            << " activation units), every_k=4 " << every4 << ", blocks " << blocks << " (" << blocks / unit
            << " units)\n";
  EXPECT_GT(plain, 9 * depth * unit);  // the plain run keeps what the estimate says
  EXPECT_LT(blocks, plain / 3);
  EXPECT_LT(blocks, every4);
  EXPECT_LT(every4, plain);
}

TEST(PeakCpuMemory, CountsAllocationsAndFrees) {
  testing::PeakCpuMemory memory;
  {
    torch::Tensor a = torch::empty({1024}, torch::kFloat);  // 4 KiB
    torch::Tensor b = torch::empty({2048}, torch::kFloat);  // 8 KiB
    EXPECT_EQ(memory.live_bytes(), 12 * 1024);
  }
  EXPECT_EQ(memory.live_bytes(), 0);
  torch::Tensor c = torch::empty({256}, torch::kFloat);
  EXPECT_EQ(memory.peak_bytes(), 12 * 1024);
  EXPECT_EQ(memory.live_bytes(), 1024);
}

}  // namespace
}  // namespace fasttrain
