#include "fasttrain/dist/fully_sharded.h"

#include <c10/core/StorageImpl.h>
#include <torch/torch.h>

#include <set>

#include "fasttrain/detail/flat_buffer.h"
#include "fasttrain/models/model.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// The memory behind `tensor`'s storage, freed and allocated again in place: every view of it
// (the parameters, and what autograd saved of them) keeps pointing at the same storage.
void free_storage(const torch::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
  // The device's allocator now, not the storage's from when it was made: on the CPU, fasttrain's
  // counting allocator (memory/stats.h) installed since then sees the gathers in the run's peak.
  storage->set_data_ptr_noswap(c10::GetAllocator(tensor.device().type())->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace

// One unit's parameters of one optimizer group.
struct FullySharded::Flat {
  size_t group = 0;     // the optimizer group
  FlatBuffer buffer;    // blocks: the memory of `buffer.whole` is there only while gathered
  torch::Tensor shard;  // [part]: what the optimizer steps; the root's is a view into `buffer.whole`
};

struct FullySharded::Unit {
  std::string name;
  bool root = false;  // keeps its whole parameters
  std::vector<Flat> flats;
  bool gathered = true;
  bool reduced = false;  // in this backward: later gradients add to the shards'
};

FullySharded::FullySharded(ProcessGroup& group, torch::nn::Module& module) : group_(group), module_(module) {
  for (const auto& child : module_.modules(/*include_self=*/true)) {
    if (auto* stage = dynamic_cast<StageImpl*>(child.get())) stages_.push_back(stage);
  }
  std::set<const void*> in_blocks;
  {
    std::map<const void*, std::string> names;  // module -> its path in the model
    for (const auto& item : module_.named_modules()) names[item.value().get()] = item.key();
    for (StageImpl* stage : stages_) {
      for (const auto& [start, end] : checkpoint_blocks(*stage)) {
        std::vector<torch::Tensor> parameters;
        for (size_t index = start; index < end; ++index) {
          for (const auto& parameter : (*(stage->begin() + index)).ptr()->parameters()) {
            if (!parameter.requires_grad()) continue;
            FT_CHECK(in_blocks.insert(parameter.unsafeGetTensorImpl()).second,
                     "dist.zero = 3: a parameter of shape {} is shared by two blocks; each block's "
                     "parameters must be its own",
                     parameter.sizes());
            parameters.push_back(parameter);
          }
        }
        if (parameters.empty()) continue;  // pooling, activations: nothing to gather
        const std::pair<const void*, size_t> block{static_cast<const torch::nn::SequentialImpl*>(stage),
                                                   start};
        block_units_[block] = unit_parameters_.size() + 1;
        unit_parameters_.emplace_back(names[(*(stage->begin() + start)).ptr().get()], std::move(parameters));
      }
    }
  }
  std::vector<torch::Tensor> root;
  for (const auto& parameter : module_.parameters()) {
    if (parameter.requires_grad() && !in_blocks.count(parameter.unsafeGetTensorImpl()))
      root.push_back(parameter);
  }
  unit_parameters_.insert(unit_parameters_.begin(), {"root", std::move(root)});
  for (StageImpl* stage : stages_) stage->set_block_hooks(this);
}

FullySharded::~FullySharded() {
  for (StageImpl* stage : stages_) stage->set_block_hooks(nullptr);
}

std::vector<ParamGroup> FullySharded::shard(const std::vector<ParamGroup>& groups) {
  FT_CHECK(units_.empty(), "FullySharded::shard was already called");
  torch::NoGradGuard no_grad;
  const int64_t world = group_.size();
  std::map<const void*, size_t> group_of;  // parameter -> optimizer group
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& parameter : groups[g].params) group_of[parameter.unsafeGetTensorImpl()] = g;
  }
  std::vector<ParamGroup> sharded(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) sharded[g].weight_decay = groups[g].weight_decay;
  for (auto& [name, parameters] : unit_parameters_) {
    Unit unit;
    unit.name = name;
    unit.root = units_.empty();
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<torch::Tensor> in_group;
      for (const auto& parameter : parameters) {
        auto found = group_of.find(parameter.unsafeGetTensorImpl());
        FT_CHECK(found != group_of.end(),
                 "dist.zero = 3: a parameter of shape {} ({}) is in no optimizer group", parameter.sizes(),
                 name);
        if (found->second == g) in_group.push_back(parameter);
      }
      if (in_group.empty()) continue;
      Flat flat{g, FlatBuffer::lay_out(std::move(in_group), world), {}};
      torch::Tensor mine = flat.buffer.part_of(group_.rank());
      flat.shard = unit.root ? mine : mine.clone();
      sharded[g].names.push_back("zero3." + name + ".group" + std::to_string(g));
      sharded[g].params.push_back(flat.shard);
      unit.flats.push_back(std::move(flat));
    }
    units_.push_back(std::move(unit));
    if (!units_.back().root) release(units_.back());
  }
  return sharded;
}

