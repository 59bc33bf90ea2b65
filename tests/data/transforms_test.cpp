// SampleRng, RandomCrop, HorizontalFlip and the normalising TransformPipeline.
#include "fasttrain/data/transforms.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "data/data_test_util.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;

// Distinct non-zero bytes, so every window of the zero-padded image is recognisable.
std::vector<uint8_t> distinct_image(const SampleShape& shape) {
  std::vector<uint8_t> image(shape.numel());
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>(1 + i % 255);
  return image;
}

// Pixel (c, y, x) of `image` padded by `p` zeros on every side; coordinates in the padded frame.
uint8_t padded_at(const std::vector<uint8_t>& image, const SampleShape& shape, int p, int64_t c, int64_t y,
                  int64_t x) {
  y -= p;
  x -= p;
  if (y < 0 || y >= shape.height || x < 0 || x >= shape.width) return 0;
  return image[(c * shape.height + y) * shape.width + x];
}

bool is_window(const std::vector<uint8_t>& out, const std::vector<uint8_t>& image, const SampleShape& shape,
               int p, int64_t top, int64_t left) {
  for (int64_t c = 0; c < shape.channels; ++c) {
    for (int64_t y = 0; y < shape.height; ++y) {
      for (int64_t x = 0; x < shape.width; ++x) {
        if (out[(c * shape.height + y) * shape.width + x] !=
            padded_at(image, shape, p, c, y + top, x + left)) {
          return false;
        }
      }
    }
  }
  return true;
}

TEST(SampleRng, IsAPureFunctionOfItsKey) {
  SampleRng a(7, 3, 11);
  SampleRng b(7, 3, 11);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next(), b.next());
  // Any part of the key changes the stream, including swapping parts.
  const uint64_t first = SampleRng(7, 3, 11).next();
  EXPECT_NE(first, SampleRng(8, 3, 11).next());
  EXPECT_NE(first, SampleRng(7, 4, 11).next());
  EXPECT_NE(first, SampleRng(7, 3, 12).next());
  EXPECT_NE(first, SampleRng(7, 11, 3).next());
  EXPECT_NE(SampleRng(0, 0, 0).next(), SampleRng(0, 0, 1).next());
}

