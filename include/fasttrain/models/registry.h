#pragma once
// Models by name (model.name): each registered model declares its own [model] keys (an FT_KEY options
// struct) and is built for the data it trains on (DataShape: input size, classes, vocabulary).
// Built in: mlp, cnn (the classic conv net), resnet (small, bias-free convs before BatchNorm), gpt (a
// byte-level transformer: tokens [B, T] in, next-token logits [B * T, vocabulary] out), torchscript (a
// module written in Python: models/torchscript.h). A program
// registers its own in one line, and `[model] name = "mine"` then builds it:
//
//   fasttrain::model_registry().add("mine", "my autoencoder",
//       fasttrain::model_recipe<MyOptions>([](const MyOptions& o, const fasttrain::DataShape& shape) {
//         return fasttrain::Model(MyAutoencoder(shape.input, o.latent()));
//       }));
//
//   fasttrain::Model cnn = fasttrain::make_cnn(fasttrain::CnnOptions().widths({32, 64}),
//                                              fasttrain::DataShape::images(1, 28, 28, 10));
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/models/model.h"
#include "fasttrain/util/key.h"
#include "fasttrain/util/registry.h"

namespace fasttrain {

// A registered model: its keys with their defaults, how it is built for data of a shape, and the
// longest sequence it takes (sequence models: what the data cuts; null for the others).
struct ModelRecipe {
  AnyOptions options;
  std::function<Model(const AnyOptions& options, const DataShape& shape)> build;
  std::function<int64_t(const AnyOptions& options)> sequence_length;
};

// The registry behind model.name, with the built-in models.
Registry<ModelRecipe>& model_registry();

// A recipe from a typed builder; the options' rules are checked (as "model.<key>") before it runs.
template <typename Options>
ModelRecipe model_recipe(std::function<Model(const Options&, const DataShape&)> build,
                         std::function<int64_t(const Options&)> sequence_length = nullptr) {
  ModelRecipe recipe;
  recipe.options = AnyOptions::of(Options());
  recipe.build = [build](const AnyOptions& options, const DataShape& shape) {
    options.check("model");
    return build(options.as<Options>(), shape);
  };
  if (sequence_length) {
    recipe.sequence_length = [sequence_length](const AnyOptions& options) {
      return sequence_length(options.as<Options>());
    };
  }
  return recipe;
}

// Sizes such as model.widths: each > 0, and at least one unless `allow_empty`.
KeyRule<std::vector<int64_t>> positive_sizes(bool allow_empty);

// ---- the built-in models' keys ----
struct MlpOptions {
  FT_KEYS(MlpOptions);
  FT_KEY(std::vector<int64_t>, hidden, "Hidden fully connected layers before the output layer",
         positive_sizes(true)) = std::vector<int64_t>{128};
  FT_KEY(double, dropout, "Dropout before each fully connected layer", below_one()) = 0.0;
};

struct CnnOptions {
  FT_KEYS(CnnOptions);
  FT_KEY(std::vector<int64_t>, widths, "Channels of each 3x3 conv stage (each followed by a 2x2 max-pool)",
         positive_sizes(false)) = std::vector<int64_t>{32, 64};
  FT_KEY(std::vector<int64_t>, hidden, "Hidden fully connected layers before the output layer",
         positive_sizes(true)) = std::vector<int64_t>{128};
  FT_KEY(bool, batchnorm,
         "BatchNorm after each conv (the conv then has no bias: BatchNorm's shift replaces it)") = false;
  FT_KEY(bool, bias_before_norm,
         "Keep the conv bias before BatchNorm (as PyTorch's Conv2d(bias=True) has it, to load its weights); "
         "wasted work otherwise") = false;
  FT_KEY(bool, pool_first,
         "Max-pool right after each conv, before BatchNorm and ReLU (they commute with it; 4x less "
         "normalisation work)") = false;
  FT_KEY(double, dropout, "Dropout before each fully connected layer", below_one()) = 0.0;
  FT_KEY(
      std::string, kernels,
      "CPU kernels: fasttrain (its own 2x2 max-pool for channels_last inputs: a byte per output kept for "
      "backward, which writes each input gradient once, ATen's values bit for bit; BatchNorm with the "
      "ReLU after it in one kernel, keeping x alone for backward; and with pool_first, each conv fused with "
      "its max-pool, writing only the pooled maps (over at most 4 input channels a direct conv, over more "
      "Winograd's F(2x2, 3x3), whose output tiles are the pooling windows) and summing backward from the "
      "winners only, or in bf16 on a CPU with AMX-BF16 an implicit GEMM on AMX's tiles with the max-pool in "
      "its epilogue and the weight's gradient on the tiles too; the last maps flattened for the classifier "
      "by a transpose "
      "with gathers, not ATen's strided copy; in bf16 on a CPU with AMX-BF16, each hidden Linear and its "
      "ReLU on AMX's tiles, the weight rounded and packed in one pass and its gradient summed in fp32; in "
      "fp32, each hidden Linear and its ReLU with a backward that multiplies only the gradients the ReLU "
      "passes; in bf16, the output Linear's few outputs as dot products in fp32 vectors) or aten (conv2d, "
      "max_pool2d, batch_norm, relu, flatten, linear); NCHW "
      "inputs and GPUs run aten",
      one_of({"fasttrain", "aten"})) = "fasttrain";
  FT_KEY(std::vector<std::string>, aten_kernels,
         "With kernels = fasttrain: those of its CPU kernels to leave to ATen (max_pool, batch_norm_relu, "
         "conv_max_pool, winograd_conv: the fused conv's forward over more than 4 input channels as oneDNN's "
         "conv and the max-pool kernel instead of Winograd's F(2x2, 3x3), amx_conv: the same in bf16, and "
         "over one input channel the direct forward, instead of the fused conv on AMX's tiles, "
         "conv_batch_norm_relu: in evaluation, the fused conv (fp32's, or bf16's on AMX's tiles) and the "
         "BatchNorm + ReLU after it as two passes instead of one, flatten, amx_linear, linear_relu, "
         "narrow_linear), to "
         "measure one kernel on and off",
         each_one_of({"max_pool", "batch_norm_relu", "conv_max_pool", "winograd_conv", "amx_conv",
                      "conv_batch_norm_relu", "flatten", "amx_linear", "linear_relu", "narrow_linear"})) = {};
};

struct ResnetOptions {
  FT_KEYS(ResnetOptions);
  FT_KEY(std::vector<int64_t>, widths,
         "Channels of each stage (the first is also the stem's; later stages halve the resolution)",
         positive_sizes(false)) = std::vector<int64_t>{32, 64};
  FT_KEY(int64_t, blocks, "Residual blocks per stage", at_least(1)) = 1;
  FT_KEY(std::vector<int64_t>, hidden, "Hidden fully connected layers before the output layer",
         positive_sizes(true)) = std::vector<int64_t>{128};
  FT_KEY(double, dropout, "Dropout before each fully connected layer", below_one()) = 0.0;
};

struct GptOptions {
  FT_KEYS(GptOptions);
  FT_KEY(int64_t, layers, "Transformer blocks", at_least(1)) = 4;
  FT_KEY(int64_t, heads, "Attention heads", at_least(1)) = 4;
  FT_KEY(int64_t, embed, "Embedding width (a multiple of heads)", at_least(1)) = 128;
  FT_KEY(int64_t, context, "Longest sequence (positions embedded; what the data cuts)", at_least(1)) = 128;
  FT_KEY(double, dropout, "Dropout on the embeddings and each residual branch", below_one()) = 0.0;
  FT_KEY(
      std::string, kernels,
      "CPU kernels: fasttrain (its own causal attention, reading the packed qkv in place; the MLP's bias + "
      "tanh-GELU in one pass; its residual add + LayerNorm for an fp32 stream (writing bf16 for the matmul "
      "under bf16 autocast; in fp32 adding the attention projection's bias too; the residual gradient's add "
      "inside its backward); in fp32 its linear, whose input gradient and bias-less or residual-adding "
      "forward are oneDNN matmuls or, at depths up to 128, its own tiled matmul, where LibTorch 2.4+ and "
      "AVX512 BW/VL/DQ allow; and in fp32 on AVX2 or AVX512 the MLP as its own matmuls with the bias + GELU "
      "in the fc's epilogue and GELU's derivative in the projection's input gradient) or aten "
      "(scaled_dot_product_attention, or the math path on 1.x; addmm, gelu, add, layer_norm); GPUs run aten",
      one_of({"fasttrain", "aten"})) = "fasttrain";
  FT_KEY(
      std::vector<std::string>, aten_kernels,
      "With kernels = fasttrain or gpu_kernels = fasttrain: those of its kernels to leave to ATen "
      "(attention, layer_norm, bias_gelu, linear; on GPUs layer_norm, bias_gelu for the fused MLP and linear "
      "for the blocks' other Linears: qkv, the attention's projection, and the MLP's two where bias_gelu is "
      "left to ATen), or gelu_mlp to run the CPU's MLP unfused (fc, bias_gelu, projection), to measure one "
      "kernel on and off",
      each_one_of({"attention", "layer_norm", "bias_gelu", "linear", "gelu_mlp"})) = {};
  FT_KEY(std::string, gpu_kernels,
         "GPU kernels, on GPUs of compute capability 8.0 and later: fasttrain (its residual add + LayerNorm "
         "in one CUDA kernel each way, writing the dtype of the matmul it feeds; under bf16 the MLP as four "
         "cuBLASLt matmuls whose epilogues add the biases, GELU and the residual, and GELU's derivative with "
         "the bias gradient in one pass; qkv and the attention's projection as cuBLASLt matmuls with their "
         "bias gradients inside the weight gradients') or aten (add, layer_norm and autocast's cast; addmm, "
         "gelu and the bias gradients' reductions); aten_kernels names layer_norm, bias_gelu or linear to "
         "leave one to ATen. Measured on an H200 (BENCHMARKS.md \"GPU\")",
         one_of({"fasttrain", "aten"})) = "fasttrain";
};

Model make_mlp(const MlpOptions& options, const DataShape& shape);
Model make_cnn(const CnnOptions& options, const DataShape& shape);
Model make_resnet(const ResnetOptions& options, const DataShape& shape);
Model make_gpt(const GptOptions& options, const DataShape& shape);

// The registered model `name` with `options` (its keys; null: its defaults) for data of `shape`.
Model make_model(const std::string& name, const DataShape& shape, const AnyOptions* options = nullptr);

// What a classifier or regressor head ends in: the classes, or the values of one sample's target.
// A ConfigError naming `model` when the data says neither.
int64_t output_count(const DataShape& shape, const std::string& model);

// Which of fasttrain's CPU kernels a classifier_head runs where they take their inputs (else ATen's).
struct HeadKernels {
  bool amx_linear = false;   // each hidden Linear and its ReLU: kernels::amx_linear (bf16, AMX-BF16)
  bool linear_relu = false;  // each hidden Linear and its ReLU: kernels::linear_relu (fp32, sparse backward)
  bool narrow_linear = false;  // the output Linear: kernels::narrow_linear (bf16, a few outputs)
};

// The fully connected head the image models end with: for each of `hidden`, [Dropout +] Linear + ReLU,
// then [Dropout +] the output Linear, from `features` inputs to `outputs`. With `kernels.amx_linear` or
// `linear_relu` an Identity holds each ReLU's place (the parameters keep their names and the modules their
// indices).
Stage classifier_head(int64_t features, const std::vector<int64_t>& hidden, double dropout, int64_t outputs,
                      HeadKernels kernels = {});

}  // namespace fasttrain
