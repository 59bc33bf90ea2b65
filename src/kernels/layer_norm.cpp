#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <algorithm>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/kernels/gpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

#if FASTTRAIN_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/layer_norm_cuda.h"
#endif

namespace fasttrain::kernels {

namespace {

detail::LayerNormKernels layer_norm_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(layer_norm_kernels, capability);
}

bool bf16(const torch::Tensor& t) {
  return t.defined() && t.scalar_type() == torch::kBFloat16;
}

struct NormGrads {
  torch::Tensor x, branch, weight, bias, branch_bias;
};

detail::LayerNormRows describe(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& w,
                               const torch::Tensor& b, const torch::Tensor& y, double eps) {
  detail::LayerNormRows n;
  n.width = x.size(-1);
  n.rows = x.numel() / std::max<int64_t>(n.width, 1);
  n.eps = static_cast<float>(eps);
  n.x_bf16 = bf16(x);
  n.branch_bf16 = bf16(branch);
  n.y_bf16 = bf16(y);
  n.x = x.data_ptr();
  n.branch = branch.defined() ? branch.data_ptr() : nullptr;
  n.weight = w.data_ptr<float>();
  n.bias = b.data_ptr<float>();
  return n;
}

// The rows of `n` through the CPU body of `capability`, or on a GPU its CUDA kernel.
void run_forward(const detail::LayerNormRows& n, [[maybe_unused]] const torch::Device& device,
                 CpuCapability capability) {
#if FASTTRAIN_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard on_device(device);
    return detail::layer_norm_forward_cuda(n, c10::cuda::getCurrentCUDAStream().stream());
  }
#endif
  const auto kernel = layer_norm_bodies(capability).forward;
  at::parallel_for(0, n.rows, detail::rows_per_task(n.width),
                   [&](int64_t begin, int64_t end) { kernel(n, begin, end); });
}

// How many partial sums of the parameters' gradients backward writes: a CPU thread's rows each, or the
// CUDA kernel's row ranges.
int64_t backward_partials([[maybe_unused]] const torch::Device& device, int64_t rows,
                          [[maybe_unused]] int64_t width) {
#if FASTTRAIN_CUDA
  if (device.is_cuda()) return detail::layer_norm_backward_partials(rows, width);
#endif
  return detail::row_chunks(rows).count;
}

void run_backward(const detail::LayerNormRows& n, [[maybe_unused]] int64_t partials,
                  [[maybe_unused]] const torch::Device& device, CpuCapability capability) {
#if FASTTRAIN_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard on_device(device);
    return detail::layer_norm_backward_cuda(n, partials, c10::cuda::getCurrentCUDAStream().stream());
  }
#endif
  const auto kernel =
      layer_norm_bodies(capability).backward;  // a chunk's rows per partial (backward_partials)
  detail::for_each_row_chunk(
      n.rows, detail::row_chunks(n.rows),
      [&](int64_t begin, int64_t end, int64_t chunk) { kernel(n, begin, end, chunk); });
}

// What a norm reads besides x, weight and bias: a branch added to x, and the bias of the Linear that made
// the branch (added with it; CPU only). Either may be undefined.
struct NormBranch {
  torch::Tensor branch, bias;
};

// The forward of the functions below: {y} without a branch, {x + branch (+ its bias), y} with one. Saves
// what norm_backward reads.
torch::autograd::variable_list norm_forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                                            const NormBranch& branch_in, const torch::Tensor& weight,
                                            const torch::Tensor& bias, double eps, int64_t y_dtype,
                                            int64_t capability) {
  const torch::Tensor x = x_in.contiguous();
  const torch::Tensor branch = branch_in.branch.defined() ? branch_in.branch.contiguous() : torch::Tensor();
  const torch::Tensor branch_bias = branch_in.bias.defined() ? branch_in.bias.contiguous() : torch::Tensor();
  const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(width, 1);
  torch::Tensor sum = branch.defined() ? torch::empty_like(x) : torch::Tensor();
  torch::Tensor y = torch::empty(x.sizes(), x.options().dtype(static_cast<torch::ScalarType>(y_dtype)));
  torch::Tensor mean = torch::empty({rows}, x.options().dtype(torch::kFloat));
  torch::Tensor rstd = torch::empty({rows}, x.options().dtype(torch::kFloat));
  const torch::Tensor w = weight.contiguous(), b = bias.contiguous();
  detail::LayerNormRows n = describe(x, branch, w, b, y, eps);
  n.sum = sum.defined() ? sum.data_ptr() : nullptr;
  n.y = y.data_ptr();
  n.mean = mean.data_ptr<float>();
  n.rstd = rstd.data_ptr<float>();
  n.branch_bias = branch_bias.defined() ? branch_bias.data_ptr<float>() : nullptr;
  run_forward(n, x.device(), static_cast<CpuCapability>(capability));
  // What backward normalises again: the sum where there is one, else x.
  ctx->save_for_backward({branch.defined() ? sum : x, w, b, mean, rstd});
  ctx->saved_data["eps"] = eps;
  ctx->saved_data["y_dtype"] = y_dtype;
  ctx->saved_data["capability"] = capability;
  ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
  ctx->saved_data["branch_dtype"] =
      static_cast<int64_t>(branch.defined() ? branch.scalar_type() : x.scalar_type());
  if (branch.defined()) return {sum, y};
  return {y};
}

