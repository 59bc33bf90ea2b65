// The GPT model and its attention and GELU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/detail/compat.h"
#include "fasttrain/kernels/attention.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/models/generate.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

GptOptions small_gpt() {
  return GptOptions().layers(2).heads(2).embed(16).context(12);
}

Model make_gpt(const GptOptions& options) {
  return fasttrain::make_gpt(options, DataShape::tokens(options.context(), 256));
}

// The model's logits for `tokens` [B, T]: [B * T, 256].
torch::Tensor logits_of(const Model& model, const torch::Tensor& tokens) {
  Batch batch;
  batch.inputs = tokens;
  return model.forward(batch).tensor();
}

// softmax(q k^T / sqrt(D)) v over positions <= t, one (b, h, t) at a time.
torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  auto out = torch::zeros_like(q);
  const int64_t length = q.size(2), dim = q.size(3);
  for (int64_t b = 0; b < q.size(0); ++b) {
    for (int64_t h = 0; h < q.size(1); ++h) {
      for (int64_t t = 0; t < length; ++t) {
        auto scores = torch::zeros({t + 1}, torch::kDouble);
        for (int64_t s = 0; s <= t; ++s) {
          scores[s] =
              (q[b][h][t].to(torch::kDouble) * k[b][h][s].to(torch::kDouble)).sum() / std::sqrt(double(dim));
        }
        auto weights = torch::softmax(scores, 0);
        for (int64_t s = 0; s <= t; ++s)
          out[b][h][t] += (weights[s] * v[b][h][s].to(torch::kDouble)).to(q.dtype());
      }
    }
  }
  return out;
}

