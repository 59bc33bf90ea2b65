// Device-resident batches (data/device_resident.h): the same batches as the loader's workers build,
// value for value, with augmentations, channels_last and per-channel normalisation; when "auto" keeps
// a data set on the device; and on a GPU, the same batches there.
#include "fasttrain/data/device_resident.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fasttrain/data/loader.h"
#include "fasttrain/data/tensor_source.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/huge_pages.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::epoch_batches;

void expect_same_batches(DataLoader& built, DataLoader& resident, int64_t epoch, const std::string& what) {
  const auto a = epoch_batches(built, epoch), b = epoch_batches(resident, epoch);
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].names(), b[i].names()) << what;
    for (const std::string& name : a[i].names()) {
      EXPECT_TRUE(torch::equal(a[i].at(name), b[i].at(name).cpu())) << what << ": batch " << i << " " << name;
      EXPECT_EQ(b[i].at(name).device(), b[i].inputs.device()) << what << ": " << name;
    }
    EXPECT_EQ(a[i].inputs.is_contiguous(torch::MemoryFormat::ChannelsLast),
              b[i].inputs.is_contiguous(torch::MemoryFormat::ChannelsLast))
        << what;
    EXPECT_EQ(a[i].count, b[i].count) << what;
    EXPECT_EQ(a[i].index, b[i].index) << what;
  }
}

struct PipelineCase {
  std::string name;
  int64_t channels;
  TransformPipeline pipeline;
  bool channels_last;
};

std::vector<PipelineCase> pipeline_cases() {
  return {
      {"plain", 1, TransformPipeline({0.5f}, {0.25f}), false},
      {"crop+flip", 1,
       TransformPipeline({0.3f}, {0.4f})
           .add(std::make_shared<RandomCrop>(3))
           .add(std::make_shared<HorizontalFlip>()),
       false},
      {"rgb, per-channel, flip+crop, channels_last", 3,
       TransformPipeline({0.1f, 0.5f, 0.9f}, {0.2f, 0.3f, 0.4f})
           .add(std::make_shared<HorizontalFlip>(0.7))
           .add(std::make_shared<RandomCrop>(2)),
       true},
      {"rgb, one mean for all, channels_last", 3, TransformPipeline({0.4f}, {0.3f}), true},
  };
}

TEST(DeviceResident, BatchesEqualThoseTheWorkersBuild) {
  for (const auto& c : pipeline_cases()) {
    const ImageDataset data = testing::synthetic_images(70, c.channels, 9, 7);
    // drop_last false: the last short batch too; two epochs: another order and other augmentations.
    const auto options = LoaderOptions(16).seed(11).drop_last(false).channels_last(c.channels_last);
    DataLoader built(data, c.pipeline, LoaderOptions(options).workers(2));
    DataLoader resident(data, c.pipeline, LoaderOptions(options).device_resident(true));
    EXPECT_EQ(resident.workers(), 0);
    ASSERT_NE(resident.resident(), nullptr);
    EXPECT_GE(resident.resident()->bytes(), data.images.numel());
    for (int64_t epoch : {0, 1}) expect_same_batches(built, resident, epoch, c.name);
  }
}

// memory.cpu_huge_pages on and off: resident images larger than a few huge pages (18.8 MB normalised, 4.7 MB
// of pixels where augmented) give the workers' batches either way.
TEST(DeviceResident, HugePagesGiveTheSameBatches) {
  const ImageDataset data = testing::synthetic_images(6000, 1, 28, 28);
  for (const auto& c : pipeline_cases()) {
    if (c.channels != 1) continue;
    const auto options = LoaderOptions(256).seed(5).drop_last(false).channels_last(c.channels_last);
    DataLoader built(data, c.pipeline, LoaderOptions(options).workers(2));
    for (const bool huge_pages : {true, false}) {
      set_cpu_huge_pages(huge_pages);
      DataLoader resident(data, c.pipeline, LoaderOptions(options).device_resident(true));
      const auto* images = dynamic_cast<const ResidentImageBatches*>(resident.resident());
      ASSERT_NE(images, nullptr);
      const torch::Tensor& block = images->images();
      const auto* middle = static_cast<const uint8_t*>(block.data_ptr()) + block.nbytes() / 2;
      // Only "on" is checked: a block without advice may reuse heap pages an earlier block advised.
      if (huge_pages && testing::kernel_records_huge_page_advice()) {
        EXPECT_TRUE(advised_huge_pages(middle)) << c.name;
      }
      expect_same_batches(built, resident, 0, c.name + (huge_pages ? ", huge pages" : ", small pages"));
    }
  }
}

