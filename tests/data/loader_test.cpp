// DataLoader: determinism across worker counts, epoch coverage, resuming, errors, shutdown, waiting.
#include "fasttrain/data/loader.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "data/data_test_util.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;

// N samples of [1, 6, 7]; sample i's label is i, so targets tell which samples a batch holds.
ImageDataset make_dataset(int64_t n, int64_t channels = 1) {
  ImageDataset dataset;
  dataset.images = torch::empty({n, channels, 6, 7}, torch::kUInt8);
  uint8_t* p = dataset.images.data_ptr<uint8_t>();
  for (int64_t i = 0; i < dataset.images.numel(); ++i) p[i] = static_cast<uint8_t>((i * 37 + i / 42) % 256);
  dataset.labels = torch::arange(n, torch::kInt64);
  dataset.num_classes = n;
  return dataset;
}

TransformPipeline augmented() {
  return TransformPipeline({0.25f}, {0.5f})
      .add(std::make_shared<RandomCrop>(2))
      .add(std::make_shared<HorizontalFlip>());
}

struct Collected {
  std::vector<torch::Tensor> inputs;
  std::vector<torch::Tensor> targets;
};

Collected run_epoch(DataLoader& loader, int64_t epoch, int64_t first_batch = 0) {
  Collected out;
  loader.start_epoch(epoch, first_batch);
  int64_t expected_index = first_batch;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->epoch, epoch);
    EXPECT_EQ(batch->index, expected_index++);
    EXPECT_EQ(batch->inputs.scalar_type(), torch::kFloat32);
    EXPECT_EQ(batch->targets.scalar_type(), torch::kInt64);
    EXPECT_TRUE(batch->inputs.is_contiguous(loader.options().channels_last()
                                                ? torch::MemoryFormat::ChannelsLast
                                                : torch::MemoryFormat::Contiguous));
    out.inputs.push_back(batch->inputs);
    out.targets.push_back(batch->targets);
  }
  EXPECT_EQ(expected_index, loader.batches_per_epoch());
  EXPECT_FALSE(loader.next().has_value());  // stays at the end
  return out;
}

void expect_identical(const Collected& a, const Collected& b, const std::string& what) {
  ASSERT_EQ(a.inputs.size(), b.inputs.size()) << what;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    // Bitwise: equal values and shapes, no tolerance.
    EXPECT_TRUE(torch::equal(a.inputs[i], b.inputs[i])) << what << ": inputs of batch " << i;
    EXPECT_TRUE(torch::equal(a.targets[i], b.targets[i])) << what << ": targets of batch " << i;
  }
}

// Sleeps in the worker: makes the consumer outpace the loader.
class SlowAugmentation : public Augmentation {
 public:
  explicit SlowAugmentation(std::chrono::microseconds delay) : delay_(delay) {}
  void apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng&) const override {
    std::this_thread::sleep_for(delay_);
    std::memcpy(out, in, shape.numel());
  }
  bool pixel_map(const SampleShape&, SampleRng&, PixelMap&) const override { return false; }  // host only
  std::string describe() const override { return "Slow"; }

 private:
  std::chrono::microseconds delay_;
};

// Throws on the sample whose first byte is `marker`.
class ThrowingAugmentation : public Augmentation {
 public:
  explicit ThrowingAugmentation(uint8_t marker) : marker_(marker) {}
  void apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng&) const override {
    FT_CHECK(in[0] != marker_, "augmentation failed on marker {}", marker_);
    std::memcpy(out, in, shape.numel());
  }
  bool pixel_map(const SampleShape&, SampleRng&, PixelMap&) const override { return false; }  // host only
  std::string describe() const override { return "Throwing"; }

 private:
  uint8_t marker_;
};

// A captured step copies each batch into its input buffers: same names, shapes and dtypes, or an error
// naming the tensor (copy_ would convert a dtype silently: float pixels into uint8 buffers, say).
TEST(Batch, CopyFromTakesTheSameShapesAndDtypesOrNamesTheTensor) {
  Batch into{torch::zeros({2, 3}), torch::zeros({2}, torch::kLong)};
  into.copy_from(Batch{torch::ones({2, 3}), torch::ones({2}, torch::kLong)}, false);
  EXPECT_TRUE(torch::equal(into.inputs, torch::ones({2, 3})));
  EXPECT_TRUE(contains_all(error_message([&] {
                             into.copy_from(Batch{torch::ones({2, 3}), torch::ones({2})}, false);
                           }),
                           {"batch tensor 'targets'", "Long", "Float"}));
  EXPECT_TRUE(
      contains_all(error_message([&] {
                     into.copy_from(Batch{torch::ones({2, 4}), torch::ones({2}, torch::kLong)}, false);
                   }),
                   {"batch tensor 'inputs'", "[2, 3]", "[2, 4]"}));
}

