#pragma once
// fasttrain's own CPU kernels, for the work where ATen's composed ops leave speed behind: each one is
// compiled for every x86 capability (scalar, AVX2, AVX512) and the process runs the widest its CPU
// has. Each has a reference in ATen ops it is tested against (tests/kernels) and a switch that turns
// it off (model.kernels = "aten" for the gpt and the cnn, task.kernels = "aten" for the cross-entropy). Each
// is differentiable once: a backward with create_graph through one is an error that names it.
//
//   torch::Tensor y = fasttrain::kernels::packed_causal_attention(qkv, heads);   // [B, T, 3C] -> [B, T, C]
//   auto [sum, normed] = fasttrain::kernels::add_layer_norm(x, branch, w, b, 1e-5, torch::kBFloat16);
//   torch::Tensor h = fasttrain::kernels::bias_gelu(torch::linear(x, fc->weight), fc->bias);  // [..., 4C]
//   torch::Tensor y = fasttrain::kernels::gelu_mlp(x, fc->weight, fc->bias, proj->weight, proj->bias, x);
//   torch::Tensor pooled = fasttrain::kernels::max_pool2x2(maps);  // NHWC [N, C, H, W] -> [N, C, H/2, W/2]
//   torch::Tensor flat = fasttrain::kernels::flatten_channels_last(maps);  // NHWC -> [N, CHW] NCHW order
//   torch::Tensor p = fasttrain::kernels::conv3x3_max_pool2x2(x, conv->weight, {}, cpu_compute_dtype(x));
//   torch::Tensor a = fasttrain::kernels::batch_norm_relu(maps, bn->weight, bn->bias, bn->running_mean,
//                                                         bn->running_var, true, 0.1, 1e-5);  // NHWC
//   torch::Tensor loss = fasttrain::kernels::cross_entropy(logits, targets, 0.1);  // [N, C], [N] -> 0-dim
#include <torch/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fasttrain::kernels {

enum class CpuCapability { scalar, avx2, avx512 };

// The widest capability this CPU runs among those compiled. ATEN_CPU_CAPABILITY (default, avx2,
// avx512) lowers it as it lowers ATen's own kernels.
CpuCapability cpu_capability();
// Every capability this CPU runs, narrowest first (what the reference tests check).
std::vector<CpuCapability> runnable_cpu_capabilities();
std::string to_string(CpuCapability capability);

// The dtype an op on `x` computes in on the CPU: autocast's where CPU autocast is on, else x's. What the
// dtype arguments below take, so that a kernel runs as the matmul or conv it feeds or replaces would.
torch::ScalarType cpu_compute_dtype(const torch::Tensor& x);
// The same on x's device (a GPU's autocast on a CUDA tensor).
torch::ScalarType compute_dtype(const torch::Tensor& x);

// Whether packed_causal_attention takes these inputs: qkv [B, T, 3C] on the CPU, fp32 or bf16,
// C a multiple of `heads`, and a bias fp32 [3C] or none. Elsewhere (a GPU, another dtype) the caller runs
// ATen's attention.
bool packed_attention_takes(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& bias = {});

// Causal self-attention of a Linear(C, 3C)'s output, read in place: q, k and v of `heads` heads of
// C / heads each, side by side in the last dimension; returns [B, T, C] with the heads side by side.
// softmax(q k^T / sqrt(D), masked above the diagonal) v, in fp32 arithmetic whatever the dtype, and
// differentiable (its own backward, which recomputes the scores from the rows' log-sum-exp).
// `capability`: which build of the kernel runs (tests pick each; it must be runnable here). `bias`, where
// defined: the Linear's bias [3C], added to every token row as the kernel reads it (the Linear then runs
// without it: no pass of its own, and its gradient, summed over the rows, comes from here).
torch::Tensor packed_causal_attention(const torch::Tensor& qkv, int64_t heads,
                                      CpuCapability capability = cpu_capability(),
                                      const torch::Tensor& bias = {});