TEST(Attention, MathPathMatchesAReferenceLoop) {
  torch::manual_seed(0);
  auto q = torch::randn({2, 3, 5, 4}), k = torch::randn({2, 3, 5, 4}), v = torch::randn({2, 3, 5, 4});
  EXPECT_TRUE(torch::allclose(causal_attention_math(q, k, v), reference_attention(q, k, v), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(causal_attention(q, k, v), reference_attention(q, k, v), 1e-5, 1e-6));
}

// Skips only where the LibTorch has no fused attention (1.13); on 2.x a missing fused path fails.
TEST(Attention, FusedAttentionMatchesTheMathPath) {
#if !FASTTRAIN_HAS_SDPA
  GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no scaled_dot_product_attention";
#endif
  torch::manual_seed(1);
  auto q = torch::randn({2, 4, 33, 8}, torch::requires_grad()), k = torch::randn({2, 4, 33, 8}),
       v = torch::randn({2, 4, 33, 8});
  torch::Tensor fused;
  ASSERT_TRUE(compat::fused_causal_attention(q, k, v, fused));
  auto math = causal_attention_math(q, k, v);
  EXPECT_TRUE(torch::allclose(fused, math, 1e-5, 1e-5));
  auto fused_grad = torch::autograd::grad({fused.sum()}, {q})[0];
  auto math_grad = torch::autograd::grad({math.sum()}, {q})[0];
  EXPECT_TRUE(torch::allclose(fused_grad, math_grad, 1e-4, 1e-5));
}

TEST(Attention, FusedGeluMatchesTheFormulaAndItsGradient) {
  auto x = torch::linspace(-6, 6, 1001, torch::kDouble).requires_grad_(true);
  auto fused = gelu_tanh(x), unfused = gelu_tanh_unfused(x);
  EXPECT_TRUE(torch::allclose(fused, unfused, 1e-12, 1e-12));
  auto fused_grad = torch::autograd::grad({fused.sum()}, {x})[0];
  auto unfused_grad = torch::autograd::grad({unfused.sum()}, {x})[0];
  EXPECT_TRUE(torch::allclose(fused_grad, unfused_grad, 1e-10, 1e-10));
  auto x32 = torch::randn({4096});
  EXPECT_LT((gelu_tanh(x32) - gelu_tanh_unfused(x32)).abs().max().item<double>(), 1e-6);
}

TEST(Gpt, PredictsEachPositionFromItsPastOnly) {
  torch::manual_seed(2);
  auto model = make_gpt(small_gpt());
  model.module().eval();
  auto tokens = torch::randint(0, 256, {3, 12}, torch::kLong);
  auto logits = logits_of(model, tokens).view({3, 12, 256});
  EXPECT_EQ(logits_of(model, tokens).sizes(), (std::vector<int64_t>{36, 256}));
  auto changed = tokens.clone();
  changed.slice(1, 7).random_(0, 256);  // positions 7.. differ
  auto changed_logits = logits_of(model, changed).view({3, 12, 256});
  EXPECT_TRUE(torch::allclose(logits.slice(1, 0, 7), changed_logits.slice(1, 0, 7), 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(logits.slice(1, 7), changed_logits.slice(1, 7), 1e-3, 1e-3));
}

TEST(Gpt, TiesTheOutputToTheTokenEmbedding) {
  auto model = make_gpt(small_gpt());
  // 256 x 16 token + 12 x 16 position embeddings, 2 blocks of (2 LayerNorms, qkv, proj, fc, proj), final
  // norm.
  const int64_t block = 2 * 2 * 16 + (16 * 48 + 48) + (16 * 16 + 16) + (16 * 64 + 64) + (64 * 16 + 16);
  EXPECT_EQ(model.parameter_count(), 256 * 16 + 12 * 16 + 2 * block + 2 * 16);
  auto tokens = torch::randint(0, 256, {2, 12}, torch::kLong);
  logits_of(model, tokens).sum().backward();
  for (const auto& item : model.module().named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
  }
}

// model.kernels on and off (attention, residual add + LayerNorm): the same loss and gradients in fp32, and
// under bf16 autocast within bf16's rounding (the switch's parity test; tests/kernels checks the kernel
// itself).
struct StepOutcome {
  double loss;
  std::vector<torch::Tensor> grads;
};

// One training step's loss and gradients (on the CPU) of the small gpt on `device`, fp32 or under bf16
// autocast.
StepOutcome gpt_train_step(const GptOptions& options, bool bf16, torch::Device device = torch::kCPU) {
  torch::manual_seed(7);
  auto tokens = torch::randint(0, 256, {3, 12}, torch::kLong).to(device);
  auto targets = torch::randint(0, 256, {36}, torch::kLong).to(device);
  torch::manual_seed(6);
  auto model = make_gpt(options);
  // Biases away from a fresh gpt's zeros, so that where a kernel adds them matters: with zero biases
  // fasttrain's linear (residual + bias, then the matmul) gave ATen's bits on an AMX Xeon, whose oneDNN
  // runs fp32 matmuls with MKL's own sgemm kernel.
  {
    torch::NoGradGuard no_grad;
    for (const auto& parameter : model.module().named_parameters())
      if (parameter.key().size() >= 4 && parameter.key().substr(parameter.key().size() - 4) == "bias")
        parameter.value().normal_(0.0, 0.1);
  }
  model.module().to(device);
  torch::Tensor loss;
  {
    AutocastGuard autocast(device, torch::kBFloat16, bf16);
    loss = torch::nn::functional::cross_entropy(logits_of(model, tokens).to(torch::kFloat), targets);
  }
  loss.backward();
  StepOutcome outcome{loss.item<double>(), {}};
  for (const auto& p : model.module().parameters()) outcome.grads.push_back(p.grad().cpu());
  return outcome;
}

bool bitwise_equal(const StepOutcome& a, const StepOutcome& b) {
  if (a.loss != b.loss) return false;
  for (size_t i = 0; i < a.grads.size(); ++i)
    if (!torch::equal(a.grads[i], b.grads[i])) return false;
  return true;
}

// All of fasttrain's kernels, and each alone (model.aten_kernels naming the others), against ATen's in
// loss and gradients; each one alone changes the arithmetic (not bitwise ATen's) where it runs, and
// naming all three in aten_kernels is ATen's run bit for bit, so the switch is what decides.
TEST(Gpt, OwnKernelsMatchATensInLossAndGradients) {
  const std::vector<std::string> all = {"attention", "layer_norm", "bias_gelu", "linear"};
  // fasttrain's linear runs in fp32 where oneDNN has fp32 matmuls (LibTorch 2.4+, AVX512 BW/VL/DQ).
  const bool own_linear_here = kernels::linear_takes(torch::ones({1, 1}), torch::ones({1, 1}), {});
  for (bool bf16 : {false, true}) {
    const StepOutcome aten = gpt_train_step(small_gpt().kernels("aten"), bf16);
    EXPECT_TRUE(bitwise_equal(gpt_train_step(small_gpt().aten_kernels(all), bf16), aten));
    for (const std::string own : {"all", "attention", "layer_norm", "bias_gelu", "linear"}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16 " : "fp32 ") + own);
      std::vector<std::string> others;
      for (const auto& name : all)
        if (own != "all" && name != own) others.push_back(name);
      const StepOutcome mine = gpt_train_step(small_gpt().aten_kernels(others), bf16);
      // fasttrain's linear runs only in fp32 (where LibTorch reaches oneDNN's fp32 matmul).
      const bool runs = own == "linear" ? !bf16 && own_linear_here : true;
      if (runs) {
        EXPECT_FALSE(bitwise_equal(mine, aten));
      }
      const double tolerance = bf16 ? 2e-2 : 1e-5;
      EXPECT_NEAR(mine.loss, aten.loss, tolerance * std::abs(aten.loss));
      ASSERT_EQ(mine.grads.size(), aten.grads.size());
      for (size_t i = 0; i < mine.grads.size(); ++i) {
        const double error = (mine.grads[i] - aten.grads[i]).abs().max().item<double>();
        const double scale = aten.grads[i].abs().max().item<double>();
        EXPECT_LE(error, 10 * tolerance * scale + 1e-7) << "parameter " << i;
      }
    }
  }
  // With dropout on, no bias moves past it into the next kernel: the same dropout draws, ATen's loss.
  const StepOutcome dropped = gpt_train_step(small_gpt().dropout(0.1), false);
  const StepOutcome dropped_aten = gpt_train_step(small_gpt().dropout(0.1).kernels("aten"), false);
  EXPECT_NEAR(dropped.loss, dropped_aten.loss, 1e-5 * std::abs(dropped_aten.loss));
  const std::string message = testing::error_message([] { make_gpt(small_gpt().aten_kernels({"softmax"})); });
  EXPECT_TRUE(testing::contains_all(message, {"model.aten_kernels", "'softmax'", "bias_gelu"})) << message;
}

// The MLP as fasttrain's gelu_mlp (fc's matmul with the bias + GELU in its epilogue, GELU's derivative in the
// projection's input gradient's) and unfused (model.aten_kernels = ["gelu_mlp"]: linear, bias_gelu, linear):
// the same loss and gradients to fp32 sums' rounding. It runs in fp32 on a CPU with AVX2 or AVX512, not under
// bf16 autocast (the matmuls are autocast's), not when named in aten_kernels or with either kernel it fuses
// off.
TEST(Gpt, FusedMlpMatchesTheUnfusedKernelsAndRunsWhereItTakesTheBlock) {
  const auto runs_fused = [](const GptOptions& options, bool bf16) {
    torch::manual_seed(6);
    auto model = make_gpt(options);
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
    return testing::graph_has_node(logits_of(model, torch::randint(0, 256, {3, 12}, torch::kLong)),
                                   "GeluMlp");
  };
  const bool vector_cpu = kernels::cpu_capability() != kernels::CpuCapability::scalar;
  EXPECT_EQ(runs_fused(small_gpt(), false), vector_cpu);
  EXPECT_FALSE(runs_fused(small_gpt(), true));
  EXPECT_FALSE(runs_fused(small_gpt().aten_kernels({"gelu_mlp"}), false));
  EXPECT_FALSE(runs_fused(small_gpt().aten_kernels({"bias_gelu"}), false));
  EXPECT_FALSE(runs_fused(small_gpt().aten_kernels({"linear"}), false));
  EXPECT_FALSE(runs_fused(small_gpt().dropout(0.1), false));

  const StepOutcome fused = gpt_train_step(small_gpt(), false);
  const StepOutcome unfused = gpt_train_step(small_gpt().aten_kernels({"gelu_mlp"}), false);
  EXPECT_NEAR(fused.loss, unfused.loss, 1e-6 * std::abs(unfused.loss));
  ASSERT_EQ(fused.grads.size(), unfused.grads.size());
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    const double error = (fused.grads[i] - unfused.grads[i]).abs().max().item<double>();
    const double scale = unfused.grads[i].abs().max().item<double>();
    EXPECT_LE(error, 1e-5 * scale + 1e-7) << "parameter " << i;
  }
}

// model.gpu_kernels on and off: fasttrain's residual add + LayerNorm and MLP on the GPU give ATen's loss and
// gradients, in fp32 and under bf16 autocast (the cuBLASLt MLP runs only there), and aten_kernels naming both
// turns them off.
TEST(Gpt, GpuKernelsMatchATensInLossAndGradients_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const StepOutcome aten = gpt_train_step(small_gpt().gpu_kernels("aten"), bf16, torch::kCUDA);
    const StepOutcome mine = gpt_train_step(small_gpt().gpu_kernels("fasttrain"), bf16, torch::kCUDA);
    const StepOutcome off = gpt_train_step(
        small_gpt().gpu_kernels("fasttrain").aten_kernels({"layer_norm", "bias_gelu", "linear"}), bf16,
        torch::kCUDA);
    EXPECT_FALSE(bitwise_equal(mine, aten));  // the kernel ran
    const double tolerance = bf16 ? 2e-2 : 1e-5;
    for (const StepOutcome* run : {&mine, &off}) {
      EXPECT_NEAR(run->loss, aten.loss, tolerance * std::abs(aten.loss));
      ASSERT_EQ(run->grads.size(), aten.grads.size());
      for (size_t i = 0; i < run->grads.size(); ++i) {
        const double error = (run->grads[i] - aten.grads[i]).abs().max().item<double>();
        const double scale = aten.grads[i].abs().max().item<double>();
        EXPECT_LE(error, 10 * tolerance * scale + 1e-7) << "parameter " << i;
      }
    }
    EXPECT_NEAR(off.loss, aten.loss, 1e-6 * std::abs(aten.loss));  // ATen's ops both: the same loss
  }
}