TEST(DataLoader, IdenticalBatchesForAnyWorkerCount) {
  const ImageDataset dataset = make_dataset(103);
  std::vector<std::vector<Collected>> runs;
  for (int workers : {0, 1, 2, 4}) {
    DataLoader loader(dataset, augmented(),
                      LoaderOptions(10).workers(workers).prefetch(3).shuffle(true).drop_last(false).seed(42));
    EXPECT_EQ(loader.workers(), workers);
    runs.push_back({run_epoch(loader, 0), run_epoch(loader, 1)});
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    expect_identical(runs[0][0], runs[r][0], "epoch 0, run " + std::to_string(r));
    expect_identical(runs[0][1], runs[r][1], "epoch 1, run " + std::to_string(r));
  }
  // The two epochs differ in order (and so in augmentation too).
  EXPECT_FALSE(torch::equal(runs[0][0].targets[0], runs[0][1].targets[0]));
}

TEST(DataLoader, ChannelsLastBatchesHoldTheSameValues) {
  for (int64_t channels : {1, 3}) {
    const ImageDataset dataset = make_dataset(30, channels);
    auto pipeline = [&] {
      return TransformPipeline(std::vector<float>(channels, 0.25f), std::vector<float>(channels, 0.5f))
          .add(std::make_shared<RandomCrop>(2))
          .add(std::make_shared<HorizontalFlip>());
    };
    DataLoader nchw(dataset, pipeline(), LoaderOptions(8).workers(1).seed(5));
    DataLoader nhwc(dataset, pipeline(), LoaderOptions(8).workers(2).seed(5).channels_last(true));
    auto a = run_epoch(nchw, 0), b = run_epoch(nhwc, 0);
    ASSERT_EQ(a.inputs.size(), b.inputs.size());
    for (size_t i = 0; i < a.inputs.size(); ++i) {
      EXPECT_TRUE(b.inputs[i].is_contiguous(torch::MemoryFormat::ChannelsLast)) << "channels " << channels;
      EXPECT_TRUE(torch::equal(a.inputs[i], b.inputs[i])) << "channels " << channels << ", batch " << i;
    }
  }
}

TEST(DataLoader, BatchesHoldTheTransformedSamples) {
  const ImageDataset dataset = make_dataset(40);
  const TransformPipeline pipeline = augmented();
  DataLoader loader(dataset, pipeline, LoaderOptions(8).workers(2).seed(3));
  loader.start_epoch(5);
  const SampleShape shape{1, 6, 7};
  std::vector<float> expected(shape.numel());
  while (auto batch = loader.next()) {
    for (int64_t i = 0; i < batch->targets.size(0); ++i) {
      const int64_t sample = batch->targets[i].item<int64_t>();
      pipeline.apply(dataset.images[sample].data_ptr<uint8_t>(), shape, expected.data(),
                     SampleRng(3, 5, sample));
      const torch::Tensor want = torch::from_blob(expected.data(), {1, 6, 7}, torch::kFloat32);
      ASSERT_TRUE(torch::equal(batch->inputs[i], want)) << "batch " << batch->index << " position " << i;
    }
  }
}

TEST(DataLoader, EpochOrderIsAPureFunctionOfSeedAndEpoch) {
  const ImageDataset dataset = make_dataset(50);
  DataLoader loader(dataset, augmented(), LoaderOptions(5).workers(0).seed(1));
  DataLoader same(dataset, augmented(), LoaderOptions(5).workers(2).seed(1));
  DataLoader other_seed(dataset, augmented(), LoaderOptions(5).workers(0).seed(2));
  const auto order0 = loader.epoch_order(0);
  EXPECT_EQ(order0, loader.epoch_order(0));
  EXPECT_EQ(order0, same.epoch_order(0));
  EXPECT_NE(order0, loader.epoch_order(1));
  EXPECT_NE(order0, other_seed.epoch_order(0));
  auto sorted = order0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(order0, identity);
  DataLoader sequential(dataset, augmented(), LoaderOptions(5).workers(0).shuffle(false));
  EXPECT_EQ(sequential.epoch_order(3), identity);
}

