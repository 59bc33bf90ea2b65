#pragma once
// Optimizers built by name from a registry ("sgd", "adam", "adamw", "muon", and any a program registers),
// stepping on the device: the
// learning rate is a 0-dim tensor, the step counts live on the parameters' device, and a
// GradScaler's found-inf flag skips the update inside the kernels, so a step reads nothing back to
// the host and can be captured in a CUDA graph.
//
// Kernels (optim.kernel): "fused" runs ATen's fused multi-tensor kernels (_fused_adamw_,
// _fused_adam_, _fused_sgd_: CUDA, and CPU from LibTorch 2.4), one launch per group; "foreach" the
// same arithmetic as ATen's _foreach_ multi-tensor ops, on every LibTorch and device; "auto" the
// fused ones where the device has them. Both give the numbers of LibTorch's torch::optim (tests
// compare the three).
//
// Weight decay applies to weight matrices and conv kernels only: biases and norm weights (every
// parameter with dim <= 1) go to a second group with weight_decay 0. Parameters that do not
// require grad are left out. Group 0 holds the decayed parameters, group 1 the others (a group
// with no parameters is omitted).
//
//   auto optimizer = fasttrain::make_optimizer(model->named_parameters(),
//                                              fasttrain::OptimizerOptions("adamw").lr(3e-3));
//   torch::Tensor lr = torch::full({}, 1e-3);   // 0-dim, on the parameters' device
//   loss.backward();
//   optimizer->step(lr);
//   optimizer->zero_grad();                      // gradients to None
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"
#include "fasttrain/util/registry.h"

