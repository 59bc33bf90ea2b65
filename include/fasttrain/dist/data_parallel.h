#pragma once
// Data parallelism: every rank trains a replica of the model on its shard of each global batch,
// and the replicas stay identical because every rank applies the same averaged gradients.
//
//   auto group = fasttrain::default_process_group(options);
//   fasttrain::DataParallel parallel(group, model, options);   // broadcasts rank 0's weights
//   optimizer = parallel.shard_optimizer(std::move(optimizer));  // ZeRO: this rank's part only
//   // per micro-batch, `sync` true on the last of the accumulation window:
//   parallel.before_forward(sync);  loss = ...;  parallel.backward(loss, sync);
//   optimizer->step(lr);  parallel.after_optimizer_step();
//
// dist.zero = 0 (DDP): c10d::Reducer, the engine of PyTorch's DistributedDataParallel. Gradients
// go into buckets of dist.bucket_cap_mb in the order backward produces them, and each bucket is
// all-reduced (averaged) as soon as it is full, while backward goes on computing the rest. Inside
// an accumulation window nothing is communicated (DDP's no_sync): the gradients accumulate locally
// and the window's last backward all-reduces the sum.
//
// dist.zero = 1 / 2 (ZeRO, as DeepSpeed stages 1 and 2): the parameters of each optimizer group
// are laid out in one flat buffer (the model's parameters become views into it) padded to a
// multiple of the world size, and rank r owns the r-th contiguous part. The optimizer is rebuilt
// over these parts, so its state (Adam's two moments) is 1/N of DDP's per rank. After the window's
// backward the gradients are flattened and the model's gradients freed; ZeRO-1 all-reduces the
// flat gradients and keeps its part, ZeRO-2 reduce-scatters them so that each rank receives only
// its part (half the bytes of an all-reduce). After the optimizer step each rank's updated part
// is all-gathered into everyone's flat buffer. The collectives run after backward, not overlapped
// with it. Element-wise optimizers (sgd, adam, adamw) give the same updates as DDP.
//
// dist.zero = 3 (fully sharded, dist/fully_sharded.h): the parameters too, block by block: each rank
// keeps 1/N of each block's parameters between uses and gathers a block's whole parameters just
// before its forward and its backward. Whatever reads the weights outside a training step (saving,
// loading) does it inside a WholeParameters scope.
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fasttrain/dist/process_group.h"
#include "fasttrain/optim/optimizer.h"

namespace c10d {
class Logger;
class Reducer;
}  // namespace c10d

namespace fasttrain {

class FullySharded;

class DataParallel {
 public:
  // Copies rank 0's parameters and buffers to every rank. Checks dist.zero and bucket_cap_mb.
  DataParallel(std::shared_ptr<ProcessGroup> group, std::shared_ptr<torch::nn::Module> model,
               DistOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // DDP: `optimizer` as it is. ZeRO: an optimizer of the same kind and group options over this
  // rank's parts of each group's flat buffer, named "zero.group<g>" (its state starts empty: call
  // before any step).
  std::unique_ptr<Optimizer> shard_optimizer(std::unique_ptr<Optimizer> optimizer);
  // What the sharded optimizer steps, named for its checkpoint ("zero.group0", ...); the model's
  // named parameters under DDP.
  torch::OrderedDict<std::string, torch::Tensor> optimizer_parameters() const;

  // ---- the training step ----
  // `sync`: this micro-batch ends the accumulation window, so its backward communicates.
  void before_forward(bool sync);
  // loss.backward(), communicating when `sync`: afterwards the averaged gradients are where the
  // optimizer reads them. A rank that died makes this an Error naming the collective.
  void backward(const torch::Tensor& loss, bool sync);
  // ZeRO: all-gathers the updated parts into every rank's parameters.
  void after_optimizer_step();

  // ---- values every rank must agree on ----
  // Sums `tensor` over ranks in place.
  void all_reduce_sum(torch::Tensor& tensor) { group_->all_reduce(tensor, ReduceOp::kSum); }
  // The gradient norm's square summed over the ranks' parts (ZeRO); identity under DDP, where
  // every rank already holds every averaged gradient. For clip_grad_norm.
  std::function<void(torch::Tensor&)> grad_norm_reducer();
  // Any rank's inf/NaN makes every rank skip the step (GradScaler::set_found_inf_reducer).
  std::function<void(torch::Tensor&)> found_inf_reducer();
  bool any(bool flag) { return group_->any(flag); }

  // While alive, every parameter is whole on every rank (ZeRO-3 gathers them; otherwise it does
  // nothing): for saving or loading weights. `write_back`: what was loaded into them becomes each
  // rank's shard when the scope ends. Collective: every rank makes one, at the same point.
  class WholeParameters {
   public:
    WholeParameters(DataParallel& parallel, bool write_back);
    ~WholeParameters();
    WholeParameters(const WholeParameters&) = delete;
    WholeParameters& operator=(const WholeParameters&) = delete;

   private:
    FullySharded* sharded_;
    bool write_back_;
  };

  ProcessGroup& group() { return *group_; }
  int rank() const { return group_->rank(); }
  int world_size() const { return group_->size(); }
  int zero() const { return options_.zero(); }
  // Parameter bytes this rank keeps between steps (ZeRO-3: its shards and the root's parameters).
  int64_t parameter_bytes() const;
  // DDP: PyTorch DDP's own runtime statistics of the sampled iterations (c10d::Logger, what
  // model._get_ddp_logging_data() shows in Python), in ns: avg_backward_compute_time,
  // avg_backward_comm_time, avg_backward_compute_comm_overlap_time, ... Empty under ZeRO.
  std::map<std::string, int64_t> ddp_timings() const;
  // This run's facts for summary.json: world size, zero, bytes sent per step, optimizer state and
  // parameter bytes.
  nlohmann::json describe(const Optimizer& optimizer, int64_t steps, int64_t bytes_before) const;

 private:
  struct FlatGroup;  // ZeRO: one optimizer group's flat parameter buffer and this rank's part
  // ZeRO, after the window's backward: the gradients into the flat layout, reduced to the parts.
  void reduce_flat_gradients();
  // Combines a 0-dim tensor over the ranks with `op`, in place.
  std::function<void(torch::Tensor&)> reducer(ReduceOp op);

  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<torch::nn::Module> model_;
  DistOptions options_;
  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> buffers_;
  int64_t gradient_bytes_ = 0;
  std::shared_ptr<c10d::Reducer> reducer_;  // DDP
  std::shared_ptr<c10d::Logger> logger_;    // DDP: the Reducer's timings
  std::vector<FlatGroup> flat_groups_;      // ZeRO-1/2
  std::unique_ptr<FullySharded> sharded_;   // ZeRO-3
};

}  // namespace fasttrain