// The gradients of x, the branch (grad_x itself where their dtypes agree), weight, bias and, where
// `has_branch_bias`, the branch's bias. grad_sum_in: the gradient of the sum, or of x passed on.
NormGrads norm_backward(torch::autograd::AutogradContext* ctx, const torch::Tensor& grad_sum_in,
                        const torch::Tensor& grad_y_in, bool has_branch, bool has_branch_bias = false) {
  detail::check_first_order("layer_norm");
  const auto saved = ctx->get_saved_variables();
  const torch::Tensor &normalised = saved[0], &w = saved[1], &b = saved[2];
  const auto y_dtype = static_cast<torch::ScalarType>(ctx->saved_data["y_dtype"].toInt());
  const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
  const auto branch_dtype = static_cast<torch::ScalarType>(ctx->saved_data["branch_dtype"].toInt());
  torch::Tensor grad_y = grad_y_in.defined()
                             ? grad_y_in.to(y_dtype).contiguous()
                             : torch::zeros(normalised.sizes(), normalised.options().dtype(y_dtype));
  torch::Tensor grad_sum = grad_sum_in.defined() ? grad_sum_in.to(x_dtype).contiguous() : torch::Tensor();

  const int64_t width = normalised.size(-1), rows = normalised.numel() / std::max<int64_t>(width, 1);
  const int64_t partials = backward_partials(normalised.device(), rows, width);
  NormGrads grads;
  grads.x = torch::empty_like(normalised);
  // One gradient for both where the dtypes agree: the branch's is the sum's, as grad_x is.
  const bool own_branch_grad = has_branch && branch_dtype != x_dtype;
  if (own_branch_grad)
    grads.branch = torch::empty(normalised.sizes(), normalised.options().dtype(branch_dtype));
  const auto partial = [&] {
    return torch::zeros({partials, width}, normalised.options().dtype(torch::kFloat));
  };
  torch::Tensor weight_partial = partial(), bias_partial = partial();
  torch::Tensor branch_bias_partial = has_branch_bias ? partial() : torch::Tensor();
  detail::LayerNormRows n =
      describe(normalised, grads.branch, w, b, grad_y, ctx->saved_data["eps"].toDouble());
  n.mean = saved[3].data_ptr<float>();
  n.rstd = saved[4].data_ptr<float>();
  n.grad_y = grad_y.data_ptr();
  n.grad_sum = grad_sum.defined() ? grad_sum.data_ptr() : nullptr;
  n.grad_x = grads.x.data_ptr();
  n.grad_branch = own_branch_grad ? grads.branch.data_ptr() : nullptr;
  n.grad_weight_partial = weight_partial.data_ptr<float>();
  n.grad_bias_partial = bias_partial.data_ptr<float>();
  n.grad_branch_bias_partial = has_branch_bias ? branch_bias_partial.data_ptr<float>() : nullptr;
  run_backward(n, partials, normalised.device(),
               static_cast<CpuCapability>(ctx->saved_data["capability"].toInt()));
  if (has_branch && !own_branch_grad) grads.branch = grads.x;
  grads.weight = weight_partial.sum(0);
  grads.bias = bias_partial.sum(0);
  if (has_branch_bias) grads.branch_bias = branch_bias_partial.sum(0);
  return grads;
}

