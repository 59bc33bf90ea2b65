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
//   // A Sequential, every block checkpointed ("blocks") or every k-th one ("every_k"):
//   torch::Tensor out = fasttrain::checkpoint_sequential(*layers, x,
//   fasttrain::CheckpointPolicy::every_k(2));
//
// Limits, as in PyTorch's reentrant variant: use loss.backward(), not torch::autograd::grad (the
// recompute accumulates into .grad); the block must not modify its input in place (an in-place ReLU
// as the first op) — that is detected and reported in forward. Unlike PyTorch, buffers passed in
// (BatchNorm's running statistics) are put back after the recompute, so they advance once per
// training forward as without checkpointing. Under no-grad (evaluation) the block simply runs.
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/util/arg.h"

namespace fasttrain {

using CheckpointBlock = std::function<torch::Tensor(const torch::Tensor&)>;

// Runs `block(input)` with checkpointing. `parameters` are the tensors the block uses besides its
// input (its module's parameters): when any requires grad, so does the output, even when the input does not
// (the first block's input is data), so backward reaches the block. It is an error when grad mode
// is on and neither the input nor any parameter requires grad: the block's gradients would be lost.
// `buffers` are the state the block updates as it runs (BatchNorm's running mean, variance and
// count): their values from before the recompute are restored after it.
torch::Tensor checkpoint(const CheckpointBlock& block, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters = {},
                         const std::vector<torch::Tensor>& buffers = {});

// Which blocks are checkpointed: none, every block, or blocks 0, k, 2k, ... of each Sequential.
struct CheckpointPolicy {
  int64_t every = 0;  // 0: none; 1: every block; k: blocks 0, k, 2k, ...

  static CheckpointPolicy none() { return {}; }
  static CheckpointPolicy blocks() { return {1}; }
  static CheckpointPolicy every_k(int64_t k);  // k >= 1
  // memory.checkpoint ("none" | "blocks" | "every_k") with memory.checkpoint_every = `every`; a bad mode
  // or every < 1 is a ConfigError naming the key.
  static CheckpointPolicy parse(const std::string& mode, int64_t every);
  bool enabled() const { return every > 0; }
  bool applies(int64_t index) const { return every > 0 && index % every == 0; }
};

// `sequential`'s children grouped into blocks: a block starts at each child that has a weight of two
// or more dimensions (a Linear, a convolution, a residual block) and takes the parameter-free and
// normalisation children after it (ReLU, pooling, dropout, BatchNorm). Conv -> BatchNorm ->
// ReLU(inplace) is one block, so an in-place activation never starts one. Children before the first
// weighted one form a block of their own. [start, end) child indices, in order.
std::vector<std::pair<size_t, size_t>> checkpoint_blocks(torch::nn::SequentialImpl& sequential);

// Called around every block (checkpoint_blocks) that checkpoint_sequential runs, checkpointed or not,
// in training and in evaluation: fully sharded training (dist.zero = 3) gathers a block's parameters
// before it and frees them after. A block is named by its Sequential and its first child's index.
// The recompute of a checkpointed block in backward runs inside the block, between no hooks.
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_block(const torch::nn::SequentialImpl& stage, size_t start) = 0;
  // Returns the block's output (the hooks may attach a gradient hook to it).
  virtual torch::Tensor after_block(const torch::nn::SequentialImpl& stage, size_t start,
                                    torch::Tensor output) = 0;
};

// `sequential`'s forward with the blocks (checkpoint_blocks) the policy selects checkpointed; the
// rest run normally. Children must take and return one tensor. `hooks` (may be null) run around
// each block.
torch::Tensor checkpoint_sequential(torch::nn::SequentialImpl& sequential, const torch::Tensor& input,
                                    const CheckpointPolicy& policy, BlockHooks* hooks = nullptr);

}  // namespace fasttrain
