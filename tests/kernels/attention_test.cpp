// fasttrain's causal attention kernel against ATen's ops: values and gradients, fp32 and bf16, every
// CPU capability this machine runs, sizes that fill no vector evenly.
#include "fasttrain/kernels/attention.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "kernels/compare.h"

namespace fasttrain {
namespace {

using testing::expect_close;

// tolerance x (max |want| + 1e-12): the check stays satisfiable where every wanted value is 0.
constexpr double kZeroScaleFloor = 1e-12;

struct Shape {
  int64_t batch, length, heads, head_dim;
};

// Odd lengths and widths, most with a partial vector at the end of each row and head; heads of 1-5
// vectors (on AVX512, 72 is a register tile of 3 vectors and one of 2, 48 one of 3, 64 one of 3 and one of
// 1). Lengths of whole transposed blocks (16, 48, 128: no rows left over, no padding keys) beside the
// others, 128 x 32 the gpt's shape; 16 x 5 whole blocks with padding columns on every capability.
const Shape kShapes[] = {
    {2, 1, 1, 4},
    {2, 7, 3, 5},
    {1, 33, 2, 16},
    {3, 20, 4, 32},
    {1, 129, 1, 24},
    {1, 90, 1, 72},
    {2, 11, 2, 48},
    {2, 16, 2, 5},
    {1, 48, 2, 64},
    {2, 128, 4, 32},
    // one head's tiles past half of kRunBytes: the kernel loads its three heads one at a time
    {1, 300, 3, 128}};
// Longer than one block of backward rows (src/kernels/cpu/attention_kernel.cpp, kBlockValues), and
// not a whole number of groups of kRows rows (4, or 8 on AVX512): padding rows in the last block.
const Shape kLongShape{1, 1101, 1, 8};

struct AttentionResult {
  torch::Tensor out, grad;
};

// out and d(sum(out * weights))/d(qkv) for `attention`, in the dtype of `qkv`.
template <typename Attention>
AttentionResult run_attention(const torch::Tensor& qkv, const torch::Tensor& weights, Attention attention) {
  auto input = qkv.detach().clone().requires_grad_(true);
  auto out = attention(input);
  (out.to(torch::kDouble) * weights).sum().backward();
  return {out.detach(), input.grad()};
}

AttentionResult attention_reference(const torch::Tensor& qkv, const torch::Tensor& weights, int64_t heads) {
  // ATen's composed ops in fp64 from the same (possibly bf16-rounded) inputs.
  return run_attention(qkv.to(torch::kDouble), weights,
                       [&](const torch::Tensor& x) { return packed_causal_attention_aten(x, heads); });
}

TEST(CpuAttention, MatchesATenInValuesAndGradientsOnEveryCapability) {
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
      if (dtype == torch::kFloat) shapes.push_back(kLongShape);
      for (const Shape& s : shapes) {
        torch::manual_seed(s.length * 100 + s.head_dim);
        const int64_t embed = s.heads * s.head_dim;
        auto qkv = torch::randn({s.batch, s.length, 3 * embed}).to(dtype);
        auto weights = torch::randn({s.batch, s.length, embed}, torch::kDouble);
        const std::string what = fmt::format("{} {} B{} T{} H{} D{}", kernels::to_string(capability),
                                             c10::toString(dtype), s.batch, s.length, s.heads, s.head_dim);
        auto want = attention_reference(qkv, weights, s.heads);
        auto got = run_attention(qkv, weights, [&](const torch::Tensor& x) {
          return kernels::packed_causal_attention(x, s.heads, capability);
        });
        ASSERT_EQ(got.out.scalar_type(), dtype) << what;
        ASSERT_EQ(got.grad.scalar_type(), dtype) << what;
        // fp32: the arithmetic's rounding; bf16: one rounding of each result to 8 bits of mantissa.
        const double tolerance = dtype == torch::kFloat ? 2e-5 : 1.6e-2;
        expect_close(got.out, want.out, tolerance, what + " out", kZeroScaleFloor * tolerance);
        expect_close(got.grad, want.grad, tolerance, what + " grad qkv", kZeroScaleFloor * tolerance);
      }
    }
  }
}

// The qkv Linear's bias given to the kernel, which adds it as it reads the rows: the same values and qkv
// gradients as attention over qkv + bias, and the bias's gradient (each row's qkv gradient, summed). Heads
// beyond the first and k's and v's parts of the bias each matter: a bias read at the wrong offset fails.
TEST(CpuAttention, AddsTheLinearsBiasAsItReadsAndGivesItsGradient) {
  const Shape shapes[] = {{2, 7, 3, 5}, {3, 20, 4, 32}, {1, 33, 2, 16}};
  for (auto capability : kernels::runnable_cpu_capabilities()) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (const Shape& s : shapes) {
        torch::manual_seed(s.length + s.head_dim);
        const int64_t embed = s.heads * s.head_dim;
        const auto qkv = torch::randn({s.batch, s.length, 3 * embed}).to(dtype);
        const auto bias = torch::randn({3 * embed});
        const auto weights = torch::randn({s.batch, s.length, embed}, torch::kDouble);
        const std::string what = fmt::format("{} {} B{} T{} H{} D{}", kernels::to_string(capability),
                                             c10::toString(dtype), s.batch, s.length, s.heads, s.head_dim);
        // The bias is a leaf of its own, its gradient read after run_attention's backward.
        auto want_bias = bias.to(torch::kDouble).requires_grad_(true);
        auto want = run_attention(qkv.to(torch::kDouble), weights, [&](const torch::Tensor& x) {
          return packed_causal_attention_aten(x, s.heads, want_bias);
        });
        auto got_bias = bias.clone().requires_grad_(true);
        auto got = run_attention(qkv, weights, [&](const torch::Tensor& x) {
          return kernels::packed_causal_attention(x, s.heads, capability, got_bias);
        });
        const torch::Tensor bias_grad = got_bias.grad();
        ASSERT_TRUE(bias_grad.defined()) << what;
        ASSERT_EQ(bias_grad.scalar_type(), torch::kFloat) << what;
        // bf16: q, k and v are qkv's bf16 values plus the fp32 bias, not rounded again: out within one
        // rounding of its own; the bias's gradient is summed in fp32 before grad_qkv's rows are rounded.
        const double tolerance = dtype == torch::kFloat ? 2e-5 : 1.6e-2;
        expect_close(got.out, want.out, tolerance, what + " out", kZeroScaleFloor * tolerance);
        expect_close(got.grad, want.grad, tolerance, what + " grad qkv", kZeroScaleFloor * tolerance);
        expect_close(bias_grad, want_bias.grad(), tolerance, what + " grad bias",
                     kZeroScaleFloor * tolerance);
      }
    }
  }
  try {
    kernels::packed_causal_attention(torch::zeros({2, 4, 12}), 2, kernels::cpu_capability(),
                                     torch::zeros({11}));
    FAIL() << "a bias of 11 for qkv of 12 was taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("bias [11]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(
      kernels::packed_attention_takes(torch::zeros({2, 4, 12}), 2, torch::zeros({12}, torch::kBFloat16)));
  EXPECT_TRUE(kernels::packed_attention_takes(torch::zeros({2, 4, 12}), 2, torch::zeros({12})));
}

