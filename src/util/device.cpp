#include "fasttrain/util/device.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/cuda.h>
#ifdef FASTTRAIN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

#include "fasttrain/util/check.h"

namespace fasttrain {

torch::Device parse_device(const std::string& spec, int local_rank) {
  const auto rank_gpu = [&] {
    const int gpus = static_cast<int>(torch::cuda::device_count());
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % std::max(gpus, 1)));
  };
  if (spec == "auto") return torch::cuda::is_available() ? rank_gpu() : torch::Device(torch::kCPU);
  if (spec == "cpu") return torch::Device(torch::kCPU);
  const std::string must_be = "train.device must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"";
  if (spec.rfind("cuda", 0) == 0) {
    const std::string index = spec.size() > 5 && spec[4] == ':' ? spec.substr(5) : "";
    FT_CONFIG_CHECK(spec == "cuda" || (!index.empty() && index.size() <= 4 &&
                                       std::all_of(index.begin(), index.end(),
                                                   [](unsigned char c) { return std::isdigit(c) != 0; })),
                    "{}, got '{}'", must_be, spec);
    FT_CONFIG_CHECK(
        torch::cuda::is_available(),
        "train.device = '{}', but this LibTorch ({}) sees no CUDA device; use \"cpu\" or \"auto\"", spec,
        TORCH_VERSION);
    if (index.empty()) return rank_gpu();
    const int ordinal = std::stoi(index);
    FT_CONFIG_CHECK(ordinal < static_cast<int>(torch::cuda::device_count()),
                    "train.device = '{}' does not exist: {} CUDA device(s) visible", spec,
                    torch::cuda::device_count());
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ordinal));
  }
  throw ConfigError(fmt::format("{}, got '{}'", must_be, spec));
}

void use_device(const torch::Device& device) {
#ifdef FASTTRAIN_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

int physical_cores() {
  // Count distinct (physical id, core id) pairs; fall back to the logical count.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;
  std::string line;
  int physical_id = 0;
  while (std::getline(cpuinfo, line)) {
    auto value = [&] { return std::stoi(line.substr(line.find(':') + 1)); };
    if (line.rfind("physical id", 0) == 0) physical_id = value();
    if (line.rfind("core id", 0) == 0) cores.emplace(physical_id, value());
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  return std::max(1u, std::thread::hardware_concurrency());
}

int set_intra_op_threads(int threads, int processes_sharing) {
  FT_CONFIG_CHECK(threads >= 0, "train.threads must be >= 0 (0 = physical cores), got {}", threads);
  int count = threads > 0 ? threads : std::max(1, physical_cores() / std::max(1, processes_sharing));
  at::set_num_threads(count);
  return count;
}

namespace {

// OpenBLAS's thread controls, found in the process (LibTorch links the BLAS); null when absent.
struct OpenBlasControls {
  int (*get)() = nullptr;
  void (*set)(int) = nullptr;
  int at_start = 0;  // the pool's size before anyone here changed it
};

const OpenBlasControls& openblas() {
  static const OpenBlasControls controls = [] {
    OpenBlasControls found;
    found.get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    found.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    if (!found.get || !found.set) return OpenBlasControls{};
    found.at_start = found.get();
    return found;
  }();
  return controls;
}

}  // namespace

BlasLibrary blas_library() {
  const auto& controls = openblas();
  if (!controls.get) return {};
  return {"OpenBLAS", controls.get(), controls.at_start};
}

int set_blas_threads(int threads) {
  FT_CONFIG_CHECK(threads >= 0, "train.blas_threads must be >= 0 (0 = the library's own count), got {}",
                  threads);
  const auto& controls = openblas();
  if (!controls.set) {
    FT_CONFIG_CHECK(threads == 0,
                    "train.blas_threads = {} needs OpenBLAS, and this LibTorch's BLAS is another (its "
                    "matmuls follow train.threads); set train.blas_threads = 0",
                    threads);
    return 0;
  }
  const int count = threads > 0 ? threads : controls.at_start;
  controls.set(count);
  return count;
}

}  // namespace fasttrain