// A program's tensors (a TensorSource: 4-d inputs, values, a field) are resident alike: every named
// tensor of every batch equals the workers' copy, in either layout.
std::shared_ptr<TensorSource> program_tensors() {
  torch::manual_seed(6);
  return std::make_shared<TensorSource>(
      std::map<std::string, torch::Tensor>{{"inputs", torch::randn({45, 3, 4, 5})},
                                           {"targets", torch::randn({45, 2})},
                                           {"mask", torch::randint(0, 2, {45}, torch::kLong)}});
}

TEST(DeviceResident, AProgramsTensorsGiveTheWorkersBatches) {
  const auto source = program_tensors();
  EXPECT_EQ(source->resident_bytes(), (45 * 60 + 45 * 2) * 4 + 45 * 8);
  for (const bool channels_last : {false, true}) {
    const auto options = LoaderOptions(8).seed(3).drop_last(false).channels_last(channels_last);
    DataLoader built(source, LoaderOptions(options).workers(2));
    DataLoader resident(source, LoaderOptions(options).device_resident(true));
    ASSERT_NE(resident.resident(), nullptr);
    for (int64_t epoch : {0, 1}) expect_same_batches(built, resident, epoch, channels_last ? "nhwc" : "nchw");
  }
}

// A request from outside the loader (no epoch order uploaded, or samples outside it) is copied as it
// comes; one inside the uploaded order is a slice of it. Both give the host's batch.
TEST(DeviceResident, RequestsInsideAndOutsideTheEpochsOrderGiveTheSameBatch) {
  const ImageDataset data = testing::synthetic_images(30, 3, 5, 4);
  for (const auto& c : pipeline_cases()) {
    if (c.channels != 3) continue;
    const ImageBatchSource source(data, c.pipeline);
    auto resident = source.make_resident(torch::kCPU);
    EpochPlan plan;
    const std::vector<int64_t> order = {7, 3, 29, 0, 11, 5};
    plan.add_batch(order.data(), 3);
    plan.add_batch(order.data() + 3, 3);
    BatchRequest inside;
    inside.samples = plan.samples.data() + 3;
    inside.count = 3;
    inside.epoch = 2;
    inside.seed = 9;
    inside.channels_last = c.channels_last;
    BatchRequest outside = inside;
    const std::vector<int64_t> loose = {0, 11, 5};
    outside.samples = loose.data();
    const Batch expected = source.build(inside);
    EXPECT_TRUE(torch::equal(resident->build(outside).inputs, expected.inputs))
        << c.name << ": before start_epoch";
    resident->start_epoch(plan);
    EXPECT_TRUE(torch::equal(resident->build(inside).inputs, expected.inputs))
        << c.name << ": a slice of the order";
    EXPECT_TRUE(torch::equal(resident->build(outside).inputs, expected.inputs))
        << c.name << ": outside the order";
    EXPECT_TRUE(torch::equal(resident->build(inside).targets, expected.targets)) << c.name;
  }
}

TEST(DeviceResident, ShardsOfRanksAndTheEvaluationOrderAreTheLoaders) {
  const ImageDataset data = testing::synthetic_images(50);
  const TransformPipeline pipeline({0.5f}, {0.25f});
  for (int64_t rank : {0, 1}) {
    const auto options = LoaderOptions(8).rank(rank).world_size(2).seed(5);
    DataLoader built(data, pipeline, LoaderOptions(options).workers(0));
    DataLoader resident(data, pipeline, LoaderOptions(options).device_resident(true));
    expect_same_batches(built, resident, 3, "rank " + std::to_string(rank));
  }
  const auto eval = LoaderOptions(16).shuffle(false).drop_last(false).even_shards(false);
  DataLoader built(data, pipeline, LoaderOptions(eval).workers(1));
  DataLoader resident(data, pipeline, LoaderOptions(eval).device_resident(true));
  expect_same_batches(built, resident, 0, "evaluation");
}

