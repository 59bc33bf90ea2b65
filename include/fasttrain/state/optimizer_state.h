#pragma once
// Optimizer state as named tensors, so that a checkpoint's optimizer.safetensors opens in any
// safetensors reader and maps onto PyTorch's optimizer.state_dict():
//
//   features.0.weight.exp_avg       F32 [16, 1, 3, 3]     adam / adamw
//   features.0.weight.exp_avg_sq    F32 [16, 1, 3, 3]
//   features.0.weight.step          I64 []                (PyTorch 1.13 keeps it as a float tensor)
//   features.0.weight.momentum_buffer                     sgd
//   metadata: {"optimizer": "adamw", "param_groups": "[{\"lr\": 0.003, ..., \"params\": [names]}]"}
//
//   auto state = fasttrain::optimizer_state(*optimizer, model->named_parameters());
//   fasttrain::save_safetensors(path, state.tensors, state.metadata);
//   fasttrain::load_optimizer_state(*optimizer, model->named_parameters(),
//   fasttrain::load_safetensors(path));
//
// Parameters are named by the model, not by their position, so a checkpoint of one model cannot
// be loaded into another silently. Supported: torch::optim::SGD, Adam, AdamW (what make_optimizer builds).
#include <torch/optim/optimizer.h>

#include <map>
#include <string>

#include "fasttrain/state/safetensors.h"

namespace fasttrain {

struct OptimizerStateTensors {
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
};

OptimizerStateTensors optimizer_state(const torch::optim::Optimizer& optimizer,
                                      const torch::OrderedDict<std::string, torch::Tensor>& named_parameters);

// Replaces the optimizer's state and its groups' options with those in `file`. Errors (nothing is
// changed then): another optimizer type, groups that hold other parameters, a parameter's state
// missing, of the wrong shape, or state for a parameter the optimizer lacks. Tensors are copied to
// each parameter's device.
void load_optimizer_state(torch::optim::Optimizer& optimizer,
                          const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                          const SafetensorsFile& file);

}  // namespace fasttrain
