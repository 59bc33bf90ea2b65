#pragma once
// Devices and threads.
//
//   torch::Device device = fasttrain::parse_device("auto");   // cuda if available, else cpu
//   fasttrain::set_intra_op_threads(0);                         // 0 = physical cores
//   fasttrain::set_blas_threads(1);                             // OpenBLAS's own pool
#include <torch/types.h>

#include <string>

namespace fasttrain {

// "auto" | "cpu" | "cuda" | "cuda:N". An unavailable CUDA device is an error. "auto" and "cuda" (no
// index) take GPU `local_rank` modulo the GPUs visible: a distributed run's ranks on one machine each
// take their own GPU, as torch.cuda.set_device(LOCAL_RANK) does, and share them when there are fewer.
torch::Device parse_device(const std::string& spec, int local_rank = 0);

// Makes `device` this process's current CUDA device (where c10d's NCCL and unindexed CUDA tensors go);
// nothing for the CPU.
void use_device(const torch::Device& device);

// Physical cores of this machine (hyper-threads counted once); at least 1.
int physical_cores();

// Sets LibTorch's intra-op threads: `threads` > 0 as given, 0 = this process's share of the physical
// cores when `processes_sharing` processes (the ranks of a job on this machine) share them, at least
// 1. Returns the count set.
int set_intra_op_threads(int threads, int processes_sharing = 1);

// The BLAS library LibTorch's matmuls call, as its threads can be set: OpenBLAS keeps a thread pool
// of its own that neither set_intra_op_threads nor OpenMP reaches.
struct BlasLibrary {
  std::string name;          // "OpenBLAS", or "" when the BLAS is another (MKL follows the intra-op threads)
  int threads = 0;           // threads of its pool now; 0 when `name` is ""
  int threads_at_start = 0;  // before anyone here changed them: what train.blas_threads = 0 means
};
BlasLibrary blas_library();

// Sets OpenBLAS's threads: `threads` > 0 as given, 0 = the count it had when this process started.
// Returns the count set. `threads` > 0 with a BLAS that is not OpenBLAS is a ConfigError.
//
//   fasttrain::set_blas_threads(1);   // matmuls on one core, the other free for OpenMP's ops
int set_blas_threads(int threads);

}  // namespace fasttrain
