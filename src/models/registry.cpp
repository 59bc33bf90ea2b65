#include "fasttrain/models/registry.h"

#include <torch/nn.h>

#include <functional>
#include <map>
#include <sstream>

#include "fasttrain/util/check.h"

namespace fasttrain {

std::shared_ptr<Model> make_mlp(const ModelOptions& options);
std::shared_ptr<Model> make_cnn(const ModelOptions& options);
std::shared_ptr<Model> make_resnet(const ModelOptions& options);
std::shared_ptr<Model> make_gpt(const ModelOptions& options);

namespace {

using Factory = std::function<std::shared_ptr<Model>(const ModelOptions&)>;

const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> factories = {
      {"mlp", make_mlp},
      {"cnn", make_cnn},
      {"resnet", make_resnet},
      {"gpt", make_gpt},
  };
  return factories;
}

void validate(const ModelOptions& options) {
  auto check_sizes = [](const char* key, const std::vector<int64_t>& sizes, bool allow_empty) {
    FT_CONFIG_CHECK(allow_empty || !sizes.empty(), "model.{} must list at least one size, got []", key);
    for (int64_t size : sizes) {
      FT_CONFIG_CHECK(size > 0, "model.{} entries must be > 0, got [{}]", key, fmt::join(sizes, ", "));
    }
  };
  check_sizes("widths", options.widths(), options.name() == "mlp");
  check_sizes("hidden", options.hidden(), true);
  FT_CONFIG_CHECK(options.blocks() >= 1, "model.blocks must be >= 1, got {}", options.blocks());
  FT_CONFIG_CHECK(options.dropout() >= 0 && options.dropout() < 1, "model.dropout must be in [0, 1), got {}",
                  options.dropout());
  FT_CONFIG_CHECK(options.in_channels() > 0 && options.height() > 0 && options.width() > 0,
                  "model input must have a positive shape, got [{}, {}, {}]", options.in_channels(),
                  options.height(), options.width());
  FT_CONFIG_CHECK(options.num_classes() > 1, "model needs at least 2 classes, got {}", options.num_classes());
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> result;
    for (const auto& entry : registry()) result.push_back(entry.first);
    return result;
  }();
  return names;
}

std::shared_ptr<Model> make_model(const ModelOptions& options) {
  auto found = registry().find(options.name());
  FT_CONFIG_CHECK(found != registry().end(), "model.name '{}' is unknown; valid: {}", options.name(),
                  fmt::join(model_names(), ", "));
  validate(options);
  return found->second(options);
}

torch::nn::Sequential classifier_head(int64_t features, const ModelOptions& options) {
  torch::nn::Sequential head;
  for (int64_t hidden : options.hidden()) {
    if (options.dropout() > 0) head->push_back(torch::nn::Dropout(options.dropout()));
    head->push_back(torch::nn::Linear(features, hidden));
    head->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
    features = hidden;
  }
  if (options.dropout() > 0) head->push_back(torch::nn::Dropout(options.dropout()));
  head->push_back(torch::nn::Linear(features, options.num_classes()));
  return head;
}

void to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  auto convert = [](torch::Tensor& tensor) {
    if (tensor.defined() && tensor.dim() == 4) {
      tensor.set_data(tensor.data().contiguous(torch::MemoryFormat::ChannelsLast));
    }
  };
  for (auto& parameter : module.parameters()) convert(parameter);
  for (auto& buffer : module.buffers()) convert(buffer);
}

std::string Model::describe() const {
  std::ostringstream out;
  out << name() << " (" << parameter_count() << " parameters)\n";
  for (const auto& child : named_children()) {
    out << "  " << child.key() << ": ";
    child.value()->pretty_print(out);
    out << "\n";
  }
  return out.str();
}

int64_t Model::parameter_count() const {
  int64_t count = 0;
  for (const auto& parameter : parameters()) count += parameter.numel();
  return count;
}

}  // namespace fasttrain