TEST(DeviceResident, AutoKeepsSmallDataSetsWhereABatchIsCheaperThereAndSaysWhy) {
  const torch::Device cuda(torch::kCUDA, 0), cpu(torch::kCPU);
  const int64_t gib = int64_t{1} << 30, mib = int64_t{1} << 20;
  const ResidentData gathered{55 * mib, true}, augmented{55 * mib, false}, text{0, false};
  const DeviceMemory gpu{80 * gib, "cuda:0's memory"}, host{24 * gib, "the host's memory"},
      budget{500 * mib, "memory.budget"};
  const ResidencyChoice small = choose_residency("auto", cuda, augmented, gpu);
  EXPECT_TRUE(small.resident) << small.reason;
  EXPECT_TRUE(testing::contains_all(small.reason, {"cuda:0", "80.00 GiB"})) << small.reason;
  const ResidencyChoice large = choose_residency("auto", cuda, {9 * gib, true}, gpu);
  EXPECT_FALSE(large.resident);
  EXPECT_TRUE(testing::contains_all(large.reason, {"9.00 GiB", "a tenth"})) << large.reason;
  // On a CPU: a gather instead of the step's thread normalising every batch, where the host has room.
  const ResidencyChoice on_cpu = choose_residency("auto", cpu, gathered, host);
  EXPECT_TRUE(on_cpu.resident) << on_cpu.reason;
  EXPECT_TRUE(testing::contains_all(on_cpu.reason, {"the host", "24.00 GiB", "normalised once"}))
      << on_cpu.reason;
  const ResidencyChoice cpu_full = choose_residency("auto", cpu, gathered, budget);
  EXPECT_FALSE(cpu_full.resident);
  EXPECT_TRUE(testing::contains_all(cpu_full.reason, {"55.00 MiB", "a tenth", "memory.budget (500.00 MiB)"}))
      << cpu_full.reason;
  const ResidencyChoice cpu_augmented = choose_residency("auto", cpu, augmented, host);
  EXPECT_FALSE(cpu_augmented.resident);
  EXPECT_NE(cpu_augmented.reason.find("loader's threads"), std::string::npos) << cpu_augmented.reason;
  const ResidencyChoice unknown_memory = choose_residency("auto", cpu, gathered, {0, "the host's memory"});
  EXPECT_FALSE(unknown_memory.resident) << unknown_memory.reason;
  EXPECT_NE(unknown_memory.reason.find("unknown"), std::string::npos) << unknown_memory.reason;
  const ResidencyChoice on_device = choose_residency("auto", cuda, text, gpu);
  EXPECT_FALSE(on_device.resident);
  EXPECT_NE(on_device.reason.find("text"), std::string::npos) << on_device.reason;
  EXPECT_TRUE(choose_residency("true", cpu, augmented, {}).resident);  // asked for: CPU tests build this way
  EXPECT_FALSE(choose_residency("false", cuda, gathered, gpu).resident);
  const std::string impossible = testing::error_message([&] { choose_residency("true", cuda, text, gpu); });
  EXPECT_TRUE(testing::contains_all(impossible, {"data.device_resident = true", "cannot"})) << impossible;
  EXPECT_THROW(choose_residency("true", cuda, text, gpu), ConfigError);
  const std::string wrong = testing::error_message([&] { choose_residency("gpu", cuda, {1, true}, gpu); });
  EXPECT_TRUE(testing::contains_all(wrong, {"data.device_resident", "'gpu'", "auto, true, false"})) << wrong;
}

// Which sources a CPU keeps resident under "auto": unaugmented images and a program's tensors, whose batches
// are gathers; not augmented images, whose batches the loader's threads build, nor a source of its own that
// does not say so.
TEST(DeviceResident, SourcesSayWhetherTheirResidentBatchesAreGathers) {
  const ImageDataset data = testing::synthetic_images(20, 1, 6, 6);
  EXPECT_TRUE(ImageBatchSource(data, TransformPipeline({0.5f}, {0.25f})).resident_batches_are_gathers());
  EXPECT_FALSE(
      ImageBatchSource(data, TransformPipeline({0.5f}, {0.25f}).add(std::make_shared<HorizontalFlip>()))
          .resident_batches_are_gathers());
  EXPECT_TRUE(program_tensors()->resident_batches_are_gathers());
  // A source of its own says nothing by default: its CPU runs stay with the loader's threads.
  struct OwnSource : BatchSource {
    int64_t size() const override { return 1; }
    Batch build(const BatchRequest&) const override { return {}; }
    std::string describe() const override { return "its own"; }
  };
  EXPECT_FALSE(OwnSource().resident_batches_are_gathers());
}