TEST(DataLoader, EverySampleOncePerEpochWithAPartialLastBatch) {
  const ImageDataset dataset = make_dataset(103);
  for (int workers : {0, 3}) {
    DataLoader loader(dataset, augmented(), LoaderOptions(10).workers(workers).drop_last(false).seed(9));
    EXPECT_EQ(loader.batches_per_epoch(), 11);
    for (int64_t epoch : {0, 1}) {
      const Collected run = run_epoch(loader, epoch);
      ASSERT_EQ(run.targets.size(), 11u);
      for (size_t b = 0; b < 10; ++b) EXPECT_EQ(run.targets[b].size(0), 10);
      EXPECT_EQ(run.targets[10].size(0), 3);
      EXPECT_EQ(run.inputs[10].sizes(), (std::vector<int64_t>{3, 1, 6, 7}));
      const torch::Tensor all = std::get<0>(torch::sort(torch::cat(run.targets)));
      EXPECT_TRUE(torch::equal(all, torch::arange(103, torch::kInt64))) << "workers " << workers;
    }
  }
}

TEST(DataLoader, DropLastDropsThePartialBatch) {
  const ImageDataset dataset = make_dataset(103);
  DataLoader loader(dataset, augmented(), LoaderOptions(10).workers(2).drop_last(true).seed(9));
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  const Collected run = run_epoch(loader, 0);
  ASSERT_EQ(run.targets.size(), 10u);
  for (const auto& t : run.targets) EXPECT_EQ(t.size(0), 10);
  const torch::Tensor all = torch::cat(run.targets);
  EXPECT_EQ(std::get<0>(torch::_unique(all)).size(0), 100);  // 100 distinct samples
  // Without shuffling the dropped samples are the last three.
  DataLoader sequential(dataset, augmented(), LoaderOptions(10).workers(1).shuffle(false).drop_last(true));
  const Collected seq = run_epoch(sequential, 0);
  EXPECT_TRUE(torch::equal(torch::cat(seq.targets), torch::arange(100, torch::kInt64)));
}

TEST(DataLoader, BatchLargerThanTheDatasetWithoutDropLastIsOneBatch) {
  const ImageDataset dataset = make_dataset(7);
  DataLoader loader(dataset, augmented(), LoaderOptions(64).workers(1).drop_last(false));
  EXPECT_EQ(loader.batches_per_epoch(), 1);
  const Collected run = run_epoch(loader, 0);
  ASSERT_EQ(run.targets.size(), 1u);
  EXPECT_EQ(run.targets[0].size(0), 7);
}

TEST(DataLoader, StartEpochResumesMidEpochExactly) {
  const ImageDataset dataset = make_dataset(90);
  for (int workers : {0, 2}) {
    DataLoader straight(dataset, augmented(), LoaderOptions(8).workers(workers).seed(5));
    const Collected full = run_epoch(straight, 2);
    ASSERT_EQ(full.inputs.size(), 11u);

    DataLoader resumed(dataset, augmented(), LoaderOptions(8).workers(workers).seed(5));
    // Take a little of another epoch first, then abandon it for the resume.
    resumed.start_epoch(0);
    ASSERT_TRUE(resumed.next().has_value());
    const Collected tail = run_epoch(resumed, 2, 4);
    ASSERT_EQ(tail.inputs.size(), 7u);
    for (size_t k = 0; k < tail.inputs.size(); ++k) {
      EXPECT_TRUE(torch::equal(tail.inputs[k], full.inputs[k + 4]))
          << "workers " << workers << " batch " << k + 4;
      EXPECT_TRUE(torch::equal(tail.targets[k], full.targets[k + 4]));
    }
    // Starting at the end gives an empty epoch; beyond it is an error.
    resumed.start_epoch(1, resumed.batches_per_epoch());
    EXPECT_FALSE(resumed.next().has_value());
    EXPECT_TRUE(
        contains_all(error_message([&] { resumed.start_epoch(1, 12); }), {"first_batch", "[0, 11]", "12"}));
  }
}

// A program's source that forgets Batch::count: its first batch is an error naming the source, not zero
// samples counted in samples/s. Batch(inputs, targets) counts the rows itself.
struct CountlessRows : BatchSource {
  int64_t size() const override { return 8; }
  Batch build(const BatchRequest& request) const override {
    Batch batch;
    batch.inputs = torch::zeros({request.count, 2});
    return batch;
  }
  std::string describe() const override { return "countless rows"; }
};

