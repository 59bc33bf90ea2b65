// The transformer MLP as four cuBLASLt matmuls with epilogues, and a Linear as three
// (fasttrain/kernels/gpu.h). cuBLASLt is called through the library LibTorch loaded (its entry points looked
// up at run time, not linked), with LibTorch's handle, stream and workspace, so that it is the same cuBLAS
// that ATen runs and a CUDA graph captures it as it captures ATen's matmuls.
#include <torch/csrc/autograd/custom_function.h>

#include "../runnable.h"
#include "fasttrain/kernels/gpu.h"
#include "fasttrain/util/check.h"

#if FASTTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <dlfcn.h>

#include "fasttrain/kernels/cpu.h"
#include "gelu_cuda.h"
#endif

namespace fasttrain::kernels {

#if FASTTRAIN_CUDA
namespace {

// The cuBLASLt functions used, from the libcublasLt that libtorch_cuda loaded.
struct CublasLt {
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

template <typename F>
void look_up(F& f, const char* name) {
  void* address = dlsym(RTLD_DEFAULT, name);
  FT_CHECK(
      address != nullptr,
      "fasttrain's cuBLASLt matmuls: {} was not found in the process: LibTorch's libcublasLt is not loaded "
      "(a CUDA build of LibTorch loads it); set model.gpu_kernels = \"aten\"",
      name);
  f = reinterpret_cast<F>(address);
}

const CublasLt& cublas_lt() {
  static const CublasLt api = [] {
    CublasLt f{};
    look_up(f.desc_create, "cublasLtMatmulDescCreate");
    look_up(f.desc_destroy, "cublasLtMatmulDescDestroy");
    look_up(f.desc_set, "cublasLtMatmulDescSetAttribute");
    look_up(f.layout_create, "cublasLtMatrixLayoutCreate");
    look_up(f.layout_destroy, "cublasLtMatrixLayoutDestroy");
    look_up(f.preference_create, "cublasLtMatmulPreferenceCreate");
    look_up(f.preference_destroy, "cublasLtMatmulPreferenceDestroy");
    look_up(f.preference_set, "cublasLtMatmulPreferenceSetAttribute");
    look_up(f.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    look_up(f.matmul, "cublasLtMatmul");
    return f;
  }();
  return api;
}

void check(cublasStatus_t status, const char* call, const char* gemm) {
  FT_CHECK(status == CUBLAS_STATUS_SUCCESS, "fasttrain's {}: cuBLASLt's {} failed with status {}", gemm, call,
           static_cast<int>(status));
}

cudaDataType_t cuda_type(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}

// One matmul in row-major terms: D [m, n] = A [m, k] B [k, n], with A and B each stored as it is or, where
// `transposed`, as its transpose ([k, m], [n, k]); contiguous 2-d tensors. cuBLASLt is column-major, where
// a row-major X is X^T: it computes D^T = B^T A^T, so B goes first.
struct Gemm {
  const char* name;
  torch::Tensor a, b, d;
  bool a_transposed = false, b_transposed = false;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // BIAS: added over D's rows, [n], in D's dtype; BGRAD epilogues: the gradient written, [n] or [m].
  torch::Tensor bias;
  torch::Tensor aux;  // GELU_AUX_BIAS: the pre-activation written ([m, n] as D)
  torch::Tensor c;    // where defined, added to the product (beta = 1): [m, n] in D's dtype, contiguous
};

// The largest power of two up to 256 that divides a pointer: cuBLASLt's heuristic assumes 256-byte operands
// unless told otherwise, and a view at an offset (a batch's row, a shard of a flat buffer) is not.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// RAII for cuBLASLt's descriptors.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~Descriptors() {
    const CublasLt& lt = cublas_lt();
    if (preference != nullptr) lt.preference_destroy(preference);
    for (auto layout : {a, b, d})
      if (layout != nullptr) lt.layout_destroy(layout);
    if (op != nullptr) lt.desc_destroy(op);
  }
};

void run(const Gemm& g) {
  const CublasLt& lt = cublas_lt();
  const int64_t m = g.d.size(0), n = g.d.size(1);
  const int64_t k = g.a_transposed ? g.a.size(0) : g.a.size(1);
  Descriptors desc;
  check(lt.desc_create(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate", g.name);
  const auto set = [&](cublasLtMatmulDescAttributes_t attribute, const auto& value) {
    check(lt.desc_set(desc.op, attribute, &value, sizeof(value)), "MatmulDescSetAttribute", g.name);
  };
  // Column-major: the first operand is B^T (n x k), the second A^T (k x m), the output D^T (n x m).
  const cublasOperation_t first_op = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t second_op = g.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, first_op);
  set(CUBLASLT_MATMUL_DESC_TRANSB, second_op);
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.bias.defined()) {
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias.data_ptr());
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(g.bias)));
  }
  if (g.aux.defined()) {
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux.data_ptr());
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux.size(1));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, static_cast<int32_t>(cuda_type(g.aux)));
  }
  // Stored shapes, column-major: B^T is B stored [k, n] (n x k, ld n), or stored [n, k] (k x n, ld k) and
  // transposed by the op; likewise A.
  const auto layout = [&](cublasLtMatrixLayout_t* out, const torch::Tensor& t) {
    check(lt.layout_create(out, cuda_type(t), t.size(1), t.size(0), t.size(1)), "MatrixLayoutCreate", g.name);
  };
  layout(&desc.a, g.b);
  layout(&desc.b, g.a);
  layout(&desc.d, g.d);
  FT_CHECK(
      !g.c.defined() ||
          (g.c.sizes() == g.d.sizes() && g.c.scalar_type() == g.d.scalar_type() && g.c.is_contiguous()),
      "fasttrain's {}: the matrix added ({} {}) must be contiguous in the output's sizes and dtype ({} {})",
      g.name, g.c.sizes(), c10::toString(g.c.scalar_type()), g.d.sizes(), c10::toString(g.d.scalar_type()));
  const size_t workspace_bytes = at::cuda::getCUDABlasLtWorkspaceSize();
  check(lt.preference_create(&desc.preference), "MatmulPreferenceCreate", g.name);
  const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
    check(lt.preference_set(desc.preference, attribute, &value, sizeof(value)),
          "MatmulPreferenceSetAttribute", g.name);
  };
  prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes);
  // As ATen's cuBLASLt calls do: cuBLASLt's A is our B, its B our A.
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(g.b.data_ptr()));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(g.a.data_ptr()));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
         alignment_of(g.c.defined() ? g.c.data_ptr() : g.d.data_ptr()));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(g.d.data_ptr()));
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  check(lt.heuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.preference, 1, &best, &found),
        "MatmulAlgoGetHeuristic", g.name);
  FT_CHECK(found > 0,
           "fasttrain's {}: cuBLASLt has no kernel for [{}, {}] x [{}, {}] ({} x {}, epilogue {}) on this "
           "GPU; set "
           "model.gpu_kernels = \"aten\", or leave this kernel to ATen in model.aten_kernels (bias_gelu: the "
           "MLP; linear: a Linear)",
           g.name, m, k, k, n, c10::toString(g.a.scalar_type()), c10::toString(g.d.scalar_type()),
           static_cast<int>(g.epilogue));
  const float one = 1, zero = 0;
  // C shares D's layout (its shape and dtype, checked above).
  const void* c = g.c.defined() ? g.c.data_ptr() : g.d.data_ptr();
  check(lt.matmul(handle, desc.op, &one, g.b.data_ptr(), desc.a, g.a.data_ptr(), desc.b,
                  g.c.defined() ? &one : &zero, c, desc.d, g.d.data_ptr(), desc.d, &best.algo,
                  at::cuda::getCUDABlasLtWorkspace(), workspace_bytes, at::cuda::getCurrentCUDAStream()),
        "Matmul", g.name);
}

