#include "fasttrain/models/model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <sstream>

#include "fasttrain/util/check.h"

namespace fasttrain {

// ---- ModelOutput ----

const torch::Tensor& ModelOutput::tensor() const {
  FT_CHECK(!named(),
           "the model's forward gave named outputs ({}), not one tensor: a task that takes one needs "
           "a forward that returns one",
           fmt::join(names(), ", "));
  return tensor_;
}

const torch::Tensor& ModelOutput::at(const std::string& name) const {
  auto found = named_.find(name);
  FT_CHECK(found != named_.end(), "the model's forward gave no output '{}'; it gave: {}", name,
           named() ? fmt::format("{}", fmt::join(names(), ", ")) : std::string("one tensor"));
  return found->second;
}

std::vector<std::string> ModelOutput::names() const {
  std::vector<std::string> result;
  for (const auto& item : named_) result.push_back(item.first);
  return result;
}

namespace {

std::string describe_tensor(const torch::Tensor& tensor) {
  if (!tensor.defined()) return "(undefined)";
  return fmt::format("[{}] {}", fmt::join(tensor.sizes(), ", "), c10::toString(tensor.scalar_type()));
}

}  // namespace

std::string ModelOutput::describe() const {
  if (!named()) return describe_tensor(tensor_);
  std::vector<std::string> parts;
  for (const auto& [name, tensor] : named_) parts.push_back(name + ": " + describe_tensor(tensor));
  return fmt::format("{{{}}}", fmt::join(parts, ", "));
}

// ---- Stage ----

torch::Tensor StageImpl::forward(const torch::Tensor& input) {
  return checkpoint_sequential(*this, input, policy_, hooks_);
}

// ---- Model ----

void Model::set(std::shared_ptr<torch::nn::Module> module, std::function<ModelOutput(const Batch&)> forward) {
  FT_CHECK(module, "a Model needs a module (got an empty holder or a null pointer)");
  module_ = std::move(module);
  forward_ = std::move(forward);
}

ModelOutput Model::forward(const Batch& batch) const {
  FT_CHECK(module_, "forward on an empty Model");
  return forward_(batch);
}

std::string Model::name() const {
  return name_.empty() ? module().name() : name_;
}

torch::nn::Module& Model::module() const {
  FT_CHECK(module_, "an empty Model has no module");
  return *module_;
}

std::vector<StageImpl*> Model::stages() const {
  std::vector<StageImpl*> stages;
  for (const auto& child : module().modules(/*include_self=*/true)) {
    if (auto* stage = dynamic_cast<StageImpl*>(child.get())) stages.push_back(stage);
  }
  return stages;
}

void Model::set_checkpointing(const CheckpointPolicy& policy) const {
  if (policy.enabled()) require_blocks("memory.checkpoint", "memory.checkpoint = \"none\"");
  for (StageImpl* stage : stages()) stage->set_checkpointing(policy);
}

void Model::require_blocks(const std::string& setting, const std::string& otherwise) const {
  const std::string reason = no_blocks_reason_.empty()
                                 ? "build its layer stack as a fasttrain::Stage (a drop-in for "
                                   "torch::nn::Sequential, models/model.h)"
                                 : no_blocks_reason_;
  FT_CONFIG_CHECK(!stages().empty(), "{} needs the model's blocks, and {} has none: {}; or set {}", setting,
                  name(), reason, otherwise);
}

void Model::set_block_hooks(BlockHooks* hooks) const {
  for (StageImpl* stage : stages()) stage->set_block_hooks(hooks);
}

bool Model::has_convolutions() const {
  for (const auto& parameter : module().parameters()) {
    if (parameter.dim() == 4) return true;
  }
  return false;
}

void Model::to_channels_last() const {
  FT_CONFIG_CHECK(has_convolutions(),
                  "train.channels_last = true lays out 4-d (convolution) weights, and {} has none: set "
                  "train.channels_last = false",
                  module().name());
  fasttrain::to_channels_last(module());
}

void to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  // Into channels_last's own strides, even where a size-1 dimension makes the tensor count as
  // channels_last already (a conv over one input channel: contiguous() would keep [9, 9, 3, 1]): the
  // conv kernels write its gradient with those strides, and DDP lays its bucket views out as the
  // parameter's, so they must agree (else the reducer warns and copies every step).
  auto convert = [](torch::Tensor& tensor) {
    if (!tensor.defined() || tensor.dim() != 4) return;
    torch::Tensor laid_out =
        torch::empty(tensor.sizes(), tensor.options().memory_format(torch::MemoryFormat::ChannelsLast));
    if (tensor.strides() == laid_out.strides()) return;
    laid_out.copy_(tensor.data());
    tensor.set_data(laid_out);
  };
  for (auto& parameter : module.parameters()) convert(parameter);
  for (auto& buffer : module.buffers()) convert(buffer);
}

std::string Model::describe() const {
  std::ostringstream out;
  out << module().name() << " (" << parameter_count() << " parameters)\n";
  for (const auto& child : module().named_children()) {
    out << "  " << child.key() << ": ";
    child.value()->pretty_print(out);
    out << "\n";
  }
  return out.str();
}

int64_t Model::parameter_count() const {
  int64_t count = 0;
  for (const auto& parameter : module().parameters()) count += parameter.numel();
  return count;
}

}  // namespace fasttrain