TEST(DataLoader, ABatchWithoutItsCountIsAnErrorNamingTheSource) {
  for (int workers : {0, 1}) {
    DataLoader loader(std::make_shared<CountlessRows>(), LoaderOptions(4).workers(workers));
    loader.start_epoch(0);
    EXPECT_TRUE(contains_all(error_message([&] { loader.next(); }),
                             {"countless rows", "Batch::count = 0", "4 samples"}));
  }
  EXPECT_EQ(Batch(torch::zeros({5, 3}), torch::zeros({5})).count, 5);
}

TEST(DataLoader, WorkerExceptionIsRethrownByNextInOrder) {
  ImageDataset dataset = make_dataset(40);
  // Sample 17 (batch 3 of 5 when not shuffled) carries the marker; no other sample starts with it.
  uint8_t* images = dataset.images.data_ptr<uint8_t>();
  for (int64_t i = 0; i < 40; ++i) images[i * 42] = 0;
  images[17 * 42] = 200;
  for (int workers : {0, 1, 3}) {
    const auto pipeline = TransformPipeline({0.0f}, {1.0f}).add(std::make_shared<ThrowingAugmentation>(200));
    DataLoader loader(dataset, pipeline, LoaderOptions(5).workers(workers).shuffle(false).prefetch(8));
    loader.start_epoch(0);
    for (int b = 0; b < 3; ++b)
      ASSERT_TRUE(loader.next().has_value()) << "workers " << workers << " batch " << b;
    EXPECT_TRUE(contains_all(error_message([&] { loader.next(); }), {"augmentation failed on marker 200"}))
        << "workers " << workers;
    // The failure sticks until the next epoch starts.
    EXPECT_THROW(loader.next(), Error);
    loader.start_epoch(1, 4);
    int rest = 0;
    while (loader.next()) ++rest;
    EXPECT_EQ(rest, 4);
  }
}

TEST(DataLoader, AbandoningAnEpochAndDestroyingDoesNotHang) {
  const ImageDataset dataset = make_dataset(400);
  const auto slow = TransformPipeline({0.0f}, {1.0f})
                        .add(std::make_shared<SlowAugmentation>(std::chrono::microseconds(200)));
  const auto begin = std::chrono::steady_clock::now();
  {
    DataLoader loader(dataset, slow, LoaderOptions(16).workers(3).prefetch(2));
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    loader.start_epoch(1);  // abandon while workers are mid-batch
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(loader.next().has_value());
  }  // destroyed mid-epoch, with batches queued and in progress
  { DataLoader never_started(dataset, slow, LoaderOptions(16).workers(2)); }
  {
    DataLoader idle(dataset, slow, LoaderOptions(16).workers(2));
    idle.start_epoch(0);  // workers busy, consumer never reads
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // A whole epoch would take 400 * 200us / 3 ≈ 27 ms at least per worker; abandoned work stops early.
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_LT(seconds, 5.0);
}

TEST(DataLoader, WaitSecondsGrowsWhenTheConsumerOutpacesTheWorkers) {
  const ImageDataset dataset = make_dataset(160);
  const auto slow = TransformPipeline({0.0f}, {1.0f})
                        .add(std::make_shared<SlowAugmentation>(std::chrono::microseconds(500)));
  DataLoader loader(dataset, slow, LoaderOptions(8).workers(1).prefetch(2));
  EXPECT_EQ(loader.wait_seconds(), 0.0);
  loader.start_epoch(0);
  const auto begin = std::chrono::steady_clock::now();
  int batches = 0;
  while (loader.next()) ++batches;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(batches, 20);
  // 160 samples * 0.5 ms = 80 ms of work the consumer mostly waits for.
  EXPECT_GT(loader.wait_seconds(), 0.04);
  EXPECT_LE(loader.wait_seconds(), elapsed + 1e-3);

  // A consumer slower than the loader barely waits.
  DataLoader fast(make_dataset(160), augmented(), LoaderOptions(8).workers(2).prefetch(4));
  fast.start_epoch(0);
  while (fast.next()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_LT(fast.wait_seconds(), loader.wait_seconds());
}

TEST(DataLoader, SynchronousLoadingCountsBuildTimeAsWait) {
  const auto slow = TransformPipeline({0.0f}, {1.0f})
                        .add(std::make_shared<SlowAugmentation>(std::chrono::microseconds(300)));
  DataLoader loader(make_dataset(40), slow, LoaderOptions(8).workers(0));
  loader.start_epoch(0);
  while (loader.next()) {
  }
  EXPECT_GT(loader.wait_seconds(), 0.010);  // 40 * 0.3 ms
}

TEST(DataLoader, InvalidOptionsAreConfigErrors) {
  const ImageDataset dataset = make_dataset(20);
  auto make = [&](LoaderOptions options) { DataLoader(dataset, augmented(), options); };
  EXPECT_THROW(make(LoaderOptions(0)), ConfigError);
  EXPECT_TRUE(contains_all(error_message([&] { make(LoaderOptions(-3)); }), {"data.batch_size", "-3"}));
  EXPECT_TRUE(contains_all(error_message([&] { make(LoaderOptions(21).drop_last(true)); }),
                           {"data.batch_size", "21", "20 samples"}));
  EXPECT_THROW(make(LoaderOptions(21).drop_last(true)), ConfigError);
  EXPECT_NO_THROW(make(LoaderOptions(20).drop_last(true)));
  EXPECT_TRUE(
      contains_all(error_message([&] { make(LoaderOptions(4).prefetch(0)); }), {"data.prefetch", "0"}));
  EXPECT_THROW(make(LoaderOptions(4).prefetch(0)), ConfigError);
  EXPECT_TRUE(
      contains_all(error_message([&] { make(LoaderOptions(4).workers(-2)); }), {"data.workers", "-2"}));
  EXPECT_THROW(make(LoaderOptions(4).workers(-2)), ConfigError);
  // Normalisation constants for 3 channels on 1-channel images.
  EXPECT_THROW(DataLoader(dataset, TransformPipeline({0, 0, 0}, {1, 1, 1}), LoaderOptions(4)), ConfigError);
}

TEST(DataLoader, NextBeforeStartEpochIsAnError) {
  for (int workers : {0, 1}) {
    DataLoader loader(make_dataset(10), augmented(), LoaderOptions(2).workers(workers));
    EXPECT_TRUE(contains_all(error_message([&] { loader.next(); }), {"start_epoch"}));
  }
}

TEST(DataLoader, AutoWorkerCount) {
  const int count = auto_worker_count();
  EXPECT_GE(count, 1);
  EXPECT_LE(count, 4);
  // The library's default: data.workers = "auto" is resolved by the run layer to the same count.
  EXPECT_EQ(LoaderOptions(2).workers(), count);
  DataLoader loader(make_dataset(10), augmented(), LoaderOptions(2));
  EXPECT_EQ(loader.workers(), count);
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] { DataLoader(make_dataset(10), augmented(), LoaderOptions(2).workers(-1)); }),
      {"data.workers", "-1"}));
}

