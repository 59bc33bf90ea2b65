#include "fasttrain/models/registry.h"

#include <torch/nn.h>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/models/torchscript.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

KeyRule<std::vector<int64_t>> positive_sizes(bool allow_empty) {
  return KeyRule<std::vector<int64_t>>(
      [allow_empty](const std::string& name, const std::vector<int64_t>& sizes) {
        FT_CONFIG_CHECK(allow_empty || !sizes.empty(), "{} must list at least one size, got []", name);
        for (int64_t size : sizes) {
          FT_CONFIG_CHECK(size > 0, "{} entries must be > 0, got [{}]", name, fmt::join(sizes, ", "));
        }
      });
}

Registry<ModelRecipe>& model_registry() {
  static Registry<ModelRecipe> registry = [] {
    Registry<ModelRecipe> models("model.name");
    models.add("cnn", "the classic conv net: conv stages, then fully connected layers",
               model_recipe<CnnOptions>(make_cnn));
    models.add("gpt", "a byte-level GPT-2-style transformer (data.dataset = \"text\")",
               model_recipe<GptOptions>(make_gpt, [](const GptOptions& o) { return o.context(); }));
    models.add("mlp", "fully connected layers over the flattened inputs", model_recipe<MlpOptions>(make_mlp));
    models.add("resnet", "a small ResNet (basic blocks, global average pool)",
               model_recipe<ResnetOptions>(make_resnet));
    models.add("torchscript", "a module written in Python, scripted or traced and saved with torch.jit.save",
               model_recipe<TorchScriptOptions>([](const TorchScriptOptions& options, const DataShape&) {
                 return load_torchscript(options.path());
               }));
    return models;
  }();
  return registry;
}

Model make_model(const std::string& name, const DataShape& shape, const AnyOptions* options) {
  const ModelRecipe& recipe = model_registry().at(name);
  Model model = recipe.build(options ? *options : recipe.options, shape);
  return model.named(name);
}

int64_t output_count(const DataShape& shape, const std::string& model) {
  if (shape.classes > 0) {
    FT_CONFIG_CHECK(shape.classes > 1, "model '{}' needs at least 2 classes, the data has {}", model,
                    shape.classes);
    return shape.classes;
  }
  FT_CONFIG_CHECK(
      torch::isFloatingType(shape.target_dtype),
      "model '{}' needs to know how many classes there are: the data's targets are class ids, but "
      "it does not say how many ({})",
      model, shape.describe());
  int64_t values = 1;
  for (int64_t size : shape.target) values *= size;
  return values;
}

namespace {

// A Linear and the ReLU after it: kernels::amx_linear (bf16) or kernels::linear_relu (fp32) where the head
// runs them and they take the input, else ATen's linear and an in-place relu. It stays a Linear, with its
// parameters' names, for checkpoints and optimizer groups.
class LinearReLUImpl : public torch::nn::LinearImpl {
 public:
  LinearReLUImpl(int64_t in, int64_t out, HeadKernels kernels)
      : torch::nn::LinearImpl(in, out), kernels_(kernels) {}

  torch::Tensor forward(const torch::Tensor& x) {
    if (kernels_.amx_linear && kernels::amx_linear_takes(x, weight, bias))
      return kernels::amx_linear(x, weight, bias, /*relu=*/true);
    if (kernels_.linear_relu && kernels::linear_relu_takes(x, weight, bias))
      return kernels::linear_relu(x, weight, bias);
    return torch::nn::LinearImpl::forward(x).relu_();
  }

 private:
  HeadKernels kernels_;
};
TORCH_MODULE(LinearReLU);

// The output Linear: kernels::narrow_linear where it takes it (bf16 on the CPU, a few outputs), else ATen's
// linear. It stays a Linear, as LinearReLU does.
class NarrowLinearImpl : public torch::nn::LinearImpl {
 public:
  NarrowLinearImpl(int64_t in, int64_t out) : torch::nn::LinearImpl(in, out) {}

  torch::Tensor forward(const torch::Tensor& x) {
    if (kernels::narrow_linear_takes(x, weight, bias)) return kernels::narrow_linear(x, weight, bias);
    return torch::nn::LinearImpl::forward(x);
  }
};
TORCH_MODULE(NarrowLinear);

}  // namespace

Stage classifier_head(int64_t features, const std::vector<int64_t>& hidden, double dropout, int64_t outputs,
                      HeadKernels kernels) {
  Stage head;
  for (int64_t width : hidden) {
    if (dropout > 0) head->push_back(torch::nn::Dropout(dropout));
    if (kernels.amx_linear || kernels.linear_relu) {
      head->push_back(LinearReLU(features, width, kernels));
      head->push_back(torch::nn::Identity());
    } else {
      head->push_back(torch::nn::Linear(features, width));
      head->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
    }
    features = width;
  }
  if (dropout > 0) head->push_back(torch::nn::Dropout(dropout));
  if (kernels.narrow_linear) {
    head->push_back(NarrowLinear(features, outputs));
  } else {
    head->push_back(torch::nn::Linear(features, outputs));
  }
  return head;
}

}  // namespace fasttrain
