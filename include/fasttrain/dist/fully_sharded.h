#pragma once
// Fully sharded training (dist.zero = 3, as DeepSpeed's stage 3 and PyTorch's FSDP): between uses a
// rank holds only its 1/N of each block's parameters, gradients and optimizer state.
//
// The model is cut into units: one per block of its Stages (models/model.h: the blocks activation
// checkpointing uses: a GPT's transformer blocks, a ResNet's residual blocks), and the root, every
// parameter outside them (a GPT's embeddings and final norm). A module without Stages is all root. For each
// unit and each optimizer group the parameters are laid out in one flat buffer padded to a multiple of the
// world size; rank r keeps the r-th contiguous part of it (its shard), and the optimizer steps the shards.
//
//   forward   before a block: its shards all-gathered into the flat buffer (the parameters are views
//             into it); after the block: the buffer's memory freed, a hook put on the block's output.
//   backward  the hook fires when the output's gradient is ready, just before the block's backward:
//             the block is gathered again (a checkpointed block recomputes its forward from it), and
//             the blocks whose backward ran before it are done: their gradients are flattened,
//             averaged and reduce-scattered into the shards' gradients, and their memory freed.
//   step      the optimizer updates the shards; the next forward gathers the new values.
// The root keeps its whole parameters (as FSDP's root that does not reshard after forward): its
// gradients are reduce-scattered after backward and the updated shards all-gathered after the step,
// as ZeRO-2. Inside an accumulation window nothing is reduced: the whole gradients accumulate on the
// parameters (FSDP's no_sync), and the window's last backward reduces the sum. Element-wise
// optimizers (sgd, adam, adamw) give DDP's updates.
//
// The buffer's memory is freed and allocated again in place (the storage keeps its identity), so the
// tensors autograd saved in forward see the gathered values again in backward, as in FSDP.
// Evaluation forwards gather and free block by block too. Whatever else reads the weights (saving,
// loading, export) does so inside a WholeParameters scope.
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/dist/process_group.h"
#include "fasttrain/memory/checkpoint.h"
#include "fasttrain/optim/optimizer.h"

namespace fasttrain {

class StageImpl;

class FullySharded : public BlockHooks {
 public:
  // Installs itself as the block hooks of `module`'s Stages (a module without Stages is all root).
  FullySharded(ProcessGroup& group, torch::nn::Module& module);
  ~FullySharded() override;
  FullySharded(const FullySharded&) = delete;
  FullySharded& operator=(const FullySharded&) = delete;

  // Lays out every unit's part of each optimizer group, frees the blocks' whole parameters and
  // returns the groups the optimizer steps instead: group g holds every unit's shard of g, named
  // "zero3.<unit>.group<g>" (<unit>: "root" or the block's first module, "blocks.3").
  std::vector<ParamGroup> shard(const std::vector<ParamGroup>& groups);
  // The shards by those names, in optimizer order.
  torch::OrderedDict<std::string, torch::Tensor> shards() const;

  // ---- the training step (DataParallel calls these) ----
  // `sync`: this backward ends the accumulation window, so the gradients are reduced.
  void begin_backward(bool sync);
  void end_backward();
  void after_optimizer_step();  // the root's updated shards to every rank

  // Collective: gathers every unit; `write_back` copies the whole parameters into the shards when
  // the scope ends (after loading weights). Scopes do not nest.
  void gather_all();
  void release_all(bool write_back);

  // Parameter bytes this rank keeps between steps (the root whole, the blocks' shards).
  int64_t parameter_bytes() const;
  int64_t units() const;  // the root and the blocks with parameters

  void before_block(const torch::nn::SequentialImpl& stage, size_t start) override;
  torch::Tensor after_block(const torch::nn::SequentialImpl& stage, size_t start,
                            torch::Tensor output) override;

 private:
  struct Flat;  // one unit's parameters of one optimizer group
  struct Unit;
  void gather(Unit& unit);
  void release(Unit& unit);
  void reduce(Unit& unit);
  void before_unit_backward(size_t index);

  ProcessGroup& group_;
  torch::nn::Module& module_;
  std::vector<StageImpl*> stages_;                                // the module's Stages: the hooks' owners
  std::vector<Unit> units_;                                       // the root first, then forward order
  std::map<std::pair<const void*, size_t>, size_t> block_units_;  // (stage, first child) -> unit
  std::vector<std::pair<std::string, std::vector<torch::Tensor>>> unit_parameters_;  // before shard()
  bool in_backward_ = false;
  bool sync_ = false;
  bool whole_ = false;            // inside gather_all .. release_all
  std::vector<size_t> backward_;  // units whose backward has started, not yet finished
};

}  // namespace fasttrain
