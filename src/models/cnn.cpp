// cnn: the classic conv net. Each stage is conv3x3(pad 1) [+ BatchNorm] + ReLU + maxpool2 (or, with
// pool_first, conv3x3 + maxpool2 [+ BatchNorm] + ReLU), then flatten, hidden Linear+ReLU layers and
// the output layer. On the CPU the max-pools, each BatchNorm + ReLU, with pool_first the first conv
// with its max-pool, and the flatten of channels_last maps run fasttrain's kernels (model.kernels). With
// widths {32, 64} and hidden {128} this is the textbook MNIST network the benchmarks compare against.
#include <torch/nn.h>

#include <optional>
#include <ostream>
#include <utility>
#include <vector>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/util/check.h"
#include "own_kernels.h"

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

// Conv2d(3x3, padding 1) and the MaxPool2d(2) after it: fasttrain's fused kernel where it takes them
// (channels_last on the CPU) and pays, else the conv and then MaxPool2x2. Over an image's few channels the
// kernel writes only the pooled maps; over more its forward is Winograd's F(2x2, 3x3) with the max-pool in
// its output transform (model.aten_kernels "winograd_conv": oneDNN's conv and the max-pool kernel), and
// its backward, from each window's winner only, pays in fp32 (1.17-1.56x alone, 1.14x the main job's fp32
// throughput with AVX512; even with AVX2) but not in bf16, where oneDNN's dense backward runs on bf16 dot
// products (BENCHMARKS.md, "Own CPU kernels, sixth part"): there, on a CPU with AMX-BF16, the forward is an
// implicit GEMM on AMX's tiles with the max-pool in its epilogue, and so are the weight's and the input's
// gradients (model.aten_kernels "amx_conv": oneDNN's conv and MaxPool2x2; "twenty-sixth part"); and over one
// input channel so is the forward (a window's 4x4 patch per tile row; "twenty-seventh part"). It
// stays a Conv2d, with its parameters' names, for checkpoints and whatever inspects the model; an Identity
// holds the max-pool's place.
class ConvMaxPool2dImpl : public torch::nn::Conv2dImpl {
 public:
  ConvMaxPool2dImpl(const torch::nn::Conv2dOptions& options, bool own_max_pool, kernels::WideConvForward wide,
                    bool amx)
      : torch::nn::Conv2dImpl(options), pool_(own_max_pool), wide_(wide), amx_(amx) {}

  torch::Tensor forward(const torch::Tensor& images) {
    const torch::ScalarType dtype = kernels::cpu_compute_dtype(images);
    // Over one channel NCHW images are NHWC too; the kernel's channels_last maps are what conv2d would
    // give only where the weight is laid out channels_last (train.channels_last).
    const bool channels_last = weight.suggest_memory_format() == torch::MemoryFormat::ChannelsLast;
    const bool amx = amx_ && kernels::conv3x3_max_pool2x2_runs_on_amx(images.size(1), weight.size(0), dtype);
    const bool pays = images.size(1) <= kernels::kConvMaxPoolInChannels || dtype == torch::kFloat || amx;
    if (channels_last && pays && kernels::conv3x3_max_pool2x2_takes(images, weight, bias, dtype)) {
      return kernels::conv3x3_max_pool2x2(images, weight, bias, dtype, kernels::cpu_capability(),
                                          amx ? kernels::WideConvForward::amx : wide_);
    }
    return pool_->forward(torch::nn::Conv2dImpl::forward(images));
  }

