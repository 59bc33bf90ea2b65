#pragma once
// Models written in Python: a module scripted or traced in PyTorch and saved with torch.jit.save
// (model.name = "torchscript", model.path), trained by the same Trainer as any C++ module.
//
//   # Python, the same PyTorch release as the LibTorch fasttrain is built against:
//   torch.jit.save(torch.jit.script(Net()), "net.pt")
//
//   fasttrain::Model model = fasttrain::load_torchscript("net.pt");   // C++
//
// The scripted module's parameters and buffers are registered, as the very same tensors, in a tree of
// torch::nn::Modules that mirrors its submodules: optimizers, EMA, DDP and ZeRO-1/2, checkpoints and the
// safetensors export see them under PyTorch's own state_dict names ("features.0.weight"), and the
// scripted forward computes with what they change. train()/eval() reach the scripted module too.
//
// How a batch enters it: forward's first argument gets batch.inputs, every later one the batch tensor of
// its name (`def forward(self, x, mask)` gets batch.at("mask")); an argument with a default may be
// missing from the batch. It returns a Tensor or a Dict[str, Tensor] (named outputs).
//
// What cannot reach inside: its forward runs in the TorchScript interpreter, so fasttrain cannot
// recompute or shard its blocks (memory.checkpoint, dist.zero = 3 are refused by name).
#include <torch/script.h>

#include <string>
#include <vector>

#include "fasttrain/models/model.h"
#include "fasttrain/util/key.h"

namespace fasttrain {

// [model] keys of name = "torchscript".
struct TorchScriptOptions {
  FT_KEYS(TorchScriptOptions);
  FT_KEY(std::string, path,
         "torchscript: the module saved by torch.jit.save (scripted or traced, with the PyTorch release of "
         "this LibTorch)") = "";
};

// The scripted module as a torch::nn::Module: a mirror of its submodule tree holding its tensors.
class ScriptedModuleImpl : public torch::nn::Module {
 public:
  // `what` names it in messages (the file).
  ScriptedModuleImpl(torch::jit::Module module, std::string what);

  // forward's arguments from the batch (see above); its Tensor or Dict[str, Tensor].
  ModelOutput forward(const Batch& batch);
  void train(bool on = true) override;
  const torch::jit::Module& scripted() const { return module_; }
  // forward's arguments after self, in order.
  const std::vector<std::string>& arguments() const { return arguments_; }

 private:
  torch::jit::Module module_;
  std::string what_;
  std::vector<std::string> arguments_;
  std::vector<bool> has_default_;
};
TORCH_MODULE(ScriptedModule);

// Loads `path` (torch.jit.load) on the CPU as a Model named "torchscript". A missing file, a file that
// is not a TorchScript archive (or one from a newer PyTorch) and a module without forward are Errors
// naming the path.
Model load_torchscript(const std::string& path);

}  // namespace fasttrain
