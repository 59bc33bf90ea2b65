#include "fasttrain/run/auto.h"

#include <fmt/format.h>

#include <algorithm>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"

namespace fasttrain {

AutoChoice auto_precision(const Hardware& hardware) {
  if (hardware.device.is_cuda()) {
    if (hardware.native_bf16())
      return {"train.precision", "bf16",
              fmt::format("{} has bf16 tensor cores (compute capability >= 8.0)", hardware.gpu_name)};
    return {"train.precision", "fp32",
            fmt::format("{} (sm_{}) has no native bf16; fp16 with loss scaling is train.precision = "
                        "\"fp16\"",
                        hardware.gpu_name, hardware.cuda_capability)};
  }
  if (hardware.native_bf16())
    return {"train.precision", "bf16", "this CPU runs bfloat16 natively (AVX512-BF16 or AMX)"};
  return {"train.precision", "fp32",
          "this CPU has no native bfloat16 (AVX512-BF16 or AMX): bf16 would be emulated, many times "
          "slower than fp32"};
}

// train.threads and train.blas_threads = "auto" on a CPU. Where OpenBLAS runs fp32 matmuls in a
// pool of its own, both pools on every core spin against each other (BENCHMARKS.md "Hardware-aware
// defaults": the main job 3.9k samples/s at 2 + 2 threads, 5.7k at 2 + 1; the gpt 7.2k tokens/s at
// 2 + 2, 15.1k at 1 + 2): the pool that runs the model's bulk gets the cores, the other one thread.
// The bulk: a conv net's convolutions run in oneDNN on the OpenMP (intra-op) threads, the matmuls of a
// model without convolutions in the BLAS.
void resolve_threads(AutoResolution& resolved, const Hardware& hardware, int processes_sharing,
                     bool convolutions) {
  TrainConfig& train = resolved.config.train;
  const int share = std::max(1, hardware.physical_cores / std::max(1, processes_sharing));
  if (!hardware.device.is_cpu()) {  // the GPU computes: the host's threads and the BLAS pool as they come
    if (train.threads() == 0) train.threads(share);
    if (train.blas_threads() == -1) train.blas_threads(0);
    return;
  }
  const std::string cores = processes_sharing > 1
                                ? fmt::format("this rank's share of the {} physical cores ({} ranks here)",
                                              hardware.physical_cores, processes_sharing)
                                : fmt::format("one per physical core ({})", hardware.physical_cores);
  const bool pools_compete = hardware.openblas_pool && train.precision() == "fp32";
  const bool bulk_in_blas = pools_compete && !convolutions;
  if (train.threads() == 0) {
    const int threads = bulk_in_blas ? 1 : share;
    train.threads(threads);
    resolved.choices.push_back(
        {"train.threads", std::to_string(threads),
         bulk_in_blas ? std::string("the model has no convolutions: its fp32 matmuls run in OpenBLAS's own "
                                    "pool, which gets the cores; more OpenMP threads would spin against it")
                      : cores});
  }
  if (train.blas_threads() == -1) {
    if (!pools_compete) {
      train.blas_threads(0);  // the library's own count: it runs little or nothing here
    } else if (bulk_in_blas) {
      train.blas_threads(share);
      resolved.choices.push_back({"train.blas_threads", std::to_string(share), cores});
    } else {
      train.blas_threads(1);
      resolved.choices.push_back(
          {"train.blas_threads", "1",
           "the model's convolutions run on the OpenMP threads; OpenBLAS's pool runs only the small fp32 "
           "matmuls and, on every core, would spin against them"});
    }
  }
}

namespace {

// train.fp32_precision = "bf16" is oneDNN's, on the CPU, from LibTorch 2.9. oneDNN 3.10 (LibTorch 2.11)
// takes the hint on AMX only: on AVX512-BF16 it still picks its fp32 avx512_core kernels (ONEDNN_VERBOSE
// shows "attr-fpmath:bf16" on them): the switch only moves the fp32 matmuls from the BLAS to oneDNN.
void check_fp32_precision(AutoResolution& resolved, const Hardware& hardware) {
  if (resolved.config.train.fp32_precision() != "bf16") return;
  FT_CONFIG_CHECK(hardware.device.is_cpu(),
                  "train.fp32_precision = \"bf16\" sets the arithmetic of the CPU's oneDNN kernels; on {} "
                  "use train.tf32 (TF32 tensor cores for fp32 matmuls and convolutions)",
                  hardware.device.str());
  FT_CONFIG_CHECK(compat::has_cpu_fp32_precision(),
                  "train.fp32_precision = \"bf16\" needs LibTorch >= 2.9 (this is {}): set it to \"ieee\", "
                  "or train.precision = \"bf16\" for autocast",
                  compat::torch_version());
  if (!hardware.cpu_amx_bf16) {
    resolved.warnings.push_back(
        "train.fp32_precision = \"bf16\" on a CPU without AMX-BF16: oneDNN keeps fp32 arithmetic here (its "
        "own fp32 kernels run the matmuls instead of the BLAS's: other rounding, no bf16); train.precision "
        "= \"bf16\" autocasts instead");
  }
}

}  // namespace

void resolve_precision(AutoResolution& resolved, const Hardware& hardware) {
  TrainConfig& train = resolved.config.train;
  if (train.precision() == "auto") {
    AutoChoice precision = auto_precision(hardware);
    train.precision(precision.value);
    resolved.choices.push_back(std::move(precision));
  } else if (train.precision() == "bf16" && hardware.device.is_cpu() && !hardware.native_bf16()) {
    resolved.warnings.push_back(
        "train.precision = \"bf16\" on a CPU without native bfloat16 (no AVX512-BF16 or AMX): every bf16 "
        "op is emulated, 16x slower than fp32 for the main job on an AVX2 CPU (BENCHMARKS.md "
        "\"Hardware-aware defaults\"); set train.precision = \"auto\" or \"fp32\"");
  }
  check_fp32_precision(resolved, hardware);
}

AutoResolution resolve_auto(const Config& config, const Hardware& hardware, int processes_sharing,
                            bool convolutions) {
  AutoResolution resolved{config, {}, {}};
  resolve_precision(resolved, hardware);
  resolve_threads(resolved, hardware, processes_sharing, convolutions);
  return resolved;
}

EngineChoice choose_engine(const std::string& cuda_graphs, const CaptureFacts& facts) {
  if (cuda_graphs == "false") return {};
  const auto blocker = capture_blocker(facts);
  FT_CONFIG_CHECK(cuda_graphs != "true" || !blocker,
                  "train.cuda_graphs = true, but the step cannot be captured: {}", blocker.value_or(""));
  if (blocker) return {false, *blocker};
  return {true, ""};
}

}  // namespace fasttrain
