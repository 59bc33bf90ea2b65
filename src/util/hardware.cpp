#include "fasttrain/util/hardware.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"

#ifdef FASTTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace fasttrain {

namespace {

struct CpuInfo {
  std::string model = "unknown";
  std::vector<std::string> flags;
  bool has(const std::string& flag) const {
    for (const auto& f : flags)
      if (f == flag) return true;
    return false;
  }
};

CpuInfo read_cpuinfo() {
  CpuInfo info;
  std::ifstream cpuinfo("/proc/cpuinfo");
  bool have_model = false, have_flags = false;
  for (std::string line; std::getline(cpuinfo, line) && !(have_model && have_flags);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (!have_model && line.rfind("model name", 0) == 0) {
      info.model = value;
      have_model = true;
    } else if (!have_flags && line.rfind("flags", 0) == 0) {
      std::istringstream words(value);
      for (std::string flag; words >> flag;) info.flags.push_back(flag);
      have_flags = true;
    }
  }
  return info;
}

// FASTTRAIN_NATIVE_BF16: "0" or "1" overrides the CPU's answer; unset or empty leaves it.
std::optional<bool> native_bf16_override() {
  const char* value = std::getenv("FASTTRAIN_NATIVE_BF16");
  if (!value || !*value) return std::nullopt;
  const std::string text = value;
  FT_CONFIG_CHECK(text == "0" || text == "1",
                  "FASTTRAIN_NATIVE_BF16 must be 0 (treat this CPU as without native bfloat16) or 1, got "
                  "'{}'",
                  text);
  return text == "1";
}

}  // namespace

bool Hardware::native_bf16() const {
  if (device.is_cuda()) return cuda_capability >= 80;
  return cpu_native_bf16;
}

std::string Hardware::describe() const {
  if (device.is_cuda()) {
    return fmt::format("{} (sm_{}, {}native bf16)", gpu_name, cuda_capability, native_bf16() ? "" : "no ");
  }
  const std::string vector_unit = cpu_avx512 ? "AVX512" : cpu_avx2 ? "AVX2" : "no AVX2";
  std::string bf16 = cpu_native_bf16 ? "native bf16" : "no native bf16";
  if (native_bf16_overridden) bf16 += " by FASTTRAIN_NATIVE_BF16";
  return fmt::format("{} ({}, {}, {} physical cores)", cpu_model, vector_unit, bf16, physical_cores);
}

Hardware detect_hardware(const torch::Device& device) {
  static const CpuInfo cpu = read_cpuinfo();
  Hardware hardware;
  hardware.device = device;
  hardware.cpu_model = cpu.model;
  hardware.cpu_avx2 = cpu.has("avx2");
  hardware.cpu_avx512 = cpu.has("avx512f");
  hardware.cpu_native_bf16 = cpu.has("avx512_bf16") || cpu.has("amx_bf16");
  hardware.cpu_amx_bf16 = cpu.has("amx_bf16");
  if (const auto forced = native_bf16_override()) {
    hardware.native_bf16_overridden = *forced != hardware.cpu_native_bf16;
    hardware.cpu_native_bf16 = *forced;
  }
  hardware.physical_cores = physical_cores();
  hardware.openblas_pool = blas_library().name == "OpenBLAS";
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_bytes > 0) hardware.host_memory_bytes = static_cast<int64_t>(pages) * page_bytes;
#ifdef FASTTRAIN_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* gpu = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    hardware.gpu_name = gpu->name;
    hardware.cuda_capability = gpu->major * 10 + gpu->minor;
    hardware.gpu_memory_bytes = static_cast<int64_t>(gpu->totalGlobalMem);
  }
#endif
  return hardware;
}

}  // namespace fasttrain
