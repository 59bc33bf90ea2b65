#pragma once
// Model: what a Trainer trains. Any torch::nn::Module (a ModuleHolder such as a TORCH_MODULE, or a
// shared_ptr to the module), with how a batch enters it:
//
//   fasttrain::Model model(MyNet(...));                            // my_net->forward(batch.inputs)
//   fasttrain::Model two_inputs(MyNet(...), [](MyNetImpl& net, const fasttrain::Batch& batch) {
//     return net.forward(batch.inputs, batch.at("mask"));           // any signature the task calls
//   });
//   fasttrain::ModelOutput out = model.forward(batch);              // a tensor, or named tensors
//
// What a switch needs from a model is asked for, not assumed: activation checkpointing
// (memory.checkpoint) and fully sharded training (dist.zero = 3) cut the model at the blocks of its
// Stages (below: a drop-in for torch::nn::Sequential), and channels_last converts its 4-d parameters.
// A switch whose need is not met is a ConfigError before training that names the switch and what the
// model lacks.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/memory/checkpoint.h"

namespace fasttrain {

// What a model's forward gives for a batch: one tensor (logits, a prediction, a reconstruction), or
// several by name (the heads of a multi-task model, two embeddings of a contrastive one).
class ModelOutput {
 public:
  ModelOutput(torch::Tensor tensor) : tensor_(std::move(tensor)) {}  // NOLINT: a forward's one tensor
  ModelOutput(std::map<std::string, torch::Tensor> named) : named_(std::move(named)) {}  // NOLINT
  // The one tensor; an Error naming the outputs when the forward gave named tensors.
  const torch::Tensor& tensor() const;
  // The output called `name`; an Error naming the outputs there are.
  const torch::Tensor& at(const std::string& name) const;
  bool named() const { return !named_.empty(); }
  std::vector<std::string> names() const;
  // "[64, 10] float" or "{logits: [64, 10] float, box: [64, 4] float}", for messages.
  std::string describe() const;

 private:
  torch::Tensor tensor_;
  std::map<std::string, torch::Tensor> named_;
};

// A Sequential whose blocks fasttrain can run differently: recomputed in backward instead of kept
// (memory.checkpoint) and gathered from their shards one block at a time (dist.zero = 3). Same children
// and state_dict names as torch::nn::Sequential; children take and return one tensor. A block is a child
// with a weight of two or more dimensions and the normalisation and parameter-free children after it
// (memory/checkpoint.h: checkpoint_blocks).
//
//   fasttrain::Stage layers;
//   for (int i = 0; i < 12; ++i) layers->push_back(TransformerBlock(768, 12));
//   x = layers->forward(x);
class StageImpl : public torch::nn::SequentialImpl {
 public:
  using torch::nn::SequentialImpl::SequentialImpl;
  torch::Tensor forward(const torch::Tensor& input);
  void set_checkpointing(const CheckpointPolicy& policy) { policy_ = policy; }
  const CheckpointPolicy& checkpointing() const { return policy_; }
  // Run around every block (dist.zero = 3); null for none. Not owned.
  void set_block_hooks(BlockHooks* hooks) { hooks_ = hooks; }
  bool has_block_hooks() const { return hooks_ != nullptr; }

 private:
  CheckpointPolicy policy_;
  BlockHooks* hooks_ = nullptr;
};
TORCH_MODULE(Stage);

namespace detail {
template <typename T>
struct ModulePointer : std::false_type {};
template <typename M>
struct ModulePointer<std::shared_ptr<M>> : std::is_base_of<torch::nn::Module, M> {
  using Impl = M;
  static std::shared_ptr<M> get(const std::shared_ptr<M>& module) { return module; }
};
template <typename T>
struct ModuleHolderPointer {
  using Impl = typename T::ContainedType;
  static std::shared_ptr<Impl> get(const T& holder) { return holder.ptr(); }
};
template <typename T>
using ModuleAccess = std::conditional_t<std::is_base_of_v<torch::detail::ModuleHolderIndicator, T>,
                                        ModuleHolderPointer<T>, ModulePointer<T>>;
template <typename T>
inline constexpr bool is_module_handle =
    std::is_base_of_v<torch::detail::ModuleHolderIndicator, T> || ModulePointer<T>::value;
}  // namespace detail

class Model {
 public:
  Model() = default;  // no model: a Trainer refuses it
  // `module`'s forward takes the batch's inputs: module->forward(batch.inputs).
  template <typename Handle, typename = std::enable_if_t<detail::is_module_handle<std::decay_t<Handle>>>>
  Model(const Handle& module)  // NOLINT: a module is a model
      : Model(module, [](auto& impl, const Batch& batch) { return impl.forward(batch.inputs); }) {}
  // `forward(impl, batch)` says how a batch enters the module (impl: the module itself).
  template <typename Handle, typename Forward,
            typename = std::enable_if_t<detail::is_module_handle<std::decay_t<Handle>>>>
  Model(const Handle& module, Forward forward) {
    auto impl = detail::ModuleAccess<std::decay_t<Handle>>::get(module);
    set(impl, [impl, forward](const Batch& batch) { return ModelOutput(forward(*impl, batch)); });
  }

  ModelOutput forward(const Batch& batch) const;
  torch::nn::Module& module() const;
  // What runs call the model: its registered name ("cnn"), or the module's type name.
  std::string name() const;
  Model& named(std::string name) {
    name_ = std::move(name);
    return *this;
  }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  explicit operator bool() const { return module_ != nullptr; }

  // The module's Stages, in registration order (the blocks memory.checkpoint and dist.zero = 3 use).
  std::vector<StageImpl*> stages() const;
  // memory.checkpoint on every Stage; an enabled policy on a model without Stages is a ConfigError.
  void set_checkpointing(const CheckpointPolicy& policy) const;
  // A ConfigError naming `setting` ("dist.zero = 3") and what the model lacks when it has no Stages.
  void require_blocks(const std::string& setting, const std::string& otherwise) const;
  // Why the model has no blocks, for those errors (default: build the layer stack as a Stage).
  Model& without_blocks(std::string reason) {
    no_blocks_reason_ = std::move(reason);
    return *this;
  }
  // Installs `hooks` around every block of every Stage (null: none).
  void set_block_hooks(BlockHooks* hooks) const;
  // Whether the module has 4-d (convolution) weights: what channels_last converts.
  bool has_convolutions() const;
  // Every 4-d parameter and buffer to channels_last (NHWC) in place, keeping the Parameter objects;
  // a ConfigError naming train.channels_last when there is none.
  void to_channels_last() const;

  // One line per child module and the parameter count; the parameter count alone.
  std::string describe() const;
  int64_t parameter_count() const;

 private:
  void set(std::shared_ptr<torch::nn::Module> module, std::function<ModelOutput(const Batch&)> forward);

  std::shared_ptr<torch::nn::Module> module_;
  std::function<ModelOutput(const Batch&)> forward_;
  std::string name_;
  std::string no_blocks_reason_;
};

// Converts every 4-d parameter and buffer (conv kernels) of `module` to channels_last (NHWC) in
// place, keeping the Parameter objects (optimizers made later or earlier still see them).
void to_channels_last(torch::nn::Module& module);

}  // namespace fasttrain