namespace fasttrain {

// The registered optimizers' names: "sgd", "adam", "adamw", "muon", then any a program added.
std::vector<std::string> optimizer_names();
// The kernels optim.kernel accepts.
const std::vector<std::string>& optimizer_kernel_names();

// [optim]
struct OptimizerOptions {
  FT_KEYS(OptimizerOptions);
  explicit OptimizerOptions(std::string name = "adam") : name_(std::move(name)) {}
  FT_KEY(std::string, name, "Optimizer: sgd, adam, adamw, muon, or one a program registered",
         one_of(optimizer_names));
  FT_KEY(double, lr, "Learning rate (the peak of one-cycle and cyclic schedules)", at_least(0)) = 1e-3;
  FT_KEY(double, momentum, "sgd momentum", below_one()) = 0.9;
  FT_KEY(bool, nesterov, "sgd Nesterov momentum") = false;
  FT_KEY(double, weight_decay, "Weight decay (decoupled for adamw); never applied to biases and norm weights",
         at_least(0)) = 0.0;
  FT_KEY(double, beta1, "adam/adamw beta1", below_one()) = 0.9;
  FT_KEY(double, beta2, "adam/adamw beta2", below_one()) = 0.999;
  FT_KEY(double, eps, "adam/adamw epsilon", at_least(0)) = 1e-8;
  FT_KEY(double, muon_momentum,
         "muon momentum (the buffer is an EMA of the gradients, as torch.optim.Muon's)", below_one()) = 0.95;
  FT_KEY(bool, muon_nesterov, "muon Nesterov momentum") = true;
  FT_KEY(int64_t, muon_ns_steps, "muon Newton-Schulz iterations per update", at_least(1)) = 5;
  FT_KEY(std::string, muon_adjust_lr,
         "How muon scales lr per matrix [A, B]: match_rms_adamw (0.2 sqrt(max(A, B)): AdamW's lr and weight "
         "decay carry over) or original (sqrt(max(1, A / B)), Keller Jordan's)",
         one_of({"match_rms_adamw", "original"})) = "match_rms_adamw";
  FT_KEY(
      std::vector<std::string>, muon_exclude,
      "muon: weight matrices whose names contain one of these strings step with AdamW instead (embeddings, "
      "the classifier)") = {};
  FT_KEY(std::string, muon_newton_schulz,
         "muon's orthogonalisation of matrices whose smaller side is at most 64 (conv kernels, a classifier) "
         "on the CPU: fasttrain (one kernel a matrix, rounding to bf16 where torch.optim.Muon's bf16 matmuls "
         "round; for fp32 parameters the whole step, momentum to update, in the same call) or aten (an mm "
         "and two addmm per iteration, as torch.optim.Muon); larger matrices and GPUs "
         "run aten",
         one_of({"fasttrain", "aten"})) = "fasttrain";
  FT_KEY(double, muon_adamw_lr_scale,
         "muon: lr multiplier of the parameters it steps with AdamW (biases, norms, muon_exclude)",
         at_least(0)) = 1.0;
  FT_KEY(std::string, kernel,
         "How the optimizer steps on the device: fused (ATen's fused multi-tensor kernel, one launch per "
         "group; CUDA, and CPU from LibTorch 2.4), foreach (multi-tensor ops; every LibTorch) or auto (fused "
         "where the device has it)",
         one_of(optimizer_kernel_names()), KeyTrait::kNeutral) = "auto";
};

// Parameters stepped alike; `names` name them in checkpoints (the model's names, or ZeRO's parts).
struct ParamGroup {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  double weight_decay = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient, at learning rate `lr` (0-dim floating tensor on
  // the parameters' device). `found_inf` (0-dim fp32, optional: a GradScaler's flag): where it is
  // 1 nothing changes. The fused kernels skip on the device; the foreach kernels have no such
  // input, so with one the flag is read on the host first (one synchronisation).
  void step(const torch::Tensor& lr, const torch::Tensor& found_inf = {});
  // Every gradient to None: the next backward writes instead of accumulating, and the memory is
  // free between steps. (Dropped one by one: ZeRO-1's shard gradient is a view, which 2.x's own
  // zero_grad(set_to_none) refuses to detach.)
  void zero_grad();

  const std::string& name() const { return options_.name(); }
  const OptimizerOptions& options() const { return options_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  std::vector<torch::Tensor> parameters() const;
  // Whether step() runs ATen's fused kernels (optim.kernel resolved for the parameters' device).
  bool fused() const { return fused_; }
  // "fused (_fused_adamw_)" or "foreach": what step() runs, for announcements.
  std::string describe_kernel() const;
  // SGD momentum or Adam's beta1, which momentum-cycling schedules move; the next step() uses it.
  void set_momentum(double momentum);
  double momentum() const;

  // ---- state, per parameter by name: what a checkpoint's optimizer.safetensors holds ----
  // Field names of the state of group `group`'s parameters ("exp_avg", "exp_avg_sq" /
  // "momentum_buffer") and whether they have a step count ("step": Adam's bias correction). Groups
  // may differ (muon: momentum buffers for its matrices, Adam's moments for the rest).
  virtual const std::vector<std::string>& state_fields(size_t group) const = 0;
  virtual bool counts_steps(size_t group) const = 0;
  // Whether ZeRO may step this optimizer on flat shards of the parameters (an elementwise update);
  // muon orthogonalises whole matrices, so it may not.
  virtual bool steps_shards() const { return true; }
  // Whether parameter `index` of `group` has state (was stepped, or loaded).
  bool has_state(size_t group, size_t index) const;
  // Field `field` of that parameter's state, and its step count (0-dim fp32 on the device; undefined
  // for optimizers that do not count steps). Only where has_state.
  const torch::Tensor& state(size_t group, size_t field, size_t index) const {
    return state_[group][field][index];
  }
  const torch::Tensor& step_count(size_t group, size_t index) const { return steps_[group][index]; }
  // Replaces the state of one parameter (tensors already on its device and in its layout), for
  // checkpoint loading; `step` is ignored by optimizers that do not count steps.
  void set_state(size_t group, size_t index, std::vector<torch::Tensor> fields, int64_t step);
  void clear_state();
  // A group's options as the checkpoint records them (PyTorch's param_groups entry without
  // "params"), and reading them back (momentum / betas, eps, weight_decay: what can differ).
  virtual nlohmann::json group_options(size_t group) const = 0;
  virtual void set_group_options(size_t group, const nlohmann::json& options) = 0;
  // Bytes of state held (moments, momentum buffers, step counts).
  int64_t state_bytes() const;

  // An optimizer of the same kind and options over `groups` (ZeRO: this rank's parts), state empty.
  // Needs an optimizer made by make_optimizer (it knows the kind's factory).
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const;

 protected:
  // `fused_kernel`: the ATen kernel update_fused calls ("aten::_fused_adamw_"), whose presence for
  // the parameters' device decides optim.kernel = "auto"; null for an optimizer with only the foreach
  // path (a program's own: update_foreach alone, with torch ops on the device). `momentum`: the option
  // momentum-cycling schedules move (SGD's momentum, Adam's beta1: the kind's OptimizerRecipe::momentum).
  Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options, const char* fused_kernel,
            double momentum);
  // The update of group `group`'s parameters at `with_grad` (indices into the group; their state
  // exists), through the fused kernel or the foreach ops.
  virtual void update_fused(size_t group, const std::vector<size_t>& with_grad, const torch::Tensor& lr,
                            const torch::Tensor& found_inf);
  virtual void update_foreach(size_t group, const std::vector<size_t>& with_grad,
                              const torch::Tensor& lr) = 0;
  // `lr` as the fused kernels read it: fp32 on a GPU (the CUDA kernels read a float), as it is on the
  // CPU (read once as a double).
  static torch::Tensor fused_lr(const torch::Tensor& lr);
  // `field` of the parameters at `indices` of `group`, as a list for the multi-tensor ops.
  std::vector<torch::Tensor> gather(size_t group, size_t field, const std::vector<size_t>& indices) const;
  std::vector<torch::Tensor> gather_params(size_t group, const std::vector<size_t>& indices) const;
  std::vector<torch::Tensor> gather_grads(size_t group, const std::vector<size_t>& indices) const;
  std::vector<torch::Tensor> gather_steps(size_t group, const std::vector<size_t>& indices) const;
  // Whether the parameter's state was created by this step (SGD's first momentum step).
  bool fresh(size_t group, size_t index) const { return fresh_[group][index]; }
  double weight_decay_of(size_t group) const { return groups_[group].weight_decay; }
  void set_weight_decay(size_t group, double weight_decay) { groups_[group].weight_decay = weight_decay; }

 private:
  void resolve_kernel();
  // Sizes the state of every group (once), then creates that of parameters stepped for the first
  // time: zeros like the parameter, step 0.
  void ensure_state(size_t group, const std::vector<size_t>& with_grad);
  void size_state();

  friend std::unique_ptr<Optimizer> make_optimizer(std::vector<ParamGroup>, const OptimizerOptions&);

  std::vector<ParamGroup> groups_;
  OptimizerOptions options_;
  double momentum_;
  std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>, const OptimizerOptions&)> factory_;
  bool fused_ = false;
  std::string fused_kernel_;
  std::vector<std::vector<std::vector<torch::Tensor>>> state_;  // [group][field][parameter]
  std::vector<std::vector<torch::Tensor>> steps_;               // [group][parameter]
  std::vector<std::vector<bool>> stepped_;                      // [group][parameter]: has state
  std::vector<std::vector<bool>> fresh_;                        // [group][parameter]: state made this step
};

// ---- the registry: optimizers by name ----
struct OptimizerRecipe {
  // The option that momentum-cycling schedules move and start from (SGD's momentum, Adam's beta1).
  std::function<double(const OptimizerOptions&)> momentum;
  std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>, const OptimizerOptions&)> make;
};
// The registry behind optim.name, with the built-in optimizers (adding one: optim/adam.cpp, sgd.cpp show
// how; a program calls optimizer_registry().add(...)).
Registry<OptimizerRecipe>& optimizer_registry();

// The optimizer `options.name()` names over `groups`; its options checked (check_keys: "optim.<key>").
std::unique_ptr<Optimizer> make_optimizer(std::vector<ParamGroup> groups, const OptimizerOptions& options);
// ... over the model's trainable parameters, grouped as above (weight decay on dim >= 2 only).
std::unique_ptr<Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters, const OptimizerOptions& options);

}  // namespace fasttrain
