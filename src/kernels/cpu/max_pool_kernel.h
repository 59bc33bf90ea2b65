#pragma once
// The 2x2 max-pool kernel's contract between its dispatcher (src/kernels/max_pool.cpp) and its bodies
// (max_pool_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// A channels_last image batch, input [N, H, W, C] in memory, pooled over 2x2 windows at stride 2
// (floor: an odd last row or column is left out) into output [N, H / 2, W / 2, C]. argmax holds which of
// each window's four values won, one byte per output value (0 top left, 1 top right, 2 bottom left,
// 3 bottom right). input, output, grad_output and grad_input are fp32 or bf16 as the flag says.
struct MaxPoolImages {
  int64_t batch = 0, height = 0, width = 0, channels = 0;
  int64_t out_height = 0, out_width = 0;
  bool bf16 = false;
  const void* input = nullptr;
  void* output = nullptr;
  uint8_t* argmax = nullptr;
  const void* grad_output = nullptr;
  void* grad_input = nullptr;
};

// Output rows [begin, end) of the batch * out_height: forward writes them and their argmax; backward
// writes the two input rows under each (and the odd last ones, zero), so each grad_input value once.
using MaxPoolForward = void (*)(const MaxPoolImages& images, int64_t begin, int64_t end);
using MaxPoolBackward = void (*)(const MaxPoolImages& images, int64_t begin, int64_t end);

struct MaxPoolKernels {
  MaxPoolForward forward;
  MaxPoolBackward backward;
};

}  // namespace fasttrain::kernels::detail
