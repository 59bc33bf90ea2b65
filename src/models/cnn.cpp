// cnn: the classic conv net. Each stage is conv3x3(pad 1) [+ BatchNorm] + ReLU + maxpool2 (or, with
// pool_first, conv3x3 + maxpool2 [+ BatchNorm] + ReLU), then flatten, hidden Linear+ReLU layers and
// the classifier. With widths {32, 64} and hidden {128}
// this is the textbook MNIST network the benchmarks compare against.
#include <torch/nn.h>

#include "fasttrain/models/registry.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

class Cnn : public Model {
 public:
  explicit Cnn(const ModelOptions& options) {
    int64_t channels = options.in_channels(), height = options.height(), width = options.width();
    for (int64_t stage_width : options.widths()) {
      // A bias before BatchNorm is wasted work: BatchNorm subtracts the mean and adds its own shift.
      features_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, stage_width, 3)
                                                 .padding(1)
                                                 .bias(!options.batchnorm() || options.bias_before_norm())));
      if (options.pool_first()) features_->push_back(torch::nn::MaxPool2d(2));
      if (options.batchnorm()) features_->push_back(torch::nn::BatchNorm2d(stage_width));
      features_->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
      if (!options.pool_first()) features_->push_back(torch::nn::MaxPool2d(2));
      channels = stage_width;
      height /= 2;
      width /= 2;
    }
    FT_CONFIG_CHECK(height > 0 && width > 0, "model.widths has {} pooling stages, too many for {}x{} inputs",
                    options.widths().size(), options.height(), options.width());
    int64_t features = channels * height * width;
    classifier_ = classifier_head(features, options);
    register_module("features", features_);
    register_module("classifier", classifier_);
    add_stage(features_);
    add_stage(classifier_);
  }

  torch::Tensor forward(torch::Tensor images) override {
    auto maps = run_stage(features_, images);        // [B, widths.back(), H / 2^S, W / 2^S]
    return run_stage(classifier_, maps.flatten(1));  // [B, classes]
  }

 private:
  torch::nn::Sequential features_;
  torch::nn::Sequential classifier_;
};

}  // namespace

std::shared_ptr<Model> make_cnn(const ModelOptions& options) {
  return std::make_shared<Cnn>(options);
}

}  // namespace fasttrain