torch::OrderedDict<std::string, torch::Tensor> FullySharded::shards() const {
  torch::OrderedDict<std::string, torch::Tensor> named;
  for (size_t g = 0;; ++g) {
    bool any = false;
    for (const Unit& unit : units_) {
      for (const Flat& flat : unit.flats) {
        if (flat.group != g) continue;
        named.insert("zero3." + unit.name + ".group" + std::to_string(g), flat.shard);
        any = true;
      }
    }
    if (!any) return named;
  }
}

// ---- gathering and freeing ----

void FullySharded::gather(Unit& unit) {
  if (unit.gathered) return;
  torch::NoGradGuard no_grad;
  for (Flat& flat : unit.flats) {
    allocate_storage(flat.buffer.whole);
    std::vector<torch::Tensor> parts = flat.buffer.parts();
    group_.all_gather(parts, flat.shard);
  }
  unit.gathered = true;
}

void FullySharded::release(Unit& unit) {
  if (unit.root || !unit.gathered || whole_) return;
  for (Flat& flat : unit.flats) free_storage(flat.buffer.whole);
  unit.gathered = false;
}

void FullySharded::before_block(const torch::nn::SequentialImpl& stage, size_t start) {
  auto found = block_units_.find({&stage, start});
  if (found != block_units_.end()) gather(units_[found->second]);  // else: no parameters
}

torch::Tensor FullySharded::after_block(const torch::nn::SequentialImpl& stage, size_t start,
                                        torch::Tensor output) {
  auto found = block_units_.find({&stage, start});
  if (found == block_units_.end()) return output;
  const size_t index = found->second;
  if (torch::GradMode::is_enabled() && output.requires_grad()) {
    // Fires when the output's gradient is complete: the block's backward comes next.
    output.register_hook([this, index](const torch::Tensor&) { before_unit_backward(index); });
  }
  if (!in_backward_) release(units_[index]);
  return output;
}

// ---- backward ----

void FullySharded::begin_backward(bool sync) {
  in_backward_ = true;
  sync_ = sync;
  backward_.clear();
  for (Unit& unit : units_) unit.reduced = false;
}

void FullySharded::before_unit_backward(size_t index) {
  // The blocks are a chain: when this block's output gradient is ready, the backward of the blocks
  // after it (which started earlier) has run, and AccumulateGrad, first in the engine's queue, has
  // put their parameters' gradients in place.
  for (size_t done : backward_) {
    if (sync_) reduce(units_[done]);
    release(units_[done]);
  }
  backward_.clear();
  gather(units_[index]);
  backward_.push_back(index);
}

void FullySharded::end_backward() {
  // Whatever the hooks did not finish, in unit order (the same on every rank): the last blocks of
  // the backward, the root, and any block whose gradients arrived late.
  for (Unit& unit : units_) {
    if (sync_) reduce(unit);
    release(unit);
  }
  backward_.clear();
  in_backward_ = false;
}

void FullySharded::reduce(Unit& unit) {
  torch::NoGradGuard no_grad;
  for (Flat& flat : unit.flats) {
    torch::Tensor grads = flat.buffer.take_gradients();  // [world x part], averaged once summed
    if (!grads.defined()) continue;
    torch::Tensor mine = group_.reduce_scatter(grads.view({group_.size(), flat.buffer.part}));
    if (unit.reduced && flat.shard.grad().defined()) {
      flat.shard.mutable_grad().add_(mine);
    } else {
      flat.shard.mutable_grad() = mine;
    }
  }
  unit.reduced = true;
}

void FullySharded::after_optimizer_step() {
  torch::NoGradGuard no_grad;
  for (Flat& flat : units_.front().flats) {
    std::vector<torch::Tensor> parts = flat.buffer.parts();
    group_.all_gather(parts, flat.shard);
  }
}

// ---- the whole model at once ----

void FullySharded::gather_all() {
  FT_CHECK(!whole_, "dist.zero = 3: the whole parameters are already gathered");
  for (Unit& unit : units_) gather(unit);
  whole_ = true;
}

void FullySharded::release_all(bool write_back) {
  whole_ = false;
  torch::NoGradGuard no_grad;
  for (Unit& unit : units_) {
    if (write_back && !unit.root) {
      for (Flat& flat : unit.flats) flat.shard.copy_(flat.buffer.part_of(group_.rank()));
    }
    release(unit);
  }
}

int64_t FullySharded::units() const {
  return static_cast<int64_t>(units_.size());
}

int64_t FullySharded::parameter_bytes() const {
  int64_t bytes = 0;
  for (const Unit& unit : units_) {
    for (const Flat& flat : unit.flats) {
      const torch::Tensor& kept = unit.root ? flat.buffer.whole : flat.shard;
      bytes += kept.numel() * static_cast<int64_t>(kept.element_size());
    }
  }
  return bytes;
}

}  // namespace fasttrain