// autograd takes no undefined inputs: the plain norm, the passed-on norm and the add are three functions
// over one body.
class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                               int64_t y_dtype, int64_t capability) {
    return norm_forward(ctx, x, {}, weight, bias, eps, y_dtype, capability)[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    NormGrads g = norm_backward(ctx, torch::Tensor(), grads[0], /*has_branch=*/false);
    return {g.x, g.weight, g.bias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// x passed on as it is, and its norm: {x, y}. Backward adds the gradient x gets from its later use to the
// norm's, in the same pass (autograd would add the two in a pass of its own).
class PassLayerNormFunction : public torch::autograd::Function<PassLayerNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                double eps, int64_t y_dtype, int64_t capability) {
    return {x, norm_forward(ctx, x, {}, weight, bias, eps, y_dtype, capability)[0]};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    NormGrads g = norm_backward(ctx, grads[0], grads[1], /*has_branch=*/false);
    return {g.x, g.weight, g.bias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Inputs {x, branch, weight, bias} or {x, branch, weight, bias, branch_bias}: a custom Function's tensor
// inputs must be defined, so the branch's bias is there only where given.
class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList in,
                                                double eps, int64_t y_dtype, int64_t capability) {
    const bool has_branch_bias = in.size() > 4;
    ctx->saved_data["has_branch_bias"] = has_branch_bias;
    return norm_forward(ctx, in[0], {in[1], has_branch_bias ? in[4] : torch::Tensor()}, in[2], in[3], eps,
                        y_dtype, capability);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const bool has_branch_bias = ctx->saved_data["has_branch_bias"].toBool();
    NormGrads g = norm_backward(ctx, grads[0], grads[1], /*has_branch=*/true, has_branch_bias);
    torch::autograd::variable_list out{g.x, g.branch, g.weight, g.bias};
    if (has_branch_bias) out.push_back(g.branch_bias);
    out.resize(out.size() + 3);  // eps, y_dtype, capability
    return out;
  }
};

void check_takes(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                 const torch::Tensor& bias, torch::ScalarType y_dtype) {
  FT_CHECK(
      layer_norm_takes(x, branch, weight, bias),
      "layer_norm takes x [..., C] (and a branch of its shape) on the CPU or a CUDA GPU in fp32 or bf16 with "
      "weight and bias fp32 [C] on its device; got x {} {} on {}, branch {}, weight {}, bias {}",
      x.sizes(), c10::toString(x.scalar_type()), x.device().str(),
      branch.defined() ? c10::toString(branch.scalar_type()) : "none", weight.sizes(), bias.sizes());
  FT_CHECK(y_dtype == torch::kFloat || y_dtype == torch::kBFloat16, "layer_norm writes fp32 or bf16, not {}",
           c10::toString(y_dtype));
}

}  // namespace

bool layer_norm_takes(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                      const torch::Tensor& bias) {
  // The CPU bodies, or the CUDA kernel where LibTorch has CUDA.
  if (!x.defined()) return false;
  const auto float_or_bf16 = [&](const torch::Tensor& t) {
    return t.defined() && t.device() == x.device() &&
           (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16);
  };
  const bool on_a_device_with_a_kernel = x.device().is_cpu() || gpu_kernels_run_on(x.device());
  if (!on_a_device_with_a_kernel || !float_or_bf16(x) || x.dim() < 1 || x.numel() == 0) return false;
  if (branch.defined() && (!float_or_bf16(branch) || branch.sizes() != x.sizes())) return false;
  const auto fp32_width = [&](const torch::Tensor& p) {
    return p.defined() && p.device() == x.device() && p.scalar_type() == torch::kFloat && p.dim() == 1 &&
           p.size(0) == x.size(-1);
  };
  return fp32_width(weight) && fp32_width(bias);
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps, torch::ScalarType y_dtype, CpuCapability capability) {
  check_takes(x, torch::Tensor(), weight, bias, y_dtype);
  detail::check_runnable(capability, "layer_norm");
  return LayerNormFunction::apply(x, weight, bias, eps, static_cast<int64_t>(y_dtype),
                                  static_cast<int64_t>(capability));
}

std::pair<torch::Tensor, torch::Tensor> pass_layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                                                        const torch::Tensor& bias, double eps,
                                                        torch::ScalarType y_dtype, CpuCapability capability) {
  check_takes(x, torch::Tensor(), weight, bias, y_dtype);
  detail::check_runnable(capability, "pass_layer_norm");
  auto outputs = PassLayerNormFunction::apply(x, weight, bias, eps, static_cast<int64_t>(y_dtype),
                                              static_cast<int64_t>(capability));
  return {outputs[0], outputs[1]};
}

std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch,
                                                       const torch::Tensor& weight, const torch::Tensor& bias,
                                                       double eps, torch::ScalarType y_dtype,
                                                       CpuCapability capability,
                                                       const torch::Tensor& branch_bias) {
  FT_CHECK(branch.defined(), "add_layer_norm needs a branch to add (layer_norm normalises x alone)");
  check_takes(x, branch, weight, bias, y_dtype);
  FT_CHECK(
      !branch_bias.defined() || (branch_bias.device().is_cpu() && x.device().is_cpu() &&
                                 branch_bias.scalar_type() == torch::kFloat && branch_bias.dim() == 1 &&
                                 branch_bias.size(0) == x.size(-1)),
      "add_layer_norm's branch_bias is fp32 [C] = [{}] with x on the CPU (the CUDA kernel adds none); got "
      "{} {} on {} with x on {}",
      x.size(-1), branch_bias.sizes(), c10::toString(branch_bias.scalar_type()), branch_bias.device().str(),
      x.device().str());
  detail::check_runnable(capability, "add_layer_norm");
  std::vector<torch::Tensor> inputs{x, branch, weight, bias};
  if (branch_bias.defined()) inputs.push_back(branch_bias);
  auto outputs = AddLayerNormFunction::apply(at::TensorList(inputs), eps, static_cast<int64_t>(y_dtype),
                                             static_cast<int64_t>(capability));
  return {outputs[0], outputs[1]};
}

}  // namespace fasttrain::kernels
