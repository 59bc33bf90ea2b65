#pragma once
// The fused 3x3 conv + 2x2 max-pool kernel's contract between its dispatcher (src/kernels/conv_max_pool.cpp)
// and its bodies (conv_max_pool_kernel.cpp, compiled once per CPU capability; bodies.h declares each one's
// entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// The most input channels the direct forward and its weight backward take: a direct conv over a few
// channels (an image's), where oneDNN's GEMM-shaped kernels have little to multiply. winner_backward takes
// any count.
constexpr int64_t kConvMaxPoolInChannels = 4;

// An evaluation's BatchNorm with running statistics and the ReLU after it, per output channel fp32 [Cout]
// each: y = max(0, (x - mean) * scale + shift), batch_norm_relu's terms (batch_norm_relu_running_terms).
struct BatchNormReluEpilogue {
  const float* mean = nullptr;
  const float* scale = nullptr;
  const float* shift = nullptr;
};

// conv2d(input, weight, bias, stride 1, padding 1) and then max_pool2d(., 2) over channels_last images:
// input [N, H, W, Cin] in memory (bf16 where input_bf16, else fp32), output [N, H / 2, W / 2, Cout] (bf16
// where bf16, else fp32). argmax holds which of each window's four conv outputs won, one byte per output
// value (0 top left, 1 top right, 2 bottom left, 3 bottom right: MaxPoolImages's bytes). taps is the
// weight as fp32 [Cin, 3, 3, Cout] (a row of Cout per tap) and bias fp32 [Cout] or null, both already
// rounded to the compute dtype; where `bf16` the input values and each conv output are rounded to bf16,
// as a bf16 conv's are, before the max-pool compares them.
struct ConvMaxPoolImages {
  int64_t batch = 0, height = 0, width = 0, in_channels = 0, out_channels = 0;
  int64_t out_height = 0, out_width = 0;
  bool input_bf16 = false, bf16 = false;
  const void* input = nullptr;
  const float* taps = nullptr;
  const float* bias = nullptr;
  void* output = nullptr;
  uint8_t* argmax = nullptr;
  // Or, in an evaluation, the BatchNorm + ReLU after the max-pool applied to each pooled value before it is
  // stored (batch_norm_relu's arithmetic and rounding, bit for bit), and argmax null: no bytes kept.
  const BatchNormReluEpilogue* batch_norm = nullptr;
  const void* grad_output = nullptr;  // like output
  float* grad_taps = nullptr;         // [chunks][Cin * 9 + 1][Cout]: each chunk's sums, the bias's last
  // Backward from the winners (any Cin; the dispatcher's path for more than kConvMaxPoolInChannels, whose
  // forward is ATen's conv and the max-pool kernel, giving the same argmax bytes):
  const float* weight_rows = nullptr;  // [Cout, 3, 3, Cin] fp32 rounded as taps is: a row of Cin per tap
  void* grad_input = nullptr;          // [N, H, W, Cin] in input's dtype, or null where none is needed
  float* grad_rows = nullptr;          // [chunks][Cout][9 * Cin + 1]: each chunk's sums, the bias's last
  // The Winograd forward's (any Cin): the weight transformed, U = G g G^T for each input and output channel,
  // as fp32 [16][Cin][winograd_out_channels] (U's 4 x 4 positions in row order, then a row of output
  // channels padded with zeros to a multiple of kWinogradOutChannelsMultiple, so every load is whole).
  const float* winograd_taps = nullptr;
  int64_t winograd_out_channels = 0;
};

// Covers every capability's vector of fp32 lanes (8 with AVX2, 16 with AVX512).
constexpr int64_t kWinogradOutChannelsMultiple = 16;

// Output rows [begin, end) of the batch * out_height: their values and argmax (or, with batch_norm, the
// BatchNorm + ReLU's values and no argmax).
using ConvMaxPoolForward = void (*)(const ConvMaxPoolImages& images, int64_t begin, int64_t end);
// Adds the gradients of the taps and of the bias from output rows [begin, end) into chunk `chunk`'s rows of
// grad_taps; only each window's winner has a gradient, so only it is summed.
using ConvMaxPoolWeightBackward = void (*)(const ConvMaxPoolImages& images, int64_t begin, int64_t end,
                                           int64_t chunk);

// Images [begin, end): adds the weight's and the bias's gradients into chunk `chunk`'s rows of grad_rows and
// writes the images' grad_input (where not null), each from the winners only: a window's gradient flows
// through the one conv output that won it, so a quarter of a dense conv backward's multiply-adds. Vectorised
// over the input channels, which the winners' 3x3 neighbourhoods share.
using ConvMaxPoolWinnerBackward = void (*)(const ConvMaxPoolImages& images, int64_t begin, int64_t end,
                                           int64_t chunk);

struct ConvMaxPoolKernels {
  ConvMaxPoolForward forward;
  // Output rows by Winograd's F(2x2, 3x3): each pooling window is one of its 2x2 output tiles, so the four
  // conv outputs come from 16 multiply-adds per input and output channel where the direct conv takes 36, and
  // are pooled in registers (forward's argmax bytes and rule). fp32 arithmetic; the outputs differ from a
  // direct conv's by the transforms' roundings (none on small whole numbers).
  ConvMaxPoolForward winograd_forward;
  ConvMaxPoolWeightBackward weight_backward;
  ConvMaxPoolWinnerBackward winner_backward;
};

}  // namespace fasttrain::kernels::detail
