#pragma once
// BatchSource: what a DataLoader loads from. A source knows its samples (images, token windows,
// documents) and how to build one batch of them; the loader owns everything else (the epoch's
// order, sharding over ranks, worker threads, prefetching, delivery in order, device copies).
//
//   auto source = std::make_shared<fasttrain::ImageBatchSource>(splits.train, pipeline);
//   fasttrain::DataLoader loader(source, fasttrain::LoaderOptions(256));
//
// Sources in fasttrain: ImageBatchSource (image classification), and in data/text.h
// TextWindowSource (random fixed-length windows) and TextDocumentSource (whole documents, batched
// by token count with length bucketing). A source may group its samples into batches itself
// (batch_plan: token-count buckets); otherwise the loader slices its sample order by batch_size.
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/data/dataset.h"
#include "fasttrain/data/transforms.h"

namespace fasttrain {

struct Batch {
  torch::Tensor inputs;   // images [B, C, H, W] float32, or tokens [B, T] int64
  torch::Tensor targets;  // [B] int64 labels, or [B * T] next tokens (kIgnoreTarget on padding)
  int64_t epoch = 0;      // set by the loader
  int64_t index = 0;      // batch index within the epoch, set by the loader
  // What the run counts as samples (samples/s, samples seen): images, or target tokens that are
  // not padding. Known when the batch is built: counting it never reads the device.
  int64_t count = 0;
  // Some targets are padding (kIgnoreTarget): the loss averages over the others only.
  bool padded = false;
};

// The target value a loss ignores (padding), as torch's cross_entropy's default ignore_index.
constexpr int64_t kIgnoreTarget = -100;

// What build() gets: the batch's samples, in order, and how to lay it out.
struct BatchRequest {
  const int64_t* samples = nullptr;
  int64_t count = 0;
  int64_t epoch = 0;
  uint64_t seed = 0;
  bool shuffle = true;         // random augmentation and window positions; off: deterministic
  bool pinned = false;         // allocate in pinned memory (CUDA staging)
  bool channels_last = false;  // images: NHWC
  // True once the loader abandoned this batch (epoch restarted, loader stopping): a source polls it
  // between samples and returns early; whatever it returns is then dropped.
  std::function<bool()> abandoned = [] { return false; };
};

// The batches of an epoch as sample lists: batch b is samples[starts[b], starts[b + 1]).
struct EpochPlan {
  std::vector<int64_t> samples;
  std::vector<int64_t> starts{0};

  int64_t batches() const { return static_cast<int64_t>(starts.size()) - 1; }
  void add_batch(const int64_t* first, int64_t count);
};

// Batches built on a device from a copy of a source's samples held there (data/device_resident.h).
class ResidentBatches {
 public:
  virtual ~ResidentBatches() = default;
  // The epoch's sample order, copied to the device once, so that build() slices it for requests whose
  // samples point into `plan` instead of copying each batch's indices over. The loader calls it at
  // each start_epoch; requests from elsewhere are copied as they come.
  virtual void start_epoch(const EpochPlan& plan) = 0;
  // The batch of request.samples, built on the device by torch ops on the caller's thread and
  // current stream (request.pinned is ignored: nothing is staged).
  virtual Batch build(const BatchRequest& request) const = 0;
  // Device memory the copy holds.
  virtual int64_t bytes() const = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Samples in the source; at least 1.
  virtual int64_t size() const = 0;
  // Builds the batch of request.samples. Runs on loader worker threads, several at once: it must
  // only read the source, and use no torch operator (raw loops only: workers stay off the intra-op
  // pool that the trainer computes on).
  virtual Batch build(const BatchRequest& request) const = 0;
  // The epoch's batches, when the source groups samples itself; the number of batches must be the
  // same every epoch (schedules and resumes count on it). nullopt: the loader slices its order.
  virtual std::optional<EpochPlan> batch_plan(int64_t epoch, bool shuffle, uint64_t seed) const;
  // Whether every full batch has the same shape (images, fixed windows); false where the shape
  // follows the samples (documents padded to the longest). A CUDA-graph step needs fixed shapes.
  virtual bool fixed_shape() const { return true; }
  // Bytes a copy of the samples on a device would take, or 0 when this source cannot build batches
  // there (then make_resident fails).
  virtual int64_t resident_bytes() const { return 0; }
  // A copy of the samples on `device` that builds the same batches there (data.device_resident).
  virtual std::unique_ptr<ResidentBatches> make_resident(torch::Device device) const;
  // Bytes of raw text per target (1 for byte-level text), or 0 when targets are not text: then
  // evaluation reports no bits per byte.
  virtual double bytes_per_target() const { return 0; }
  // One line for logs: what the samples are.
  virtual std::string describe() const = 0;
};

// Image classification: each sample is transformed by the pipeline (keyed on seed, epoch and the
// sample's index: the same for any worker count) and collated into [B, C, H, W] float32.
class ImageBatchSource : public BatchSource {
 public:
  // Checks the dataset (uint8 [N, C, H, W], one int64 label per image, not empty) and that the
  // pipeline's normalisation has one entry per channel.
  ImageBatchSource(ImageDataset dataset, TransformPipeline pipeline);

  int64_t size() const override { return dataset_.size(); }
  Batch build(const BatchRequest& request) const override;
  int64_t resident_bytes() const override;
  std::unique_ptr<ResidentBatches> make_resident(torch::Device device) const override;
  std::string describe() const override;
  const ImageDataset& dataset() const { return dataset_; }

 private:
  ImageDataset dataset_;
  TransformPipeline pipeline_;
};

}  // namespace fasttrain
