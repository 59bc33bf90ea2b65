#pragma once
// Optimizer state as named tensors, so that a checkpoint's optimizer.safetensors opens in any
// safetensors reader and maps onto PyTorch's optimizer.state_dict():
//
//   features.0.weight.exp_avg       F32 [16, 1, 3, 3]     adam / adamw
//   features.0.weight.exp_avg_sq    F32 [16, 1, 3, 3]
//   features.0.weight.step          I64 []                (PyTorch keeps it as a float tensor)
//   features.0.weight.momentum_buffer                     sgd with momentum
//   metadata: {"optimizer": "adamw", "param_groups": "[{\"lr\": 0.003, ..., \"params\": [names]}]"}
//
//   auto state = fasttrain::optimizer_state(*optimizer);
//   fasttrain::save_safetensors(path, state.tensors, state.metadata);
//   fasttrain::load_optimizer_state(*optimizer, fasttrain::load_safetensors(path));
//
// Parameters are named as the optimizer's groups name them (the model's names, or ZeRO's parts), not
// by position, so a checkpoint of one model cannot be loaded into another silently. The format is
// the one torch::optim's SGD, Adam and AdamW were saved in before fasttrain stepped on the device:
// those checkpoints load (a group's "lr" is informational: the schedule sets the LR of every step).
#include <map>
#include <string>

#include "fasttrain/optim/optimizer.h"
#include "fasttrain/state/safetensors.h"

namespace fasttrain {

struct OptimizerStateTensors {
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
};

OptimizerStateTensors optimizer_state(const Optimizer& optimizer);

// Replaces the optimizer's state and its groups' options with those in `file`. Errors (nothing is
// changed then): another optimizer kind, groups that hold other parameters, a parameter's state
// missing, of the wrong shape, or state for a parameter the optimizer lacks. Tensors are copied to
// each parameter's device and layout.
void load_optimizer_state(Optimizer& optimizer, const SafetensorsFile& file);

}  // namespace fasttrain
