#pragma once
// Shared test fixtures: temporary directories, the real dataset's location, synthetic datasets.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/data/dataset.h"
#include "fasttrain/data/loader.h"
#include "fasttrain/detail/file_io.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/huge_pages.h"

namespace fasttrain::testing {

// Whether this kernel records huge-page advice where fasttrain reads it: a mapping advised directly.
inline bool kernel_records_huge_page_advice() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr size_t kBytes = 4 << 20;
  void* mapping = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) return false;
  const bool recorded = madvise(mapping, kBytes, MADV_HUGEPAGE) == 0 && advised_huge_pages(mapping);
  munmap(mapping, kBytes);
  return recorded;
#else
  return false;
#endif
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fasttrain-test-XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = made;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Sets environment variables for one test (and unsets `cleared`), putting the previous values back.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& values,
                     const std::vector<std::string>& cleared = {}) {
    for (const auto& name : cleared) save_and_unset(name);
    for (const auto& [name, value] : values) {
      save_and_unset(name);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ScopedEnv(const std::string& name, const std::string& value)
      : ScopedEnv(std::map<std::string, std::string>{{name, value}}) {}
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void save_and_unset(const std::string& name) {
    if (saved_.count(name)) return;
    const char* old = std::getenv(name.c_str());
    saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    ::unsetenv(name.c_str());
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

// The message of the fasttrain::Error `fn` throws; a test failure (and "") when it throws none.
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fasttrain::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a fasttrain::Error";
  return "";
}

// Every one of `parts` occurs in `message`.
inline ::testing::AssertionResult contains_all(const std::string& message,
                                               const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

// Whether the autograd graph that produced `output` has a node whose name contains `name` (which kernel ran).
inline bool graph_has_node(const torch::Tensor& output, const std::string& name) {
  std::vector<torch::autograd::Node*> pending{output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (!node || !seen.insert(node).second) continue;
    if (node->name().find(name) != std::string::npos) return true;
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return false;
}

inline const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

// The shape of Fashion-MNIST's images and classes.
inline const DataShape kFashion = DataShape::images(1, 28, 28, 10);

inline bool have_fashion_mnist() {
  return std::filesystem::is_directory(kFashionMnist);
}

#define FT_REQUIRE_FASHION_MNIST()                                                                     \
  if (!::fasttrain::testing::have_fashion_mnist()) {                                                   \
    GTEST_SKIP() << "needs Debian's dataset-fashion-mnist at " << ::fasttrain::testing::kFashionMnist; \
  }

// `count` random uint8 images [count, channels, height, width] with labels in [0, classes).
inline ImageDataset synthetic_images(int64_t count, int64_t channels = 1, int64_t height = 8,
                                     int64_t width = 8, int64_t classes = 4, uint64_t seed = 1) {
  torch::manual_seed(seed);
  ImageDataset dataset;
  dataset.images = torch::randint(0, 256, {count, channels, height, width}, torch::kUInt8);
  dataset.labels = torch::randint(0, classes, {count}, torch::kLong);
  dataset.num_classes = classes;
  return dataset;
}

// 40 small "python files" of varying length (1 to 7 functions) with a learnable structure, under
// DIR/corpus (a quarter in a subfolder). Returns the corpus directory.
inline std::string write_text_corpus(const TempDir& dir) {
  const std::string root = dir.file("corpus");
  for (int i = 0; i < 40; ++i) {
    std::filesystem::create_directories(root + (i % 4 == 0 ? "/pkg" : ""));
    std::ofstream out(root + (i % 4 == 0 ? "/pkg/" : "/") + "m" + std::to_string(i) + ".py");
    for (int f = 0; f < 1 + i % 7; ++f) out << "def f" << f << "(x):\n    return x + " << f << "\n\n";
  }
  return root;
}

// tests/<relative>, a reference file kept beside its test (written by a script there), parsed.
inline nlohmann::json read_reference_json(const std::string& relative) {
  const std::string path = std::string(FASTTRAIN_SOURCE_DIR) + "/tests/" + relative;
  std::ifstream file(path);
  EXPECT_TRUE(file.is_open()) << "cannot open " << path;
  return nlohmann::json::parse(file);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A file's bytes, for comparing two runs' files (a missing file is read_binary_file's error, not "").
inline std::string bytes_of(const std::string& path) {
  const std::vector<uint8_t> bytes = read_binary_file(path);
  return std::string(bytes.begin(), bytes.end());
}

// The largest element difference between two safetensors files with the same tensor names.
inline double max_difference(const std::string& a, const std::string& b) {
  SafetensorsFile first = load_safetensors(a), second = load_safetensors(b);
  EXPECT_EQ(first.names(), second.names());
  double worst = 0;
  for (const auto& name : first.names()) {
    worst = std::max(worst, (first.at(name) - second.at(name)).abs().max().item<double>());
  }
  return worst;
}

// One epoch's batches from `loader`, as many as it says an epoch has.
inline std::vector<Batch> epoch_batches(DataLoader& loader, int64_t epoch) {
  std::vector<Batch> batches;
  loader.start_epoch(epoch);
  while (auto batch = loader.next()) batches.push_back(std::move(*batch));
  EXPECT_EQ(static_cast<int64_t>(batches.size()), loader.batches_per_epoch());
  return batches;
}

// The fasttrain executable under test.
inline const std::string kCli = FASTTRAIN_CLI;

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

// Starts `command` under /bin/sh with exec, so that the returned pid is the command's own (signals
// reach it, not the shell). Output goes where the command redirects it.
inline pid_t spawn_command(const std::string& command) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// The exit code of `pid` (128 + signal when a signal ended it).
inline int wait_exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Polls `condition` every millisecond until it holds (true) or `timeout_s` passes (false).
inline bool wait_until(const std::function<bool()>& condition, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return condition();
}

// Modules written in Python (tests/models/scripted_models.py: cnn, cnn_traced, cnn_7_classes, regressor,
// heads, no_forward), saved as DIR/<name>.pt by FASTTRAIN_TORCH_PYTHON, the PyTorch release of the LibTorch
// under test: made once per test process. `missing` says why there are none (that Python lacks torch).
struct ScriptedModels {
  std::string dir;
  std::string missing;
  std::string path(const std::string& name) const { return dir + "/" + name + ".pt"; }
};

inline const ScriptedModels& scripted_models() {
  static TempDir dir;
  static const ScriptedModels models = [] {
    const std::string python = FASTTRAIN_TORCH_PYTHON;
    const CommandResult made =
        run_command(python + " " + FASTTRAIN_SOURCE_DIR + "/tests/models/scripted_models.py " + dir.path());
    if (made.exit_code == 0) return ScriptedModels{dir.path(), ""};
    return ScriptedModels{"", python +
                                  " could not save the TorchScript modules (it needs the torch of this "
                                  "LibTorch's release; scripts/install-deps installs it): " +
                                  made.output};
  }();
  return models;
}

#define FT_REQUIRE_SCRIPTED_MODELS()                                 \
  if (!::fasttrain::testing::scripted_models().missing.empty()) {    \
    GTEST_SKIP() << ::fasttrain::testing::scripted_models().missing; \
  }

}  // namespace fasttrain::testing