// Whether layer_norm and add_layer_norm take these: x (and branch, when defined) [..., C] of one shape on
// the CPU, or on a CUDA GPU where LibTorch has CUDA (src/kernels/cuda: the same arithmetic and roundings, a
// warp a row), in fp32 or bf16, weight and bias fp32 [C] on x's device. Elsewhere the caller runs ATen's ops.
bool layer_norm_takes(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                      const torch::Tensor& bias);

// LayerNorm over the last dimension, (x - mean) / sqrt(var + eps) * weight + bias, written in `y_dtype`
// (fp32 or bf16: the dtype of the matmul it feeds, which saves autocast's cast). fp32 arithmetic,
// differentiable in x, weight and bias.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps, torch::ScalarType y_dtype, CpuCapability capability = cpu_capability());

// {x, layer_norm(x)}: x passed on (the residual stream a pre-norm block adds to), whose gradient from
// its later use backward adds to the norm's in the same pass instead of autograd's add after it.
// Differentiable in x, weight and bias. The x returned is autograd's view of the input: not to be
// modified in place (autograd refuses it).
std::pair<torch::Tensor, torch::Tensor> pass_layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                                                        const torch::Tensor& bias, double eps,
                                                        torch::ScalarType y_dtype,
                                                        CpuCapability capability = cpu_capability());

// The residual add and the LayerNorm after it, in one pass: {x + branch (x's dtype), layer_norm(x +
// branch) in y_dtype}. Differentiable in x, branch, weight, bias and branch_bias. branch_bias (fp32 [C],
// on the CPU), where defined, is the bias of the Linear that made the branch, run without it: added with
// the branch, its gradient summed in backward's pass.
std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch,
                                                       const torch::Tensor& weight, const torch::Tensor& bias,
                                                       double eps, torch::ScalarType y_dtype,
                                                       CpuCapability capability = cpu_capability(),
                                                       const torch::Tensor& branch_bias = {});

// Whether bias_gelu takes these: pre [..., N] on the CPU in fp32 or bf16, bias fp32 [N].
bool bias_gelu_takes(const torch::Tensor& pre, const torch::Tensor& bias);

// gelu_tanh(pre + bias) in one pass, in pre's dtype (fp32 arithmetic): the bias of the Linear before it
// (run without its bias) and the tanh-approximated GELU, with a tanh that costs a fraction of ATen's.
// Differentiable in pre and bias: backward writes grad_pre and sums grad_bias in the same pass.
torch::Tensor bias_gelu(const torch::Tensor& pre, const torch::Tensor& bias,
                        CpuCapability capability = cpu_capability());

// Whether linear takes these: x [..., K], weight [N, K], bias [N] and residual [..., N] (either may be
// undefined), all fp32 on the CPU with CPU autocast off, where oneDNN runs fp32 matmuls (LibTorch 2.4 and
// later, a CPU with AVX512 BW, VL and DQ). Elsewhere the caller runs torch::linear (and adds the residual).
bool linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                  const torch::Tensor& residual = {});

// residual + x weight^T + bias, differentiable in all four. The input's gradient grad_y weight is oneDNN's
// matmul, which ran the gpt's shapes 10-25% faster than MKL's sgemm and writes its output without MKL's
// zeroing pass; with a residual the forward is one oneDNN matmul that adds into residual + bias (the
// residual add a transformer block does after its projection, in the same pass); with a bias alone it is
// torch::linear's. Where the product's depth is at most 128 (K for the forward without bias or residual, N
// for the input's gradient) fasttrain's own tiled matmul runs instead, 8-28% faster than oneDNN's there. The
// weight's and bias's gradients are ATen's. fp32 arithmetic.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     const torch::Tensor& residual = {});

