#include "fasttrain/data/tensor_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cstring>

#include "fasttrain/data/device_resident.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

TensorSource::TensorSource(std::map<std::string, torch::Tensor> tensors, std::string what, int64_t classes)
    : tensors_(std::move(tensors)), what_(std::move(what)) {
  FT_CHECK(tensors_.count("inputs") && tensors_.at("inputs").defined(),
           "{}: a TensorSource needs a tensor named 'inputs' (it has: {})", what_, [&] {
             std::vector<std::string> names;
             for (const auto& item : tensors_) names.push_back(item.first);
             return fmt::format("{}", fmt::join(names, ", "));
           }());
  size_ = tensors_.at("inputs").dim() > 0 ? tensors_.at("inputs").size(0) : 0;
  FT_CHECK(size_ >= 1, "{}: 'inputs' holds no samples (shape {})", what_, tensors_.at("inputs").sizes());
  for (auto& [name, tensor] : tensors_) {
    FT_CHECK(tensor.defined() && tensor.dim() >= 1 && tensor.size(0) == size_,
             "{}: tensor '{}' has shape {}, but 'inputs' has {} samples: every tensor needs them along its "
             "first dimension",
             what_, name, tensor.defined() ? tensor.sizes() : c10::IntArrayRef{}, size_);
    tensor = tensor.to(torch::kCPU).contiguous();
  }
  if (tensors_.count("targets")) {
    const torch::Tensor& targets = tensors_.at("targets");
    if (targets.dim() == 1 && !torch::isFloatingType(targets.scalar_type())) {
      FT_CHECK(targets.min().item<int64_t>() >= 0, "{}: class targets must be >= 0, the smallest is {}",
               what_, targets.min().item<int64_t>());
      const int64_t largest = targets.max().item<int64_t>();
      FT_CHECK(classes == 0 || largest < classes, "{}: class target {} is out of the {} classes", what_,
               largest, classes);
      classes_ = classes > 0 ? classes : largest + 1;
    }
  }
}

const torch::Tensor& TensorSource::tensor(const std::string& name) const {
  auto found = tensors_.find(name);
  FT_CHECK(found != tensors_.end(), "{}: no tensor '{}'", what_, name);
  return found->second;
}

namespace {

// Rows `samples` of `from` [N, ...] into a new [count, ...] tensor (NHWC when `channels_last` and 4-d).
torch::Tensor gather_rows(const torch::Tensor& from, const BatchRequest& request) {
  std::vector<int64_t> sizes = from.sizes().vec();
  sizes[0] = request.count;
  const bool nhwc = request.channels_last && from.dim() == 4;
  torch::Tensor out =
      torch::empty(sizes, from.options().pinned_memory(request.pinned),
                   nhwc ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous);
  const int64_t row = from.numel() / from.size(0);
  const size_t row_bytes = static_cast<size_t>(row) * from.element_size();
  const auto* source = static_cast<const char*>(from.data_ptr());
  auto* target = static_cast<char*>(out.data_ptr());
  const int64_t channels = nhwc ? from.size(1) : 1, plane = row / channels;
  const size_t element = from.element_size();
  for (int64_t i = 0; i < request.count; ++i) {
    if (request.abandoned()) break;
    const char* in = source + request.samples[i] * row_bytes;
    char* to = target + i * row_bytes;
    if (!nhwc || channels == 1) {
      std::memcpy(to, in, row_bytes);
      continue;
    }
    for (int64_t c = 0; c < channels; ++c) {  // [C, H, W] -> [H, W, C]
      for (int64_t p = 0; p < plane; ++p)
        std::memcpy(to + (p * channels + c) * element, in + (c * plane + p) * element, element);
    }
  }
  return out;
}

}  // namespace

Batch TensorSource::build(const BatchRequest& request) const {
  Batch batch;
  batch.count = request.count;
  for (const auto& [name, tensor] : tensors_) batch.set(name, gather_rows(tensor, request));
  return batch;
}

int64_t TensorSource::resident_bytes() const {
  int64_t bytes = 0;
  for (const auto& item : tensors_) bytes += static_cast<int64_t>(item.second.nbytes());
  return bytes;
}

std::unique_ptr<ResidentBatches> TensorSource::make_resident(torch::Device device) const {
  return std::make_unique<ResidentTensorBatches>(tensors_, device);
}

DataShape TensorSource::shape() const {
  DataShape shape;
  const torch::Tensor& inputs = tensors_.at("inputs");
  shape.input = inputs.sizes().slice(1).vec();
  shape.input_dtype = inputs.scalar_type();
  if (tensors_.count("targets")) {
    const torch::Tensor& targets = tensors_.at("targets");
    shape.target = targets.sizes().slice(1).vec();
    shape.target_dtype = targets.scalar_type();
  }
  shape.classes = classes_;
  shape.task = torch::isFloatingType(shape.target_dtype) ? "regression" : "classification";
  return shape;
}

std::string TensorSource::describe() const {
  std::vector<std::string> parts;
  for (const auto& [name, tensor] : tensors_)
    parts.push_back(fmt::format("{} [{}] {}", name, fmt::join(tensor.sizes().slice(1), ", "),
                                c10::toString(tensor.scalar_type())));
  return fmt::format("{} samples of {}", size_, fmt::join(parts, ", "));
}

}  // namespace fasttrain
