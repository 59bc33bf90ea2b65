#include "fasttrain/data/device_resident.h"

#include <torch/torch.h>

#include <algorithm>

#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/huge_pages.h"

namespace fasttrain {

ResidentImageBatches::ResidentImageBatches(const ImageDataset& dataset, const TransformPipeline& pipeline,
                                           torch::Device device)
    : ResidentSamples(device),
      pipeline_(pipeline),
      shape_{dataset.channels(), dataset.height(), dataset.width()},
      augmented_(pipeline.has_augmentations()) {
  FT_CHECK(
      dataset.images.defined() && dataset.images.dim() == 4 && dataset.images.scalar_type() == torch::kUInt8,
      "ResidentImageBatches needs uint8 images [N, C, H, W]");
  pipeline_.check_channels(shape_.channels);
  if (augmented_) pipeline_.pixel_map(shape_, SampleRng(0, 0, 0));  // an Error now if one cannot map
  const int64_t n = dataset.size(), plane = shape_.height * shape_.width;
  torch::Tensor images = dataset.images.to(torch::kCPU).reshape({n, shape_.channels, plane});
  const std::vector<float>& table = pipeline_.normalisation_table();
  const int64_t tables = static_cast<int64_t>(table.size()) / 256;
  table_ = torch::tensor(table, torch::kFloat).reshape({tables, 256});
  if (tables > 1) channel_offset_ = (torch::arange(tables, torch::kLong) * 256).reshape({1, tables, 1});
  if (augmented_) {
    // Augmented batches gather pixels by index; index H * W is a zero pixel (crop padding).
    const torch::Tensor zero_pixel = torch::zeros({n, shape_.channels, 1}, images.options());
    if (device_.is_cpu()) {
      images_ = empty_long_lived_cpu({n, shape_.channels, plane + 1}, torch::kUInt8);
      torch::cat_out(images_, {images, zero_pixel}, 2);
    } else {
      images_ = torch::cat({images, zero_pixel}, 2).to(device_);
    }
    table_ = table_.to(device_);
    if (channel_offset_.defined()) channel_offset_ = channel_offset_.to(device_);
  } else {
    // Normalised here once, a slice at a time (the lookup's int64 indices are 8 bytes a pixel).
    torch::Tensor normalised = device_.is_cpu()
                                   ? empty_long_lived_cpu({n, shape_.channels, plane}, torch::kFloat)
                                   : torch::empty({n, shape_.channels, plane}, torch::kFloat);
    constexpr int64_t kSlice = 4096;
    for (int64_t start = 0; start < n; start += kSlice) {
      const int64_t length = std::min(kSlice, n - start);
      normalised.narrow(0, start, length).copy_(normalise(images.narrow(0, start, length)));
    }
    images_ = normalised.view({n, shape_.channels, shape_.height, shape_.width}).to(device_);
  }
  labels_ = dataset.labels.to(device_, torch::kLong).contiguous();
  bytes_ = images_.numel() * static_cast<int64_t>(images_.element_size()) + labels_.numel() * 8 +
           table_.numel() * 4;
}

torch::Tensor ResidentImageBatches::normalise(const torch::Tensor& pixels) const {
  torch::Tensor codes = pixels.to(torch::kLong);  // [B, C, P] uint8 -> the table's indices
  if (channel_offset_.defined()) codes = codes + channel_offset_;
  return table_.take(codes);
}

void ResidentSamples::start_epoch(const EpochPlan& plan) {
  plan_begin_ = plan.samples.data();
  plan_end_ = plan_begin_ + plan.samples.size();
  plan_indices_ = to_device(plan_begin_, static_cast<int64_t>(plan.samples.size()));
}

torch::Tensor ResidentSamples::to_device(const int64_t* values, int64_t count) const {
  torch::Tensor host = torch::from_blob(const_cast<int64_t*>(values), {count}, torch::kLong);
  if (device_.is_cpu()) return host.clone();
  // From pinned memory the copy is asynchronous: the host does not wait for the device's queue.
  return host.pin_memory().to(device_, /*non_blocking=*/true);
}

torch::Tensor ResidentImageBatches::pixel_sources(const BatchRequest& request) const {
  const int64_t count = request.count, h = shape_.height, w = shape_.width;
  std::vector<int64_t> sources(static_cast<size_t>(count * h * w));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t sample = request.samples[i];
    const PixelMap map = pipeline_.pixel_map(
        shape_, SampleRng(request.seed, static_cast<uint64_t>(request.epoch), static_cast<uint64_t>(sample)));
    int64_t* out = sources.data() + i * h * w;
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const int64_t row = map.rows[static_cast<size_t>(y)], col = map.cols[static_cast<size_t>(x)];
        out[y * w + x] = row < 0 || col < 0 ? h * w : row * w + col;
      }
    }
  }
  return to_device(sources.data(), count * h * w).reshape({count, 1, h * w});
}

