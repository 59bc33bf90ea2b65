// load_image_dataset over synthetic directories and the real Fashion-MNIST, head, channel_statistics.
#include "fasttrain/data/dataset.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "data/data_test_util.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;
using testing::gzip;
using testing::idx_bytes;
using testing::pattern;
using testing::TempDir;
using testing::write_bytes;

const char* const kFashionMnist = "/usr/share/datasets/fashion-mnist";

struct SplitSpec {
  uint32_t count;
  uint32_t height;
  uint32_t width;
  std::vector<uint8_t> labels;
};

// Writes the four standard files; `gz` picks which of them are gzipped (train images, train labels,
// test images, test labels).
void write_dataset(const TempDir& dir, const SplitSpec& train, const SplitSpec& test,
                   std::array<bool, 4> gz = {false, false, false, false}) {
  auto put = [&](const std::string& name, const std::vector<uint8_t>& bytes, bool compress) {
    write_bytes(dir.file(compress ? name + ".gz" : name), compress ? gzip(bytes) : bytes);
  };
  put("train-images-idx3-ubyte",
      idx_bytes({train.count, train.height, train.width}, pattern(train.count * train.height * train.width)),
      gz[0]);
  put("train-labels-idx1-ubyte", idx_bytes({static_cast<uint32_t>(train.labels.size())}, train.labels),
      gz[1]);
  put("t10k-images-idx3-ubyte",
      idx_bytes({test.count, test.height, test.width}, pattern(test.count * test.height * test.width, 11)),
      gz[2]);
  put("t10k-labels-idx1-ubyte", idx_bytes({static_cast<uint32_t>(test.labels.size())}, test.labels), gz[3]);
}

TEST(Dataset, Names) {
  EXPECT_EQ(image_dataset_names(), (std::vector<std::string>{"fashion-mnist", "mnist", "idx"}));
}

