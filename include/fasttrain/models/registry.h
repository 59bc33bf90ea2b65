#pragma once
// Models built by name from config: "mlp", "cnn" (the classic conv net), "resnet" (small, with
// bias-free convs before BatchNorm), "gpt" (a byte-level transformer: tokens [B, T] in, next-token
// logits [B * T, num_classes] out). Input sizes come from the dataset, the rest from [model].
//
//   auto model = fasttrain::make_model(fasttrain::ModelOptions("cnn").widths({32, 64}).hidden({128}));
//   torch::Tensor logits = model->forward(images);   // [B, C, H, W] -> [B, num_classes]
//   std::cout << model->describe();                  // layers and parameter count
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/memory/checkpoint.h"
#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"

namespace fasttrain {

// The registered models' names (an unknown model.name lists them).
const std::vector<std::string>& model_names();

// [model]
struct ModelOptions {
  FT_KEYS(ModelOptions);
  explicit ModelOptions(std::string name) : name_(std::move(name)) {}
  FT_KEY(std::string, name,
         "Model: mlp, cnn, resnet (images), or gpt (byte-level text: data.dataset = \"text\")",
         one_of(model_names()));
  // Set from the dataset.
  FT_ARG(int64_t, in_channels) = 1;
  FT_ARG(int64_t, height) = 28;
  FT_ARG(int64_t, width) = 28;
  FT_ARG(int64_t, num_classes) = 10;
  FT_KEY(std::vector<int64_t>, widths,
         "cnn: channels of each 3x3 conv stage (each followed by a 2x2 max-pool); resnet: channels of each "
         "stage (the first is also the stem; later stages halve the resolution)") = std::vector<int64_t>{32,
                                                                                                         64};
  FT_KEY(std::vector<int64_t>, hidden,
         "Hidden fully connected layers before the classifier") = std::vector<int64_t>{128};
  FT_KEY(bool, batchnorm,
         "cnn: BatchNorm after each conv (the conv then has no bias: BatchNorm's shift replaces it)") = false;
  FT_KEY(bool, bias_before_norm,
         "cnn: keep the conv bias before BatchNorm (as PyTorch's Conv2d(bias=True) has it, to load its "
         "weights); wasted work otherwise") = false;
  FT_KEY(bool, pool_first,
         "cnn: max-pool right after each conv, before BatchNorm and ReLU (they commute with it; 4x less "
         "normalisation work)") = false;
  FT_KEY(int64_t, blocks, "resnet: residual blocks per stage", at_least(1)) = 1;
  FT_KEY(double, dropout,
         "Dropout before each fully connected layer (gpt: on the embeddings and each residual branch)",
         in_unit_interval()) = 0.0;
  // ---- gpt ----
  FT_KEY(int64_t, layers, "gpt: transformer blocks", at_least(1)) = 4;
  FT_KEY(int64_t, heads, "gpt: attention heads", at_least(1)) = 4;
  FT_KEY(int64_t, embed, "gpt: embedding width (a multiple of heads)", at_least(1)) = 128;
  FT_KEY(int64_t, context, "gpt: longest sequence (positions embedded)", at_least(1)) = 128;
};

// A classifier: images in, logits out.
class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor images) = 0;  // [B, C, H, W] -> [B, num_classes]
  // One line per layer and the parameter count.
  std::string describe() const;
  int64_t parameter_count() const;
  // memory.checkpoint: the blocks of each stage (checkpoint_blocks: a conv or linear layer with the
  // norm, activation and pooling after it; a residual block) that training forwards recompute in
  // backward instead of keeping their activations. Gradients and BatchNorm statistics are unchanged.
  void set_checkpointing(const CheckpointPolicy& policy) { checkpointing_ = policy; }
  const CheckpointPolicy& checkpointing() const { return checkpointing_; }
  // The Sequentials the forward runs block by block (run_stage), in forward order; parameters
  // outside them (a GPT's embeddings) belong to no block.
  const std::vector<torch::nn::Sequential>& stages() const { return stages_; }
  // Run around every block of every stage (dist.zero = 3); null for none. Not owned.
  void set_block_hooks(BlockHooks* hooks) { block_hooks_ = hooks; }

 protected:
  // Each model lists its stages once, in its constructor.
  void add_stage(const torch::nn::Sequential& stage) { stages_.push_back(stage); }
  // `stage`'s forward under the checkpointing policy, between the block hooks.
  torch::Tensor run_stage(torch::nn::Sequential& stage, const torch::Tensor& input) {
    return checkpoint_sequential(*stage, input, checkpointing_, block_hooks_);
  }

 private:
  CheckpointPolicy checkpointing_;
  std::vector<torch::nn::Sequential> stages_;
  BlockHooks* block_hooks_ = nullptr;
};

// The fully connected head every model ends with: for each of options.hidden() [Dropout +] Linear +
// ReLU, then [Dropout +] the Linear classifier, from `features` inputs to options.num_classes().
torch::nn::Sequential classifier_head(int64_t features, const ModelOptions& options);

// Converts every 4-d parameter and buffer (conv kernels) of `module` to channels_last (NHWC) in
// place, keeping the Parameter objects (optimizers made later or earlier still see them).
void to_channels_last(torch::nn::Module& module);

// Builds the model named by options.name(); an unknown name or bad size is a ConfigError naming
// model.<key>, the value and what is allowed.
std::shared_ptr<Model> make_model(const ModelOptions& options);

}  // namespace fasttrain