torch::Tensor bf16(const torch::Tensor& t) {
  return t.to(torch::kBFloat16).contiguous();
}

// [..., n] from [rows, n] and the leading sizes of `like` [..., k].
torch::Tensor view_like(const torch::Tensor& rows, const torch::Tensor& like) {
  auto sizes = like.sizes().vec();
  sizes.back() = rows.size(1);
  return rows.view(sizes);
}

// A linear's weight gradient [N, K] in fp32 from its output's gradient [M, N] and its input [M, K] (bf16);
// where `grad_bias` ([N], fp32) is given, the matmul's epilogue also sums the gradient's rows into it
// (BGRADB), where ATen reduces them in a pass of its own and casts both products from bf16.
torch::Tensor weight_gradient(const char* name, const torch::Tensor& grad_out, const torch::Tensor& input,
                              const torch::Tensor& grad_bias = {}) {
  torch::Tensor grad_weight =
      torch::empty({grad_out.size(1), input.size(1)}, input.options().dtype(torch::kFloat));
  const cublasLtEpilogue_t epilogue =
      grad_bias.defined() ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
  run({name, grad_out, input, grad_weight, true, false, epilogue, grad_bias, {}, {}});
  return grad_weight;
}

// The weight gradient and the bias gradient [N] summed in the same matmul.
std::pair<torch::Tensor, torch::Tensor> weight_and_bias_gradients(const char* name,
                                                                  const torch::Tensor& grad_out,
                                                                  const torch::Tensor& input) {
  torch::Tensor grad_bias = torch::empty({grad_out.size(1)}, input.options().dtype(torch::kFloat));
  return {weight_gradient(name, grad_out, input, grad_bias), grad_bias};
}