  // In evaluation, the conv, its max-pool and `norm` (BatchNorm + ReLU) after it in one pass, where forward
  // runs the fused kernel (on AMX's tiles in bf16, or its fp32 bodies: the direct forward, or Winograd's
  // where that is `wide_`) and no gradient is asked (conv3x3_max_pool2x2_batch_norm_relu); nullopt elsewhere,
  // and where that kernel declines the values.
  std::optional<torch::Tensor> forward_normalised(const torch::Tensor& images,
                                                  const torch::nn::BatchNorm2dImpl& norm) {
    const torch::ScalarType dtype = kernels::cpu_compute_dtype(images);
    const bool amx = amx_ && kernels::conv3x3_max_pool2x2_runs_on_amx(images.size(1), weight.size(0), dtype);
    const bool fp32_bodies = dtype == torch::kFloat && (images.size(1) <= kernels::kConvMaxPoolInChannels ||
                                                        wide_ == kernels::WideConvForward::winograd);
    if (!(amx || fp32_bodies) || norm.is_training() ||
        weight.suggest_memory_format() != torch::MemoryFormat::ChannelsLast ||
        !kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(images, weight, bias, dtype, norm.weight,
                                                            norm.bias, norm.running_mean, norm.running_var))
      return std::nullopt;
    return kernels::conv3x3_max_pool2x2_batch_norm_relu(images, weight, bias, dtype, norm.weight, norm.bias,
                                                        norm.running_mean, norm.running_var,
                                                        norm.options.eps());
  }

 private:
  MaxPool2x2 pool_;                // not registered: it holds nothing
  kernels::WideConvForward wide_;  // fp32's
  bool amx_;                       // bf16's: on AMX's tiles where they are lent
};
TORCH_MODULE(ConvMaxPool2d);

// BatchNorm2d and the ReLU after it: fasttrain's kernel where it takes the maps (channels_last on the
// CPU), else ATen's batch_norm and an in-place relu. It stays a BatchNorm2d, with its parameters and
// buffers, for checkpoints and whatever inspects the model.
class BatchNormReLU2dImpl : public torch::nn::BatchNorm2dImpl {
 public:
  explicit BatchNormReLU2dImpl(int64_t features) : torch::nn::BatchNorm2dImpl(features) {}

  torch::Tensor forward(const torch::Tensor& maps) {
    if (!kernels::batch_norm_relu_takes(maps, weight, bias, running_mean, running_var, is_training())) {
      torch::Tensor normed = torch::nn::BatchNorm2dImpl::forward(maps);
      return normed.relu_();
    }
    return kernels::batch_norm_relu(maps, weight, bias, running_mean, running_var, is_training(),
                                    running_average_factor(), options.eps());
  }

  // Its own: LibTorch 1.13 does not export BatchNormImplBase's.
  void pretty_print(std::ostream& stream) const override {
    stream << "BatchNormReLU2d(" << options.num_features() << ", eps=" << options.eps() << ")";
  }

 private:
  // The batch counted as BatchNorm2d counts it; the cnn's BatchNorms keep the default momentum (0.1).
  double running_average_factor() {
    if (is_training()) num_batches_tracked += 1;
    return *options.momentum();
  }
};
TORCH_MODULE(BatchNormReLU2d);

// Which of fasttrain's CPU kernels the cnn runs (model.kernels, model.aten_kernels).
struct CnnKernels {
  bool max_pool = false, batch_norm_relu = false, conv_max_pool = false, winograd_conv = false,
       amx_conv = false, conv_batch_norm_relu = false, flatten = false;
  HeadKernels head;

  explicit CnnKernels(const CnnOptions& options)
      : max_pool(runs_own_kernel(options.kernels(), options.aten_kernels(), "max_pool")),
        batch_norm_relu(runs_own_kernel(options.kernels(), options.aten_kernels(), "batch_norm_relu")),
        conv_max_pool(runs_own_kernel(options.kernels(), options.aten_kernels(), "conv_max_pool")),
        winograd_conv(runs_own_kernel(options.kernels(), options.aten_kernels(), "winograd_conv")),
        amx_conv(runs_own_kernel(options.kernels(), options.aten_kernels(), "amx_conv")),
        conv_batch_norm_relu(
            runs_own_kernel(options.kernels(), options.aten_kernels(), "conv_batch_norm_relu")),
        flatten(runs_own_kernel(options.kernels(), options.aten_kernels(), "flatten")),
        head{runs_own_kernel(options.kernels(), options.aten_kernels(), "amx_linear"),
             runs_own_kernel(options.kernels(), options.aten_kernels(), "linear_relu"),
             runs_own_kernel(options.kernels(), options.aten_kernels(), "narrow_linear")} {}
};

