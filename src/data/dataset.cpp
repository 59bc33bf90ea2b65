#include "fasttrain/data/dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>

#include "fasttrain/data/idx.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

// What a named dataset guarantees beyond the IDX format; "idx" accepts any MNIST-shaped files.
struct DatasetSpec {
  int64_t height = 0;  // 0 = any
  int64_t width = 0;
  int64_t num_classes = 0;  // 0 = max label + 1
};

DatasetSpec spec_for(const std::string& name) {
  if (name == "fashion-mnist" || name == "mnist") return {28, 28, 10};
  return {};
}

struct Split {
  torch::Tensor images;
  torch::Tensor labels;
  std::string images_path;
  std::string labels_path;
};

Split load_split(const std::string& directory, const std::string& prefix) {
  Split split;
  split.images_path = find_idx_file(directory, prefix + "-images-idx3-ubyte");
  split.labels_path = find_idx_file(directory, prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx(split.images_path, 3);
  torch::Tensor labels = read_idx(split.labels_path, 1);
  FT_CHECK(images.size(0) == labels.size(0), "{} holds {} images but {} holds {} labels; they must match",
           split.images_path, images.size(0), split.labels_path, labels.size(0));
  split.images = images.unsqueeze(1).contiguous();  // [N, H, W] -> [N, 1, H, W]
  split.labels = labels.to(torch::kInt64);
  return split;
}

void check_spec(const Split& split, const std::string& name, const DatasetSpec& spec) {
  if (spec.height > 0) {
    FT_CHECK(split.images.size(2) == spec.height && split.images.size(3) == spec.width,
             "{}: {} images must be {}x{}, found {}x{}", split.images_path, name, spec.height, spec.width,
             split.images.size(2), split.images.size(3));
  }
  if (spec.num_classes > 0) {
    const int64_t* labels = split.labels.data_ptr<int64_t>();
    const int64_t count = split.labels.size(0);
    for (int64_t i = 0; i < count; ++i) {
      // The label data starts after the 8-byte header (magic + one dimension).
      FT_CHECK(labels[i] < spec.num_classes, "{}: label {} at offset {} is {}; {} labels must be in [0, {})",
               split.labels_path, i, 8 + i, labels[i], name, spec.num_classes);
    }
  }
}

}  // namespace

ImageDataset ImageDataset::head(int64_t count) const {
  FT_CHECK(count >= 1 && count <= size(), "ImageDataset::head({}): count must be in [1, {}]", count, size());
  ImageDataset out;
  out.images = images.narrow(0, 0, count);
  out.labels = labels.narrow(0, 0, count);
  out.num_classes = num_classes;
  return out;
}

const std::vector<std::string>& image_dataset_names() {
  static const std::vector<std::string> names = {"fashion-mnist", "mnist", "idx"};
  return names;
}

ImageSplits load_image_dataset(const std::string& name, const std::string& directory) {
  const auto& names = image_dataset_names();
  FT_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "unknown dataset '{}'; valid: {}",
           name, fmt::join(names, ", "));
  std::error_code ec;
  FT_CHECK(std::filesystem::is_directory(directory, ec), "dataset directory '{}' for '{}' does not exist{}",
           directory, name, std::filesystem::exists(directory, ec) ? " (it is not a directory)" : "");

  const DatasetSpec spec = spec_for(name);
  Split train = load_split(directory, "train");
  Split test = load_split(directory, "t10k");
  check_spec(train, name, spec);
  check_spec(test, name, spec);
  FT_CHECK(train.images.size(2) == test.images.size(2) && train.images.size(3) == test.images.size(3),
           "{} holds {}x{} images but {} holds {}x{}; train and test images must have the same size",
           train.images_path, train.images.size(2), train.images.size(3), test.images_path,
           test.images.size(2), test.images.size(3));

  int64_t num_classes = spec.num_classes;
  if (num_classes == 0) {
    // Labels are bytes, so the maximum is at most 255 and the class count at most 256.
    num_classes = std::max(train.labels.max().item<int64_t>(), test.labels.max().item<int64_t>()) + 1;
  }
  ImageSplits splits;
  splits.train = ImageDataset{train.images, train.labels, num_classes};
  splits.test = ImageDataset{test.images, test.labels, num_classes};
  return splits;
}

std::pair<std::vector<float>, std::vector<float>> channel_statistics(const torch::Tensor& images) {
  FT_CHECK(images.defined() && images.scalar_type() == torch::kUInt8 && images.dim() == 4,
           "channel_statistics: expected uint8 images [N, C, H, W], got {} {}",
           images.defined() ? std::string(c10::toString(images.scalar_type())) : "undefined",
           images.defined() ? fmt::format("{}", fmt::join(images.sizes(), "x")) : "");
  FT_CHECK(images.numel() > 0, "channel_statistics: no pixels in images of shape {}",
           fmt::join(images.sizes(), "x"));
  const torch::Tensor contiguous = images.contiguous();
  const int64_t n = contiguous.size(0);
  const int64_t channels = contiguous.size(1);
  const int64_t plane = contiguous.size(2) * contiguous.size(3);
  const uint8_t* data = contiguous.data_ptr<uint8_t>();
  // A histogram per channel makes the sums exact (integers) and the pass one tight loop over bytes.
  std::vector<std::array<uint64_t, 256>> histogram(channels);
  for (auto& h : histogram) h.fill(0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      const uint8_t* p = data + (i * channels + c) * plane;
      auto& h = histogram[c];
      for (int64_t k = 0; k < plane; ++k) ++h[p[k]];
    }
  }
  std::vector<float> mean(channels);
  std::vector<float> stddev(channels);
  const double count = static_cast<double>(n) * static_cast<double>(plane);
  for (int64_t c = 0; c < channels; ++c) {
    double sum = 0;
    for (int v = 0; v < 256; ++v) sum += static_cast<double>(histogram[c][v]) * v;
    const double m = sum / count;
    double squares = 0;  // around the mean, to avoid cancellation
    for (int v = 0; v < 256; ++v) squares += static_cast<double>(histogram[c][v]) * (v - m) * (v - m);
    // Population standard deviation, as the usual normalisation constants (0.2860, 0.3530) are computed.
    mean[c] = static_cast<float>(m / 255.0);
    stddev[c] = static_cast<float>(std::sqrt(squares / count) / 255.0);
  }
  return {mean, stddev};
}

}  // namespace fasttrain
