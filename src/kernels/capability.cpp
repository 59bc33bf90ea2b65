#include <algorithm>
#include <cstdlib>
#include <string>

#include "fasttrain/detail/compat.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/kernels/gpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

#if FASTTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <atomic>

#include "cuda/layer_norm_cuda.h"
#endif

namespace fasttrain::kernels {

namespace {

CpuCapability widest_in_hardware() {
#ifdef FASTTRAIN_X86_KERNELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return CpuCapability::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuCapability::avx2;
#endif
  return CpuCapability::scalar;
}

// ATEN_CPU_CAPABILITY's values, as ATen reads them: an unknown value leaves the hardware's choice.
CpuCapability lowered_by_environment(CpuCapability widest) {
  const char* asked = std::getenv("ATEN_CPU_CAPABILITY");
  if (asked == nullptr) return widest;
  const std::string value = asked;
  if (value == "default") return CpuCapability::scalar;
  if (value == "avx2") return std::min(widest, CpuCapability::avx2);
  return widest;
}

}  // namespace

CpuCapability cpu_capability() {
  static const CpuCapability chosen = lowered_by_environment(widest_in_hardware());
  return chosen;
}

std::vector<CpuCapability> runnable_cpu_capabilities() {
  std::vector<CpuCapability> runnable;
  const CpuCapability widest = widest_in_hardware();
  for (CpuCapability c : {CpuCapability::scalar, CpuCapability::avx2, CpuCapability::avx512})
    if (c <= widest) runnable.push_back(c);
  return runnable;
}

void detail::check_runnable(CpuCapability capability, const char* kernel) {
  const auto runnable = runnable_cpu_capabilities();
  FT_CHECK(std::find(runnable.begin(), runnable.end(), capability) != runnable.end(),
           "{}: this CPU does not run the {} build of the kernel (it runs up to {})", kernel,
           to_string(capability), to_string(runnable.back()));
}

void detail::check_first_order(const char* kernel) {
  FT_CHECK(!torch::GradMode::is_enabled(),
           "{}: its backward is not itself differentiable, so a second derivative through it (backward with "
           "create_graph) would be wrong; leave this model's kernels to ATen (model.kernels = \"aten\")",
           kernel);
}

std::string to_string(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::avx512:
      return "avx512";
    case CpuCapability::avx2:
      return "avx2";
    case CpuCapability::scalar:
      break;
  }
  return "scalar";
}

torch::ScalarType cpu_compute_dtype(const torch::Tensor& x) {
  return compat::autocast_enabled(c10::DeviceType::CPU) ? compat::autocast_dtype(c10::DeviceType::CPU)
                                                        : x.scalar_type();
}

bool gpu_kernels_run_on(const torch::Device& device) {
#if FASTTRAIN_CUDA
  if (!device.is_cuda()) return false;
  const int index = device.has_index() ? device.index() : at::cuda::current_device();
  static std::array<std::atomic<int>, 64> loads{};  // per device: 0 not asked yet, 1 yes, 2 no
  if (index < 0 || index >= static_cast<int>(loads.size())) return false;
  if (loads[index] == 0) {
    const c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(index));
    loads[index] =
        at::cuda::getDeviceProperties(index)->major >= 8 && detail::cuda_kernels_load_on_current_device() ? 1
                                                                                                          : 2;
  }
  return loads[index] == 1;
#else
  (void)device;
  return false;
#endif
}

torch::ScalarType compute_dtype(const torch::Tensor& x) {
  const c10::DeviceType type = x.device().type();
  return compat::autocast_enabled(type) ? compat::autocast_dtype(type) : x.scalar_type();
}

}  // namespace fasttrain::kernels
