#pragma once
// Shared test fixtures: temporary directories, the real dataset's location, synthetic datasets.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fasttrain/data/dataset.h"

namespace fasttrain::testing {

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fasttrain-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

inline bool have_fashion_mnist() { return std::filesystem::is_directory(kFashionMnist); }

#define FT_REQUIRE_FASHION_MNIST()                                                        \
  if (!::fasttrain::testing::have_fashion_mnist()) {                                      \
    GTEST_SKIP() << "needs Debian's dataset-fashion-mnist at " << ::fasttrain::testing::kFashionMnist; \
  }

// `count` random uint8 images [count, channels, height, width] with labels in [0, classes).
inline ImageDataset synthetic_images(int64_t count, int64_t channels = 1, int64_t height = 8, int64_t width = 8,
                                     int64_t classes = 4, uint64_t seed = 1) {
  torch::manual_seed(seed);
  ImageDataset dataset;
  dataset.images = torch::randint(0, 256, {count, channels, height, width}, torch::kUInt8);
  dataset.labels = torch::randint(0, classes, {count}, torch::kLong);
  dataset.num_classes = classes;
  return dataset;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs a shell command, returns its exit code and merged stdout+stderr.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  std::string full = command + " 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) result.output.append(buffer, n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace fasttrain::testing
