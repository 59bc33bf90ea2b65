#pragma once
// DataLoader: worker threads build whole batches from a BatchSource (images, token windows,
// documents; data/batch_source.h) ahead of the trainer into a bounded queue; batches come out in
// order. On CUDA the batch is built in pinned memory and copied with non_blocking.
//
//   fasttrain::DataLoader loader(splits.train, pipeline,
//                                fasttrain::LoaderOptions(256).workers(2).shuffle(true).seed(7));
//   loader.start_epoch(0);
//   while (auto batch = loader.next()) { ... batch->inputs ... }   // [B, C, H, W] float32
//   double waited = loader.wait_seconds();
//
// Shuffling and augmentation are keyed on (seed, epoch, sample index): the batches are identical
// for any worker count. An exception in a worker is rethrown by next().
#include <torch/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"

namespace fasttrain {

// Workers that keep the trainer fed without taking cores from compute, when `processes_sharing`
// processes (the ranks of a job on this machine) share the hardware threads: data.workers = "auto".
int auto_worker_count(int processes_sharing = 1);

// The loader's options; prefetch, shuffle, drop_last and pin_memory are also keys of [data].
struct LoaderOptions {
  FT_KEYS(LoaderOptions);
  explicit LoaderOptions(int64_t batch_size = 1) : batch_size_(batch_size) {}
  FT_ARG(int64_t, batch_size);
  // Worker threads building batches ahead of the trainer; 0 = build them in the caller's thread.
  FT_ARG(int, workers) = auto_worker_count();
  FT_KEY(
      int, prefetch,
      "Batches kept ready ahead of the step (bounded queue); give at least the workers, so that each has a "
      "batch to build",
      at_least(1), KeyTrait::kNeutral) = 4;
  FT_KEY(bool, shuffle, "Shuffle the training set each epoch (order keyed on seed and epoch)") = true;
  FT_KEY(bool, drop_last, "Drop the last incomplete training batch of each epoch") = true;
  FT_KEY(bool, pin_memory, "On CUDA, build batches in pinned memory and copy them non_blocking",
         KeyTrait::kNeutral) = true;
  FT_ARG(uint64_t, seed) = 0;
  // Where batches are delivered; on CUDA they are staged in pinned memory when pin_memory is set.
  FT_ARG(torch::Device, device) = torch::kCPU;
  // Data parallel sharding, as PyTorch's DistributedSampler: the epoch's order (the same on every
  // rank) is dealt out so that rank r takes its samples r, r + world_size, r + 2 world_size, ...
  // With even_shards (training: ranks must step together) the order is first padded by repeating
  // its start to a multiple of world_size; without (evaluation) every sample is seen exactly once
  // and the shards differ by at most one.
  FT_ARG(int64_t, rank) = 0;
  FT_ARG(int64_t, world_size) = 1;
  FT_ARG(bool, even_shards) = true;
  // Build batches on `device` from a copy of the source's samples held there, in the caller's thread
  // (data/device_resident.h): no workers, no pinned staging, no copies per batch. The batches are
  // those the workers would build. An error where the source cannot (text).
  FT_ARG(bool, device_resident) = false;
  // Deliver inputs in channels_last (NHWC) layout, written so by the workers, for conv models
  // whose kernels run faster on it (mkldnn on CPU, tensor cores on GPU).
  FT_ARG(bool, channels_last) = false;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const BatchSource> source, LoaderOptions options);
  // Image classification: an ImageBatchSource over `dataset` and `pipeline`.
  DataLoader(ImageDataset dataset, TransformPipeline pipeline, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts producing batches of `epoch`, beginning at batch `first_batch` (for resuming).
  // Abandons whatever is left of the previous epoch.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the current epoch, nullopt at its end. Rethrows a worker's exception when it
  // reaches the batch that threw (the batches before it are delivered), and again on every call
  // until the next start_epoch.
  std::optional<Batch> next();

  int64_t batches_per_epoch() const;
  // Whether the source groups its samples into batches itself (batch_plan: token buckets), so that
  // batch_size does not decide them.
  bool source_batched() const { return planned_batches_ >= 0; }
  // Whether every batch of an epoch has the same shape: a fixed-shape source, and no last short
  // batch (drop_last, or an epoch that divides into whole batches).
  bool fixed_batch_shape() const;
  // Samples this loader delivers per epoch: the source's, or this rank's shard of them.
  int64_t samples_per_epoch() const;
  const BatchSource& source() const { return *source_; }
  const LoaderOptions& options() const { return options_; }
  int workers() const { return workers_; }
  // The samples' copy on the device (device_resident), or null.
  const ResidentBatches* resident() const { return resident_.get(); }
  // Seconds the caller spent blocked in next() since construction (with workers = 0: building).
  double wait_seconds() const { return wait_seconds_; }
  // Seconds next() spent issuing the copies to a non-CPU device (asynchronous from pinned memory).
  double copy_seconds() const { return copy_seconds_; }

  // The samples of `epoch` in delivery order, this rank's shard only: a pure function of (seed,
  // epoch, rank, world_size). The source's order is a permutation when shuffling; sources that
  // group samples into batches themselves (token-count buckets) have their batches dealt to ranks
  // whole, batch b to rank b mod world_size.
  std::vector<int64_t> epoch_order(int64_t epoch) const { return epoch_plan(epoch).samples; }
  // This rank's batches of `epoch`.
  EpochPlan epoch_plan(int64_t epoch) const;

 private:
  struct Impl;
  // The indices of n units (samples, or a source's batches) this rank gets: every world_size-th
  // from its rank, wrapping round to the first ones when ranks must step together (even_shards).
  std::vector<int64_t> rank_share(int64_t n) const;
  // This rank's batches of a source's plan of the whole epoch.
  EpochPlan shard_of(EpochPlan whole) const;
  // Builds batch `index` of `plan`; returns nullopt when the loader's generation moved on from
  // `generation` meanwhile (the batch was abandoned).
  std::optional<Batch> build_batch(int64_t epoch, int64_t index, const EpochPlan& plan,
                                   uint64_t generation) const;
  void worker_loop();
  void shutdown();  // stops and joins the workers

  std::shared_ptr<const BatchSource> source_;
  LoaderOptions options_;
  // Sources with their own batch plan: its batch and sample counts (every epoch the same).
  int64_t planned_batches_ = -1;
  int64_t planned_samples_ = -1;
  int workers_ = 0;
  double wait_seconds_ = 0;
  double copy_seconds_ = 0;
  std::unique_ptr<ResidentBatches> resident_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fasttrain
