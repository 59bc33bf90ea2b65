#include "fasttrain/dist/data_parallel.h"

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "fasttrain/detail/compat.h"
#include "fasttrain/detail/flat_buffer.h"
#include "fasttrain/dist/fully_sharded.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// The name of ZeRO group g's part in checkpoints.
std::string shard_name(size_t group) {
  return "zero.group" + std::to_string(group);
}

// PyTorch's DDP: a small first bucket so that communication starts early in backward.
constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;

}  // namespace

// ZeRO-1/2: one optimizer group's parameters in one flat buffer, and this rank's part of it.
struct DataParallel::FlatGroup {
  FlatBuffer flat;
  torch::Tensor shard;  // flat.part_of(rank): what the sharded optimizer steps
};

DataParallel::DataParallel(std::shared_ptr<ProcessGroup> group, std::shared_ptr<torch::nn::Module> model,
                           DistOptions options)
    : group_(std::move(group)), model_(std::move(model)), options_(std::move(options)) {
  FT_CHECK(group_ != nullptr, "DataParallel needs a process group");
  check_keys(options_, "dist");
  for (const auto& parameter : model_->parameters()) {
    if (!parameter.requires_grad()) continue;
    parameters_.push_back(parameter);
    gradient_bytes_ += parameter.numel() * static_cast<int64_t>(parameter.element_size());
  }
  buffers_ = model_->buffers();

  // ---- every replica starts from rank 0's weights ----
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state = parameters_;
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    group_->broadcast(state, 0);
  }
  if (options_.zero() == 3) sharded_ = std::make_unique<FullySharded>(*group_, *model_);
  if (options_.zero() > 0) return;  // shard_optimizer lays out the flat buffers

  // ---- DDP: c10d::Reducer with PyTorch DDP's bucket order (reverse of registration) ----
  const auto bucket_bytes = static_cast<int64_t>(options_.bucket_cap_mb() * (1 << 20));
  std::vector<bool> sparse(parameters_.size(), false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      parameters_, {static_cast<size_t>(kFirstBucketBytes), static_cast<size_t>(bucket_bytes)}, sparse);
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  std::unordered_map<size_t, std::string> names;
  size_t index = 0;
  for (const auto& item : model_->named_parameters()) {
    if (item.value().requires_grad()) names[index++] = item.key();
  }
  reducer_ = compat::make_reducer<c10d::Reducer>(parameters_, buckets, limits, group_->c10d_group(), sparse,
                                                 bucket_bytes, /*gradient_as_bucket_view=*/false, names,
                                                 kFirstBucketBytes);
  logger_ = std::make_shared<c10d::Logger>(reducer_);
  reducer_->set_logger(logger_);
}

DataParallel::~DataParallel() = default;

std::unique_ptr<Optimizer> DataParallel::shard_optimizer(std::unique_ptr<Optimizer> optimizer) {
  if (options_.zero() == 0) return optimizer;
  FT_CONFIG_CHECK(
      optimizer->steps_shards(),
      "dist.zero = {}: optimizer '{}' updates whole weight matrices, which ZeRO's flat shards split; "
      "use dist.zero = 0 (DDP) with it",
      options_.zero(), optimizer->name());
  FT_CHECK(flat_groups_.empty(), "shard_optimizer was already called");
  if (sharded_) return optimizer->rebuild(sharded_->shard(optimizer->groups()));
  torch::NoGradGuard no_grad;
  const int64_t world = world_size();
  std::vector<ParamGroup> shards;
  for (const auto& param_group : optimizer->groups()) {
    FlatGroup flat_group{FlatBuffer::lay_out(param_group.params, world), {}};
    flat_group.shard = flat_group.flat.part_of(rank());
    shards.push_back({{shard_name(flat_groups_.size())}, {flat_group.shard}, param_group.weight_decay});
    flat_groups_.push_back(std::move(flat_group));
  }
  return optimizer->rebuild(std::move(shards));
}

torch::OrderedDict<std::string, torch::Tensor> DataParallel::optimizer_parameters() const {
  if (options_.zero() == 0) {
    torch::OrderedDict<std::string, torch::Tensor> named;
    for (const auto& item : model_->named_parameters()) {
      if (item.value().requires_grad()) named.insert(item.key(), item.value());
    }
    return named;
  }
  if (sharded_) return sharded_->shards();
  torch::OrderedDict<std::string, torch::Tensor> named;
  for (size_t g = 0; g < flat_groups_.size(); ++g) named.insert(shard_name(g), flat_groups_[g].shard);
  return named;
}

