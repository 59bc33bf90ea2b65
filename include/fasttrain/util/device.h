#pragma once
// Devices and threads.
//
//   torch::Device device = fasttrain::parse_device("auto");   // cuda if available, else cpu
//   fasttrain::set_intra_op_threads(0);                         // 0 = physical cores
#include <torch/types.h>

#include <string>

namespace fasttrain {

// "auto" | "cpu" | "cuda" | "cuda:N". An unavailable CUDA device is an error.
torch::Device parse_device(const std::string& spec);

// Physical cores of this machine (hyper-threads counted once); at least 1.
int physical_cores();

// This CPU runs bfloat16 matmuls and convolutions natively (AVX512-BF16 or AMX, which oneDNN uses).
bool cpu_has_native_bf16();

// Sets LibTorch's intra-op threads: `threads` > 0 as given, 0 = this process's share of the physical
// cores when `processes_sharing` processes (the ranks of a job on this machine) share them, at least
// 1. Returns the count set.
int set_intra_op_threads(int threads, int processes_sharing = 1);

}  // namespace fasttrain
