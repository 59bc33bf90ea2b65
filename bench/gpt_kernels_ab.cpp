// gpt_kernels_ab: one of the gpt's kernel switches on and off in one process, training step by training step.
// Two gpt models (configs/gpt_text.toml's size: 4 blocks, width 128, 4 heads, 128 tokens, batch 32) from the
// same seed, A with every fasttrain kernel and B with --aten-kernels left to ATen (or run unfused), take
// turns on the same random batches (forward, the cross-entropy, backward, AdamW), which goes first
// alternating: a VM's drift from minute to minute lands on both alike, where two processes one after the
// other see it as a difference. Prints JSON: each side's median step, the median and quartiles of B's step
// over A's beside it, and both losses at the end (the same data: equal where the switch keeps the bits).
//
//   build/bin/gpt_kernels_ab --aten-kernels gelu_mlp --steps 200 --threads 2 [--precision bf16]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/precision/autocast.h"

namespace {

struct Side {
  fasttrain::Model model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::vector<double> step_ms;
  double loss = 0;
};

Side make_side(const fasttrain::GptOptions& options) {
  torch::manual_seed(0);
  Side side{fasttrain::make_gpt(options, fasttrain::DataShape::tokens(128, 256)), nullptr, {}, 0};
  side.optimizer = std::make_unique<torch::optim::AdamW>(side.model.module().parameters(),
                                                         torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  return side;
}

void train_step(Side& side, const fasttrain::Batch& batch, const torch::Tensor& targets, bool bf16) {
  const auto start = std::chrono::steady_clock::now();
  side.optimizer->zero_grad();
  torch::Tensor loss;
  {
    fasttrain::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
    const torch::Tensor logits = side.model.forward(batch).tensor().reshape({-1, 256});
    loss = fasttrain::kernels::cross_entropy(logits, targets, 0.0);
  }
  loss.backward();
  side.optimizer->step();
  side.loss = loss.item<double>();
  side.step_ms.push_back(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * static_cast<double>(values.size() - 1))];
}

int usage(const std::string& problem) {
  std::cerr << "gpt_kernels_ab: " << problem
            << "\nusage: gpt_kernels_ab --aten-kernels NAME[,NAME...] [--steps N>20] [--threads N>0] "
               "[--precision fp32|bf16]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, threads = 2;
  std::string precision = "fp32";
  std::vector<std::string> aten_kernels;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage("'" + flag + "' needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--steps" && std::atoi(value.c_str()) > 20) {
      steps = std::atoi(value.c_str());
    } else if (flag == "--threads" && std::atoi(value.c_str()) > 0) {
      threads = std::atoi(value.c_str());
    } else if (flag == "--precision" && (value == "fp32" || value == "bf16")) {
      precision = value;
    } else if (flag == "--aten-kernels") {
      std::stringstream names(value);
      for (std::string name; std::getline(names, name, ',');) aten_kernels.push_back(name);
    } else {
      return usage("'" + flag + " " + value + "' is not an option with a valid value");
    }
  }
  if (aten_kernels.empty()) return usage("--aten-kernels names what B leaves out");
  torch::set_num_threads(threads);
  const bool bf16 = precision == "bf16";
  Side a = make_side(fasttrain::GptOptions());
  Side b = make_side(fasttrain::GptOptions().aten_kernels(aten_kernels));  // an unknown name: its Error
  torch::manual_seed(1);
  fasttrain::Batch batch;
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor tokens = torch::randint(0, 256, {32, 129}, torch::kLong);
    batch.inputs = tokens.slice(1, 0, 128).contiguous();
    const torch::Tensor targets = tokens.slice(1, 1, 129).reshape({-1});
    Side& first = step % 2 ? a : b;
    Side& second = step % 2 ? b : a;
    train_step(first, batch, targets, bf16);
    train_step(second, batch, targets, bf16);
  }
  const int warmup = 10;  // steps left out: the allocator's and the caches' first passes
  std::vector<double> ratios, a_ms(a.step_ms.begin() + warmup, a.step_ms.end()),
      b_ms(b.step_ms.begin() + warmup, b.step_ms.end());
  for (size_t i = 0; i < a_ms.size(); ++i) ratios.push_back(b_ms[i] / a_ms[i]);
  nlohmann::json out{
      {"aten_kernels_in_b", aten_kernels},
      {"precision", precision},
      {"threads", threads},
      {"steps", steps},
      {"a_step_ms", quantile(a_ms, 0.5)},
      {"b_step_ms", quantile(b_ms, 0.5)},
      {"b_over_a",
       {{"median", quantile(ratios, 0.5)}, {"p25", quantile(ratios, 0.25)}, {"p75", quantile(ratios, 0.75)}}},
      {"loss_a", a.loss},
      {"loss_b", b.loss},
      {"capability", fasttrain::kernels::to_string(fasttrain::kernels::cpu_capability())},
      {"torch", TORCH_VERSION}};
  std::cout << out.dump(1) << "\n";
  return 0;
}
