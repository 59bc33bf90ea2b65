// The gpt's pointwise and attention kernels on/off, at the shapes of configs/gpt_text.toml (batch 32,
// context 128, width 128, 4 heads): the fused tanh GELU against the formula's seven ops, and ATen's
// fused scaled_dot_product_attention against the math path where the LibTorch build has it.
// Forward + backward, median of --repeats timed calls after a warm-up; one JSON line.
//
//   gpt_ops_bench [--threads 1] [--repeats 50]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "fasttrain/detail/compat.h"
#include "fasttrain/detail/json.h"
#include "fasttrain/models/attention.h"

namespace {

double median_ms(const std::function<void()>& run, int repeats) {
  for (int i = 0; i < 5; ++i) run();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Forward and backward of `op` on a fresh leaf copy of `input`.
std::function<void()> forward_backward(const torch::Tensor& input,
                                       std::function<torch::Tensor(const torch::Tensor&)> op) {
  return [input, op] {
    auto x = input.detach().requires_grad_(true);
    op(x).sum().backward();
  };
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, repeats = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else if (flag == "--repeats") {
      repeats = std::atoi(argv[i + 1]);
    } else {
      std::cerr << "usage: gpt_ops_bench [--threads N] [--repeats N]\n";
      return 2;
    }
  }
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  nlohmann::json out{
      {"torch", fasttrain::compat::torch_version()}, {"threads", threads}, {"repeats", repeats}};

  // ---- GELU on the MLP's hidden activations [B, T, 4C] ----
  const auto hidden = torch::randn({32, 128, 512});
  const double fused = median_ms(forward_backward(hidden, fasttrain::gelu_tanh), repeats);
  const double unfused = median_ms(forward_backward(hidden, fasttrain::gelu_tanh_unfused), repeats);
  out["gelu_shape"] = "[32, 128, 512] fp32, forward + backward";
  out["gelu_fused_ms"] = fused;
  out["gelu_unfused_ms"] = unfused;
  out["gelu_speedup"] = unfused / fused;

  // ---- causal attention [B, H, T, D] ----
  const auto q = torch::randn({32, 4, 128, 32}), k = torch::randn({32, 4, 128, 32}),
             v = torch::randn({32, 4, 128, 32});
  auto attention = [&](bool fused_path) {
    return [&, fused_path] {
      auto qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
           vv = v.detach().requires_grad_(true);
      auto y =
          fused_path ? fasttrain::causal_attention(qq, kk, vv) : fasttrain::causal_attention_math(qq, kk, vv);
      y.sum().backward();
    };
  };
  out["attention_shape"] = "[32, 4, 128, 32] fp32, forward + backward";
  out["attention_math_ms"] = median_ms(attention(false), repeats);
  torch::Tensor probe;
  if (fasttrain::compat::fused_causal_attention(q, k, v, probe)) {
    out["attention_fused_ms"] = median_ms(attention(true), repeats);
    out["attention_speedup"] =
        out["attention_math_ms"].get<double>() / out["attention_fused_ms"].get<double>();
  } else {
    out["attention_fused_ms"] = nullptr;
    out["attention_note"] =
        "this LibTorch has no scaled_dot_product_attention (added in 2.0): the math path runs";
  }
  std::cout << out.dump() << "\n";
  return 0;
}