// grad_input [M, K] = grad_out [M, N] weight [N, K], in bf16.
torch::Tensor input_gradient(const char* name, const torch::Tensor& grad_out, const torch::Tensor& weight) {
  torch::Tensor grad_input = torch::empty({grad_out.size(0), weight.size(1)}, grad_out.options());
  run({name, grad_out, weight, grad_input, false, false, CUBLASLT_EPILOGUE_DEFAULT, {}, {}, {}});
  return grad_input;
}

// The dtypes the gradients go back in: x's and the parameters'.
void save_dtypes(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight) {
  ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
  ctx->saved_data["parameter_dtype"] = static_cast<int64_t>(weight.scalar_type());
}
torch::ScalarType saved_dtype(torch::autograd::AutogradContext* ctx, const char* which) {
  return static_cast<torch::ScalarType>(ctx->saved_data[which].toInt());
}

class GpuLinearFunction : public torch::autograd::Function<GpuLinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    const c10::cuda::CUDAGuard on_device(x.device());
    const torch::Tensor input = bf16(x.reshape({-1, x.size(-1)}));  // [M, K]
    const torch::Tensor w = bf16(weight);                           // [N, K]
    torch::Tensor out = torch::empty({input.size(0), w.size(0)}, input.options());
    // ---- out [M, N] = input [M, K] w^T [K, N] + bias
    run({"linear forward", input, w, out, false, true, CUBLASLT_EPILOGUE_BIAS, bf16(bias), {}, {}});
    ctx->save_for_backward({input, w});
    save_dtypes(ctx, x, weight);
    return view_like(out, x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("gpu_linear");
    if (!grads[0].defined()) return {{}, {}, {}};
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &w = saved[1];
    const c10::cuda::CUDAGuard on_device(input.device());
    const torch::Tensor grad_out = bf16(grads[0].reshape({input.size(0), w.size(0)}));  // [M, N]
    // ---- grad_w [N, K] = grad_out^T [N, M] input [M, K], grad_b [N] its rows' sum; grad_x = grad_out w
    auto [grad_weight, grad_bias] = weight_and_bias_gradients("linear weight gradient", grad_out, input);
    const torch::Tensor grad_input = input_gradient("linear input gradient", grad_out, w);
    const auto parameter_dtype = saved_dtype(ctx, "parameter_dtype");
    return {view_like(grad_input.to(saved_dtype(ctx, "x_dtype")), grads[0]), grad_weight.to(parameter_dtype),
            grad_bias.to(parameter_dtype)};
  }
};

