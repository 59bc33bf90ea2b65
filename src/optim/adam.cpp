// Adam and AdamW (decoupled weight decay) on the device, with LibTorch's torch::optim arithmetic:
//   p <- p * (1 - lr * wd)                               (AdamW; Adam adds wd * p to the gradient)
//   m <- beta1 m + (1 - beta1) g,  v <- beta2 v + (1 - beta2) g^2,  t <- t + 1
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#include <torch/torch.h>

#include "fasttrain/detail/compat.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

enum : size_t { kExpAvg = 0, kExpAvgSq = 1 };

class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, const OptimizerOptions& options, bool decoupled)
      : Optimizer(std::move(groups), options, decoupled ? "aten::_fused_adamw_" : "aten::_fused_adam_",
                  options.beta1()),
        decoupled_(decoupled) {}

  const std::vector<std::string>& state_fields() const override {
    static const std::vector<std::string> fields = {"exp_avg", "exp_avg_sq"};
    return fields;
  }
  bool counts_steps() const override { return true; }

  nlohmann::json group_options(size_t group) const override {
    return {{"lr", options().lr()},
            {"beta1", momentum()},
            {"beta2", beta2_},
            {"eps", eps_},
            {"weight_decay", weight_decay_of(group)},
            {"amsgrad", false}};
  }

  void set_group_options(size_t group, const nlohmann::json& j) override {
    FT_CHECK(!j.at("amsgrad").get<bool>(), "optimizer state uses amsgrad, which {} here does not", name());
    set_momentum(j.at("beta1").get<double>());
    beta2_ = j.at("beta2").get<double>();
    eps_ = j.at("eps").get<double>();
    set_weight_decay(group, j.at("weight_decay").get<double>());
  }

 protected:
  void update_fused(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr,
                    const torch::Tensor& found_inf) override {
    compat::fused_adam(decoupled_, gather_params(g, with_grad), gather_grads(g, with_grad),
                       gather(g, kExpAvg, with_grad), gather(g, kExpAvgSq, with_grad),
                       gather_steps(g, with_grad), fused_lr(lr), momentum(), beta2_, weight_decay_of(g), eps_,
                       found_inf);
  }

  void update_foreach(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr) override {
    auto params = gather_params(g, with_grad);
    auto grads = gather_grads(g, with_grad);
    auto exp_avgs = gather(g, kExpAvg, with_grad);
    auto exp_avg_sqs = gather(g, kExpAvgSq, with_grad);
    const double beta1 = momentum(), weight_decay = weight_decay_of(g);
    // LibTorch computes the step size and the bias corrections on the host in double; here they
    // are per parameter on the device (each has its own step count), in double too.
    const torch::Tensor steps = torch::stack(gather_steps(g, with_grad)).to(torch::kDouble);  // [n]
    const torch::Tensor lr64 = lr.to(torch::kDouble);
    const torch::Tensor neg_step_size = -lr64 / (1 - torch::pow(beta1, steps));          // [n]
    const torch::Tensor bias_correction2_sqrt = (1 - torch::pow(beta2_, steps)).sqrt();  // [n]
    if (weight_decay != 0 && decoupled_) {
      compat::foreach_mul_(params, (1 - lr64 * weight_decay).to(params.front().scalar_type()));
    }
    if (weight_decay != 0 && !decoupled_) grads = torch::_foreach_add(grads, params, weight_decay);

    torch::_foreach_mul_(exp_avgs, beta1);
    torch::_foreach_add_(exp_avgs, grads, 1 - beta1);
    torch::_foreach_mul_(exp_avg_sqs, beta2_);
    torch::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2_);
    auto denom = torch::_foreach_sqrt(exp_avg_sqs);
    torch::_foreach_div_(denom, per_parameter(bias_correction2_sqrt, params));
    torch::_foreach_add_(denom, eps_);
    // p + (-step_size * m) / denom: the order of ATen's addcdiv, so the roundings are LibTorch's.
    auto update = torch::_foreach_mul(exp_avgs, per_parameter(neg_step_size, params));
    torch::_foreach_div_(update, denom);
    torch::_foreach_add_(params, update);
  }

 private:
  // Entry i of `values` [n] as a 0-dim tensor in parameter i's dtype.
  static std::vector<torch::Tensor> per_parameter(const torch::Tensor& values,
                                                  const std::vector<torch::Tensor>& like) {
    std::vector<torch::Tensor> out;
    out.reserve(like.size());
    for (size_t i = 0; i < like.size(); ++i)
      out.push_back(values[static_cast<int64_t>(i)].to(like[i].scalar_type()));
    return out;
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

OptimizerRecipe adam_recipe() {
  return adam_recipe(/*decoupled=*/false);
}

OptimizerRecipe adamw_recipe() {
  return adam_recipe(/*decoupled=*/true);
}

}  // namespace fasttrain
