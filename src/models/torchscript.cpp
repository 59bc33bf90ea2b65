#include "fasttrain/models/torchscript.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// A node of the mirror: the direct parameters and buffers of one scripted (sub)module, and a mirror of
// each of its children, registered under the scripted names.
class MirrorImpl : public torch::nn::Module {
 public:
  MirrorImpl(const torch::jit::Module& scripted, const std::string& type_name)
      : torch::nn::Module(type_name) {
    mirror(*this, scripted);
  }

  // Registers `scripted`'s own tensors and children in `node`: the same tensors, not copies.
  static void mirror(torch::nn::Module& node, const torch::jit::Module& scripted) {
    for (const auto& parameter : scripted.named_parameters(/*recurse=*/false)) {
      node.register_parameter(parameter.name, parameter.value, parameter.value.requires_grad());
    }
    for (const auto& buffer : scripted.named_buffers(/*recurse=*/false)) {
      node.register_buffer(buffer.name, buffer.value);
    }
    for (const auto& child : scripted.named_children()) {
      node.register_module(child.name, std::make_shared<MirrorImpl>(child.value, type_name_of(child.value)));
    }
  }

  // "Net" for __torch__.Net, "Conv2d" for __torch__.torch.nn.modules.conv.Conv2d.
  static std::string type_name_of(const torch::jit::Module& scripted) {
    const auto& type = scripted.type()->name();
    return type ? type->name() : std::string("ScriptModule");
  }
};

}  // namespace

ScriptedModuleImpl::ScriptedModuleImpl(torch::jit::Module module, std::string what)
    : torch::nn::Module("TorchScript " + MirrorImpl::type_name_of(module)),
      module_(std::move(module)),
      what_(std::move(what)) {
  const auto forward = module_.find_method("forward");
  FT_CHECK(forward.has_value(), "{}: the TorchScript module has no forward method (it has: {})", what_, [&] {
    std::vector<std::string> names;
    for (const auto& method : module_.get_methods()) names.push_back(method.name());
    return fmt::format("{}", fmt::join(names, ", "));
  }());
  const auto& schema = forward->function().getSchema();
  for (size_t i = 1; i < schema.arguments().size(); ++i) {  // 0 is self
    arguments_.push_back(schema.arguments()[i].name());
    has_default_.push_back(schema.arguments()[i].default_value().has_value());
  }
  FT_CHECK(!arguments_.empty(), "{}: forward takes no input (a model takes at least the batch's inputs)",
           what_);
  MirrorImpl::mirror(*this, module_);
  train(module_.is_training());
}

ModelOutput ScriptedModuleImpl::forward(const Batch& batch) {
  std::vector<torch::jit::IValue> inputs{batch.inputs};
  for (size_t i = 1; i < arguments_.size(); ++i) {
    if (!batch.has(arguments_[i])) {
      FT_CHECK(has_default_[i],
               "{}: forward takes '{}', and the batch has no tensor of that name (it has: {})", what_,
               arguments_[i], fmt::join(batch.names(), ", "));
      break;  // this and the later arguments take their defaults
    }
    inputs.emplace_back(batch.at(arguments_[i]));
  }
  const torch::jit::IValue output = module_.forward(std::move(inputs));
  if (output.isTensor()) return output.toTensor();
  if (output.isGenericDict()) {
    std::map<std::string, torch::Tensor> named;
    for (const auto& item : output.toGenericDict()) {
      FT_CHECK(item.key().isString() && item.value().isTensor(),
               "{}: forward returned a dict that is not Dict[str, Tensor]", what_);
      named[item.key().toStringRef()] = item.value().toTensor();
    }
    return named;
  }
  FT_FAIL("{}: forward returned {}; a model returns a Tensor or a Dict[str, Tensor]", what_,
          output.tagKind());
}

void ScriptedModuleImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_.train(on);
}

Model load_torchscript(const std::string& path) {
  FT_CONFIG_CHECK(!path.empty(),
                  "model.name = \"torchscript\" needs model.path: the file torch.jit.save wrote");
  FT_CHECK(std::filesystem::is_regular_file(path), "model.path '{}': no such file", path);
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& error) {
    FT_FAIL(
        "model.path '{}' is not a TorchScript archive this LibTorch ({}) can load (torch.jit.save's file, "
        "from the same or an older PyTorch): {}",
        path, compat::torch_version(), error.what_without_backtrace());
  }
  auto scripted = ScriptedModule(std::move(module), "model.path '" + path + "'");
  Model model(scripted, [](ScriptedModuleImpl& net, const Batch& batch) { return net.forward(batch); });
  return model.named("torchscript")
      .without_blocks(
          "its forward runs in the TorchScript interpreter, where fasttrain cannot recompute or shard a "
          "block");
}

}  // namespace fasttrain