TEST(SampleRng, BelowIsUniformAndInRange) {
  std::vector<int> counts(5, 0);
  for (uint64_t i = 0; i < 50000; ++i) {
    SampleRng rng(1, 2, i);
    const uint64_t v = rng.below(5);
    ASSERT_LT(v, 5u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 400);  // about 4.5 standard deviations
  SampleRng rng(3, 0, 0);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(rng.below(1), 0u);
  for (int i = 0; i < 1000; ++i) ASSERT_LT(rng.below(~uint64_t{0}), ~uint64_t{0});
  EXPECT_THROW(rng.below(0), Error);
}

TEST(SampleRng, UniformIsInUnitInterval) {
  SampleRng rng(5, 5, 5);
  double sum = 0;
  for (int i = 0; i < 20000; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

TEST(RandomCrop, ZeroPaddingIsIdentity) {
  const SampleShape shape{2, 5, 6};
  const auto image = distinct_image(shape);
  std::vector<uint8_t> out(shape.numel());
  SampleRng rng(1, 1, 1);
  RandomCrop(0).apply(image.data(), out.data(), shape, rng);
  EXPECT_EQ(out, image);
}

TEST(RandomCrop, ShiftsByTheDrawnOffsets) {
  // Known rng: the crop draws the window's top, then its left, each uniform in [0, 2p].
  const int p = 3;
  const SampleShape shape{1, 7, 9};
  const auto image = distinct_image(shape);
  std::vector<uint8_t> out(shape.numel());
  for (uint64_t index = 0; index < 200; ++index) {
    SampleRng expected(4, 2, index);
    const auto top = static_cast<int64_t>(expected.below(2 * p + 1));
    const auto left = static_cast<int64_t>(expected.below(2 * p + 1));
    SampleRng rng(4, 2, index);
    RandomCrop(p).apply(image.data(), out.data(), shape, rng);
    ASSERT_TRUE(is_window(out, image, shape, p, top, left))
        << "index " << index << " top " << top << " left " << left;
    // Consumed exactly two draws.
    ASSERT_EQ(rng.next(), expected.next());
  }
}

TEST(RandomCrop, EveryOutputIsAWindowOfThePaddedInputAndAllWindowsOccur) {
  const int p = 2;
  const SampleShape shape{3, 6, 5};
  const auto image = distinct_image(shape);
  std::vector<uint8_t> out(shape.numel());
  std::set<std::pair<int64_t, int64_t>> seen;
  for (uint64_t index = 0; index < 1000; ++index) {
    SampleRng rng(9, 0, index);
    RandomCrop(p).apply(image.data(), out.data(), shape, rng);
    int matches = 0;
    for (int64_t top = 0; top <= 2 * p; ++top) {
      for (int64_t left = 0; left <= 2 * p; ++left) {
        if (is_window(out, image, shape, p, top, left)) {
          ++matches;
          seen.emplace(top, left);
        }
      }
    }
    // One window, the same shift for every channel (checked by is_window over all channels).
    ASSERT_EQ(matches, 1) << "index " << index;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>((2 * p + 1) * (2 * p + 1)));
}

TEST(RandomCrop, PaddingLargerThanTheImage) {
  const int p = 5;
  const SampleShape shape{1, 2, 3};
  const auto image = distinct_image(shape);
  std::vector<uint8_t> out(shape.numel());
  for (uint64_t index = 0; index < 300; ++index) {
    SampleRng expected(0, 0, index);
    const auto top = static_cast<int64_t>(expected.below(2 * p + 1));
    const auto left = static_cast<int64_t>(expected.below(2 * p + 1));
    SampleRng rng(0, 0, index);
    RandomCrop(p).apply(image.data(), out.data(), shape, rng);
    ASSERT_TRUE(is_window(out, image, shape, p, top, left)) << index;
  }
}

TEST(RandomCrop, RejectsNegativePadding) {
  EXPECT_THROW(RandomCrop(-1), ConfigError);
  EXPECT_TRUE(contains_all(error_message([] { RandomCrop(-2); }), {"padding", "-2", ">= 0"}));
  EXPECT_EQ(RandomCrop(4).describe(), "RandomCrop(padding=4)");
}

TEST(HorizontalFlip, MirrorsEveryRowOfEveryChannel) {
  const SampleShape shape{2, 3, 4};
  const auto image = distinct_image(shape);
  std::vector<uint8_t> out(shape.numel());
  SampleRng rng(1, 2, 3);
  HorizontalFlip(1.0).apply(image.data(), out.data(), shape, rng);
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t y = 0; y < 3; ++y) {
      for (int64_t x = 0; x < 4; ++x) {
        EXPECT_EQ(out[(c * 3 + y) * 4 + x], image[(c * 3 + y) * 4 + (3 - x)]);
      }
    }
  }
  HorizontalFlip(0.0).apply(image.data(), out.data(), shape, rng);
  EXPECT_EQ(out, image);
}

TEST(HorizontalFlip, FlipsWithTheGivenProbability) {
  const SampleShape shape{1, 2, 5};
  const auto image = distinct_image(shape);
  std::vector<uint8_t> out(shape.numel());
  int flipped = 0;
  for (uint64_t index = 0; index < 4000; ++index) {
    SampleRng rng(0, 1, index);
    HorizontalFlip(0.25).apply(image.data(), out.data(), shape, rng);
    if (out != image) ++flipped;
    SampleRng again(0, 1, index);
    ASSERT_EQ(out != image, again.uniform() < 0.25);
  }
  EXPECT_NEAR(flipped, 1000, 120);
  EXPECT_THROW(HorizontalFlip(1.5), ConfigError);
  EXPECT_THROW(HorizontalFlip(-0.1), ConfigError);
  EXPECT_EQ(HorizontalFlip(0.5).describe(), "HorizontalFlip(p=0.5)");
}

TEST(TransformPipeline, NormalizeIsExact) {
  const SampleShape shape{1, 16, 16};
  std::vector<uint8_t> image(256);
  for (int v = 0; v < 256; ++v) image[v] = static_cast<uint8_t>(v);
  std::vector<float> out(256);
  const TransformPipeline pipeline({0.2860f}, {0.3530f});
  pipeline.apply(image.data(), shape, out.data(), SampleRng(0, 0, 0));
  for (int v = 0; v < 256; ++v) {
    const float expected = (static_cast<float>(v) / 255.0f - 0.2860f) / 0.3530f;
    ASSERT_EQ(out[v], expected) << v;
  }
  // And as torch computes it (ToTensor + Normalize), up to float rounding.
  const torch::Tensor reference = (torch::arange(256, torch::kFloat32) / 255.0f - 0.2860f) / 0.3530f;
  EXPECT_TRUE(torch::allclose(torch::from_blob(out.data(), {256}, torch::kFloat32), reference, 1e-6, 1e-6));
}

TEST(TransformPipeline, NormalizesPerChannelOrBroadcastsOne) {
  const SampleShape shape{3, 1, 2};
  const std::vector<uint8_t> image = {0, 255, 51, 102, 255, 0};
  std::vector<float> out(6);
  TransformPipeline({0.5f, 0.0f, 1.0f}, {0.5f, 0.2f, 2.0f})
      .apply(image.data(), shape, out.data(), SampleRng(0, 0, 0));
  EXPECT_EQ(out, (std::vector<float>{-1.0f, 1.0f, (51 / 255.0f) / 0.2f, (102 / 255.0f) / 0.2f, 0.0f, -0.5f}));
  TransformPipeline({0.0f}, {1.0f}).apply(image.data(), shape, out.data(), SampleRng(0, 0, 0));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], image[i] / 255.0f);
}

