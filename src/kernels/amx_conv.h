#pragma once
// conv3x3_max_pool2x2's forward and its weight's and input's gradients in bf16 on AMX's tile units
// (amx_conv.cpp), for its dispatcher (conv_max_pool.cpp), which sums a bias's gradient itself and runs oneDNN
// where these decline or do not take the channels.
#include <torch/types.h>

#include <optional>

#include "cpu/conv_max_pool_kernel.h"  // BatchNormReluEpilogue
#include "max_pool.h"

namespace fasttrain::kernels::detail {

// Whether the AMX forward runs here for a conv from `in_channels` to `out_channels`: AMX tiles granted
// (amx_tiles_granted), 1 or 16 input channels or a multiple of 32 (a tile row of A is a window's 4x4 patch of
// one channel, or 32 bf16: two taps of 16 channels, or 32 channels of one tap), and a multiple of 16 output
// channels (a tile's columns).
bool amx_conv_max_pool_takes(int64_t in_channels, int64_t out_channels);

// max_pool2d(conv2d(input, weight, bias, stride 1, padding 1), 2) in bf16 and its argmax bytes
// (max_pool_kernel.h's: ties to the window's first value, NaN propagates): input channels_last [N, Cin, H, W]
// (bf16, or fp32 rounded to it), weight [Cout, Cin, 3, 3] and bias [Cout] (or undefined) rounded to bf16, as
// autocast's conv rounds them. Each conv output is an fp32 sum of bf16 products (the tiles' TDPBF16PS) plus
// the bias, rounded to bf16 before the max-pool compares it, as a bf16 conv's output is; only the pooled maps
// are written, channels_last [N, Cout, H / 2, W / 2] bf16. amx_conv_max_pool_takes must hold. Images, weights
// or a bias holding a NaN or an infinity are declined (nullopt), and the caller runs its other path: over 16
// input channels a tile row's last pair of taps reads one column past the kernel's, times zero weights; the
// zero border is multiplied by every weight; and the weight gradient's grid reads past each row, times zero
// gradients: each would make a NaN where conv2d gives none.
//
// With `batch_norm`, an evaluation's BatchNorm + ReLU runs in the epilogue: the maps returned are
// batch_norm_relu's of the pooled maps (its kernel's arithmetic and rounding, bit for bit), and no argmax
// bytes are kept (Pooled::argmax undefined).
std::optional<Pooled> amx_conv_max_pool(const torch::Tensor& input, const torch::Tensor& weight,
                                        const torch::Tensor& bias,
                                        const BatchNormReluEpilogue* batch_norm = nullptr);

// Whether amx_conv_weight_gradient runs here for a conv from `in_channels` to `out_channels`: AMX tiles
// granted, a multiple of 16 input channels and of 32 output channels.
bool amx_conv_weight_gradient_takes(int64_t in_channels, int64_t out_channels);

// The weight's gradient of amx_conv_max_pool, [Cout, Cin, 3, 3] fp32 holding bf16 values (the fp32 sums of
// bf16 products rounded once, as a bf16 conv's backward gives it), from its input (channels_last, bf16 or
// rounded to it; finite, as amx_conv_max_pool takes it), the pooled maps' gradient grad_output [N, Cout, H /
// 2, W / 2] (channels_last) and the forward's argmax bytes: each window's gradient at its winner.
// amx_conv_weight_gradient_takes must hold. A gradient holding a NaN or an infinity is declined (nullopt):
// the input's zero border times it would be a NaN where conv2d's backward adds nothing.
std::optional<torch::Tensor> amx_conv_weight_gradient(const torch::Tensor& input,
                                                      const torch::Tensor& grad_output,
                                                      const torch::Tensor& argmax, int64_t out_channels);

// Whether amx_conv_input_gradient runs here for a conv from `in_channels` to `out_channels`: as the weight
// gradient's rule.
bool amx_conv_input_gradient_takes(int64_t in_channels, int64_t out_channels);

// The input's gradient of amx_conv_max_pool, channels_last [N, Cin, H, W] bf16 (the fp32 sums of bf16
// products rounded once, as a bf16 conv's backward gives it), from the pooled maps' gradient grad_output [N,
// Cout, H / 2, W / 2] (channels_last), the forward's argmax bytes and the weight [Cout, Cin, 3, 3] (rounded
// to bf16): each window's gradient at its winner, through the transposed conv. amx_conv_input_gradient_takes
// must hold. A weight holding a NaN or an infinity is declined (nullopt): the zero border times it would be a
// NaN where conv2d's backward adds nothing.
std::optional<torch::Tensor> amx_conv_input_gradient(const torch::Tensor& grad_output,
                                                     const torch::Tensor& argmax, const torch::Tensor& weight,
                                                     c10::IntArrayRef input_sizes);

}  // namespace fasttrain::kernels::detail
