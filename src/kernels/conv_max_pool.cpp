#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <array>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "amx_conv.h"
#include "batch_norm_relu.h"
#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "max_pool.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

static_assert(kConvMaxPoolInChannels == detail::kConvMaxPoolInChannels);

detail::ConvMaxPoolKernels conv_max_pool_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(conv_max_pool_kernels, capability);
}

// input [N, Cin, H, W] (NHWC in memory), weight [Cout, Cin, 3, 3], computed in `dtype`.
detail::ConvMaxPoolImages describe(c10::IntArrayRef input_sizes, torch::ScalarType input_dtype,
                                   int64_t out_channels, torch::ScalarType dtype) {
  detail::ConvMaxPoolImages p;
  p.batch = input_sizes[0];
  p.in_channels = input_sizes[1];
  p.height = input_sizes[2];
  p.width = input_sizes[3];
  p.out_channels = out_channels;
  p.out_height = p.height / 2;
  p.out_width = p.width / 2;
  p.input_bf16 = input_dtype == torch::kBFloat16;
  p.bf16 = dtype == torch::kBFloat16;
  return p;
}

torch::ScalarType compute_dtype(const detail::ConvMaxPoolImages& p) {
  return p.bf16 ? torch::kBFloat16 : torch::kFloat;
}

// A tensor as fp32 holding the values it has in `dtype`: autocast rounds a bf16 conv's input, weight and
// bias, and a conv's backward in bf16 rounds the gradients it sums.
torch::Tensor rounded_to(const torch::Tensor& values, torch::ScalarType dtype) {
  return values.detach().to(dtype).to(torch::kFloat);
}

// The rule between the two paths: the direct forward over an image's few channels, oneDNN's conv and the
// winners' backward over more.
bool runs_direct(int64_t in_channels) {
  return in_channels <= kConvMaxPoolInChannels;
}

// The weight [Cout, Cin, 3, 3] as the bodies' taps: fp32 [Cin, 3, 3, Cout], a row of Cout per tap.
torch::Tensor taps_of(const torch::Tensor& weight, torch::ScalarType dtype) {
  return rounded_to(weight, dtype).permute({1, 2, 3, 0}).contiguous();
}

// grad_y scattered to each window's winner (the max-pool kernel's backward) and through the conv's
// transpose: the input's gradient, which the first conv of a network does not need, so it is left to
// ATen's conv. The transposed conv is a conv with the kernel flipped and its channels swapped ([Cin, Cout,
// 3, 3]): LibTorch 1.13's conv_transpose2d sends channels_last maps to oneDNN's forward conv and fails there.
torch::Tensor input_gradient(const torch::Tensor& input, const torch::Tensor& grad_output,
                             const torch::Tensor& argmax, const torch::Tensor& weight,
                             torch::ScalarType dtype, CpuCapability capability) {
  const torch::Tensor grad_maps = detail::unpool2x2(
      grad_output, argmax, {input.size(0), weight.size(0), input.size(2), input.size(3)}, capability);
  const torch::Tensor flipped = weight.detach().to(dtype).flip({2, 3}).transpose(0, 1);
  return torch::conv2d(grad_maps, flipped, {}, 1, 1).to(input.scalar_type()).contiguous(kChannelsLast);
}

