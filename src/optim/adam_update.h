#pragma once
// Adam's arithmetic over one list of parameters: what Adam/AdamW (optim/adam.cpp) and the AdamW part
// of muon (optim/muon.cpp) step with. Library-internal.
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fasttrain::detail {

// Where Adam keeps its two moments in a parameter's optimizer state (torch.optim.Adam's order).
enum AdamSlot : size_t { kExpAvg = 0, kExpAvgSq = 1 };

struct AdamHyperparameters {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = true;  // AdamW: p <- p (1 - lr wd); Adam: wd p added to the gradient
};

// A group's options as a checkpoint records them (torch.optim.Adam's param_groups entry without
// "params"), and reading them back: beta1, beta2, eps, weight_decay (amsgrad is refused, naming
// `optimizer`).
nlohmann::json adam_group_options(double lr, const AdamHyperparameters& hyper);
AdamHyperparameters read_adam_group_options(const nlohmann::json& options, const std::string& optimizer,
                                            bool decoupled);

// One Adam step of `params` with ATen's _foreach_ ops (every LibTorch). `steps`: each parameter's
// step count (0-dim fp32), already counting this step; `lr`: 0-dim on the parameters' device.
void adam_foreach(const std::vector<torch::Tensor>& params, std::vector<torch::Tensor> grads,
                  const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                  const std::vector<torch::Tensor>& steps, const torch::Tensor& lr,
                  const AdamHyperparameters& hyper);

// The same step through ATen's _fused_adam(w)_ (LibTorch 2.4+); where `found_inf` (0-dim fp32) is 1
// nothing changes. `lr` as Optimizer::fused_lr gives it.
void adam_fused(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                const std::vector<torch::Tensor>& steps, const torch::Tensor& lr,
                const AdamHyperparameters& hyper, const torch::Tensor& found_inf);

}  // namespace fasttrain::detail