// a [M, K] @ b by fasttrain's own fp32 matmul (a register tile of 6 rows by 4 AVX512 vectors, b packed in
// panels), b [K, N] or, with `transposed`, a weight [N, K] (a @ weight^T). Not differentiable: linear runs it
// inside its forward and input gradient where it wins (depths of at most 128, measured 8-28% faster than
// oneDNN's there), and gelu_mlp with its GELU epilogues.
torch::Tensor tiled_matmul(const torch::Tensor& a, const torch::Tensor& b, bool transposed,
                           CpuCapability capability = cpu_capability());

// Whether fasttrain's own matmul (tiled_matmul, and gelu_mlp's) is worth running on this CPU: with AVX2 or
// AVX512; in the scalar build it would lose to BLAS.
bool tiled_matmul_pays_here();

// Whether gelu_mlp takes these: x [..., C], fc_weight [H, C], fc_bias [H], proj_weight [C, H], proj_bias [C]
// and residual of x's shape, all fp32 on the CPU with CPU autocast off.
bool gelu_mlp_takes(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                    const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                    const torch::Tensor& residual);

// residual + proj(gelu_tanh(fc(x))), a transformer block's MLP and its residual add, differentiable in all
// six. fc's matmul is fasttrain's, with the bias + GELU in its epilogue: it writes fc's output (kept for
// backward) and the GELU of it from the same register tile. The projection's input gradient is the same
// matmul with GELU's derivative and fc's bias gradient in its epilogue. So the [..., H] activation is never
// read back in a pass of its own, as it is after ATen's addmm or after linear + bias_gelu. The projection's
// forward adds into residual + proj_bias (oneDNN's matmul where it runs fp32, else ATen's), x's gradient is
// the same matmul, the weights' gradients ATen's. fp32 arithmetic.
torch::Tensor gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                       const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                       const torch::Tensor& residual, CpuCapability capability = cpu_capability());

// Whether this CPU has AMX-BF16 tiles and the system lends them to this process: where amx_linear runs.
bool amx_linear_runs_here();

// Whether amx_linear takes these: x [M, K] on the CPU in bf16, or in fp32 under CPU autocast in bf16 (what
// it computes in either way); weight fp32 [N, K] and bias fp32 [N], N and K multiples of 32; on a CPU where
// amx_linear_runs_here(). Elsewhere the caller runs torch::linear (and the ReLU).
bool amx_linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// relu(x weight^T + bias) (without the ReLU where `relu` is false) in bf16 on AMX's tiles, returned in bf16:
// x, weight and bias rounded to bf16 as autocast's linear rounds them, fp32 sums, each output rounded once.
// Differentiable in all three: x's gradient rounded to bf16 (returned in x's dtype) as a bf16 matmul's; the
// weight's and bias's summed and returned in fp32 without the bf16 rounding autocast's backward gives them.
// Where ATen casts the weight and oneDNN then packs it for its tiles on every call, the weight is rounded
// and packed in one pass (into both the forward's layout and, where x's gradient will be asked for,
// backward's, from one read of it), and the bias and the ReLU are applied to each block of outputs as it is
// stored.
torch::Tensor amx_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         bool relu);

// The largest share of dz (dy where y is not <= 0) that linear_relu's backward sums nonzero by nonzero; above
// it a dense matmul multiplies fewer wasted zeros than the sparse sums lose in speed (BENCHMARKS.md).
constexpr double kLinearReluSparseUpTo = 0.3;

// Whether linear_relu takes these: x [M, K] on the CPU in fp32, not under CPU autocast in bf16; weight fp32
// [N, K] and bias fp32 [N]. Elsewhere the caller runs torch::linear and the ReLU (or amx_linear in bf16).
bool linear_relu_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// relu(x weight^T + bias) in fp32, forward as ATen's linear and an in-place ReLU, for a hidden layer whose
// ReLU passes few outputs: its backward multiplies only dz's nonzeros (dz = dy where y is not <= 0, a NaN y
// included, as ATen's threshold_backward passes it), each row of x's gradient a sum of the weight's rows that
// row's nonzeros name, each row of the weight's a sum of x's rows, in vectors of inputs held in registers;
// where more than `sparse_up_to` of dz is nonzero (0: always, 1: never; tests and benchmarks pick a path so),
// ATen's dense matmuls. The same gradients as linear + relu up to the order of fp32 sums.
torch::Tensor linear_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          CpuCapability capability = cpu_capability(),
                          double sparse_up_to = kLinearReluSparseUpTo);