// Inputs {x, fc_weight, fc_bias, proj_weight, proj_bias} or those and the residual: an undefined Tensor
// given to a custom Function's apply fails (it reads the device of each input), so the residual is there
// only where given, as add_layer_norm's branch bias is.
class GpuMlpFunction : public torch::autograd::Function<GpuMlpFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList in) {
    const torch::Tensor &x = in[0], &fc_weight = in[1], &fc_bias = in[2], &proj_weight = in[3],
                        &proj_bias = in[4];
    const torch::Tensor residual = in.size() > 5 ? in[5] : torch::Tensor();
    const c10::cuda::CUDAGuard on_device(x.device());
    const int64_t width = x.size(-1), hidden = fc_weight.size(0);
    const torch::Tensor input = bf16(x.reshape({-1, width}));  // [M, C]
    const torch::Tensor w_fc = bf16(fc_weight), w_proj = bf16(proj_weight);
    const auto options = input.options();
    torch::Tensor pre = torch::empty({input.size(0), hidden}, options);  // fc(x), GELU's input
    torch::Tensor activation = torch::empty({input.size(0), hidden}, options);
    // The residual stream's dtype (fp32 under autocast), as ATen's residual + bf16 would be; else bf16.
    const torch::Tensor stream =
        residual.defined() ? residual.reshape({-1, width}).contiguous() : torch::Tensor();
    torch::Tensor out = torch::empty({input.size(0), width}, stream.defined() ? stream.options() : options);
    // ---- activation [M, H] = gelu(x [M, C] w_fc^T [C, H] + b_fc), pre kept; out [M, C] = activation
    // w_proj^T + b_proj (+ residual [M, C], added by the matmul as its C)
    run({"fc forward",
         input,
         w_fc,
         activation,
         false,
         true,
         CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
         bf16(fc_bias),
         pre,
         {}});
    run({"proj forward",
         activation,
         w_proj,
         out,
         false,
         true,
         CUBLASLT_EPILOGUE_BIAS,
         proj_bias.to(out.scalar_type()).contiguous(),
         {},
         stream});
    ctx->save_for_backward({input, w_fc, w_proj, pre, activation});
    save_dtypes(ctx, x, fc_weight);
    ctx->saved_data["residual"] = residual.defined();
    return view_like(out, x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("gpu_mlp");
    const bool has_residual = ctx->saved_data["residual"].toBool();
    if (!grads[0].defined()) return torch::autograd::variable_list(has_residual ? 6 : 5);  // output unused
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &w_fc = saved[1], &w_proj = saved[2], &pre = saved[3],
                        &activation = saved[4];
    const c10::cuda::CUDAGuard on_device(input.device());
    const int64_t rows = input.size(0), width = input.size(1), hidden = w_fc.size(0);
    const torch::Tensor grad_out = bf16(grads[0].reshape({rows, width}));  // [M, C]
    // ---- proj: grad_w [C, H] = grad_out^T [C, M] activation [M, H], grad_b [C] = sum over M of grad_out
    auto [grad_w_proj, grad_b_proj] = weight_and_bias_gradients("proj weight gradient", grad_out, activation);
    // ---- grad_pre [M, H] = (grad_out [M, C] w_proj [C, H]) * gelu'(pre), grad_b_fc [H] = its sum over M.
    // cuBLASLt's DGELU_BGRAD epilogue would do the second part, but on an H200 it ran as a kernel of its own
    // at 320 us a call, where fasttrain's below is one pass over the product in place.
    torch::Tensor grad_pre = input_gradient("proj input gradient", grad_out, w_proj);
    const int64_t partials = detail::gelu_backward_partials(rows, hidden);
    torch::Tensor grad_b_fc_partials = torch::empty({partials, hidden}, input.options().dtype(torch::kFloat));
    detail::gelu_backward_cuda(grad_pre.data_ptr(), pre.data_ptr(), grad_pre.data_ptr(),
                               grad_b_fc_partials.data_ptr<float>(), rows, hidden, partials,
                               at::cuda::getCurrentCUDAStream().stream());
    const torch::Tensor grad_b_fc = grad_b_fc_partials.sum(0);
    // ---- fc: grad_w [H, C] = grad_pre^T [H, M] x [M, C]; grad_x [M, C] = grad_pre [M, H] w_fc [H, C]
    const torch::Tensor grad_w_fc = weight_gradient("fc weight gradient", grad_pre, input);
    const torch::Tensor grad_input = input_gradient("fc input gradient", grad_pre, w_fc);
    const auto parameter_dtype = saved_dtype(ctx, "parameter_dtype");
    torch::autograd::variable_list out{view_like(grad_input.to(saved_dtype(ctx, "x_dtype")), grads[0]),
                                       grad_w_fc.to(parameter_dtype), grad_b_fc.to(parameter_dtype),
                                       grad_w_proj.to(parameter_dtype), grad_b_proj.to(parameter_dtype)};
    if (has_residual) out.push_back(grads[0]);  // the residual's gradient is the output's, through the add
    return out;
  }
};

