// cnn: the classic conv net. Each stage is conv3x3(pad 1) [+ BatchNorm] + ReLU + maxpool2 (or, with
// pool_first, conv3x3 + maxpool2 [+ BatchNorm] + ReLU), then flatten, hidden Linear+ReLU layers and
// the output layer. With widths {32, 64} and hidden {128} this is the textbook MNIST network the
// benchmarks compare against.
#include <torch/nn.h>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// MaxPool2d(2) that runs fasttrain's max-pool kernel where it takes the input (channels_last on the CPU)
// and ATen's elsewhere. It stays a MaxPool2d for whatever inspects the model (the doctor's layer
// rules); a Sequential calls this forward, not the base's.
class MaxPool2x2Impl : public torch::nn::MaxPool2dImpl {
 public:
  explicit MaxPool2x2Impl(bool own_kernel) : torch::nn::MaxPool2dImpl(2), own_kernel_(own_kernel) {}

  torch::Tensor forward(const torch::Tensor& maps) {
    return own_kernel_ && kernels::max_pool2x2_takes(maps) ? kernels::max_pool2x2(maps)
                                                           : torch::nn::MaxPool2dImpl::forward(maps);
  }

 private:
  bool own_kernel_;
};
TORCH_MODULE(MaxPool2x2);

class Cnn : public torch::nn::Module {
 public:
  Cnn(const CnnOptions& options, const DataShape& shape) {
    int64_t channels = shape.input[0], height = shape.input[1], width = shape.input[2];
    const bool own_pool = options.kernels() == "fasttrain";
    for (int64_t stage_width : options.widths()) {
      // A bias before BatchNorm is wasted work: BatchNorm subtracts the mean and adds its own shift.
      features_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, stage_width, 3)
                                                 .padding(1)
                                                 .bias(!options.batchnorm() || options.bias_before_norm())));
      if (options.pool_first()) features_->push_back(MaxPool2x2(own_pool));
      if (options.batchnorm()) features_->push_back(torch::nn::BatchNorm2d(stage_width));
      features_->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
      if (!options.pool_first()) features_->push_back(MaxPool2x2(own_pool));
      channels = stage_width;
      height /= 2;
      width /= 2;
    }
    FT_CONFIG_CHECK(height > 0 && width > 0, "model.widths has {} pooling stages, too many for {}x{} inputs",
                    options.widths().size(), shape.input[1], shape.input[2]);
    const int64_t features = channels * height * width;
    classifier_ = classifier_head(features, options.hidden(), options.dropout(), output_count(shape, "cnn"));
    register_module("features", features_);
    register_module("classifier", classifier_);
  }

  torch::Tensor forward(torch::Tensor images) {
    auto maps = features_->forward(images);        // [B, widths.back(), H / 2^S, W / 2^S]
    return classifier_->forward(maps.flatten(1));  // [B, outputs]
  }

 private:
  Stage features_;
  Stage classifier_{nullptr};
};

}  // namespace

// A model of images [C, H, W]: `model` names it in the error for other data.
void check_image_inputs(const DataShape& shape, const std::string& model) {
  FT_CONFIG_CHECK(shape.input.size() == 3 && torch::isFloatingType(shape.input_dtype),
                  "model '{}' takes images [C, H, W]; the data gives {}", model, shape.describe());
}

Model make_cnn(const CnnOptions& options, const DataShape& shape) {
  check_keys(options, "model");
  check_image_inputs(shape, "cnn");
  return Model(std::make_shared<Cnn>(options, shape));
}

}  // namespace fasttrain
