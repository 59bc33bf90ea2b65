// mlp: flatten, hidden Linear+ReLU layers, a Linear classifier.
#include <torch/nn.h>

#include "fasttrain/models/registry.h"

namespace fasttrain {

namespace {

class Mlp : public Model {
 public:
  explicit Mlp(const ModelOptions& options) {
    int64_t features = options.in_channels() * options.height() * options.width();
    layers_ = classifier_head(features, options);
    register_module("layers", layers_);
    add_stage(layers_);
  }

  torch::Tensor forward(torch::Tensor images) override {
    return run_stage(layers_, images.flatten(1));  // [B, C*H*W] -> [B, classes]
  }

 private:
  torch::nn::Sequential layers_;
};

}  // namespace

std::shared_ptr<Model> make_mlp(const ModelOptions& options) {
  return std::make_shared<Mlp>(options);
}

}  // namespace fasttrain
