// SGD with momentum and Nesterov on the device, with LibTorch's torch::optim arithmetic
// (dampening 0):
//   d <- g + wd p;  b <- d on the first step, else momentum b + d;  d <- d + momentum b (Nesterov)
//   or d <- b;  p <- p - lr d
#include <torch/torch.h>

#include "fasttrain/detail/compat.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

enum : size_t { kMomentumBuffer = 0 };

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, const OptimizerOptions& options)
      : Optimizer(std::move(groups), options, "aten::_fused_sgd_", options.momentum()),
        keeps_buffers_(options.momentum() > 0) {
    FT_CONFIG_CHECK(!options.nesterov() || options.momentum() > 0,
                    "optim.nesterov = true needs optim.momentum > 0, got momentum {}", options.momentum());
  }

  // Without momentum there is nothing to keep (LibTorch's SGD keeps no state then either).
  const std::vector<std::string>& state_fields(size_t) const override {
    static const std::vector<std::string> buffers = {"momentum_buffer"}, none = {};
    return keeps_buffers_ ? buffers : none;
  }
  bool counts_steps(size_t) const override { return false; }

  nlohmann::json group_options(size_t group) const override {
    return {{"lr", options().lr()},
            {"momentum", momentum()},
            {"dampening", 0.0},
            {"weight_decay", weight_decay_of(group)},
            {"nesterov", options().nesterov()}};
  }

  void set_group_options(size_t group, const nlohmann::json& j) override {
    FT_CHECK(j.at("dampening").get<double>() == 0,
             "optimizer state uses SGD dampening {}, which fasttrain's does not",
             j.at("dampening").get<double>());
    FT_CHECK(j.at("nesterov").get<bool>() == options().nesterov(),
             "optimizer state was saved with nesterov = {}, this SGD has {}", j.at("nesterov").get<bool>(),
             options().nesterov());
    set_momentum(j.at("momentum").get<double>());
    set_weight_decay(group, j.at("weight_decay").get<double>());
  }

 protected:
  void update_fused(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr,
                    const torch::Tensor& found_inf) override {
    check_momentum();
    // The kernel copies the gradient into the buffers of a first step: one call per kind.
    std::vector<size_t> first, later;
    for (size_t i : with_grad) (fresh(g, i) ? first : later).push_back(i);
    for (const auto* indices : {&first, &later}) {
      if (indices->empty()) continue;
      compat::fused_sgd(gather_params(g, *indices), gather_grads(g, *indices),
                        keeps_buffers_ ? gather(g, kMomentumBuffer, *indices) : std::vector<torch::Tensor>{},
                        fused_lr(lr), weight_decay_of(g), momentum(), options().nesterov(),
                        /*first_step=*/indices == &first, found_inf);
    }
  }

  void update_foreach(size_t g, const std::vector<size_t>& with_grad, const torch::Tensor& lr) override {
    check_momentum();
    auto params = gather_params(g, with_grad);
    auto directions = gather_grads(g, with_grad);
    if (weight_decay_of(g) != 0) directions = torch::_foreach_add(directions, params, weight_decay_of(g));
    if (keeps_buffers_) {
      auto buffers = gather(g, kMomentumBuffer, with_grad);
      for (size_t k = 0; k < with_grad.size(); ++k) {
        if (fresh(g, with_grad[k])) buffers[k].copy_(directions[k]);  // b <- d on the first step
      }
      std::vector<torch::Tensor> later_buffers, later_directions;
      for (size_t k = 0; k < with_grad.size(); ++k) {
        if (fresh(g, with_grad[k])) continue;
        later_buffers.push_back(buffers[k]);
        later_directions.push_back(directions[k]);
      }
      if (!later_buffers.empty()) {
        torch::_foreach_mul_(later_buffers, momentum());
        torch::_foreach_add_(later_buffers, later_directions, 1.0);
      }
      directions = options().nesterov() ? torch::_foreach_add(directions, buffers, momentum()) : buffers;
    }
    // p - lr d, with lr on the device: d * (-lr) first (ATen's add with alpha rounds alpha d too).
    std::vector<torch::Tensor> neg_lr;
    for (const auto& p : params) neg_lr.push_back((-lr).to(p.scalar_type()));
    torch::_foreach_add_(params, torch::_foreach_mul(directions, neg_lr));
  }

 private:
  void check_momentum() const {
    FT_CHECK(keeps_buffers_ || momentum() == 0,
             "SGD built with momentum 0 keeps no momentum buffers, so it cannot step with momentum {}: "
             "set optim.momentum > 0 to cycle it",
             momentum());
  }

  bool keeps_buffers_;
};

}  // namespace

OptimizerRecipe sgd_recipe() {
  return {[](const OptimizerOptions& options) { return options.momentum(); },
          [](std::vector<ParamGroup> groups, const OptimizerOptions& options) -> std::unique_ptr<Optimizer> {
            return std::make_unique<Sgd>(std::move(groups), options);
          }};
}

}  // namespace fasttrain