TEST(Gpt, CheckpointedBlocksMatchThePlainGradients) {
  auto tokens = torch::randint(0, 256, {4, 12}, torch::kLong);
  auto targets = torch::randint(0, 256, {48}, torch::kLong);
  auto gradients = [&](const std::string& mode) {
    torch::manual_seed(4);
    auto model = make_gpt(small_gpt().dropout(0.1));
    model.set_checkpointing(CheckpointPolicy::parse(mode, 2));
    torch::manual_seed(5);  // the same dropout masks
    torch::nn::functional::cross_entropy(logits_of(model, tokens), targets).backward();
    std::vector<torch::Tensor> result;
    for (const auto& p : model.module().parameters()) result.push_back(p.grad().clone());
    return result;
  };
  auto plain = gradients("none"), checkpointed = gradients("blocks");
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::allclose(plain[i], checkpointed[i], 1e-5, 1e-6)) << i;
}

TEST(Gpt, LearnsARepeatingSequence) {
  torch::manual_seed(6);
  auto model = make_gpt(small_gpt());
  torch::optim::AdamW optimizer(model.module().parameters(), torch::optim::AdamWOptions(1e-2));
  const std::string text = "abcdefg abcdefg abcdefg abcdefg ";
  auto stream = torch::tensor(std::vector<int64_t>(text.begin(), text.end()));
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto starts = torch::randint(0, static_cast<int64_t>(text.size()) - 13, {8}, torch::kLong);
    std::vector<torch::Tensor> inputs, targets;
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t s = starts[i].item<int64_t>();
      inputs.push_back(stream.slice(0, s, s + 12));
      targets.push_back(stream.slice(0, s + 1, s + 13));
    }
    auto loss =
        torch::nn::functional::cross_entropy(logits_of(model, torch::stack(inputs)), torch::cat(targets));
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_GT(first, 4.0);  // about ln 256 = 5.5 at the start
  EXPECT_LT(last, 0.5) << "the next byte of a period-8 text is predictable from the last few";
}

