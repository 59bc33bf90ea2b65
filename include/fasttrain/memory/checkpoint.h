#pragma once
// Activation checkpointing: run a block of the forward pass without keeping its intermediate
// activations, and recompute them during backward. Memory for activations drops from "every layer's"
// to "each checkpointed block's input plus one block's internals", for about one extra forward.
// This is torch.utils.checkpoint.checkpoint(use_reentrant=True) for C++:
//   - forward runs the block under no-grad and saves only its input;
//   - backward reruns it with grad enabled, with the CPU RNG (and the input device's RNG) and the
//     autocast state as they were in forward, so dropout draws the same mask and matmuls run in the
//     same precision; then back-propagates through the recomputed graph, which accumulates the
//     block's parameter gradients directly and returns the input's gradient.
//
//   torch::Tensor y = fasttrain::checkpoint([&](const torch::Tensor& x) { return block->forward(x); }, x,
//                                           block->parameters());
//   // A Sequential, every child checkpointed ("blocks") or every k-th one ("every_k"):
//   fasttrain::CheckpointPolicy policy =
//       fasttrain::CheckpointPolicy::parse(fasttrain::CheckpointOptions().mode("every_k").every(2));
//   torch::Tensor out = fasttrain::checkpoint_sequential(*layers, x, policy);
//
// Limits, as in PyTorch's reentrant variant: use loss.backward(), not torch::autograd::grad (the
// recompute accumulates into .grad); the block must not modify its input in place (an in-place ReLU
// as the first op) — that is detected and reported in forward; BatchNorm running statistics are
// updated twice (forward and recompute). Under no-grad (evaluation) the block simply runs.
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fasttrain/util/arg.h"

namespace fasttrain {

using CheckpointBlock = std::function<torch::Tensor(const torch::Tensor&)>;

// Runs `block(input)` with checkpointing. `parameters` are the tensors the block uses besides its
// input (its module's parameters): they make the output require grad even when the input does not
// (the first block's input is data), so backward reaches the block. It is an error when grad mode
// is on and neither the input nor any parameter requires grad: the block's gradients would be lost.
torch::Tensor checkpoint(const CheckpointBlock& block, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters = {});

// memory.checkpoint: "none" | "blocks" (every child of the Sequential) | "every_k" (children 0, k,
// 2k, ... with k = memory.checkpoint_every; k = 1 is "blocks").
struct CheckpointOptions {
  FT_ARG(std::string, mode) = "none";
  FT_ARG(int64_t, every) = 2;
};

struct CheckpointPolicy {
  int64_t every = 0;  // 0: none; 1: every block; k: blocks 0, k, 2k, ...

  // Invalid modes or every < 1 are a ConfigError naming memory.checkpoint / memory.checkpoint_every.
  static CheckpointPolicy parse(const CheckpointOptions& options);
  bool enabled() const { return every > 0; }
  bool applies(int64_t index) const { return every > 0 && index % every == 0; }
};

// `sequential`'s forward with the children the policy selects checkpointed (each on its own, with
// its own parameters); the rest run normally. Children must take and return one tensor.
torch::Tensor checkpoint_sequential(torch::nn::SequentialImpl& sequential, const torch::Tensor& input,
                                    const CheckpointPolicy& policy);

}  // namespace fasttrain