TEST(DeviceResident, PixelMapsComposeAsTheAugmentationsApply) {
  const SampleShape shape{1, 5, 6};
  const TransformPipeline pipeline = TransformPipeline({0.f}, {1.f})
                                         .add(std::make_shared<RandomCrop>(2))
                                         .add(std::make_shared<HorizontalFlip>());
  const ImageDataset data = testing::synthetic_images(1, 1, 5, 6);
  for (uint64_t index = 0; index < 40; ++index) {
    std::vector<float> applied(static_cast<size_t>(shape.numel()));
    pipeline.apply(data.images.data_ptr<uint8_t>(), shape, applied.data(), SampleRng(3, 1, index));
    const PixelMap map = pipeline.pixel_map(shape, SampleRng(3, 1, index));
    for (int64_t y = 0; y < shape.height; ++y) {
      for (int64_t x = 0; x < shape.width; ++x) {
        const int64_t row = map.rows[static_cast<size_t>(y)], col = map.cols[static_cast<size_t>(x)];
        const float expected = row < 0 || col < 0
                                   ? 0.f
                                   : static_cast<float>(data.images[0][0][row][col].item<int64_t>()) / 255.f;
        EXPECT_FLOAT_EQ(applied[static_cast<size_t>(y * shape.width + x)], expected)
            << index << " " << y << "," << x;
      }
    }
  }
}

// An augmentation that is not a row/column move stays on the host, and says why.
class Blur : public Augmentation {
 public:
  void apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng&) const override {
    std::copy(in, in + shape.numel(), out);
  }
  bool pixel_map(const SampleShape&, SampleRng&, PixelMap&) const override { return false; }
  std::string describe() const override { return "Blur"; }
};

TEST(DeviceResident, AnAugmentationWithoutAPixelMapKeepsTheDataOnTheHost) {
  const ImageDataset data = testing::synthetic_images(20);
  const TransformPipeline pipeline = TransformPipeline({0.5f}, {0.25f}).add(std::make_shared<Blur>());
  EXPECT_FALSE(pipeline.maps_pixels());
  EXPECT_EQ(ImageBatchSource(data, pipeline).resident_bytes(), 0);
  const std::string message = testing::error_message(
      [&] { DataLoader loader(data, pipeline, LoaderOptions(4).device_resident(true)); });
  EXPECT_TRUE(
      testing::contains_all(message, {"Blur", "cannot run on a device", "data.device_resident = false"}))
      << message;
}

TEST(DeviceResident, BatchesOnTheGpuEqualTheHostsBatches_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto& c : pipeline_cases()) {
    const ImageDataset data = testing::synthetic_images(70, c.channels, 9, 7);
    const auto options = LoaderOptions(16).seed(11).drop_last(false).channels_last(c.channels_last);
    DataLoader built(data, c.pipeline, LoaderOptions(options).workers(2));
    DataLoader resident(data, c.pipeline, LoaderOptions(options).device(cuda).device_resident(true));
    resident.start_epoch(0);
    auto first = resident.next();
    ASSERT_TRUE(first.has_value());
    EXPECT_TRUE(first->inputs.is_cuda());
    EXPECT_TRUE(first->targets.is_cuda());
    for (int64_t epoch : {0, 1}) expect_same_batches(built, resident, epoch, c.name);
  }
  const auto source = program_tensors();
  DataLoader built(source, LoaderOptions(8).seed(3).workers(1));
  DataLoader resident(source, LoaderOptions(8).seed(3).device(cuda).device_resident(true));
  expect_same_batches(built, resident, 0, "a program's tensors");
}

}  // namespace
}  // namespace fasttrain