TEST(DataLoader, MultiChannelImages) {
  const ImageDataset dataset = make_dataset(12, 3);
  const auto pipeline =
      TransformPipeline({0.1f, 0.2f, 0.3f}, {0.5f, 0.6f, 0.7f}).add(std::make_shared<RandomCrop>(1));
  DataLoader a(dataset, pipeline, LoaderOptions(4).workers(0).seed(8));
  DataLoader b(dataset, pipeline, LoaderOptions(4).workers(2).seed(8));
  const Collected ra = run_epoch(a, 0);
  expect_identical(ra, run_epoch(b, 0), "3 channels");
  EXPECT_EQ(ra.inputs[0].sizes(), (std::vector<int64_t>{4, 3, 6, 7}));
}

TEST(DataLoader, PinnedBatchesOnTheDevice_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device device(torch::kCUDA, 0);
  DataLoader cpu(make_dataset(30), augmented(), LoaderOptions(8).workers(0).seed(4));
  DataLoader gpu(make_dataset(30), augmented(),
                 LoaderOptions(8).workers(2).seed(4).device(device).pin_memory(true));
  const Collected on_cpu = run_epoch(cpu, 0);
  const Collected on_gpu = run_epoch(gpu, 0);
  ASSERT_EQ(on_gpu.inputs.size(), on_cpu.inputs.size());
  for (size_t i = 0; i < on_gpu.inputs.size(); ++i) {
    EXPECT_TRUE(on_gpu.inputs[i].is_cuda());
    EXPECT_TRUE(on_gpu.targets[i].is_cuda());
    EXPECT_TRUE(torch::equal(on_gpu.inputs[i].cpu(), on_cpu.inputs[i]));
    EXPECT_TRUE(torch::equal(on_gpu.targets[i].cpu(), on_cpu.targets[i]));
  }
}

}  // namespace
}  // namespace fasttrain
