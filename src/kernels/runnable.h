#pragma once
// What every kernel's dispatcher checks before it runs a capability's build.
#include <torch/types.h>

#include "fasttrain/kernels/cpu.h"

namespace fasttrain::kernels::detail {

// An Error naming `kernel` unless this CPU runs `capability`.
void check_runnable(CpuCapability capability, const char* kernel);

// A defined tensor on the CPU in fp32 or bf16: what every kernel reads and writes.
inline bool cpu_float_or_bf16(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() &&
         (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16);
}

}  // namespace fasttrain::kernels::detail