class Cnn : public torch::nn::Module {
 public:
  Cnn(const CnnOptions& options, const DataShape& shape) {
    int64_t channels = shape.input[0], height = shape.input[1], width = shape.input[2];
    const CnnKernels own(options);
    own_flatten_ = own.flatten;
    for (int64_t stage_width : options.widths()) {
      // A bias before BatchNorm is wasted work: BatchNorm subtracts the mean and adds its own shift.
      const auto conv = torch::nn::Conv2dOptions(channels, stage_width, 3)
                            .padding(1)
                            .bias(!options.batchnorm() || options.bias_before_norm());
      ConvMaxPool2d conv_max_pool{nullptr};
      if (options.pool_first() && own.conv_max_pool) {
        conv_max_pool = ConvMaxPool2d(
            conv, own.max_pool,
            own.winograd_conv ? kernels::WideConvForward::winograd : kernels::WideConvForward::onednn,
            own.amx_conv);
        features_->push_back(conv_max_pool);
        features_->push_back(torch::nn::Identity());
      } else {
        features_->push_back(torch::nn::Conv2d(conv));
        if (options.pool_first()) features_->push_back(MaxPool2x2(own.max_pool));
      }
      if (options.batchnorm() && own.batch_norm_relu) {
        const BatchNormReLU2d norm(stage_width);
        if (conv_max_pool) evaluation_stages_.emplace_back(conv_max_pool, norm);
        features_->push_back(norm);
        // The ReLU ran inside it; Identity holds its place, so the modules after keep their indices and
        // the parameters their names (checkpoints load either way).
        features_->push_back(torch::nn::Identity());
      } else {
        if (options.batchnorm()) features_->push_back(torch::nn::BatchNorm2d(stage_width));
        features_->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
      }
      if (!options.pool_first()) features_->push_back(MaxPool2x2(own.max_pool));
      channels = stage_width;
      height /= 2;
      width /= 2;
    }
    // Every stage a conv + max-pool and a BatchNorm + ReLU: evaluations may run each stage in one pass.
    if (!own.conv_batch_norm_relu || evaluation_stages_.size() != options.widths().size())
      evaluation_stages_.clear();
    FT_CONFIG_CHECK(height > 0 && width > 0, "model.widths has {} pooling stages, too many for {}x{} inputs",
                    options.widths().size(), shape.input[1], shape.input[2]);
    const int64_t features = channels * height * width;
    classifier_ =
        classifier_head(features, options.hidden(), options.dropout(), output_count(shape, "cnn"), own.head);
    register_module("features", features_);
    register_module("classifier", classifier_);
  }

  torch::Tensor forward(torch::Tensor images) {
    auto maps = is_training() ? features_->forward(images)
                              : evaluation_features(images);  // [B, widths.back(), H / 2^S, W / 2^S]
    // [B, C * H' * W'] in NCHW order whatever the maps' layout, so the hidden Linear's columns mean the
    // same with and without channels_last (checkpoints, the peer).
    auto flat = own_flatten_ && kernels::flatten_channels_last_takes(maps)
                    ? kernels::flatten_channels_last(maps)
                    : maps.flatten(1);
    return classifier_->forward(flat);  // [B, outputs]
  }

 private:
  // An evaluation's features: each stage's conv, max-pool, BatchNorm and ReLU in one pass where the fused
  // kernel runs them (the BatchNorm's maps written as the conv pools, no winners' bytes kept), else the
  // stages' modules. The Stage's own forward where gradients are recorded (its checkpointing then applies) or
  // block hooks run around its modules (ZeRO-3 gathers the weights).
  torch::Tensor evaluation_features(const torch::Tensor& images) {
    if (evaluation_stages_.empty() || torch::GradMode::is_enabled() || features_->has_block_hooks())
      return features_->forward(images);
    torch::Tensor maps = images;
    for (auto& [conv, norm] : evaluation_stages_) {
      std::optional<torch::Tensor> normalised = conv->forward_normalised(maps, *norm);
      maps = normalised ? *normalised : norm->forward(conv->forward(maps));
    }
    return maps;
  }

  bool own_flatten_ = false;
  // Each stage's conv + max-pool and BatchNorm + ReLU (features_'s modules), where every stage is those two.
  std::vector<std::pair<ConvMaxPool2d, BatchNormReLU2d>> evaluation_stages_;
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
