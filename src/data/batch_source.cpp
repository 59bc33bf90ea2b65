#include "fasttrain/data/batch_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "fasttrain/data/device_resident.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

// ---- Batch ----

Batch::Batch(torch::Tensor inputs_in, torch::Tensor targets_in)
    : inputs(std::move(inputs_in)), targets(std::move(targets_in)) {
  count = inputs.defined() && inputs.dim() > 0 ? inputs.size(0) : 0;
}

const torch::Tensor& Batch::at(const std::string& name) const {
  if (name == "inputs" && inputs.defined()) return inputs;
  if (name == "targets" && targets.defined()) return targets;
  auto found = fields.find(name);
  FT_CHECK(found != fields.end() && found->second.defined(), "the batch has no tensor '{}'; it has: {}", name,
           fmt::join(names(), ", "));
  return found->second;
}

bool Batch::has(const std::string& name) const {
  if (name == "inputs") return inputs.defined();
  if (name == "targets") return targets.defined();
  auto found = fields.find(name);
  return found != fields.end() && found->second.defined();
}

void Batch::set(const std::string& name, torch::Tensor tensor) {
  if (name == "inputs") {
    inputs = std::move(tensor);
  } else if (name == "targets") {
    targets = std::move(tensor);
  } else {
    fields[name] = std::move(tensor);
  }
}

std::vector<std::string> Batch::names() const {
  std::vector<std::string> result;
  if (inputs.defined()) result.push_back("inputs");
  if (targets.defined()) result.push_back("targets");
  for (const auto& [name, tensor] : fields) {
    if (tensor.defined()) result.push_back(name);
  }
  return result;
}

Batch Batch::map(const std::function<torch::Tensor(const torch::Tensor&)>& fn) const {
  Batch out = *this;
  if (inputs.defined()) out.inputs = fn(inputs);
  if (targets.defined()) out.targets = fn(targets);
  for (auto& [name, tensor] : out.fields) {
    if (tensor.defined()) tensor = fn(tensor);
  }
  return out;
}

void Batch::copy_from(const Batch& other, bool non_blocking) {
  FT_CHECK(names() == other.names(), "a batch of tensors [{}] cannot take one of [{}]",
           fmt::join(names(), ", "), fmt::join(other.names(), ", "));
  for (const auto& name : names()) {
    torch::Tensor& into = name == "inputs" ? inputs : name == "targets" ? targets : fields.at(name);
    const torch::Tensor& from = other.at(name);
    FT_CHECK(into.sizes() == from.sizes(),
             "batch tensor '{}' has shape {} here and {} in the batch copied in", name, into.sizes(),
             from.sizes());
    FT_CHECK(into.scalar_type() == from.scalar_type(),
             "batch tensor '{}' is {} here and {} in the batch copied in", name,
             c10::toString(into.scalar_type()), c10::toString(from.scalar_type()));
    into.copy_(from, non_blocking);
  }
  count = other.count;
  padded = other.padded;
  epoch = other.epoch;
  index = other.index;
}

std::string DataShape::describe() const {
  auto dtype = [](torch::ScalarType type) { return std::string(c10::toString(type)); };
  std::string out = fmt::format("inputs [{}] {}", fmt::join(input, ", "), dtype(input_dtype));
  if (vocabulary > 0) out += fmt::format(" (tokens of {})", vocabulary);
  out += fmt::format(", targets [{}] {}", fmt::join(target, ", "), dtype(target_dtype));
  if (classes > 0) out += fmt::format(" in {} classes", classes);
  return out;
}

DataShape DataShape::images(int64_t channels, int64_t height, int64_t width, int64_t classes) {
  DataShape shape;
  shape.input = {channels, height, width};
  shape.input_dtype = torch::kFloat;
  shape.target_dtype = torch::kLong;
  shape.classes = classes;
  shape.task = "classification";
  return shape;
}

DataShape DataShape::tokens(int64_t context, int64_t vocabulary) {
  DataShape shape;
  shape.input = {context};
  shape.input_dtype = torch::kLong;
  shape.vocabulary = vocabulary;
  shape.target = {context};
  shape.target_dtype = torch::kLong;
  shape.classes = vocabulary;
  shape.bytes_per_target = 1.0;
  shape.task = "language_modeling";
  return shape;
}

// ---- BatchSource ----

void EpochPlan::add_batch(const int64_t* first, int64_t count) {
  samples.insert(samples.end(), first, first + count);
  starts.push_back(static_cast<int64_t>(samples.size()));
}

std::optional<EpochPlan> BatchSource::batch_plan(int64_t, bool, uint64_t) const {
  return std::nullopt;
}

namespace {

// Samples 0 .. count - 1 built as the evaluation builds them (no augmentation).
Batch first_samples(const BatchSource& source, int64_t count) {
  std::vector<int64_t> samples(static_cast<size_t>(std::min(count, source.size())));
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<int64_t>(i);
  BatchRequest request;
  request.samples = samples.data();
  request.count = static_cast<int64_t>(samples.size());
  request.shuffle = false;
  return source.build(request);
}

std::vector<int64_t> per_sample(const torch::Tensor& tensor) {
  return tensor.dim() == 0 ? std::vector<int64_t>{} : tensor.sizes().slice(1).vec();
}

}  // namespace

