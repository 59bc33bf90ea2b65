#pragma once
// In-memory image classification datasets (MNIST-family) kept as uint8, as stored on disk.
//
//   auto splits = fasttrain::load_image_dataset("fashion-mnist", "/usr/share/datasets/fashion-mnist");
//   splits.train.images   // [60000, 1, 28, 28] uint8
//   splits.train.labels   // [60000] int64
#include <torch/types.h>

#include <string>
#include <vector>

namespace fasttrain {

struct ImageDataset {
  torch::Tensor images;  // [N, C, H, W] uint8, contiguous, CPU
  torch::Tensor labels;  // [N] int64, CPU
  int64_t num_classes = 0;

  int64_t size() const { return images.defined() ? images.size(0) : 0; }
  int64_t channels() const { return images.size(1); }
  int64_t height() const { return images.size(2); }
  int64_t width() const { return images.size(3); }
  // The first `count` samples (a view); count must be in [1, size()].
  ImageDataset head(int64_t count) const;
};

struct ImageSplits {
  ImageDataset train;
  ImageDataset test;
};

// The dataset names `load_image_dataset` accepts: "fashion-mnist", "mnist", "idx".
const std::vector<std::string>& image_dataset_names();

// Reads the four standard IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each optionally .gz) from `directory`.
// An unknown name, a missing directory or file, or a corrupt file is an error naming it.
ImageSplits load_image_dataset(const std::string& name, const std::string& directory);

// Per-channel mean and standard deviation of `images` scaled to [0, 1].
std::pair<std::vector<float>, std::vector<float>> channel_statistics(const torch::Tensor& images);

}  // namespace fasttrain