// Runs a forward body over the output rows, each costing `row_cost` multiply-adds: the pooled maps in `dtype`
// and their argmax bytes, or with `batch_norm` (fp32) the BatchNorm + ReLU's maps of them and no bytes. `p`
// holds the weight as the body reads it.
detail::Pooled run_forward(detail::ConvMaxPoolImages p, const torch::Tensor& input, const torch::Tensor& bias,
                           torch::ScalarType dtype, detail::ConvMaxPoolForward kernel, int64_t row_cost,
                           const detail::BatchNormReluEpilogue* batch_norm) {
  TORCH_INTERNAL_ASSERT(batch_norm == nullptr || dtype == torch::kFloat,
                        "conv3x3_max_pool2x2's BatchNorm epilogue runs in fp32 on these bodies");
  const torch::Tensor bias_values = bias.defined() ? rounded_to(bias, dtype).contiguous() : torch::Tensor();
  detail::Pooled pooled;
  pooled.output = torch::empty({p.batch, p.out_channels, p.out_height, p.out_width},
                               input.options().dtype(dtype).memory_format(kChannelsLast));
  if (batch_norm == nullptr)
    pooled.argmax = torch::empty({pooled.output.numel()}, input.options().dtype(torch::kByte));
  p.input = input.data_ptr();
  p.bias = bias_values.defined() ? bias_values.data_ptr<float>() : nullptr;
  p.output = pooled.output.data_ptr();
  p.argmax = pooled.argmax.defined() ? pooled.argmax.data_ptr<uint8_t>() : nullptr;
  p.batch_norm = batch_norm;
  detail::parallel_pieces(0, p.batch * p.out_height, detail::rows_per_task(row_cost),
                          [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
  return pooled;
}

// The direct forward (at most kConvMaxPoolInChannels input channels): the four conv outputs of each window
// from the input patch under it, pooled as they are computed; a row costs 4 x 9 x Cin multiply-adds per
// output value.
detail::Pooled direct_forward(const torch::Tensor& input, const torch::Tensor& weight,
                              const torch::Tensor& bias, torch::ScalarType dtype, CpuCapability capability,
                              const detail::BatchNormReluEpilogue* batch_norm = nullptr) {
  detail::ConvMaxPoolImages p = describe(input.sizes(), input.scalar_type(), weight.size(0), dtype);
  const torch::Tensor taps = taps_of(weight, dtype);
  p.taps = taps.data_ptr<float>();
  return run_forward(p, input, bias, dtype, conv_max_pool_bodies(capability).forward,
                     p.out_width * p.out_channels * 36 * p.in_channels, batch_norm);
}

// Winograd's transform of the weight [Cout, Cin, 3, 3] rounded to `dtype`: U = G g G^T, G = [1 0 0; 1/2 1/2
// 1/2; 1/2 -1/2 1/2; 0 0 1], as the bodies' winograd_taps, fp32 [4, 4, Cin, Cout padded with zeros].
// Elementwise, not a matmul: train.fp32_precision may let matmuls round their inputs to bf16.
torch::Tensor winograd_taps_of(const torch::Tensor& weight, torch::ScalarType dtype) {
  auto transform = [](const torch::Tensor& g, int64_t dim) {
    const torch::Tensor g0 = g.select(dim, 0), g1 = g.select(dim, 1), g2 = g.select(dim, 2);
    return torch::stack({g0, (g0 + g1 + g2) * 0.5, (g0 - g1 + g2) * 0.5, g2}, dim);
  };
  const torch::Tensor u = transform(transform(rounded_to(weight, dtype), 2), 3);  // [Cout, Cin, 4, 4]
  const int64_t cout = weight.size(0), multiple = detail::kWinogradOutChannelsMultiple;
  const int64_t padded = (cout + multiple - 1) / multiple * multiple;
  return torch::constant_pad_nd(u.permute({2, 3, 1, 0}), {0, padded - cout}).contiguous();
}

// Over more input channels in Winograd's F(2x2, 3x3): 16 multiply-adds per input and output channel a
// window where the direct conv takes 36, plus the transforms.
detail::Pooled winograd_forward(const torch::Tensor& input, const torch::Tensor& weight,
                                const torch::Tensor& bias, torch::ScalarType dtype, CpuCapability capability,
                                const detail::BatchNormReluEpilogue* batch_norm = nullptr) {
  detail::ConvMaxPoolImages p = describe(input.sizes(), input.scalar_type(), weight.size(0), dtype);
  const torch::Tensor taps = winograd_taps_of(weight, dtype);
  p.winograd_taps = taps.data_ptr<float>();
  p.winograd_out_channels = taps.size(3);
  return run_forward(p, input, bias, dtype, conv_max_pool_bodies(capability).winograd_forward,
                     p.out_width * p.winograd_out_channels * 16 * p.in_channels, batch_norm);
}

// More input channels: ATen's conv (oneDNN's GEMM-shaped kernels; a direct conv over 16 channels is slower)
// on the values rounded to `dtype`, in fp32 arithmetic as the direct forward's, then each output rounded to
// `dtype` and the max-pool kernel, whose argmax bytes are the direct forward's. Autocast is kept out: it
// would run the conv in bf16, whose sums some of ATen's CPU paths round as they go.
detail::Pooled conv_then_pool(const torch::Tensor& input, const torch::Tensor& weight,
                              const torch::Tensor& bias, torch::ScalarType dtype, CpuCapability capability) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const torch::Tensor conv = torch::conv2d(rounded_to(input, dtype), rounded_to(weight, dtype),
                                           bias.defined() ? rounded_to(bias, dtype) : torch::Tensor(), 1, 1);
  return detail::pool2x2(conv.to(dtype).contiguous(kChannelsLast), capability);
}

// Whether the AMX forward runs: asked for, in bf16, over channels the tiles take (one, or past the direct
// path's), and taken here.
bool runs_on_amx(const torch::Tensor& input, const torch::Tensor& weight, torch::ScalarType dtype,
                 WideConvForward wide) {
  return wide == WideConvForward::amx &&
         conv3x3_max_pool2x2_runs_on_amx(input.size(1), weight.size(0), dtype);
}

// The pooled maps and argmax bytes, and whether the AMX forward gave them.
struct PooledConv {
  detail::Pooled pooled;
  bool on_amx = false;
};

// The conv and its max-pool by the path the input channels and `wide` pick (where the AMX forward is asked
// for and does not run, or declines the values: the direct path over few channels, oneDNN's over more).
PooledConv pooled_conv(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                       torch::ScalarType dtype, CpuCapability capability, WideConvForward wide) {
  if (runs_on_amx(input, weight, dtype, wide)) {
    if (std::optional<detail::Pooled> pooled = detail::amx_conv_max_pool(input, weight, bias))
      return {*pooled, true};
  }
  if (runs_direct(input.size(1))) return {direct_forward(input, weight, bias, dtype, capability)};
  if (wide == WideConvForward::winograd) return {winograd_forward(input, weight, bias, dtype, capability)};
  return {conv_then_pool(input, weight, bias, dtype, capability)};
}

// The weight's and bias's gradients as the rows the bodies sum them in, rounded to the compute dtype as a
// conv's backward in it gives them (autocast then casts them back to the parameters' fp32).
struct ParameterGradients {
  torch::Tensor weight;  // [Cout, Cin, 3, 3], fp32
  torch::Tensor bias;    // [Cout], fp32
};

// The direct path's: vectorised over the output channels, [Cin * 9 + 1, Cout] sums.
ParameterGradients direct_parameter_gradients(detail::ConvMaxPoolImages p, CpuCapability capability) {
  const int64_t taps = p.in_channels * 9;
  const detail::RowChunks chunks = detail::row_chunks(p.batch * p.out_height, detail::kPiecesPerThread);
  torch::Tensor sums = torch::zeros({chunks.count, taps + 1, p.out_channels}, torch::kFloat);
  p.grad_taps = sums.data_ptr<float>();
  const auto kernel = conv_max_pool_bodies(capability).weight_backward;
  detail::for_each_row_chunk(p.batch * p.out_height, chunks, [&](int64_t begin, int64_t end, int64_t chunk) {
    kernel(p, begin, end, chunk);
  });
  const torch::Tensor total = rounded_to(sums.sum(0), compute_dtype(p));
  return {total.narrow(0, 0, taps).view({p.in_channels, 3, 3, p.out_channels}).permute({3, 0, 1, 2}),
          total[taps]};
}

// The winners' path: vectorised over the input channels, [Cout, 9 * Cin + 1] sums, and the input's
// gradient written by the same pass where `grad_input` is defined.
ParameterGradients winner_gradients(detail::ConvMaxPoolImages p, const torch::Tensor& weight,
                                    const torch::Tensor& grad_input, CpuCapability capability) {
  const int64_t padded_image = (p.height + 2) * (p.width + 2) * p.in_channels;
  FT_CHECK(padded_image <= std::numeric_limits<int32_t>::max(),
           "conv3x3_max_pool2x2's backward takes images of at most 2^31 values with their zero ring; got "
           "[{}, {}, {}] per image",
           p.in_channels, p.height, p.width);
  const int64_t taps = p.in_channels * 9;
  const torch::Tensor weight_rows = rounded_to(weight, compute_dtype(p)).permute({0, 2, 3, 1}).contiguous();
  const detail::RowChunks chunks = detail::row_chunks(p.batch, detail::kPiecesPerThread);
  torch::Tensor sums = torch::zeros({chunks.count, p.out_channels, taps + 1}, torch::kFloat);
  p.weight_rows = weight_rows.data_ptr<float>();
  p.grad_rows = sums.data_ptr<float>();
  p.grad_input = grad_input.defined() ? grad_input.data_ptr() : nullptr;
  const auto kernel = conv_max_pool_bodies(capability).winner_backward;
  detail::for_each_row_chunk(
      p.batch, chunks, [&](int64_t begin, int64_t end, int64_t chunk) { kernel(p, begin, end, chunk); });
  const torch::Tensor total = rounded_to(sums.sum(0), compute_dtype(p));
  return {total.narrow(1, 0, taps).view({p.out_channels, 3, 3, p.in_channels}).permute({0, 3, 1, 2}),
          total.select(1, taps).contiguous()};
}

// After the AMX forward, each as a bf16 conv's backward gives it, from the pooled gradient and the argmax
// bytes: the weight's and the input's gradients on the tiles where they take the channels (the weight's where
// the gradient is finite, the input's where the weight is: the forward has declined such weights already);
// elsewhere by oneDNN's bf16 conv backward of the winners' gradient, which runs on bf16 dot products (the
// winners' fp32 sums are slower there). The bias's (where it has one) is the pooled gradient's sum over the
// positions (the winners' gradient holds the same values and zeros), in fp32 rounded to bf16: asked of
// oneDNN's backward, it would compute the weight's gradient too. The input's is undefined where not needed.
std::array<torch::Tensor, 3> dense_bf16_gradients(const torch::Tensor& input, const torch::Tensor& weight,
                                                  const torch::Tensor& grad_output,
                                                  const torch::Tensor& argmax, bool input_gradient,
                                                  bool has_bias, CpuCapability capability) {
  std::optional<torch::Tensor> weight_on_tiles, input_on_tiles;
  if (detail::amx_conv_weight_gradient_takes(input.size(1), weight.size(0)))
    weight_on_tiles = detail::amx_conv_weight_gradient(input, grad_output, argmax, weight.size(0));
  if (input_gradient && detail::amx_conv_input_gradient_takes(input.size(1), weight.size(0)))
    input_on_tiles = detail::amx_conv_input_gradient(grad_output, argmax, weight, input.sizes());
  const bool onednn_input = input_gradient && !input_on_tiles, onednn_weight = !weight_on_tiles;
  torch::Tensor grad_input, grad_weight;
  if (onednn_input || onednn_weight) {
    const torch::Tensor grad_maps = detail::unpool2x2(
        grad_output, argmax, {input.size(0), weight.size(0), input.size(2), input.size(3)}, capability);
    std::tie(grad_input, grad_weight, std::ignore) = at::convolution_backward(
        grad_maps, input.to(torch::kBFloat16), weight.detach().to(torch::kBFloat16), c10::nullopt, {1, 1},
        {1, 1}, {1, 1}, false, {0, 0}, 1, {onednn_input, onednn_weight, false});
  }
  if (weight_on_tiles) grad_weight = *weight_on_tiles;
  if (input_on_tiles) grad_input = *input_on_tiles;
  if (grad_input.defined()) grad_input = grad_input.to(input.scalar_type()).contiguous(kChannelsLast);
  const torch::Tensor grad_bias =
      has_bias ? rounded_to(grad_output.to(torch::kFloat).sum({0, 2, 3}), torch::kBFloat16) : torch::Tensor();
  return {grad_input, grad_weight, grad_bias};
}

// Saves the input and the argmax bytes, not the conv's output: backward sums the gradients at each window's
// winner.
class ConvMaxPoolFunction : public torch::autograd::Function<ConvMaxPoolFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool has_bias,
                               int64_t dtype_code, int64_t capability_code, int64_t wide_code) {
    const auto dtype = static_cast<torch::ScalarType>(dtype_code);
    const auto capability = static_cast<CpuCapability>(capability_code);
    const torch::Tensor some_bias = has_bias ? bias : torch::Tensor();
    const auto wide = static_cast<WideConvForward>(wide_code);
    const PooledConv conv = pooled_conv(input, weight, some_bias, dtype, capability, wide);
    ctx->save_for_backward({input, weight, conv.pooled.argmax});
    ctx->saved_data["amx"] = conv.on_amx;
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    ctx->saved_data["dtype"] = dtype_code;
    ctx->saved_data["capability"] = capability_code;
    return conv.pooled.output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("conv3x3_max_pool2x2");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &weight = saved[1], &argmax = saved[2];
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto capability = static_cast<CpuCapability>(ctx->saved_data["capability"].toInt());
    const torch::Tensor grad_output = grads[0].to(dtype).contiguous(kChannelsLast);
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const auto bias_dtype = static_cast<torch::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
    torch::Tensor grad_input;
    ParameterGradients grads_of;
    // Over an image's few channels the winners' sums are the direct path's, whichever forward ran.
    if (ctx->saved_data["amx"].toBool() && !runs_direct(input.size(1))) {
      auto [input_grad, weight_grad, bias_grad] = dense_bf16_gradients(
          input, weight, grad_output, argmax, ctx->needs_input_grad(0), has_bias, capability);
      grad_input = input_grad;
      grads_of = {weight_grad, bias_grad};
    } else {
      detail::ConvMaxPoolImages p = describe(input.sizes(), input.scalar_type(), weight.size(0), dtype);
      p.input = input.data_ptr();
      p.argmax = argmax.data_ptr<uint8_t>();
      p.grad_output = grad_output.data_ptr();
      const bool direct = runs_direct(p.in_channels);
      if (ctx->needs_input_grad(0)) {
        grad_input = direct ? input_gradient(input, grad_output, argmax, weight, dtype, capability)
                            : torch::empty(input.sizes(), input.options().memory_format(kChannelsLast));
      }
      grads_of = direct ? direct_parameter_gradients(p, capability)
                        : winner_gradients(p, weight, grad_input, capability);
    }
    // The parameter's own layout (channels_last or not): what DDP's bucket views expect of a gradient.
    torch::Tensor grad_weight = torch::empty_like(weight).copy_(grads_of.weight);
    torch::Tensor grad_bias = has_bias ? grads_of.bias.to(bias_dtype) : torch::Tensor();
    return {grad_input,      grad_weight,     grad_bias,      torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool is_float_or_bf16(torch::ScalarType dtype) {
  return dtype == torch::kFloat || dtype == torch::kBFloat16;
}

}  // namespace

bool conv3x3_max_pool2x2_runs_on_amx(int64_t in_channels, int64_t out_channels, torch::ScalarType dtype) {
  return dtype == torch::kBFloat16 && detail::amx_conv_max_pool_takes(in_channels, out_channels);
}

bool conv3x3_max_pool2x2_takes(const torch::Tensor& input, const torch::Tensor& weight,
                               const torch::Tensor& bias, torch::ScalarType dtype) {
  const bool images = detail::cpu_float_or_bf16(input) && input.dim() == 4 && input.size(0) > 0 &&
                      input.size(1) >= 1 && input.size(2) >= 2 && input.size(3) >= 2 &&
                      input.is_contiguous(kChannelsLast);
  const bool kernel = images && detail::cpu_float_or_bf16(weight) && weight.dim() == 4 &&
                      weight.size(0) >= 1 && weight.size(1) == input.size(1) && weight.size(2) == 3 &&
                      weight.size(3) == 3;
  const bool bias_fits = !bias.defined() || (detail::cpu_float_or_bf16(bias) && bias.dim() == 1 &&
                                             weight.defined() && bias.size(0) == weight.size(0));
  return kernel && bias_fits && is_float_or_bf16(dtype);
}

bool conv3x3_max_pool2x2_batch_norm_relu_takes(const torch::Tensor& input, const torch::Tensor& weight,
                                               const torch::Tensor& bias, torch::ScalarType dtype,
                                               const torch::Tensor& norm_weight,
                                               const torch::Tensor& norm_bias,
                                               const torch::Tensor& running_mean,
                                               const torch::Tensor& running_var) {
  if (!conv3x3_max_pool2x2_takes(input, weight, bias, dtype)) return false;
  const bool on_amx = conv3x3_max_pool2x2_runs_on_amx(input.size(1), weight.size(0), dtype) &&
                      cpu_capability() == CpuCapability::avx512;
  if (!on_amx && dtype != torch::kFloat) return false;
  const int64_t channels = weight.size(0);
  for (const torch::Tensor* t : {&norm_weight, &norm_bias, &running_mean, &running_var}) {
    if (!detail::channel_vector(*t, channels)) return false;
  }
  const bool asks_gradient = input.requires_grad() || weight.requires_grad() ||
                             (bias.defined() && bias.requires_grad()) || norm_weight.requires_grad() ||
                             norm_bias.requires_grad();
  return !torch::GradMode::is_enabled() || !asks_gradient;
}

std::optional<torch::Tensor> conv3x3_max_pool2x2_batch_norm_relu(
    const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
    torch::ScalarType dtype, const torch::Tensor& norm_weight, const torch::Tensor& norm_bias,
    const torch::Tensor& running_mean, const torch::Tensor& running_var, double eps,
    CpuCapability capability) {
  FT_CHECK(conv3x3_max_pool2x2_batch_norm_relu_takes(input, weight, bias, dtype, norm_weight, norm_bias,
                                                     running_mean, running_var),
           "conv3x3_max_pool2x2_batch_norm_relu takes what conv3x3_max_pool2x2 takes, in fp32 or (with the "
           "avx512 capability) on AMX's tiles in bf16, and fp32 [Cout] BatchNorm parameters and statistics, "
           "asked for no gradient; got images {} {}, weight {}, dtype {}, BatchNorm weight {}",
           input.defined() ? input.sizes() : c10::IntArrayRef{},
           input.defined() ? c10::toString(input.scalar_type()) : "none",
           weight.defined() ? weight.sizes() : c10::IntArrayRef{}, c10::toString(dtype),
           norm_weight.defined() ? norm_weight.sizes() : c10::IntArrayRef{});
  FT_CHECK(dtype == torch::kFloat || capability == CpuCapability::avx512,
           "conv3x3_max_pool2x2_batch_norm_relu runs bf16 on AMX's tiles with the avx512 capability; got {}",
           to_string(capability));
  detail::check_runnable(capability, "conv3x3_max_pool2x2_batch_norm_relu");
  // Named in a profile (and in the tests, which count its calls).
  RECORD_FUNCTION("fasttrain::conv3x3_max_pool2x2_batch_norm_relu", std::vector<c10::IValue>());
  torch::NoGradGuard no_grad;
  detail::ChannelTerms terms =
      detail::batch_norm_relu_running_terms(norm_weight, norm_bias, running_mean, running_var, eps);
  const detail::BatchNormReluEpilogue epilogue{terms.mean(), terms.scale(), terms.shift()};
  if (dtype == torch::kBFloat16) {
    std::optional<detail::Pooled> pooled = detail::amx_conv_max_pool(input, weight, bias, &epilogue);
    if (!pooled) return std::nullopt;
    return pooled->output;
  }
  const detail::Pooled pooled = runs_direct(input.size(1))
                                    ? direct_forward(input, weight, bias, dtype, capability, &epilogue)
                                    : winograd_forward(input, weight, bias, dtype, capability, &epilogue);
  return pooled.output;
}

torch::Tensor conv3x3_max_pool2x2(const torch::Tensor& input, const torch::Tensor& weight,
                                  const torch::Tensor& bias, torch::ScalarType dtype,
                                  CpuCapability capability, WideConvForward wide) {
  FT_CHECK(
      conv3x3_max_pool2x2_takes(input, weight, bias, dtype),
      "conv3x3_max_pool2x2 takes images [N, C, H, W] (H and W at least 2) in channels_last "
      "on the CPU in fp32 or bf16, a weight [Cout, C, 3, 3] and a bias [Cout] or none, computed in fp32 or "
      "bf16; got images {} {}{}, weight {}, bias {}, dtype {}",
      input.defined() ? input.sizes() : c10::IntArrayRef{},
      input.defined() ? c10::toString(input.scalar_type()) : "none",
      input.defined() && input.dim() == 4 && !input.is_contiguous(kChannelsLast) ? " not in channels_last"
                                                                                 : "",
      weight.defined() ? weight.sizes() : c10::IntArrayRef{},
      bias.defined() ? bias.sizes() : c10::IntArrayRef{}, c10::toString(dtype));
  detail::check_runnable(capability, "conv3x3_max_pool2x2");
  // A custom Function's tensor arguments must be defined: no bias is a zero one that takes no gradient.
  const torch::Tensor some_bias = bias.defined() ? bias : torch::zeros({weight.size(0)}, weight.options());
  return ConvMaxPoolFunction::apply(input, weight, some_bias, bias.defined(), static_cast<int64_t>(dtype),
                                    static_cast<int64_t>(capability), static_cast<int64_t>(wide));
}

}  // namespace fasttrain::kernels
