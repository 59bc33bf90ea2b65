#pragma once
// What this machine offers that fasttrain's "auto" defaults depend on: the CPU's model, vector
// extensions and native bfloat16, its physical cores, and the CUDA device's compute capability.
//
//   fasttrain::Hardware hw = fasttrain::detect_hardware(device);
//   if (!hw.native_bf16()) ...            // bf16 would be emulated here: fp32 is faster
//
// Tests build a Hardware by hand to see what "auto" chooses on a machine they do not run on.
// FASTTRAIN_NATIVE_BF16=0 (or 1) in the environment overrides what the CPU reports, so a run on a
// bf16 CPU can approximate one without it.
#include <torch/types.h>

#include <string>

namespace fasttrain {

struct Hardware {
  torch::Device device = torch::kCPU;  // where the run computes
  std::string cpu_model;               // /proc/cpuinfo "model name" ("unknown" when absent)
  bool cpu_avx2 = false;
  bool cpu_avx512 = false;              // AVX512F
  bool cpu_native_bf16 = false;         // AVX512-BF16 or AMX-BF16: oneDNN's bf16 kernels run natively
  bool native_bf16_overridden = false;  // FASTTRAIN_NATIVE_BF16 decided cpu_native_bf16
  bool cpu_amx_bf16 = false;  // AMX-BF16: where oneDNN rounds fp32 convs and matmuls to bf16 when allowed
  int physical_cores = 1;
  bool openblas_pool = false;     // LibTorch's fp32 matmuls run in OpenBLAS's own thread pool
  std::string gpu_name;           // CUDA devices only
  int cuda_capability = 0;        // major * 10 + minor, e.g. 90 for an H100; 0 on CPU
  int64_t gpu_memory_bytes = 0;   // the CUDA device's memory; 0 on CPU
  int64_t host_memory_bytes = 0;  // the machine's physical memory (0 where the system does not say)

  // The memory of `device`: the GPU's on a CUDA device, else the host's.
  int64_t device_memory_bytes() const { return device.is_cuda() ? gpu_memory_bytes : host_memory_bytes; }

  // bf16 matmuls and convolutions run in hardware on `device`: CUDA compute capability >= 8.0
  // (Ampere and later), or a CPU with AVX512-BF16 / AMX.
  bool native_bf16() const;
  // "AMD EPYC (AVX2, no native bf16)", "NVIDIA H100 80GB HBM3 (sm_90)": what the run announces.
  std::string describe() const;
};

// The machine as it is (read once per process), seen from `device`.
Hardware detect_hardware(const torch::Device& device);

}  // namespace fasttrain