TEST(TransformPipeline, AppliesAugmentationsInOrderThenNormalizes) {
  const SampleShape shape{1, 6, 6};
  const auto image = distinct_image(shape);
  auto crop = std::make_shared<RandomCrop>(2);
  auto flip = std::make_shared<HorizontalFlip>(0.5);
  const auto pipeline = TransformPipeline({0.0f}, {1.0f}).add(crop).add(flip);
  EXPECT_TRUE(pipeline.has_augmentations());
  std::vector<float> out(shape.numel());
  std::vector<uint8_t> a(shape.numel()), b(shape.numel());
  for (uint64_t index = 0; index < 50; ++index) {
    pipeline.apply(image.data(), shape, out.data(), SampleRng(1, 1, index));
    SampleRng rng(1, 1, index);  // one generator threaded through the augmentations
    crop->apply(image.data(), a.data(), shape, rng);
    flip->apply(a.data(), b.data(), shape, rng);
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(out[i], b[i] / 255.0f) << index << " " << i;
  }
  EXPECT_EQ(pipeline.describe(),
            "RandomCrop(padding=2) -> HorizontalFlip(p=0.5) -> Normalize(mean=[0], std=[1])");
}

TEST(TransformPipeline, RejectsBadNormalisation) {
  EXPECT_TRUE(contains_all(error_message([] {
                             TransformPipeline({0.1f, 0.2f}, {0.3f});
                           }),
                           {"2 mean", "1 std"}));
  EXPECT_THROW(TransformPipeline({}, {}), ConfigError);
  EXPECT_TRUE(
      contains_all(error_message([] { TransformPipeline({0.1f}, {0.0f}); }), {"std[0]", "> 0", "got 0"}));
  const TransformPipeline rgb({0.1f, 0.2f, 0.3f}, {1.0f, 1.0f, 1.0f});
  EXPECT_NO_THROW(rgb.check_channels(3));
  EXPECT_TRUE(contains_all(error_message([&] { rgb.check_channels(1); }), {"3 mean/std", "1 channel"}));
  EXPECT_THROW(TransformPipeline({0.0f}, {1.0f}).add(nullptr), Error);
}

}  // namespace
}  // namespace fasttrain
