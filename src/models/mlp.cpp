// mlp: flatten, hidden Linear+ReLU layers, an output Linear (the classes, or a regression's values).
#include <torch/nn.h>

#include "fasttrain/models/registry.h"

namespace fasttrain {

namespace {

class Mlp : public torch::nn::Module {
 public:
  Mlp(const MlpOptions& options, const DataShape& shape) {
    int64_t features = 1;
    for (int64_t size : shape.input) features *= size;
    layers_ = register_module(
        "layers", classifier_head(features, options.hidden(), options.dropout(), output_count(shape, "mlp")));
  }

  torch::Tensor forward(torch::Tensor inputs) {
    return layers_->forward(inputs.flatten(1));  // [B, C*H*W] -> [B, outputs]
  }

 private:
  Stage layers_{nullptr};
};

}  // namespace

Model make_mlp(const MlpOptions& options, const DataShape& shape) {
  check_keys(options, "model");
  FT_CONFIG_CHECK(torch::isFloatingType(shape.input_dtype),
                  "model 'mlp' takes numeric inputs; the data gives {} (token ids: use model.name = \"gpt\")",
                  shape.describe());
  return Model(std::make_shared<Mlp>(options, shape));
}

}  // namespace fasttrain
