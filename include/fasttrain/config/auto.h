#pragma once
// The config's "auto" values made concrete for the machine the run is on, with the reason for
// each choice, and the warnings a config earns there (bf16 on a CPU that would emulate it).
//
//   fasttrain::AutoResolution resolved = fasttrain::resolve_auto(config, fasttrain::detect_hardware(device));
//   for (const auto& choice : resolved.choices) ...   // "train.precision = fp32: this CPU ..."
//   run(resolved.config);
//
// train.precision = "auto": bf16 where it is native (a CPU with AVX512-BF16 or AMX, a CUDA device of
// compute capability >= 8.0), fp32 elsewhere. train.threads and train.blas_threads = "auto" on a
// CPU: every physical core (this process's share when ranks share the machine) to the pool that
// runs the model's bulk, one thread to the other. Only fp32 on OpenBLAS has two pools that compete:
// a conv net's convolutions run on the OpenMP threads (OpenBLAS gets 1), an mlp's or gpt's matmuls
// in OpenBLAS's pool (OpenMP gets 1). BENCHMARKS.md "Hardware-aware defaults" has the measurements.
#include <string>
#include <vector>

#include "fasttrain/config/config.h"
#include "fasttrain/util/hardware.h"

namespace fasttrain {

struct AutoChoice {
  std::string key;     // "train.precision"
  std::string value;   // "fp32"
  std::string reason;  // "this CPU has no native bfloat16 (AVX512-BF16 or AMX): bf16 would be emulated"
};

struct AutoResolution {
  Config config;                      // no "auto" left in train.precision, threads, blas_threads
  std::vector<AutoChoice> choices;    // one per value "auto" decided
  std::vector<std::string> warnings;  // explicit settings that cost on this hardware
};

// `processes_sharing`: the ranks of a job on this machine, which split its cores.
AutoResolution resolve_auto(const Config& config, const Hardware& hardware, int processes_sharing = 1);

// "bf16" or "fp32": what train.precision = "auto" means on `hardware`, and why.
AutoChoice auto_precision(const Hardware& hardware);

}  // namespace fasttrain