// The most outputs narrow_linear takes: past a few dozen a matmul library's blocking pays for its call.
constexpr int64_t kNarrowLinearMaxOutputs = 64;

// Whether narrow_linear takes these: x [M, K] on the CPU in bf16, or in fp32 under CPU autocast in bf16;
// weight fp32 [N, K] with 1 <= N <= kNarrowLinearMaxOutputs, bias fp32 [N]. Elsewhere the caller runs
// torch::linear.
bool narrow_linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// x weight^T + bias for a Linear with few outputs (a classifier's last layer) in bf16, as autocast's linear
// rounds it: x, weight and bias rounded to bf16, fp32 sums, each output rounded once; returned in bf16. Each
// output is a dot product over the row in fp32 vectors, where oneDNN's bf16 matmul pays its call for a few
// hundred thousand multiply-adds. Differentiable in all three: x's gradient rounded to bf16 (returned in x's
// dtype), the weight's and bias's summed and returned in fp32 without the bf16 rounding autocast's backward
// gives them.
torch::Tensor narrow_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            CpuCapability capability = cpu_capability());

// Whether max_pool2x2 takes this: images [N, C, H, W] with H and W at least 2, laid out channels_last
// (NHWC), on the CPU in fp32 or bf16. Elsewhere (NCHW, a GPU) the caller runs ATen's max_pool2d.
bool max_pool2x2_takes(const torch::Tensor& input);

// max_pool2d(input, 2): the maximum of each 2x2 window at stride 2 (an odd last row or column left out),
// channels_last, in input's dtype; equal to ATen's bit for bit in both directions (ties go to the
// window's first value, NaN propagates). Differentiable: it keeps a byte per output value for backward
// (ATen keeps an int64 index), and backward writes each input gradient once instead of zero-filling
// the whole tensor and scattering into it.
torch::Tensor max_pool2x2(const torch::Tensor& input, CpuCapability capability = cpu_capability());

// Whether flatten_channels_last takes this: maps [N, C, H, W] laid out channels_last (NHWC) but not
// also contiguous (C, H and W all above 1), on the CPU in fp32 or bf16. Elsewhere maps.flatten(1) is a
// view or ATen's copy.
bool flatten_channels_last_takes(const torch::Tensor& maps);

// maps.flatten(1) of channels_last maps: [N, C * H * W] in NCHW order (the order a Linear after a conv
// net's last stage reads, whatever the maps' layout), equal bit for bit. ATen's strided copy moves a
// value at a time; this transposes each sample's [H * W, C] with gathers. Differentiable: backward
// writes the gradient channels_last, the layout the stage before it takes without another copy.
torch::Tensor flatten_channels_last(const torch::Tensor& maps, CpuCapability capability = cpu_capability());

// The most input channels conv3x3_max_pool2x2's direct forward takes: an image's few, where a direct conv
// beats oneDNN's GEMM-shaped kernels. Over more, its forward is WideConvForward's.
constexpr int64_t kConvMaxPoolInChannels = 4;

