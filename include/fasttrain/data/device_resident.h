#pragma once
// Device-resident data (data.device_resident): a dataset small next to the device's memory is
// copied there once (Fashion-MNIST's 60k training images are 47 MB), and each batch is gathered,
// augmented and normalised there, by a few kernels on the caller's stream, instead of being built
// by loader threads in pinned host memory and copied over. The DataLoader keeps the rest: the epoch
// order, sharding over ranks and delivery; only the build moves (data/loader.h).
//
// The batches are those the host would build, value for value: the order is the loader's, each
// sample's augmentation is drawn on the host from the same SampleRng as data/transforms.h and handed
// to the device as a PixelMap (which source pixel lands where), and normalisation is the pipeline's
// own byte -> float table.
//
//   auto resident = source.make_resident(torch::kCUDA);   // one copy of the samples on the GPU
//   Batch batch = resident->build(request);               // [B, C, H, W] float on the GPU
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "fasttrain/data/batch_source.h"

namespace fasttrain {

// What every resident source shares: its device, and a request's samples as indices there.
class ResidentSamples : public ResidentBatches {
 public:
  explicit ResidentSamples(torch::Device device) : device_(device) {}
  void start_epoch(const EpochPlan& plan) override;

 protected:
  // `count` int64 values as a tensor on the device (through pinned memory on CUDA).
  torch::Tensor to_device(const int64_t* values, int64_t count) const;
  // The request's samples on the device: a slice of the epoch's order when they lie in it.
  torch::Tensor sample_indices(const BatchRequest& request) const;

  torch::Device device_;

 private:
  // The epoch's order on the device (start_epoch) and the host range it was copied from.
  torch::Tensor plan_indices_;
  const int64_t* plan_begin_ = nullptr;
  const int64_t* plan_end_ = nullptr;
};

// Named tensors (a TensorSource's) held on a device: a batch is one index_select of each, 4-d ones in
// channels_last when the request asks.
class ResidentTensorBatches : public ResidentSamples {
 public:
  ResidentTensorBatches(const std::map<std::string, torch::Tensor>& tensors, torch::Device device);
  Batch build(const BatchRequest& request) const override;
  int64_t bytes() const override { return bytes_; }

 private:
  std::map<std::string, torch::Tensor> tensors_;
  int64_t bytes_ = 0;
};

// Image batches built on a device from a copy of an ImageDataset held there.
class ResidentImageBatches : public ResidentSamples {
 public:
  // Copies the images and labels to `device`; every augmentation of `pipeline` must have a PixelMap
  // form (an Error names the one that has not).
  ResidentImageBatches(const ImageDataset& dataset, const TransformPipeline& pipeline, torch::Device device);
  Batch build(const BatchRequest& request) const override;
  // What each batch gathers from: the normalised images [N, C, H, W], or where augmented the pixels
  // [N, C, H * W + 1] (uint8, a zero pixel last).
  const torch::Tensor& images() const { return images_; }
  int64_t bytes() const override { return bytes_; }

 private:
  // [B, C, P] uint8 pixels -> their normalised float values (the pipeline's table).
  torch::Tensor normalise(const torch::Tensor& pixels) const;
  // [B, H * W] flat source pixel of each output pixel (H * W: the zero pixel), drawn on the host.
  torch::Tensor pixel_sources(const BatchRequest& request) const;

  TransformPipeline pipeline_;
  SampleShape shape_;
  bool augmented_;
  // Augmented: [N, C, H * W + 1] uint8 (the last pixel 0: crop padding), normalised per batch through
  // table_ ([C or 1, 256] float, the pipeline's) after the gather. Otherwise: [N, C, H, W] float,
  // normalised once here, so a batch is one index_select.
  torch::Tensor images_;
  torch::Tensor labels_;  // [N] int64
  torch::Tensor table_;
  torch::Tensor channel_offset_;  // [1, C, 1] int64: c * 256 where each channel has its own table
  int64_t bytes_ = 0;
};

// What a resident copy of a run's data would be: its bytes (0: the source cannot build batches on a
// device), and whether each batch is then a gather of rows and nothing more (BatchSource's
// resident_batches_are_gathers).
struct ResidentData {
  int64_t bytes = 0;
  bool gathers = false;
};

// The memory a resident copy would take a share of, and what to call it ("cuda:0's memory", "the host's
// memory", "memory.budget"); bytes 0 where unknown.
struct DeviceMemory {
  int64_t bytes = 0;
  std::string name;
};

// data.device_resident ("auto" | "true" | "false") for a run on `device`: whether batches are built
// there, and why. "auto" keeps a data set resident where it takes at most 1/10 of `memory`: on a CUDA
// device whatever a batch's work, on a CPU only where a batch is then a gather (normalised once at load
// instead of on the step's thread every batch; augmentations stay with the loader, whose threads run
// them beside the step). "true" where it cannot be is a ConfigError.
struct ResidencyChoice {
  bool resident = false;
  std::string reason;
};
ResidencyChoice choose_residency(const std::string& setting, const torch::Device& device,
                                 const ResidentData& data, const DeviceMemory& memory);

}  // namespace fasttrain
