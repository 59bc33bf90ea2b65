// Adam and AdamW (decoupled weight decay) on the device, with LibTorch's torch::optim arithmetic:
//   p <- p * (1 - lr * wd)                               (AdamW; Adam adds wd * p to the gradient)
//   m <- beta1 m + (1 - beta1) g,  v <- beta2 v + (1 - beta2) g^2,  t <- t + 1
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#include <torch/torch.h>

#include "adam_update.h"
#include "fasttrain/detail/compat.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, const OptimizerOptions& options, bool decoupled)
      : Optimizer(std::move(groups), options, decoupled ? "aten::_fused_adamw_" : "aten::_fused_adam_",
                  options.beta1()),
        decoupled_(decoupled) {}

  const std::vector<std::string>& state_fields(size_t) const override {
    static const std::vector<std::string> fields = {"exp_avg", "exp_avg_sq"};
    return fields;
  }
  bool counts_steps(size_t) const override { return true; }

  nlohmann::json group_options(size_t group) const override {
    return detail::adam_group_options(options().lr(), hyperparameters(group));
  }

  void set_group_options(size_t group, const nlohmann::json& j) override {
    const detail::AdamHyperparameters saved = detail::read_adam_group_options(j, name(), decoupled_);
    set_momentum(saved.beta1);
    beta2_ = saved.beta2;
    eps_ = saved.eps;
    set_weight_decay(group, saved.weight_decay);
  }

 protected:
  void update_fused(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr,
                    const torch::Tensor& found_inf) override {
    detail::adam_fused(gather_params(g, with_grad), gather_grads(g, with_grad),
                       gather(g, detail::kExpAvg, with_grad), gather(g, detail::kExpAvgSq, with_grad),
                       gather_steps(g, with_grad), fused_lr(lr), hyperparameters(g), found_inf);
  }

  void update_foreach(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr) override {
    detail::adam_foreach(gather_params(g, with_grad), gather_grads(g, with_grad),
                         gather(g, detail::kExpAvg, with_grad), gather(g, detail::kExpAvgSq, with_grad),
                         gather_steps(g, with_grad), lr, hyperparameters(g));
  }

 private:
  detail::AdamHyperparameters hyperparameters(size_t g) const {
    return {momentum(), beta2_, eps_, weight_decay_of(g), decoupled_};
  }

  bool decoupled_;
  double beta2_ = options().beta2();
  double eps_ = options().eps();
};

OptimizerRecipe adam_recipe(bool decoupled) {
  return {[](const OptimizerOptions& options) { return options.beta1(); },
          [decoupled](std::vector<ParamGroup> groups,
                      const OptimizerOptions& options) -> std::unique_ptr<Optimizer> {
            return std::make_unique<Adam>(std::move(groups), options, decoupled);
          }};
}

}  // namespace

namespace detail {

namespace {

// Entry i of `values` [n] as a 0-dim tensor in parameter i's dtype.
std::vector<torch::Tensor> per_parameter(const torch::Tensor& values,
                                         const std::vector<torch::Tensor>& like) {
  std::vector<torch::Tensor> out;
  out.reserve(like.size());
  for (size_t i = 0; i < like.size(); ++i)
    out.push_back(values[static_cast<int64_t>(i)].to(like[i].scalar_type()));
  return out;
}

}  // namespace

nlohmann::json adam_group_options(double lr, const AdamHyperparameters& hyper) {
  return {{"lr", lr},
          {"beta1", hyper.beta1},
          {"beta2", hyper.beta2},
          {"eps", hyper.eps},
          {"weight_decay", hyper.weight_decay},
          {"amsgrad", false}};
}

AdamHyperparameters read_adam_group_options(const nlohmann::json& options, const std::string& optimizer,
                                            bool decoupled) {
  FT_CHECK(!options.at("amsgrad").get<bool>(), "optimizer state uses amsgrad, which {} here does not",
           optimizer);
  return {options.at("beta1").get<double>(), options.at("beta2").get<double>(),
          options.at("eps").get<double>(), options.at("weight_decay").get<double>(), decoupled};
}

void adam_foreach(const std::vector<torch::Tensor>& params, std::vector<torch::Tensor> grads,
                  const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                  const std::vector<torch::Tensor>& steps, const torch::Tensor& lr,
                  const AdamHyperparameters& hyper) {
  const double beta1 = hyper.beta1, beta2 = hyper.beta2;
  // LibTorch computes the step size and the bias corrections on the host in double; here they
  // are per parameter on the device (each has its own step count), in double too.
  const torch::Tensor steps64 = torch::stack(steps).to(torch::kDouble);  // [n]
  const torch::Tensor lr64 = lr.to(torch::kDouble);
  const torch::Tensor neg_step_size = -lr64 / (1 - torch::pow(beta1, steps64));         // [n]
  const torch::Tensor bias_correction2_sqrt = (1 - torch::pow(beta2, steps64)).sqrt();  // [n]
  if (hyper.weight_decay != 0 && hyper.decoupled) {
    compat::foreach_mul_(params, (1 - lr64 * hyper.weight_decay).to(params.front().scalar_type()));
  }
  if (hyper.weight_decay != 0 && !hyper.decoupled)
    grads = torch::_foreach_add(grads, params, hyper.weight_decay);

  torch::_foreach_mul_(exp_avgs, beta1);
  torch::_foreach_add_(exp_avgs, grads, 1 - beta1);
  torch::_foreach_mul_(exp_avg_sqs, beta2);
  torch::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
  auto denom = torch::_foreach_sqrt(exp_avg_sqs);
  torch::_foreach_div_(denom, per_parameter(bias_correction2_sqrt, params));
  torch::_foreach_add_(denom, hyper.eps);
  // p + (-step_size * m) / denom: the order of ATen's addcdiv, so the roundings are LibTorch's.
  auto update = torch::_foreach_mul(exp_avgs, per_parameter(neg_step_size, params));
  torch::_foreach_div_(update, denom);
  torch::_foreach_add_(params, update);
}

void adam_fused(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                const std::vector<torch::Tensor>& steps, const torch::Tensor& lr,
                const AdamHyperparameters& hyper, const torch::Tensor& found_inf) {
  compat::fused_adam(hyper.decoupled, params, grads, exp_avgs, exp_avg_sqs, steps, lr, hyper.beta1,
                     hyper.beta2, hyper.weight_decay, hyper.eps, found_inf);
}

}  // namespace detail

OptimizerRecipe adam_recipe() {
  return adam_recipe(/*decoupled=*/false);
}

OptimizerRecipe adamw_recipe() {
  return adam_recipe(/*decoupled=*/true);
}

}  // namespace fasttrain