// Right padding needs no attention mask: with causal attention a real position never sees the
// padding after it, so each real position's logits in a padded batch equal those of its sequence
// alone, and the padded loss (kIgnoreTarget) equals the loss of the sequences without padding.
TEST(Gpt, RightPaddingChangesNoRealPositionOrTheLoss) {
  torch::manual_seed(9);
  auto model = make_gpt(small_gpt());
  const std::vector<int64_t> lengths = {12, 5, 9};
  auto batch = torch::zeros({3, 12}, torch::kLong);                   // [B, T], padding 0
  auto targets = torch::full({3 * 12}, kIgnoreTarget, torch::kLong);  // [B * T]
  std::vector<torch::Tensor> alone_logits, alone_targets;
  for (int64_t b = 0; b < 3; ++b) {
    auto tokens = torch::randint(1, 256, {lengths[b] + 1}, torch::kLong);
    batch[b].slice(0, 0, lengths[b]).copy_(tokens.slice(0, 0, lengths[b]));
    targets.slice(0, b * 12, b * 12 + lengths[b]).copy_(tokens.slice(0, 1));
    alone_logits.push_back(logits_of(model, tokens.slice(0, 0, lengths[b]).unsqueeze(0)));  // [L, V]
    alone_targets.push_back(tokens.slice(0, 1));
  }
  auto padded_logits = logits_of(model, batch);  // [B * T, V]
  for (int64_t b = 0; b < 3; ++b) {
    EXPECT_TRUE(
        torch::allclose(padded_logits.slice(0, b * 12, b * 12 + lengths[b]), alone_logits[b], 1e-5, 1e-5))
        << "sequence " << b;
  }
  const auto unpadded =
      torch::nn::functional::cross_entropy(torch::cat(alone_logits), torch::cat(alone_targets));
  for (double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE(smoothing);
    const auto reference = cross_entropy(torch::cat(alone_logits), torch::cat(alone_targets), smoothing);
    EXPECT_NEAR(cross_entropy(padded_logits, targets, smoothing, /*padded=*/true).item<double>(),
                reference.item<double>(), 1e-5);
  }
  EXPECT_NEAR(cross_entropy(padded_logits, targets, 0.0, true).item<double>(), unpadded.item<double>(), 1e-5);
}

