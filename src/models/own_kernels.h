#pragma once
// The rule of the models' kernel switches (the gpt's and the cnn's model.kernels and model.aten_kernels).
#include <algorithm>
#include <string>
#include <vector>

namespace fasttrain {

// Whether a model runs fasttrain's CPU kernel `name`: kernels = "fasttrain" and `name` not in aten_kernels.
inline bool runs_own_kernel(const std::string& kernels, const std::vector<std::string>& aten_kernels,
                            const std::string& name) {
  return kernels == "fasttrain" &&
         std::find(aten_kernels.begin(), aten_kernels.end(), name) == aten_kernels.end();
}

}  // namespace fasttrain