TEST(CpuAttention, ThePositionsAfterARowChangeNothingInIt) {
  torch::manual_seed(1);
  auto qkv = torch::randn({1, 9, 3 * 8});
  auto changed = qkv.clone();
  changed.slice(1, 5).normal_();
  auto a = kernels::packed_causal_attention(qkv, 2), b = kernels::packed_causal_attention(changed, 2);
  EXPECT_TRUE(torch::equal(a.slice(1, 0, 5), b.slice(1, 0, 5)));
  EXPECT_FALSE(torch::equal(a.slice(1, 5), b.slice(1, 5)));
}

// Each thread takes a range of (batch, head) pairs and loads a batch element's heads of it together, so a
// range may begin or end inside a batch element: 15 pairs of 5 heads split at 2 and 4 threads begin ranges
// at heads 2, 3 and 4. Every pair is computed alone, so the results are the same to the bit.
TEST(CpuAttention, HowThePairsAreSplitAcrossThreadsChangesNothing) {
  torch::manual_seed(3);
  const int64_t threads = at::get_num_threads();
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto qkv = torch::randn({3, 19, 3 * 5 * 8}).to(dtype);
    auto weights = torch::randn({3, 19, 5 * 8}, torch::kDouble);
    auto attention = [](const torch::Tensor& x) { return kernels::packed_causal_attention(x, 5); };
    at::set_num_threads(1);
    const AttentionResult alone = run_attention(qkv, weights, attention);
    for (const int split : {2, 3, 4}) {
      at::set_num_threads(split);
      if (at::get_num_threads() != split)
        GTEST_SKIP() << "this ATen's thread pool stays at " << at::get_num_threads();
      const AttentionResult shared = run_attention(qkv, weights, attention);
      EXPECT_TRUE(torch::equal(shared.out, alone.out)) << split << " threads, " << c10::toString(dtype);
      EXPECT_TRUE(torch::equal(shared.grad, alone.grad)) << split << " threads, " << c10::toString(dtype);
    }
  }
  at::set_num_threads(static_cast<int>(threads));
}

TEST(CpuAttention, TakesOnlyWhatItComputes) {
  EXPECT_TRUE(kernels::packed_attention_takes(torch::zeros({2, 4, 12}), 2));
  EXPECT_TRUE(kernels::packed_attention_takes(torch::zeros({2, 4, 12}, torch::kBFloat16), 4));
  EXPECT_FALSE(kernels::packed_attention_takes(torch::zeros({2, 4, 12}, torch::kDouble), 2));
  EXPECT_FALSE(kernels::packed_attention_takes(torch::zeros({2, 4, 12}), 5));  // C = 4, not a multiple of 5
  EXPECT_FALSE(kernels::packed_attention_takes(torch::zeros({2, 4, 13}), 1));  // not 3C
  EXPECT_FALSE(kernels::packed_attention_takes(torch::zeros({8, 12}), 2));
  try {
    kernels::packed_causal_attention(torch::zeros({2, 4, 12}, torch::kDouble), 2);
    FAIL() << "a double qkv was taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("Double"), std::string::npos) << e.what();
  }
}

TEST(CpuAttention, ANonContiguousInputIsReadAsItsValues) {
  torch::manual_seed(2);
  auto wide = torch::randn({2, 6, 2 * 3 * 8});
  auto qkv = wide.slice(2, 0, 3 * 8);  // every row strided
  ASSERT_FALSE(qkv.is_contiguous());
  EXPECT_TRUE(torch::allclose(kernels::packed_causal_attention(qkv, 2),
                              kernels::packed_causal_attention(qkv.contiguous(), 2)));
}

TEST(CpuCapability, TheChosenOneRunsHereAndNamesItself) {
  const auto runnable = kernels::runnable_cpu_capabilities();
  ASSERT_FALSE(runnable.empty());
  EXPECT_EQ(runnable.front(), kernels::CpuCapability::scalar);
  EXPECT_NE(std::find(runnable.begin(), runnable.end(), kernels::cpu_capability()), runnable.end());
  EXPECT_EQ(kernels::to_string(kernels::CpuCapability::avx512), "avx512");
}

}  // namespace
}  // namespace fasttrain