TEST(Gpt, GenerationIsSeededAndGreedyFollowsTheArgmax) {
  torch::manual_seed(4);
  auto model = make_gpt(small_gpt());
  const auto options = GenerateOptions(12).max_new_tokens(20).stop_at_end_of_document(false);
  const std::string a = generate_text(model, "hello", GenerateOptions(options).seed(1));
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(a, generate_text(model, "hello", GenerateOptions(options).seed(1)));
  EXPECT_NE(a, generate_text(model, "hello", GenerateOptions(options).seed(2)));
  // Greedy: each byte is the argmax of the model on the text so far (the last 12 bytes).
  const std::string greedy = generate_text(model, "hello", GenerateOptions(options).temperature(0));
  std::string text = "hello";
  torch::NoGradGuard no_grad;
  for (char c : greedy) {
    const std::string window = text.substr(text.size() > 12 ? text.size() - 12 : 0);
    auto tokens = torch::tensor(std::vector<int64_t>(window.begin(), window.end())).unsqueeze(0);
    EXPECT_EQ(static_cast<unsigned char>(c), logits_of(model, tokens)[-1].argmax().item<int64_t>());
    text.push_back(c);
  }
  EXPECT_TRUE(model.module().is_training());  // put back as it was
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { generate_text(model, "x", GenerateOptions(12).top_k(300)); }),
      {"--top-k", "300"}));
}

TEST(Gpt, BadSizesAreConfigErrors) {
  EXPECT_TRUE(testing::contains_all(testing::error_message([] { make_gpt(small_gpt().embed(18).heads(4)); }),
                                    {"model.embed (18)", "model.heads (4)"}));
  EXPECT_TRUE(testing::contains_all(testing::error_message([] { make_gpt(small_gpt().layers(0)); }),
                                    {"model.layers must be >= 1"}));
  auto model = make_gpt(small_gpt());
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] {
                                      logits_of(model, torch::zeros({1, 13}, torch::kLong));
                                    }),
                                    {"model.context = 12", "[1, 13]"}));
}

}  // namespace
}  // namespace fasttrain