DataShape BatchSource::shape() const {
  const Batch sample = first_samples(*this, 1);
  FT_CHECK(sample.inputs.defined() && sample.targets.defined(),
           "{}: a batch must have inputs and targets to describe its samples (it has: {}); override shape()",
           describe(), fmt::join(sample.names(), ", "));
  DataShape shape;
  shape.input = per_sample(sample.inputs);
  shape.input_dtype = sample.inputs.scalar_type();
  shape.target = per_sample(sample.targets);
  shape.target_dtype = sample.targets.scalar_type();
  shape.task = torch::isFloatingType(shape.target_dtype) ? "regression" : "classification";
  return shape;
}

Batch BatchSource::largest_batch(int64_t batch_size) const {
  return first_samples(*this, batch_size);
}

std::unique_ptr<ResidentBatches> BatchSource::make_resident(torch::Device device) const {
  FT_CONFIG_FAIL("data.device_resident: {} cannot build its batches on {}; set data.device_resident = false",
                 describe(), device.str());
}

ImageBatchSource::ImageBatchSource(ImageDataset dataset, TransformPipeline pipeline)
    : dataset_(std::move(dataset)), pipeline_(std::move(pipeline)) {
  FT_CHECK(dataset_.images.defined() && dataset_.images.dim() == 4 &&
               dataset_.images.scalar_type() == torch::kUInt8,
           "ImageBatchSource needs uint8 images [N, C, H, W]");
  FT_CHECK(
      dataset_.labels.defined() && dataset_.labels.dim() == 1 && dataset_.labels.size(0) == dataset_.size(),
      "ImageBatchSource needs one label per image: {} images, {} labels", dataset_.size(),
      dataset_.labels.defined() ? dataset_.labels.size(0) : 0);
  FT_CHECK(dataset_.size() > 0, "ImageBatchSource: the dataset is empty");
  pipeline_.check_channels(dataset_.channels());
  // Workers read raw pointers: make the storage contiguous, CPU, and of the types they assume.
  dataset_.images = dataset_.images.to(torch::kCPU).contiguous();
  dataset_.labels = dataset_.labels.to(torch::kCPU, torch::kInt64).contiguous();
}

DataShape ImageBatchSource::shape() const {
  return DataShape::images(dataset_.channels(), dataset_.height(), dataset_.width(), dataset_.num_classes);
}

std::string ImageBatchSource::describe() const {
  return fmt::format("{} images of {}x{}x{}", dataset_.size(), dataset_.channels(), dataset_.height(),
                     dataset_.width());
}

int64_t ImageBatchSource::resident_bytes() const {
  if (!pipeline_.maps_pixels()) return 0;
  // What ResidentImageBatches holds: uint8 pixels and a zero pixel each when augmented, else fp32.
  const int64_t images = pipeline_.has_augmentations()
                             ? dataset_.images.numel() + dataset_.size() * dataset_.channels()
                             : dataset_.images.numel() * static_cast<int64_t>(sizeof(float));
  return images + dataset_.labels.numel() * static_cast<int64_t>(sizeof(int64_t));
}

std::unique_ptr<ResidentBatches> ImageBatchSource::make_resident(torch::Device device) const {
  return std::make_unique<ResidentImageBatches>(dataset_, pipeline_, device);
}

Batch ImageBatchSource::build(const BatchRequest& request) const {
  const int64_t count = request.count;
  const SampleShape shape{dataset_.channels(), dataset_.height(), dataset_.width()};
  const int64_t numel = shape.numel();

  // Staging in pinned (page-locked) memory lets the host-to-device copy run asynchronously.
  Batch batch;
  batch.count = count;
  const auto layout =
      request.channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  batch.inputs =
      torch::empty({count, shape.channels, shape.height, shape.width},
                   torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(request.pinned), layout);
  batch.targets =
      torch::empty({count}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(request.pinned));

  // Plain loops over raw pointers: no torch op runs here, so workers never touch the intra-op pool.
  const uint8_t* images = dataset_.images.data_ptr<uint8_t>();
  const int64_t* labels = dataset_.labels.data_ptr<int64_t>();
  float* inputs = batch.inputs.data_ptr<float>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  // The pipeline writes [C, H, W]; for NHWC with several channels it goes through a scratch sample
  // and is interleaved. With one channel both layouts are the same bytes.
  const bool interleave = request.channels_last && shape.channels > 1;
  const int64_t plane = shape.height * shape.width;
  std::vector<float> scratch(interleave ? numel : 0);
  for (int64_t i = 0; i < count; ++i) {
    if (request.abandoned()) return batch;
    const int64_t sample = request.samples[i];
    float* out = interleave ? scratch.data() : inputs + i * numel;
    pipeline_.apply(
        images + sample * numel, shape, out,
        SampleRng(request.seed, static_cast<uint64_t>(request.epoch), static_cast<uint64_t>(sample)));
    if (interleave) {
      float* nhwc = inputs + i * numel;  // [H, W, C]
      for (int64_t c = 0; c < shape.channels; ++c) {
        for (int64_t p = 0; p < plane; ++p) nhwc[p * shape.channels + c] = scratch[c * plane + p];
      }
    }
    targets[i] = labels[sample];
  }
  return batch;
}

}  // namespace fasttrain