TEST(Dataset, LoadsMixedRawAndGzipFiles) {
  TempDir dir;
  write_dataset(dir, {5, 3, 4, {0, 4, 2, 1, 2}}, {2, 3, 4, {6, 0}}, {true, false, false, true});
  const ImageSplits splits = load_image_dataset("idx", dir.path());
  EXPECT_EQ(splits.train.images.sizes(), (std::vector<int64_t>{5, 1, 3, 4}));
  EXPECT_EQ(splits.test.images.sizes(), (std::vector<int64_t>{2, 1, 3, 4}));
  EXPECT_EQ(splits.train.images.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(splits.train.images.is_contiguous());
  EXPECT_EQ(splits.train.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(splits.train.labels[1].item<int64_t>(), 4);
  EXPECT_EQ(splits.test.labels[0].item<int64_t>(), 6);
  // "idx": the class count is the largest label over both splits + 1.
  EXPECT_EQ(splits.train.num_classes, 7);
  EXPECT_EQ(splits.test.num_classes, 7);
  EXPECT_EQ(splits.train.size(), 5);
  EXPECT_EQ(splits.train.channels(), 1);
  EXPECT_EQ(splits.train.height(), 3);
  EXPECT_EQ(splits.train.width(), 4);
  const auto expected = pattern(5 * 3 * 4);
  EXPECT_EQ(splits.train.images[4][0][2][3].item<int>(), expected[4 * 12 + 2 * 4 + 3]);
}

TEST(Dataset, CountMismatchNamesBothFiles) {
  TempDir dir;
  write_dataset(dir, {5, 2, 2, {0, 1, 2, 3}}, {2, 2, 2, {0, 1}});
  EXPECT_TRUE(contains_all(
      error_message([&] { load_image_dataset("idx", dir.path()); }),
      {dir.file("train-images-idx3-ubyte"), "5 images", dir.file("train-labels-idx1-ubyte"), "4 labels"}));
}

TEST(Dataset, LabelsFileInPlaceOfImagesIsAWrongRank) {
  TempDir dir;
  write_dataset(dir, {2, 2, 2, {0, 1}}, {2, 2, 2, {0, 1}});
  write_bytes(dir.file("t10k-images-idx3-ubyte"), idx_bytes({2}, {0, 1}));
  EXPECT_TRUE(contains_all(error_message([&] { load_image_dataset("idx", dir.path()); }),
                           {dir.file("t10k-images-idx3-ubyte"), "wrong rank", "expected 3", "found 1"}));
}

TEST(Dataset, MissingFileListsBothNames) {
  TempDir dir;
  write_dataset(dir, {2, 2, 2, {0, 1}}, {2, 2, 2, {0, 1}});
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte"));
  EXPECT_TRUE(contains_all(error_message([&] { load_image_dataset("mnist", dir.path()); }),
                           {dir.file("t10k-labels-idx1-ubyte"), dir.file("t10k-labels-idx1-ubyte.gz")}));
}

TEST(Dataset, UnknownNameListsTheValidOnes) {
  EXPECT_TRUE(contains_all(error_message([] { load_image_dataset("cifar-11", "/tmp"); }),
                           {"cifar-11", "fashion-mnist", "mnist", "idx"}));
}

TEST(Dataset, MissingDirectoryIsNamed) {
  TempDir dir;
  const std::string absent = dir.file("no-such-dir");
  EXPECT_TRUE(contains_all(error_message([&] { load_image_dataset("fashion-mnist", absent); }),
                           {absent, "does not exist"}));
}

TEST(Dataset, NamedDatasetsCheckShapeAndLabels) {
  TempDir dir;
  write_dataset(dir, {2, 3, 3, {0, 1}}, {1, 3, 3, {0}});
  EXPECT_TRUE(contains_all(error_message([&] { load_image_dataset("fashion-mnist", dir.path()); }),
                           {dir.file("train-images-idx3-ubyte"), "28x28", "found 3x3"}));
  TempDir big;
  write_dataset(big, {2, 28, 28, {3, 10}}, {1, 28, 28, {0}});
  EXPECT_TRUE(contains_all(error_message([&] { load_image_dataset("mnist", big.path()); }),
                           {big.file("train-labels-idx1-ubyte"), "label 1", "offset 9", "is 10", "[0, 10)"}));
  write_dataset(big, {2, 28, 28, {3, 1}}, {1, 28, 28, {0}});
  EXPECT_EQ(load_image_dataset("mnist", big.path()).train.num_classes, 10);
}

TEST(Dataset, Head) {
  TempDir dir;
  write_dataset(dir, {6, 2, 2, {0, 1, 2, 3, 4, 5}}, {1, 2, 2, {0}});
  const ImageSplits splits = load_image_dataset("idx", dir.path());
  const ImageDataset head = splits.train.head(4);
  EXPECT_EQ(head.size(), 4);
  EXPECT_EQ(head.num_classes, 6);
  EXPECT_TRUE(head.images.is_contiguous());
  EXPECT_TRUE(torch::equal(head.images, splits.train.images.slice(0, 0, 4)));
  EXPECT_TRUE(torch::equal(head.labels, torch::arange(4, torch::kInt64)));
  EXPECT_TRUE(contains_all(error_message([&] { splits.train.head(0); }), {"head(0)", "[1, 6]"}));
  EXPECT_TRUE(contains_all(error_message([&] { splits.train.head(7); }), {"head(7)", "[1, 6]"}));
}

TEST(Dataset, ChannelStatisticsMatchTorch) {
  const torch::Tensor images =
      torch::randint(0, 256, {50, 3, 5, 7}, torch::TensorOptions().dtype(torch::kUInt8)).contiguous();
  const auto [mean, stddev] = channel_statistics(images);
  ASSERT_EQ(mean.size(), 3u);
  const torch::Tensor scaled = images.to(torch::kFloat64) / 255.0;
  for (int64_t c = 0; c < 3; ++c) {
    const torch::Tensor channel = scaled.select(1, c);
    EXPECT_NEAR(mean[c], channel.mean().item<double>(), 1e-6);
    EXPECT_NEAR(stddev[c], channel.std(/*unbiased=*/false).item<double>(), 1e-6);
  }
  const auto [m1, s1] = channel_statistics(torch::full({4, 1, 2, 2}, 51, torch::kUInt8));
  EXPECT_FLOAT_EQ(m1[0], 0.2f);
  EXPECT_FLOAT_EQ(s1[0], 0.0f);
  EXPECT_TRUE(contains_all(error_message([] {
                             channel_statistics(torch::zeros({2, 2}, torch::kUInt8));
                           }),
                           {"uint8 images [N, C, H, W]", "2x2"}));
}

TEST(Dataset, RealFashionMnist) {
  if (!std::filesystem::is_directory(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is not installed";
  const ImageSplits splits = load_image_dataset("fashion-mnist", kFashionMnist);
  EXPECT_EQ(splits.train.images.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(splits.test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(splits.train.labels.sizes(), (std::vector<int64_t>{60000}));
  EXPECT_EQ(splits.test.labels.sizes(), (std::vector<int64_t>{10000}));
  EXPECT_EQ(splits.train.num_classes, 10);
  for (const auto* split : {&splits.train, &splits.test}) {
    EXPECT_GE(split->labels.min().item<int64_t>(), 0);
    EXPECT_LT(split->labels.max().item<int64_t>(), 10);
    // Fashion-MNIST is balanced: every class has exactly a tenth of the samples.
    const torch::Tensor counts = torch::bincount(split->labels, {}, 10);
    EXPECT_TRUE(torch::all(counts == split->size() / 10).item<bool>()) << counts;
  }
  // The usual normalisation constants.
  const auto [mean, stddev] = channel_statistics(splits.train.images);
  EXPECT_NEAR(mean[0], 0.2860, 5e-4);
  EXPECT_NEAR(stddev[0], 0.3530, 5e-4);
}

}  // namespace
}  // namespace fasttrain
