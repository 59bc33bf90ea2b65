#include "fasttrain/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

// The splitmix64 finaliser: a bijection on 64 bits with full avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

}  // namespace

SampleRng::SampleRng(uint64_t seed, uint64_t epoch, uint64_t index) {
  // Each key part goes through the bijection before it is folded in, so (seed, epoch, index) and a
  // permutation of it give unrelated streams, and for a fixed (seed, epoch) distinct indices give
  // distinct states.
  uint64_t h = mix64(seed + kGolden);
  h = mix64(h ^ mix64(epoch + 2 * kGolden));
  h = mix64(h ^ mix64(index + 3 * kGolden));
  state_ = h;
}

uint64_t SampleRng::next() {
  state_ += kGolden;
  return mix64(state_);
}

uint64_t SampleRng::below(uint64_t bound) {
  FT_CHECK(bound > 0, "SampleRng::below: bound must be > 0");
  // Lemire's multiply-shift with rejection: unbiased, and usually a single multiplication.
  __extension__ typedef unsigned __int128 u128;
  u128 m = static_cast<u128>(next()) * bound;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<u128>(next()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

double SampleRng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

std::vector<int64_t> shuffled_order(int64_t count, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  SampleRng rng(seed, static_cast<uint64_t>(epoch), ~uint64_t{0});
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

PixelMap PixelMap::identity(const SampleShape& shape) {
  PixelMap map;
  map.rows.resize(static_cast<size_t>(shape.height));
  map.cols.resize(static_cast<size_t>(shape.width));
  std::iota(map.rows.begin(), map.rows.end(), int64_t{0});
  std::iota(map.cols.begin(), map.cols.end(), int64_t{0});
  return map;
}

void PixelMap::then(const PixelMap& next) {
  auto compose = [](const std::vector<int64_t>& first, const std::vector<int64_t>& second) {
    std::vector<int64_t> out(second.size());
    for (size_t i = 0; i < second.size(); ++i)
      out[i] = second[i] < 0 ? -1 : first[static_cast<size_t>(second[i])];
    return out;
  };
  rows = compose(rows, next.rows);
  cols = compose(cols, next.cols);
}

RandomCrop::RandomCrop(int padding) : padding_(padding) {
  FT_CONFIG_CHECK(padding >= 0, "RandomCrop padding must be >= 0 pixels, got {}", padding);
}

void RandomCrop::apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng& rng) const {
  const int64_t h = shape.height;
  const int64_t w = shape.width;
  const int64_t p = padding_;
  // The window's top-left corner in the padded image is (p + dy, p + dx); vertical first, as torchvision.
  const int64_t dy = static_cast<int64_t>(rng.below(2 * p + 1)) - p;
  const int64_t dx = static_cast<int64_t>(rng.below(2 * p + 1)) - p;
  // Output column x reads input column x + dx; the columns in [x0, x1) exist, the rest are padding.
  const int64_t x0 = std::clamp<int64_t>(-dx, 0, w);
  const int64_t x1 = std::clamp<int64_t>(w - dx, x0, w);
  for (int64_t c = 0; c < shape.channels; ++c) {
    const uint8_t* plane = in + c * h * w;
    uint8_t* target = out + c * h * w;
    for (int64_t y = 0; y < h; ++y) {
      uint8_t* row = target + y * w;
      const int64_t sy = y + dy;
      if (sy < 0 || sy >= h || x1 == x0) {
        std::memset(row, 0, w);
        continue;
      }
      std::memset(row, 0, x0);
      std::memcpy(row + x0, plane + sy * w + x0 + dx, x1 - x0);
      std::memset(row + x1, 0, w - x1);
    }
  }
}

bool RandomCrop::pixel_map(const SampleShape& shape, SampleRng& rng, PixelMap& map) const {
  const int64_t p = padding_;
  const int64_t dy = static_cast<int64_t>(rng.below(2 * p + 1)) - p;  // the draws of apply(), in its order
  const int64_t dx = static_cast<int64_t>(rng.below(2 * p + 1)) - p;
  auto shifted = [](int64_t size, int64_t by) {
    std::vector<int64_t> source(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i)
      source[static_cast<size_t>(i)] = i + by >= 0 && i + by < size ? i + by : -1;
    return source;
  };
  map.rows = shifted(shape.height, dy);
  map.cols = shifted(shape.width, dx);
  return true;
}

std::string RandomCrop::describe() const {
  return fmt::format("RandomCrop(padding={})", padding_);
}

HorizontalFlip::HorizontalFlip(double probability) : probability_(probability) {
  FT_CONFIG_CHECK(probability >= 0.0 && probability <= 1.0,
                  "HorizontalFlip probability must be in [0, 1], got {}", probability);
}

void HorizontalFlip::apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng& rng) const {
  const int64_t rows = shape.channels * shape.height;
  const int64_t w = shape.width;
  // Always draw, so that p = 0 and p = 1 consume the same randomness as any other p.
  if (!(rng.uniform() < probability_)) {
    std::memcpy(out, in, rows * w);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = in + r * w;
    uint8_t* dst = out + r * w;
    for (int64_t x = 0; x < w; ++x) dst[x] = src[w - 1 - x];
  }
}

bool HorizontalFlip::pixel_map(const SampleShape& shape, SampleRng& rng, PixelMap& map) const {
  map = PixelMap::identity(shape);
  if (rng.uniform() < probability_) std::reverse(map.cols.begin(), map.cols.end());
  return true;
}

std::string HorizontalFlip::describe() const {
  return fmt::format("HorizontalFlip(p={})", probability_);
}

TransformPipeline::TransformPipeline(std::vector<float> mean, std::vector<float> std)
    : mean_(std::move(mean)), std_(std::move(std)) {
  FT_CONFIG_CHECK(!mean_.empty() && mean_.size() == std_.size(),
                  "normalisation needs one mean and one std per channel (or one for all): got {} mean(s) and "
                  "{} std(s)",
                  mean_.size(), std_.size());
  for (size_t c = 0; c < std_.size(); ++c) {
    FT_CONFIG_CHECK(std::isfinite(mean_[c]), "normalisation mean[{}] must be finite, got {}", c, mean_[c]);
    FT_CONFIG_CHECK(std::isfinite(std_[c]) && std_[c] > 0, "normalisation std[{}] must be > 0, got {}", c,
                    std_[c]);
  }
  table_.resize(mean_.size() * 256);
  for (size_t c = 0; c < mean_.size(); ++c) {
    for (int v = 0; v < 256; ++v) {
      // Float operations in the order torch's ToTensor + Normalize perform them.
      const float x = static_cast<float>(v) / 255.0f;
      table_[c * 256 + v] = (x - mean_[c]) / std_[c];
    }
  }
}

TransformPipeline& TransformPipeline::add(std::shared_ptr<const Augmentation> augmentation) {
  FT_CHECK(augmentation != nullptr, "TransformPipeline::add: null augmentation");
  augmentations_.push_back(std::move(augmentation));
  return *this;
}

void TransformPipeline::check_channels(int64_t channels) const {
  FT_CONFIG_CHECK(normalized_channels() == 1 || normalized_channels() == channels,
                  "normalisation has {} mean/std value(s) but the samples have {} channel(s); give 1 or {}",
                  normalized_channels(), channels, channels);
}

void TransformPipeline::apply(const uint8_t* in, const SampleShape& shape, float* out, SampleRng rng) const {
  check_channels(shape.channels);
  const uint8_t* src = in;
  if (!augmentations_.empty()) {
    // Two scratch buffers per thread, alternated between the augmentations; reused across samples.
    thread_local std::vector<uint8_t> scratch_a;
    thread_local std::vector<uint8_t> scratch_b;
    const size_t numel = static_cast<size_t>(shape.numel());
    if (scratch_a.size() < numel) scratch_a.resize(numel);
    if (scratch_b.size() < numel) scratch_b.resize(numel);
    uint8_t* dst = scratch_a.data();
    for (const auto& augmentation : augmentations_) {
      augmentation->apply(src, dst, shape, rng);
      src = dst;
      dst = dst == scratch_a.data() ? scratch_b.data() : scratch_a.data();
    }
  }
  const int64_t plane = shape.height * shape.width;
  for (int64_t c = 0; c < shape.channels; ++c) {
    const float* table = table_.data() + (normalized_channels() == 1 ? 0 : c * 256);
    const uint8_t* s = src + c * plane;
    float* o = out + c * plane;
    for (int64_t k = 0; k < plane; ++k) o[k] = table[s[k]];
  }
}

PixelMap TransformPipeline::pixel_map(const SampleShape& shape, SampleRng rng) const {
  PixelMap map = PixelMap::identity(shape);
  for (const auto& augmentation : augmentations_) {
    PixelMap step;
    FT_CHECK(augmentation->pixel_map(shape, rng, step),
             "{} cannot run on a device (it does not move pixels by rows and columns): set "
             "data.device_resident = false",
             augmentation->describe());
    map.then(step);
  }
  return map;
}

bool TransformPipeline::maps_pixels() const {
  const SampleShape probe{1, 2, 2};
  for (const auto& augmentation : augmentations_) {
    SampleRng rng(0, 0, 0);
    PixelMap map;
    if (!augmentation->pixel_map(probe, rng, map)) return false;
  }
  return true;
}

std::string TransformPipeline::describe() const {
  std::vector<std::string> parts;
  for (const auto& augmentation : augmentations_) parts.push_back(augmentation->describe());
  parts.push_back(
      fmt::format("Normalize(mean=[{}], std=[{}])", fmt::join(mean_, ", "), fmt::join(std_, ", ")));
  return fmt::format("{}", fmt::join(parts, " -> "));
}

}  // namespace fasttrain