// Whether `x` [..., width] on a GPU whose kernels run computes in bf16 (autocast's or its own), in fp32 or
// bf16.
bool computes_in_bf16_on_a_gpu(const torch::Tensor& x) {
  return x.defined() && gpu_kernels_run_on(x.device()) && x.dim() >= 1 && x.numel() > 0 &&
         (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16) &&
         compute_dtype(x) == torch::kBFloat16;
}

// Whether p is a parameter of these sizes on x's device, in fp32 or bf16.
bool parameter_of(const torch::Tensor& p, const torch::Tensor& x, std::initializer_list<int64_t> sizes) {
  return p.defined() && p.device() == x.device() && p.sizes() == c10::IntArrayRef(sizes) &&
         (p.scalar_type() == torch::kFloat || p.scalar_type() == torch::kBFloat16);
}

}  // namespace
#endif

bool gpu_linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
#if FASTTRAIN_CUDA
  if (!computes_in_bf16_on_a_gpu(x) || !weight.defined() || weight.dim() != 2) return false;
  const int64_t in = x.size(-1), out = weight.size(0);
  return in % 8 == 0 && out % 8 == 0 && out > 0 && parameter_of(weight, x, {out, in}) &&
         parameter_of(bias, x, {out});
#else
  (void)x, (void)weight, (void)bias;
  return false;
#endif
}

torch::Tensor gpu_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  FT_CHECK(
      gpu_linear_takes(x, weight, bias),
      "gpu_linear takes x [..., K] on a CUDA GPU computing in bf16, a weight [N, K] and a bias [N] in fp32 "
      "or bf16 on its device, K and N multiples of 8; got x {} on {}, weight {} and bias {}",
      detail::describe_tensor(x), x.defined() ? x.device().str() : "none", detail::describe_tensor(weight),
      detail::describe_tensor(bias));
#if FASTTRAIN_CUDA
  return GpuLinearFunction::apply(x, weight, bias);
#else
  return {};
#endif
}

bool gpu_mlp_takes(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                   const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                   const torch::Tensor& residual) {
#if FASTTRAIN_CUDA
  if (!computes_in_bf16_on_a_gpu(x)) return false;
  const int64_t width = x.size(-1),
                hidden = fc_weight.defined() && fc_weight.dim() == 2 ? fc_weight.size(0) : 0;
  const bool residual_fits =
      !residual.defined() ||
      (residual.device() == x.device() && residual.sizes() == x.sizes() &&
       (residual.scalar_type() == torch::kFloat || residual.scalar_type() == torch::kBFloat16));
  return width % 8 == 0 && hidden % 8 == 0 && hidden > 0 && parameter_of(fc_weight, x, {hidden, width}) &&
         parameter_of(fc_bias, x, {hidden}) && parameter_of(proj_weight, x, {width, hidden}) &&
         parameter_of(proj_bias, x, {width}) && residual_fits;
#else
  (void)x, (void)fc_weight, (void)fc_bias, (void)proj_weight, (void)proj_bias, (void)residual;
  return false;
#endif
}

torch::Tensor gpu_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                      const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                      const torch::Tensor& residual) {
  FT_CHECK(
      gpu_mlp_takes(x, fc_weight, fc_bias, proj_weight, proj_bias, residual),
      "gpu_mlp takes x [..., C] on a CUDA GPU computing in bf16 and fp32 or bf16 parameters fc [H, C], "
      "[H] and proj [C, H], [C] on its device, C and H multiples of 8, and a residual, where given, of x's "
      "sizes in fp32 or bf16 on its device; got x {} on {}, fc {} and {}, proj {} and {}, residual {}",
      detail::describe_tensor(x), x.defined() ? x.device().str() : "none", detail::describe_tensor(fc_weight),
      detail::describe_tensor(fc_bias), detail::describe_tensor(proj_weight),
      detail::describe_tensor(proj_bias), detail::describe_tensor(residual));
#if FASTTRAIN_CUDA
  std::vector<torch::Tensor> inputs{x, fc_weight, fc_bias, proj_weight, proj_bias};
  if (residual.defined()) inputs.push_back(residual);
  return GpuMlpFunction::apply(at::TensorList(inputs));  // a TensorList, which autograd reads as inputs
#else
  return {};
#endif
}

}  // namespace fasttrain::kernels