// conv3x3_max_pool2x2's forward over more than kConvMaxPoolInChannels input channels: Winograd's F(2x2, 3x3),
// whose 2x2 output tiles are the pooling windows (16 multiply-adds per input and output channel a window
// where a direct conv takes 36; only the pooled maps written), or oneDNN's conv and then max_pool2x2's
// kernel. Winograd's transforms round (a relative 1e-6 or so in fp32; none on small whole numbers), so near
// ties may pool another winner than oneDNN's conv; they take differences of the input, so an infinite input
// may give NaN where a direct conv gives an infinity (a NaN goes where it goes in a direct conv). `amx`: in
// bf16 on AMX's tiles where they are lent to this process, over 16 input channels or a multiple of 32 and a
// multiple of 16 output channels (an implicit GEMM with the max-pool in its epilogue: only the pooled maps
// written; backward: the weight's and the input's gradients on the tiles too where the input channels are a
// multiple of 16 and the output channels of 32, the weight's where the gradient is finite and the input's
// where the weight is, else oneDNN's bf16 conv backward of the winners' gradient); elsewhere, and for images
// or parameters holding a NaN or an infinity, `onednn`'s path. `amx` also takes over the direct forward over
// one input channel (a pooling window's 4x4 patch per tile row, its four positions in four accumulators;
// backward the direct path's), and declines the same values to it. On the tiles each conv output is rounded
// to bf16 by AVX-512 BF16's conversion, as oneDNN's bf16 conv rounds it, which flushes values under 2^-126 to
// zero.
enum class WideConvForward { winograd, onednn, amx };

// Whether conv3x3_max_pool2x2 with WideConvForward::amx runs on AMX's tiles for a conv from `in_channels` to
// `out_channels` in `dtype` (one input channel, or past kConvMaxPoolInChannels).
bool conv3x3_max_pool2x2_runs_on_amx(int64_t in_channels, int64_t out_channels, torch::ScalarType dtype);

// Whether conv3x3_max_pool2x2 takes these: images [N, C, H, W] with H and W at least 2, laid out
// channels_last (NHWC) on the CPU in fp32 or bf16; weight [Cout, C, 3, 3] and bias [Cout] (or undefined) on
// the CPU in fp32 or bf16; dtype fp32 or bf16. Elsewhere the caller runs ATen's conv2d and then the
// max-pool.
bool conv3x3_max_pool2x2_takes(const torch::Tensor& input, const torch::Tensor& weight,
                               const torch::Tensor& bias, torch::ScalarType dtype);

// max_pool2d(conv2d(input, weight, bias, stride 1, padding 1), 2), channels_last, computed in `dtype` (bf16:
// autocast's dtype, to which the input, weight and bias are rounded as autocast's conv rounds them, and each
// conv output before the max-pool compares it; fp32 arithmetic either way) and returned in it, with a byte
// per value saying which of its window won (ties to the window's first, NaN propagates: max_pool2x2's rule).
// Over at most kConvMaxPoolInChannels input channels it runs in one pass and writes only the pooled maps;
// over more, as `wide` says. Backward runs from the winners only: a window's
// gradient flows through the one conv output that won it. The weight's and bias's gradients are summed in
// fp32, rounded to `dtype` as a conv's backward in it rounds them and returned in the parameters' own dtype
// and layout. The input's gradient, where it needs one, is over few channels the transposed conv (ATen's
// conv2d with the kernel flipped) and over more scattered from the winners in the same pass (fp32 sums,
// rounded to bf16 where either `dtype` or the input is). After WideConvForward::amx's forward, the gradients
// are a bf16 conv backward's (see there). Differentiable once (its backward is not itself
// differentiable, and says so where asked to be). A conv output that wins no window (an odd last row or
// column, and over more channels every loser) is not read by backward: an infinite or NaN input seen only
// by such outputs leaves the gradients finite, where conv2d's backward multiplies it by a zero gradient.
torch::Tensor conv3x3_max_pool2x2(const torch::Tensor& input, const torch::Tensor& weight,
                                  const torch::Tensor& bias, torch::ScalarType dtype,
                                  CpuCapability capability = cpu_capability(),
                                  WideConvForward wide = WideConvForward::winograd);