torch::Tensor ResidentSamples::sample_indices(const BatchRequest& request) const {
  const bool in_plan =
      plan_begin_ && request.samples >= plan_begin_ && request.samples + request.count <= plan_end_;
  if (in_plan) return plan_indices_.narrow(0, request.samples - plan_begin_, request.count);
  return to_device(request.samples, request.count);
}

ResidentTensorBatches::ResidentTensorBatches(const std::map<std::string, torch::Tensor>& tensors,
                                             torch::Device device)
    : ResidentSamples(device) {
  for (const auto& [name, tensor] : tensors) {
    tensors_[name] = tensor.to(device_).contiguous();
    bytes_ += static_cast<int64_t>(tensor.nbytes());
  }
}

Batch ResidentTensorBatches::build(const BatchRequest& request) const {
  torch::NoGradGuard no_grad;
  const torch::Tensor indices = sample_indices(request);  // [B] int64
  Batch batch;
  batch.count = request.count;
  for (const auto& [name, tensor] : tensors_) {
    torch::Tensor rows = tensor.index_select(0, indices);  // [B, ...]
    if (request.channels_last && rows.dim() == 4) rows = rows.contiguous(torch::MemoryFormat::ChannelsLast);
    batch.set(name, std::move(rows));
  }
  return batch;
}

Batch ResidentImageBatches::build(const BatchRequest& request) const {
  const int64_t count = request.count, c = shape_.channels, h = shape_.height, w = shape_.width;
  torch::NoGradGuard no_grad;
  const torch::Tensor indices = sample_indices(request);  // [B] int64
  Batch batch;
  batch.count = count;
  if (augmented_) {
    torch::Tensor pixels = images_.index_select(0, indices);  // [B, C, H * W + 1] uint8
    pixels = pixels.gather(2, pixel_sources(request).expand({count, c, h * w}));
    batch.inputs = normalise(pixels).view({count, c, h, w});  // [B, C, H, W] float
  } else {
    batch.inputs = images_.index_select(0, indices);  // [B, C, H, W] float, normalised already
  }
  if (request.channels_last) batch.inputs = batch.inputs.contiguous(torch::MemoryFormat::ChannelsLast);
  batch.targets = labels_.index_select(0, indices);  // [B] int64
  return batch;
}

ResidencyChoice choose_residency(const std::string& setting, const torch::Device& device,
                                 const ResidentData& data, const DeviceMemory& memory) {
  FT_CONFIG_CHECK(setting == "auto" || setting == "true" || setting == "false",
                  "data.device_resident '{}' is not allowed; valid: auto, true, false", setting);
  if (setting == "false") return {false, "data.device_resident = false"};
  if (data.bytes == 0) {
    FT_CONFIG_CHECK(setting != "true",
                    "data.device_resident = true, but this data set cannot be built on a device (text, or an "
                    "augmentation without a pixel map); set it to auto or false");
    return {false,
            "this data set is built by the loader's threads (text, or augmentations the device cannot run)"};
  }
  if (setting == "true") return {true, "data.device_resident = true"};
  if (!device.is_cuda() && !data.gathers) {
    return {false,
            "its augmentations run in the loader's threads, beside the step, not on the step's thread"};
  }
  if (memory.bytes <= 0) return {false, fmt::format("{} is unknown", memory.name)};
  const std::string limit = fmt::format("{} ({})", memory.name, format_bytes(memory.bytes));
  if (data.bytes * 10 > memory.bytes) {
    return {false,
            fmt::format("the data set ({}) is more than a tenth of {}", format_bytes(data.bytes), limit)};
  }
  return {true, fmt::format("the data set ({}) fits in a tenth of {}: batches are gathered there{}",
                            format_bytes(data.bytes), limit,
                            device.is_cuda() ? "" : ", normalised once instead of every batch")};
}

}  // namespace fasttrain
