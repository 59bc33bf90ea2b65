// resnet: a small ResNet for 28x28-class inputs. Stem conv3x3 -> BN -> ReLU at widths[0], then one
// stage per width of `blocks` basic blocks (conv-BN-ReLU-conv-BN + shortcut, ReLU); every stage after
// the first halves the resolution. Global average pool, then the classifier.
// Convs before BatchNorm have no bias: BatchNorm's shift makes it redundant.
#include <torch/nn.h>

#include "fasttrain/models/registry.h"

namespace fasttrain {

namespace {

torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1_(register_module("conv1", conv3x3(in, out, stride))),
        bn1_(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2_(register_module("conv2", conv3x3(out, out, 1))),
        bn2_(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut_ = register_module(
          "shortcut", torch::nn::Sequential(
                          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                          torch::nn::BatchNorm2d(out)));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1_(conv1_(x)));
    y = bn2_(conv2_(y));
    y += shortcut_ ? shortcut_->forward(x) : x;
    return torch::relu_(y);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_;
  torch::nn::Conv2d conv2_;
  torch::nn::BatchNorm2d bn2_;
  torch::nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

class ResNet : public torch::nn::Module {
 public:
  ResNet(const ResnetOptions& options, const DataShape& shape) {
    const auto& widths = options.widths();
    stem_->push_back(conv3x3(shape.input[0], widths[0], 1));
    stem_->push_back(torch::nn::BatchNorm2d(widths[0]));
    stem_->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
    int64_t channels = widths[0];
    for (size_t stage = 0; stage < widths.size(); ++stage) {
      for (int64_t block = 0; block < options.blocks(); ++block) {
        int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
        stages_->push_back(BasicBlock(channels, widths[stage], stride));
        channels = widths[stage];
      }
    }
    head_ = classifier_head(channels, options.hidden(), options.dropout(), output_count(shape, "resnet"));
    register_module("stem", stem_);
    register_module("stages", stages_);
    register_module("head", head_);
  }

  torch::Tensor forward(torch::Tensor images) {
    auto maps = stages_->forward(stem_->forward(images));  // [B, widths.back(), H', W']
    auto pooled = maps.mean({2, 3});                       // [B, widths.back()]
    return head_->forward(pooled);                         // [B, outputs]
  }

 private:
  Stage stem_;
  Stage stages_;
  Stage head_{nullptr};
};

}  // namespace

void check_image_inputs(const DataShape& shape, const std::string& model);

Model make_resnet(const ResnetOptions& options, const DataShape& shape) {
  check_keys(options, "model");
  check_image_inputs(shape, "resnet");
  return Model(std::make_shared<ResNet>(options, shape));
}

}  // namespace fasttrain