// Whether conv3x3_max_pool2x2_batch_norm_relu runs here: conv3x3_max_pool2x2 takes the conv, computed in fp32
// (on any capability), or in bf16 on AMX's tiles (conv3x3_max_pool2x2_runs_on_amx) on the avx512 capability
// (whose batch_norm_relu arithmetic the epilogue's is); the BatchNorm's weight, bias and running statistics
// fp32 [Cout], and no gradient is asked of any of them (grad mode off, or none requires one).
bool conv3x3_max_pool2x2_batch_norm_relu_takes(const torch::Tensor& input, const torch::Tensor& weight,
                                               const torch::Tensor& bias, torch::ScalarType dtype,
                                               const torch::Tensor& norm_weight,
                                               const torch::Tensor& norm_bias,
                                               const torch::Tensor& running_mean,
                                               const torch::Tensor& running_var);

// An evaluation's conv3x3_max_pool2x2 and the BatchNorm + ReLU with running statistics after it in one pass:
// batch_norm_relu(conv3x3_max_pool2x2(input, weight, bias, dtype, capability, wide), norm_weight, norm_bias,
// running_mean, running_var, false, momentum, eps, capability) bit for bit, channels_last [N, Cout, H / 2,
// W / 2] in `dtype`, with neither the pooled maps before the BatchNorm nor the winners' bytes written (the
// epilogue normalises each pooled value as it pools it). In fp32 `wide` is WideConvForward::winograd over
// more than kConvMaxPoolInChannels input channels (the direct forward over at most that many), on
// `capability`; in bf16 it is WideConvForward::amx, and `capability` must be avx512. Not differentiable: for
// inference. In bf16, nullopt where the AMX forward declines the values (a NaN or an infinity in the images,
// weight or bias); the caller then runs the two. fp32 always gives the maps.
// conv3x3_max_pool2x2_batch_norm_relu_takes must hold.
std::optional<torch::Tensor> conv3x3_max_pool2x2_batch_norm_relu(
    const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
    torch::ScalarType dtype, const torch::Tensor& norm_weight, const torch::Tensor& norm_bias,
    const torch::Tensor& running_mean, const torch::Tensor& running_var, double eps,
    CpuCapability capability = cpu_capability());

// Whether batch_norm_relu takes these: maps [N, C, H, W] laid out channels_last on the CPU in fp32 or
// bf16 (at least two values per channel when training), weight, bias, running_mean and running_var fp32
// [C]. Elsewhere (NCHW, a GPU, no running statistics) the caller runs ATen's batch_norm and relu.
bool batch_norm_relu_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                           const torch::Tensor& running_mean, const torch::Tensor& running_var,
                           bool training);

// relu(batch_norm(x, ...)) as BatchNorm2d and the ReLU after it compute it, in x's dtype (fp32 arithmetic):
// with batch statistics when `training` (and running_mean, running_var updated in place by `momentum`,
// the variance unbiased), else with the running ones. Differentiable in x, weight and bias (once: its
// backward is not itself differentiable); it keeps x and four numbers per channel for backward, which
// recomputes ReLU's mask, where ATen runs four operators and keeps x and y.
torch::Tensor batch_norm_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              const torch::Tensor& running_mean, const torch::Tensor& running_var,
                              bool training, double momentum, double eps,
                              CpuCapability capability = cpu_capability());

// Whether cross_entropy takes these: logits [N, C] on the CPU in fp32 or bf16, targets int64 [N] on the CPU.
bool cross_entropy_takes(const torch::Tensor& logits, const torch::Tensor& targets);

// The label-smoothed cross-entropy's mean over the rows whose target is not `ignore_target` (0 where every
// one is), as fasttrain::cross_entropy (task/tasks.h) composes it from ATen's ops: per row, in fp32
// arithmetic whatever the logits' dtype, lse(x) - (1 - e) x[target] - e mean(x), e = label_smoothing.
// Returns 0-dim fp32. bf16 logits are read as they are, where ATen's ops first copy them to fp32.
// Differentiable in the logits (once): backward writes (softmax(x) - e / C - (1 - e) onehot(target))
// times the loss's gradient over the count, in the logits' dtype, in one pass that recomputes the softmax
// from each row's maximum and log-sum-exp (all it keeps besides the inputs). A target that is neither a class
// id in [0, C) nor `ignore_target` is an error naming it.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, double label_smoothing,
                            int64_t ignore_target = -100, CpuCapability capability = cpu_capability());

