#pragma once
// What every kernel's dispatcher checks before it runs a capability's build.
#include "fasttrain/kernels/cpu.h"

namespace fasttrain::kernels::detail {

// An Error naming `kernel` unless this CPU runs `capability`.
void check_runnable(CpuCapability capability, const char* kernel);

}  // namespace fasttrain::kernels::detail
