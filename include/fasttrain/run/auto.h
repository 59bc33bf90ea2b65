#pragma once
// A config's "auto" values made concrete for the machine and the run, with the reason for each
// choice, and the warnings a config earns there (bf16 on a CPU that would emulate it). This is the one
// place "auto" is resolved: the library below takes plain values (a dtype, a thread count, a bool).
//
//   fasttrain::AutoResolution resolved{config};
//   fasttrain::resolve_precision(resolved, hardware);
//   fasttrain::resolve_threads(resolved, hardware, /*processes_sharing=*/1, model.has_convolutions());
//   for (const auto& choice : resolved.choices) ...   // "train.precision = fp32: this CPU ..."
//
// train.precision = "auto": bf16 where it is native (a CPU with AVX512-BF16 or AMX, a CUDA device of
// compute capability >= 8.0), fp32 elsewhere. train.threads and train.blas_threads = "auto" on a
// CPU: every physical core (this process's share when ranks share the machine) to the pool that
// runs the model's bulk, one thread to the other. Only fp32 on OpenBLAS has two pools that compete:
// a conv net's convolutions run on the OpenMP threads (OpenBLAS gets 1), the matmuls of a model
// without convolutions in OpenBLAS's pool (OpenMP gets 1). BENCHMARKS.md "Hardware-aware defaults"
// has the measurements. The run layer (run/run.h) resolves the rest: task.name, data.workers,
// data.device_resident, data.batch_size and train.cuda_graphs.
#include <string>
#include <vector>

#include "fasttrain/config/config.h"
#include "fasttrain/train/step_engine.h"
#include "fasttrain/util/hardware.h"

namespace fasttrain {

struct AutoChoice {
  std::string key;     // "train.precision"
  std::string value;   // "fp32"
  std::string reason;  // "this CPU has no native bfloat16 (AVX512-BF16 or AMX): bf16 would be emulated"
};

struct AutoResolution {
  Config config;                      // "auto" replaced where resolved so far
  std::vector<AutoChoice> choices;    // one per value "auto" decided
  std::vector<std::string> warnings;  // explicit settings that cost on this hardware
};

// "bf16" or "fp32": what train.precision = "auto" means on `hardware`, and why.
AutoChoice auto_precision(const Hardware& hardware);

// train.precision: "auto" decided; an explicit bf16 on a CPU that emulates it warned about.
void resolve_precision(AutoResolution& resolved, const Hardware& hardware);
// train.threads and train.blas_threads (after resolve_precision): `processes_sharing` ranks on this
// machine split its cores; `convolutions`: the model's bulk is convolutions (4-d weights).
void resolve_threads(AutoResolution& resolved, const Hardware& hardware, int processes_sharing,
                     bool convolutions);
// Both, as a run resolves them.
AutoResolution resolve_auto(const Config& config, const Hardware& hardware, int processes_sharing,
                            bool convolutions);

// train.cuda_graphs ("auto" | "true" | "false") for `facts`: whether to capture, and why "auto" runs
// eager (empty when it captures or the setting is "false"). "true" where a blocker applies is a
// ConfigError naming it.
struct EngineChoice {
  bool capture = false;
  std::string reason;
};
EngineChoice choose_engine(const std::string& cuda_graphs, const CaptureFacts& facts);

}  // namespace fasttrain