// Muon's quintic Newton-Schulz coefficients (Keller Jordan's, torch.optim.Muon's defaults), and the
// floor of the norm that the update is divided by.
struct NewtonSchulzCoefficients {
  double a = 3.4445, b = -4.7750, c = 2.0315, eps = 1e-7;
};

// Whether newton_schulz takes this update: a matrix [A, B] on the CPU in fp32 or bf16 whose smaller side
// is at most 64 and which holds at most 65536 values. Larger ones are matmul-bound: ATen's GEMMs win.
bool newton_schulz_takes(const torch::Tensor& update);

// Muon's orthogonalisation of `update` [A, B] (torch.optim.Muon's _zeropower_via_newtonschulz): X =
// update / |update|_F in bf16, then `steps` times X <- a X + (b G + c G G) X, G = X X^T, on the wide
// orientation. One call instead of ATen's three matmuls an iteration, with each product rounded to bf16
// where ATen's bf16 matmuls round it. Returns bf16 [A, B]; not differentiable.
torch::Tensor newton_schulz(const torch::Tensor& update, int64_t steps,
                            const NewtonSchulzCoefficients& coefficients = {},
                            CpuCapability capability = cpu_capability());

// One Muon step of a matrix parameter [A, ...] on the CPU, in one call where muon composes a dozen ATen
// ops around newton_schulz (for the main job's three small matrices, a quarter of its optimizer's time):
//   buffer <- buffer.lerp(grad, 1 - momentum); update = nesterov ? grad.lerp(buffer, momentum) : buffer
//   param  <- param * decay - newton_schulz(update viewed [A, B]) * scale
// each line rounded as that ATen op rounds it (the lerps as ATen's vectorised kernel computes them), so it
// gives the composed step's values. decay = 1 - lr * weight_decay, scale = lr times muon's per-matrix lr
// adjustment.
struct MuonMatrixStep {
  double momentum = 0.95;
  bool nesterov = true;
  int64_t steps = 5;
  NewtonSchulzCoefficients coefficients;
  double decay = 1, scale = 0;
};

// Whether muon_matrix_step takes these: param, grad and buffer fp32, of one shape [A, ...] and one dense
// layout (contiguous, or a channels_last conv kernel) on the CPU, whose [A, B] reshape newton_schulz takes.
bool muon_matrix_step_takes(const torch::Tensor& param, const torch::Tensor& grad,
                            const torch::Tensor& buffer);

// Updates param and buffer in place (no autograd: an optimizer step).
void muon_matrix_step(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& buffer,
                      const MuonMatrixStep& step, CpuCapability capability = cpu_capability());

// One matrix's Muon step, as muon_matrix_steps takes them.
struct MuonMatrixUpdate {
  torch::Tensor param, grad, buffer;
  MuonMatrixStep step;
};

// muon_matrix_step of each, the matrices taken in turn by the intra-op pool's threads, largest first (each
// matrix's step runs on one thread: a small matrix's is well under a millisecond, and a step's few matrices
// would otherwise run one after another while the other threads wait). Every one must be taken
// (muon_matrix_step_takes, steps >= 0) and no two may share a parameter or buffer: otherwise an error names
// the matrix before any changes. The updates are those of muon_matrix_step on each in turn.
void muon_matrix_steps(const std::vector<MuonMatrixUpdate>& updates,
                       CpuCapability capability = cpu_capability());

// The same in ATen's ops, any size, any device: an mm and two addmm an iteration in bf16, as
// torch.optim.Muon's _zeropower_via_newtonschulz; newton_schulz's reference, and what muon runs for
// the matrices it does not take.
torch::Tensor newton_schulz_aten(const torch::Tensor& update, int64_t steps,
                                 const NewtonSchulzCoefficients& coefficients = {});

}  // namespace fasttrain::kernels
