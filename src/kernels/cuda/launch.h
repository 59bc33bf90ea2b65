#pragma once
// What the CUDA kernels' launchers (layer_norm.cu, gelu.cu) share: the check after a launch, and how many
// row ranges a pass that sums over the rows splits them into. Free of torch headers, as the .cu files are.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fasttrain::kernels::detail {

// A std::runtime_error with CUDA's message where the last launch failed.
inline void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess)
    throw std::runtime_error(std::string("fasttrain's ") + what +
                             " CUDA kernel did not launch: " + cudaGetErrorString(error));
}

// Row ranges for a column-tiled pass that writes one partial sum per range: about a thousand blocks over
// the `column_tiles`, each range at least 128 rows.
inline int64_t row_partials(int64_t rows, int64_t column_tiles) {
  return std::max<int64_t>(1,
                           std::min<int64_t>((rows + 127) / 128, (1024 + column_tiles - 1) / column_tiles));
}

}  // namespace fasttrain::kernels::detail
