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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/data/dataset.h"
#include "fasttrain/data/transforms.h"

namespace fasttrain {

// One batch: named tensors, each with the samples along its first dimension (or, for text targets,
// flattened [B * T]). `inputs` and `targets` are what the built-in models and tasks read; a source adds
// any others it has (a mask, a second input, per-sample weights) to `fields`, and the loader pins,
// copies and prefetches them alike.
struct Batch {
  Batch() = default;
  // A batch of inputs.size(0) samples (count set; a token batch's count is its target tokens instead).
  Batch(torch::Tensor inputs, torch::Tensor targets);

  torch::Tensor inputs;   // images [B, C, H, W] float32, tokens [B, T] int64, features [B, F] float32
  torch::Tensor targets;  // [B] int64 labels, [B * T] next tokens (kIgnoreTarget on padding), [B, K] values
  std::map<std::string, torch::Tensor> fields;
  int64_t epoch = 0;  // set by the loader
  int64_t index = 0;  // batch index within the epoch, set by the loader
  // What the run counts as samples (samples/s, samples seen): images, rows, or target tokens that are
  // not padding. Known when the batch is built: counting it never reads the device.
  int64_t count = 0;
  // Some targets are padding (kIgnoreTarget): a loss averages over the others only.
  bool padded = false;

  // "inputs", "targets" or a field; an Error naming the batch's tensors when there is none.
  const torch::Tensor& at(const std::string& name) const;
  bool has(const std::string& name) const;
  // Sets "inputs", "targets" or the field `name`.
  void set(const std::string& name, torch::Tensor tensor);
  // "inputs", "targets" (when defined), then the fields in name order.
  std::vector<std::string> names() const;
  // The same batch with every tensor through `fn` (a copy to a device, a clone).
  Batch map(const std::function<torch::Tensor(const torch::Tensor&)>& fn) const;
  // Copies `other`'s tensors into this batch's, name by name (a captured step's input buffers); the
  // names and shapes must match (an Error names the first that does not).
  void copy_from(const Batch& other, bool non_blocking);
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

// What one sample of a source is. The built-in models take their input size and output count from it;
// task.name = "auto" takes `task`.
struct DataShape {
  std::vector<int64_t> input;                     // one sample's inputs: [C, H, W], [T] tokens, [F] features
  torch::ScalarType input_dtype = torch::kFloat;  // kLong: token ids in [0, vocabulary)
  int64_t vocabulary = 0;
  std::vector<int64_t> target;                    // one sample's targets: [] a class, [T] tokens, [K] values
  torch::ScalarType target_dtype = torch::kLong;  // kLong: class ids in [0, classes); kFloat: values
  int64_t classes = 0;                            // 0: not class ids, or not known
  double bytes_per_target = 0;                    // text: raw bytes per target (bits per byte); 0: not text
  std::string task;  // the task the samples are for: "classification", "language_modeling", ...
  // "inputs [1, 28, 28] Float, targets [] Long in 10 classes"
  std::string describe() const;

  // Images [C, H, W] with a class label each; token sequences of up to `context` over `vocabulary`
  // tokens, each predicting the next (byte-level text: vocabulary 256, one byte per target).
  static DataShape images(int64_t channels, int64_t height, int64_t width, int64_t classes);
  static DataShape tokens(int64_t context, int64_t vocabulary);
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
  // Whether a resident copy builds each batch by gathering its samples' rows and nothing more: what makes
  // "auto" keep the data resident on a CPU. False unless the source says so: a source of its own that
  // augments on the device keeps its CPU runs with the loader's threads.
  virtual bool resident_batches_are_gathers() const { return false; }
  // A copy of the samples on `device` that builds the same batches there (data.device_resident).
  virtual std::unique_ptr<ResidentBatches> make_resident(torch::Device device) const;
  // What one sample is (input and target shapes and types, classes, the task it is for): what a model
  // is built for and a task checks. The default builds sample 0 and reads its shapes: integer targets
  // are taken for classification (classes unknown, 0), float targets for regression.
  virtual DataShape shape() const;
  // A batch of the largest shape this source builds at `batch_size` (what memory.warmup runs): the
  // default builds samples 0 .. batch_size - 1, which suits sources of one sample shape.
  virtual Batch largest_batch(int64_t batch_size) const;
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
  DataShape shape() const override;
  int64_t resident_bytes() const override;
  bool resident_batches_are_gathers() const override { return !pipeline_.has_augmentations(); }
  std::unique_ptr<ResidentBatches> make_resident(torch::Device device) const override;
  std::string describe() const override;
  const ImageDataset& dataset() const { return dataset_; }

 private:
  ImageDataset dataset_;
  TransformPipeline pipeline_;
};

}  // namespace fasttrain
