#pragma once
// How the kernel tests compare a kernel's tensors with their reference's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>

#include "fasttrain/precision/autocast.h"
#include "support.h"

namespace fasttrain::testing {

constexpr auto kChannelsLast = torch::MemoryFormat::ChannelsLast;

// max |got - want|, both read as double.
inline double max_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
}

// max |got - want| <= tolerance max |want| + floor, both read as double. Both undefined passes; one
// undefined fails, naming `what`.
inline void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance,
                         const std::string& what, double floor = 0) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!got.defined()) return;
  const double error = max_error(got, want);
  const double scale = want.to(torch::kDouble).abs().max().item<double>();
  EXPECT_LE(error, tolerance * scale + floor)
      << what << ": max |error| " << error << " of max |value| " << scale;
}

// |got - want| <= atol + rtol |want| everywhere, got read as double.
inline ::testing::AssertionResult close(const char* what, const torch::Tensor& got, const torch::Tensor& want,
                                        double rtol, double atol) {
  if (got.sizes() != want.sizes()) return ::testing::AssertionFailure() << what << ": sizes " << got.sizes();
  const double worst = ((got.to(torch::kDouble) - want).abs() - rtol * want.abs()).max().item<double>();
  if (worst <= atol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": off by " << worst << " beyond rtol " << rtol << " (atol " << atol << ")";
}

// op(input) and the input's gradient for grad_y (in the output's dtype and layout).
struct OutputAndGrad {
  torch::Tensor y, grad;
};
template <typename Op>
OutputAndGrad output_and_grad(const torch::Tensor& input, const torch::Tensor& grad_y, const Op& op) {
  auto x = input.detach().requires_grad_(true);
  auto y = op(x);
  y.backward(grad_y.to(y.scalar_type()).contiguous(y.suggest_memory_format()));
  return {y.detach(), x.grad()};
}

// CPU autocast in bf16, for an AutocastStateGuard: the header-only guard, as the kernels' tests link no
// precision/ (the sanitizer build leaves it out).
inline AutocastState cpu_bf16_autocast() {
  AutocastState state = AutocastState::current();
  state.cpu_enabled = true, state.cpu_dtype = torch::kBFloat16;
  return state;
}

// A tensor's values rounded to bf16, read as double: the operands as CPU autocast rounds them.
inline torch::Tensor bf16_in_double(const torch::Tensor& t) {
  return t.to(torch::kBFloat16).to(torch::kDouble);
}

// A layer's output and the gradients of its input, weight and bias for loss = sum(y * weights) in fp64 (so
// every element's gradient differs), op(x, weight, bias) run under CPU autocast in bf16 where `autocast`.
struct LayerGradients {
  torch::Tensor y, grad_x, grad_weight, grad_bias;
};
template <typename Op>
LayerGradients layer_gradients(const torch::Tensor& x_in, const torch::Tensor& weight_in,
                               const torch::Tensor& bias_in, const torch::Tensor& weights, bool autocast,
                               Op op) {
  auto x = x_in.detach().requires_grad_(true), weight = weight_in.detach().requires_grad_(true);
  auto bias = bias_in.detach().requires_grad_(true);
  torch::Tensor y;
  {
    std::optional<AutocastStateGuard> guard;
    if (autocast) guard.emplace(cpu_bf16_autocast());
    y = op(x, weight, bias);
  }
  (y.to(torch::kDouble) * weights).sum().backward();
  return {y.detach(), x.grad(), weight.grad(), bias.grad()};
}

// got (bf16 values) against want (fp64 sums of bf16 operands) rounded once to bf16: each element within one
// bf16 ulp of the rounded reference (fp32 sums can land on the other side of a rounding boundary), and at
// most `max_moved` of them off it at all. A kernel that skipped rounding an operand, or rounded twice,
// moves a large share of them.
inline void expect_rounded_once(const torch::Tensor& got, const torch::Tensor& want, const std::string& what,
                                double max_moved = 0.02) {
  const torch::Tensor rounded = want.to(torch::kBFloat16).to(torch::kDouble), values = got.to(torch::kDouble);
  const double scale = rounded.abs().max().item<double>();
  const double beyond =
      ((values - rounded).abs() - rounded.abs() * (1.0 / 128) - 1e-6 * scale).max().item<double>();
  EXPECT_LE(beyond, 0.0) << what << ": an element more than one bf16 ulp from the rounded sum";
  const double moved = (values != rounded).to(torch::kDouble).mean().item<double>();
  EXPECT_LE(moved, max_moved) << what << ": " << moved * 100 << "% of the elements off the rounded sum";
}

// The error a second derivative through y's graph with respect to `input` raises (backward with
// create_graph): a kernel whose backward is not itself differentiable must refuse it by name.
inline std::string second_derivative_error(const torch::Tensor& y, const torch::Tensor& input) {
  return error_message([&] {
    torch::autograd::grad({y.to(torch::kFloat).pow(2).sum()}, {input}, {}, /*retain_graph=*/true,
                          /*create_graph=*/true);
  });
}

}  // namespace fasttrain::testing