void DataParallel::before_forward(bool sync) {
  if (options_.broadcast_buffers() && !buffers_.empty()) {
    torch::NoGradGuard no_grad;
    group_->broadcast(buffers_, 0);
  }
  if (!reducer_) return;
  if (sync) {
    logger_->set_runtime_stats_and_log();  // the previous synchronised iteration's timings
    reducer_->prepare_for_forward();
  }
  // After the first synchronised backward, once: buckets in the order gradients actually arrived.
  reducer_->rebuild_buckets();
}

void DataParallel::backward(const torch::Tensor& loss, bool sync) {
  if (sharded_) {
    sharded_->begin_backward(sync);
    group_->guard("the ZeRO-3 gathers and reduce-scatters in backward", [&] { loss.backward(); });
    sharded_->end_backward();
    return;
  }
  if (!sync) {
    loss.backward();  // the Reducer's hooks stay quiet: gradients accumulate locally (no_sync)
    return;
  }
  if (reducer_) {
    reducer_->prepare_for_backward({loss});
    group_->guard("the DDP gradient all-reduce in backward", [&] { loss.backward(); });
    // The Reducer finished (averaged into .grad) at the end of backward; a ring all-reduce sends
    // 2 (N - 1) / N of the gradient bytes per rank.
    group_->add_bytes_sent(2 * gradient_bytes_ * (world_size() - 1) / world_size());
    return;
  }
  loss.backward();
  reduce_flat_gradients();
}

void DataParallel::reduce_flat_gradients() {
  torch::NoGradGuard no_grad;
  for (FlatGroup& flat_group : flat_groups_) {
    const FlatBuffer& flat = flat_group.flat;
    torch::Tensor grads = flat.take_gradients();  // [world x part], averaged once summed
    if (!grads.defined()) grads = torch::zeros_like(flat.whole);
    if (options_.zero() == 1) {
      group_->all_reduce(grads);  // every rank holds every gradient; the optimizer reads its part
      flat_group.shard.mutable_grad() = grads.narrow(0, rank() * flat.part, flat.part);
    } else {
      flat_group.shard.mutable_grad() = group_->reduce_scatter(grads.view({world_size(), flat.part}));
    }
  }
}

void DataParallel::after_optimizer_step() {
  if (reducer_) return;
  if (sharded_) return sharded_->after_optimizer_step();
  torch::NoGradGuard no_grad;
  for (FlatGroup& flat_group : flat_groups_) {
    std::vector<torch::Tensor> parts = flat_group.flat.parts();
    group_->all_gather(parts, flat_group.shard);
  }
}

std::function<void(torch::Tensor&)> DataParallel::reducer(ReduceOp op) {
  return [this, op](torch::Tensor& value) {
    torch::Tensor flat = value.reshape({1});  // a view of the 0-dim value: reduced in place
    group_->all_reduce(flat, op);
  };
}

std::function<void(torch::Tensor&)> DataParallel::grad_norm_reducer() {
  return options_.zero() == 0 ? nullptr : reducer(ReduceOp::kSum);
}

std::function<void(torch::Tensor&)> DataParallel::found_inf_reducer() {
  return options_.zero() == 0 ? nullptr : reducer(ReduceOp::kMax);
}

int64_t DataParallel::parameter_bytes() const {
  if (sharded_) return sharded_->parameter_bytes();
  int64_t bytes = 0;
  for (const auto& parameter : model_->parameters()) bytes += parameter.numel() * parameter.element_size();
  return bytes;
}

DataParallel::WholeParameters::WholeParameters(DataParallel& parallel, bool write_back)
    : sharded_(parallel.sharded_.get()), write_back_(write_back) {
  if (sharded_) sharded_->gather_all();
}

DataParallel::WholeParameters::~WholeParameters() {
  if (sharded_) sharded_->release_all(write_back_);
}

std::map<std::string, int64_t> DataParallel::ddp_timings() const {
  std::map<std::string, int64_t> timings;
  if (!logger_) return timings;
  for (const auto& [key, value] : logger_->get_ddp_logging_data().ints_map) {
    if (key.rfind("avg_", 0) == 0) timings[key] = value;
  }
  return timings;
}

nlohmann::json DataParallel::describe(const Optimizer& optimizer, int64_t steps, int64_t bytes_before) const {
  nlohmann::json facts = {
      {"world_size", world_size()},
      {"backend", group_->backend()},
      {"zero", options_.zero()},
      {"bytes_sent_per_step", steps > 0 ? (group_->bytes_sent() - bytes_before) / steps : 0},
      {"optimizer_state_bytes", optimizer.state_bytes()},
      {"parameter_bytes", parameter_bytes()},
      {"ddp_timings_ns", ddp_timings()},
  };
  if (sharded_) facts["units"] = sharded_->units();  // the root and the blocks with parameters
  return facts;
}

}  // namespace fasttrain
