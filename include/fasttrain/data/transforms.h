#pragma once
// Per-sample transforms, run in the loader's worker threads on the raw uint8 samples.
// Augmentations (uint8 -> uint8) compose in order; Normalize is always last (uint8 -> float).
// Every random choice comes from a SampleRng keyed on (seed, epoch, sample index), so the
// result does not depend on which worker ran it.
//
//   auto pipeline = fasttrain::TransformPipeline({0.2860f}, {0.3530f})
//                       .add(std::make_shared<fasttrain::RandomCrop>(2))
//                       .add(std::make_shared<fasttrain::HorizontalFlip>());
//   pipeline.apply(sample_u8, shape, out_f32, fasttrain::SampleRng(seed, epoch, index));
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fasttrain {

// Counter-based generator: a pure function of its key, cheap to create per sample (splitmix64).
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index);
  uint64_t next();
  // Uniform integer in [0, bound).
  uint64_t below(uint64_t bound);
  // Uniform in [0, 1).
  double uniform();

 private:
  uint64_t state_;
};

// 0 .. count-1 in an order drawn from (seed, epoch): Fisher-Yates driven by a SampleRng keyed on an
// index no sample has. The epoch order of a loader, and of a source's batches.
std::vector<int64_t> shuffled_order(int64_t count, uint64_t seed, int64_t epoch);

struct SampleShape {
  int64_t channels = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t numel() const { return channels * height * width; }
};

// Where each output pixel of a sample comes from, row and column apart: output (y, x) is input
// (rows[y], cols[x]), or 0 where either is -1 (padding). What a device builds batches from
// (data/device_resident.h): the host draws each sample's maps, the device gathers the pixels.
struct PixelMap {
  std::vector<int64_t> rows;  // [H]
  std::vector<int64_t> cols;  // [W]
  // The identity of `shape`.
  static PixelMap identity(const SampleShape& shape);
  // This map followed by `next` (an augmentation applied to this map's output).
  void then(const PixelMap& next);
};

class Augmentation {
 public:
  virtual ~Augmentation() = default;
  // Reads `in`, writes `out` (same shape, distinct buffers, layout [C, H, W]).
  virtual void apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng& rng) const = 0;
  // The same augmentation as a PixelMap, drawing from `rng` exactly what apply() draws; false (and
  // nothing drawn) for an augmentation that does not move pixels by rows and columns apart.
  virtual bool pixel_map(const SampleShape& shape, SampleRng& rng, PixelMap& map) const = 0;
  virtual std::string describe() const = 0;
};

// Pads by `padding` zeros on every side, then crops a random window of the original size.
class RandomCrop : public Augmentation {
 public:
  explicit RandomCrop(int padding);
  void apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng& rng) const override;
  bool pixel_map(const SampleShape& shape, SampleRng& rng, PixelMap& map) const override;
  std::string describe() const override;

 private:
  int padding_;
};

// Mirrors left-right with probability `probability`.
class HorizontalFlip : public Augmentation {
 public:
  explicit HorizontalFlip(double probability = 0.5);
  void apply(const uint8_t* in, uint8_t* out, const SampleShape& shape, SampleRng& rng) const override;
  bool pixel_map(const SampleShape& shape, SampleRng& rng, PixelMap& map) const override;
  std::string describe() const override;

 private:
  double probability_;
};

// Augmentations followed by normalisation: out = (in / 255 - mean[c]) / std[c].
class TransformPipeline {
 public:
  TransformPipeline(std::vector<float> mean, std::vector<float> std);
  TransformPipeline& add(std::shared_ptr<const Augmentation> augmentation);
  // `out` holds shape.numel() floats. Thread-safe: keeps no mutable state.
  void apply(const uint8_t* in, const SampleShape& shape, float* out, SampleRng rng) const;
  bool has_augmentations() const { return !augmentations_.empty(); }
  // The augmentations of one sample as a PixelMap (what apply() would do to it, keyed on the same
  // `rng`). An Error naming the augmentation that has no PixelMap form.
  PixelMap pixel_map(const SampleShape& shape, SampleRng rng) const;
  // Whether every augmentation has a PixelMap form (the pipeline can run on a device).
  bool maps_pixels() const;
  // The byte -> float normalisation of channel c: entry c * 256 + v (one set of 256 when every channel
  // shares the mean and std).
  const std::vector<float>& normalisation_table() const { return table_; }
  std::string describe() const;
  // Channels of the mean/std given; 1 applies to every channel of a sample.
  int64_t normalized_channels() const { return static_cast<int64_t>(mean_.size()); }
  // Throws unless samples with `channels` channels can be normalised (1 or the same count).
  void check_channels(int64_t channels) const;

 private:
  std::vector<std::shared_ptr<const Augmentation>> augmentations_;
  std::vector<float> mean_;
  std::vector<float> std_;
  // table_[c * 256 + v] = (v / 255 - mean[c]) / std[c], computed in float in the formula's order:
  // a byte -> float lookup costs no more than a multiply-add and gives the values ToTensor +
  // Normalize give (bit-identical with LibTorch 1.13 on CPU), not a refactored approximation.
  std::vector<float> table_;
};

}  // namespace fasttrain
