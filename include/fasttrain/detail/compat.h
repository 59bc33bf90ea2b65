#pragma once
// The only place that knows which LibTorch we build against (Debian's 1.13 CPU, or a CUDA 2.x).
#include <torch/version.h>

#define FASTTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// LibTorch 2.x has torch::scaled_dot_product_attention, fused AdamW and Kineto with CUDA kernels.
#define FASTTRAIN_HAS_SDPA FASTTRAIN_TORCH_AT_LEAST(2, 0)
// The Kineto profiler (CPU operators on every thread, CUDA kernels and copies): PyTorch's 2.x wheels are
// built with it; Debian's 1.13 is not (torch.autograd.kineto_available() is False there), so it keeps the
// legacy profiler (CPU operators of the recording thread and its autograd threads).
#define FASTTRAIN_HAS_KINETO FASTTRAIN_TORCH_AT_LEAST(2, 0)

namespace fasttrain::compat {
inline const char* torch_version() {
  return TORCH_VERSION;
}
}  // namespace fasttrain::compat

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace fasttrain::compat {

// Drops every gradient (grad = None) so the next backward writes instead of accumulating and the
// memory is freed between steps. 1.13's zero_grad only zeroes; 2.x's zero_grad(set_to_none) calls
// detach_() on each gradient first, which throws for a gradient that is a view (ZeRO-1's shard
// gradient is a slice of the all-reduced buffer), so every release drops them itself, as Python's
// zero_grad(set_to_none=True) does.
inline void zero_grad_to_none(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) parameter.mutable_grad() = torch::Tensor();
  }
}

// The key of Optimizer::state(): the parameter's TensorImpl address as text (the form
// c10::guts::to_string wrote) in 1.13, the TensorImpl* itself in later releases (which also drop
// c10::guts::to_string). Chosen from the map's own key type, so no release number is guessed.
using OptimizerStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

namespace detail {
template <typename Key>
Key optimizer_state_key(const torch::Tensor& parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << static_cast<const void*>(parameter.unsafeGetTensorImpl());
    return text.str();
  } else {
    static_assert(std::is_same_v<Key, void*>, "Optimizer::state() has a key type compat.h does not know");
    return parameter.unsafeGetTensorImpl();
  }
}
}  // namespace detail

// The key under which `optimizer.state()` holds `parameter`'s state.
inline OptimizerStateKey optimizer_state_key(const torch::Tensor& parameter) {
  return detail::optimizer_state_key<OptimizerStateKey>(parameter);
}

}  // namespace fasttrain::compat

// ---- mixed precision: the autocast state API and ATen's fused loss-scaling kernels ----
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorOptions.h>
#include <torch/types.h>

namespace fasttrain::compat {

// Autocast state of one device type (thread-local in every LibTorch). 1.13 has one function per
// device (is_enabled() is CUDA, is_cpu_enabled() is CPU); 2.4 takes the device type and deprecates
// the old names, which would warn under -Wall.
inline bool autocast_enabled(c10::DeviceType type) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType type, bool enabled) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType type) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                      : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

// Whether ATen registers a kernel of `op` (an overload-free name such as
// "aten::_amp_update_scale_") for tensors on `device`. LibTorch 1.13 declares
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ for every build but
// registers them for CUDA only; later releases add CPU kernels. Asking the dispatcher instead of
// comparing version numbers keeps this right for every build.
inline bool has_kernel(const char* op, const torch::Device& device) {
  auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  if (!handle) return false;
  return handle->hasKernelForDispatchKey(c10::computeDispatchKey(c10::nullopt, c10::kStrided, device));
}

// Both fused loss-scaling kernels exist for `device`.
inline bool has_amp_kernels(const torch::Device& device) {
  return has_kernel("aten::_amp_foreach_non_finite_check_and_unscale_", device) &&
         has_kernel("aten::_amp_update_scale_", device);
}

}  // namespace fasttrain::compat

// ---- CUDA caching-allocator statistics (compiled only against a CUDA LibTorch) ----
#ifdef FASTTRAIN_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace fasttrain::compat {

struct CudaAllocatorCounters {
  int64_t allocated_bytes = 0, peak_allocated_bytes = 0, reserved_bytes = 0, peak_reserved_bytes = 0;
  int64_t allocations = 0, alloc_retries = 0, device_mallocs = 0;
};

// Index 0 of each Stat array is StatType::AGGREGATE in every release (the enum itself moved
// namespaces in 2.x). num_device_alloc (cudaMalloc calls) exists from 2.1.
inline CudaAllocatorCounters cuda_allocator_counters(const torch::Device& device) {
  CudaAllocatorCounters counters;
#ifdef FASTTRAIN_CUDA
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  counters.allocated_bytes = stats.allocated_bytes[0].current;
  counters.peak_allocated_bytes = stats.allocated_bytes[0].peak;
  counters.reserved_bytes = stats.reserved_bytes[0].current;
  counters.peak_reserved_bytes = stats.reserved_bytes[0].peak;
  counters.allocations = stats.allocation[0].allocated;
  counters.alloc_retries = stats.num_alloc_retries;
#if FASTTRAIN_TORCH_AT_LEAST(2, 1)
  counters.device_mallocs = stats.num_device_alloc;
#endif
#else
  (void)device;
#endif
  return counters;
}

inline void reset_cuda_peak_memory(const torch::Device& device) {
#ifdef FASTTRAIN_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index()
                                                                     : c10::cuda::current_device());
#else
  (void)device;
#endif
}

}  // namespace fasttrain::compat

// ---- backend switches: cuDNN autotuning, TF32, deterministic algorithms (process-wide) ----
#include <ATen/Context.h>

#include <cstdlib>

namespace fasttrain::compat {

inline void set_backend_switches(bool cudnn_benchmark, bool tf32, bool deterministic) {
  at::Context& context = at::globalContext();
  context.setBenchmarkCuDNN(cudnn_benchmark && !deterministic);
  context.setAllowTF32CuBLAS(tf32);
  context.setAllowTF32CuDNN(tf32);
  context.setDeterministicCuDNN(deterministic);
  context.setDeterministicAlgorithms(deterministic, /*warn_only=*/false);
  // cuBLAS is deterministic only with a fixed workspace configuration, read when it initialises.
  if (deterministic) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
}

// oneDNN's arithmetic for fp32 convolutions and matmuls on the CPU (train.fp32_precision): bf16 rounds
// their inputs to bfloat16 and accumulates in fp32. The setting exists from LibTorch 2.9.
inline constexpr bool has_cpu_fp32_precision() {
  return FASTTRAIN_TORCH_AT_LEAST(2, 9);
}

inline void set_cpu_fp32_precision(bool bf16) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 9)
  const at::Float32Precision precision = bf16 ? at::Float32Precision::BF16 : at::Float32Precision::IEEE;
  for (at::Float32Op op : {at::Float32Op::MATMUL, at::Float32Op::CONV})
    at::globalContext().setFloat32Precision(at::Float32Backend::MKLDNN, op, precision);
#else
  (void)bf16;  // resolve_precision refuses bf16 here
#endif
}

}  // namespace fasttrain::compat

// ---- CUDA allocator settings and cache ----
namespace fasttrain::compat {

// Returns the caching allocator's unused blocks to the driver (after an out-of-memory trial).
inline void empty_cuda_cache() {
#ifdef FASTTRAIN_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

// expandable_segments (LibTorch >= 2.1): the allocator maps more memory into a segment instead of
// caching blocks of many sizes, which keeps variable shapes from fragmenting the cache. Read from
// PYTORCH_CUDA_ALLOC_CONF when the allocator starts, so this must run before the first CUDA
// allocation; settings the user put there are kept. Returns false where the release lacks it.
inline bool enable_expandable_segments() {
#if FASTTRAIN_TORCH_AT_LEAST(2, 1)
  const char* current = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  std::string conf = current ? current : "";
  if (conf.find("expandable_segments") == std::string::npos) {
    conf += std::string(conf.empty() ? "" : ",") + "expandable_segments:True";
    ::setenv("PYTORCH_CUDA_ALLOC_CONF", conf.c_str(), /*overwrite=*/1);
  }
  return true;
#else
  return false;
#endif
}

}  // namespace fasttrain::compat

// ---- attention: PyTorch 2.x's fused scaled_dot_product_attention (flash / memory-efficient kernels) ----
namespace fasttrain::compat {

// Causal attention through ATen's scaled_dot_product_attention where the build has it; `false`
// (and `out` untouched) on LibTorch 1.13, whose callers use the math path (kernels/attention.h).
inline bool fused_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   torch::Tensor& out) {
#if FASTTRAIN_HAS_SDPA
  out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  return true;
#else
  (void)q, (void)k, (void)v, (void)out;
  return false;
#endif
}

}  // namespace fasttrain::compat

// ---- c10d (distributed): the Reducer's constructor and how a Gloo backend becomes a ProcessGroup ----
// Templates over the c10d types, so that only dist/, which includes c10d's headers, instantiates
// them. Each form is chosen by what the types accept, not by a release number: the Reducer's
// arguments changed more than once within 2.x.
#include <memory>
#include <unordered_map>
#include <vector>

namespace fasttrain::compat {

namespace detail {
template <typename>
inline constexpr bool kUnknownForm = false;
}  // namespace detail

// c10d::Reducer for a DDP without unused parameters. 1.13 takes each bucket's size limit as the
// third argument; 2.11 drops it and adds skip_all_reduce_unused_params, use_python_reducer and
// bucket_bytes_cap_list (per-bucket caps for rebuilt buckets; empty = PyTorch DDP's default of
// first_bucket_bytes_cap, then bucket_bytes_cap, which is what 1.13 does).
template <typename Reducer, typename Group>
std::shared_ptr<Reducer> make_reducer(
    std::vector<at::Tensor> parameters, std::vector<std::vector<size_t>> buckets,
    std::vector<size_t> bucket_limits, Group group, std::vector<bool> sparse, int64_t bucket_bytes,
    bool gradient_as_bucket_view, std::unordered_map<size_t, std::string> names, int64_t first_bucket_bytes) {
  using Names = std::unordered_map<size_t, std::string>;
  using Buckets = std::vector<std::vector<size_t>>;
  if constexpr (std::is_constructible_v<Reducer, std::vector<at::Tensor>, Buckets, std::vector<size_t>, Group,
                                        std::vector<bool>, int64_t, bool, bool, Names, int64_t>) {
    return std::make_shared<Reducer>(std::move(parameters), std::move(buckets), std::move(bucket_limits),
                                     std::move(group), std::move(sparse), bucket_bytes,
                                     /*find_unused_parameters=*/false, gradient_as_bucket_view,
                                     std::move(names), first_bucket_bytes);
  } else if constexpr (std::is_constructible_v<Reducer, std::vector<at::Tensor>, Buckets, Group,
                                               std::vector<bool>, int64_t, bool, bool, Names, int64_t, bool,
                                               bool, std::vector<int64_t>>) {
    (void)bucket_limits;  // the Reducer derives them from the caps
    return std::make_shared<Reducer>(std::move(parameters), std::move(buckets), std::move(group),
                                     std::move(sparse), bucket_bytes, /*find_unused_parameters=*/false,
                                     gradient_as_bucket_view, std::move(names), first_bucket_bytes,
                                     /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
                                     /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  } else {
    static_assert(
        detail::kUnknownForm<Reducer>,
        "this LibTorch's c10d::Reducer constructor is neither 1.13's nor 2.11's: add its form here");
  }
}

// The c10d::ProcessGroup that runs `backend` (a ProcessGroupGloo) for CPU and CUDA tensors (as
// torch.distributed.init_process_group("gloo") registers it; Gloo stages CUDA tensors through the
// host). In 1.13 ProcessGroupGloo is itself a ProcessGroup; in 2.x it is a c10d::Backend, which a
// ProcessGroup dispatches to by device type.
template <typename ProcessGroup, typename Store, typename Backend>
c10::intrusive_ptr<ProcessGroup> gloo_process_group(const c10::intrusive_ptr<Store>& store, int rank,
                                                    int size, c10::intrusive_ptr<Backend> backend) {
  if constexpr (std::is_base_of_v<ProcessGroup, Backend>) {
    (void)store, (void)rank, (void)size;
    return backend;
  } else {
    auto group = c10::make_intrusive<ProcessGroup>(store, rank, size);
    group->setBackend(c10::DeviceType::CPU, ProcessGroup::BackendType::GLOO, backend);
    group->setBackend(c10::DeviceType::CUDA, ProcessGroup::BackendType::GLOO, backend);
    group->setDefaultBackend(ProcessGroup::BackendType::GLOO);
    return group;
  }
}

}  // namespace fasttrain::compat

// ---- device-side optimizers: ATen's fused multi-tensor optimizer kernels ----
// LibTorch 2.4 and later have _fused_adam_, _fused_adamw_ and _fused_sgd_ with the learning rate as
// a tensor, on CUDA and on the CPU; earlier releases lack the tensor-LR forms (or the kernels), so
// their optimizers run the foreach form (optim/optimizer.h).
namespace fasttrain::compat {

// Every tensor of `tensors` times `factor` (0-dim, on their device and of their dtype), in place: one
// multi-tensor kernel where the release has _foreach_mul_'s tensor-factor form (2.1), else one
// multiplication per tensor.
inline void foreach_mul_(at::TensorList tensors, const at::Tensor& factor) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 1)
  at::_foreach_mul_(tensors, factor);
#else
  for (const auto& tensor : tensors) tensor.mul_(factor);
#endif
}

// tensors[i] * factor (0-dim), as new tensors: one multi-tensor kernel from 2.1, else one per tensor.
inline std::vector<at::Tensor> foreach_mul(at::TensorList tensors, const at::Tensor& factor) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 1)
  return at::_foreach_mul(tensors, factor);
#else
  std::vector<at::Tensor> out;
  for (const auto& tensor : tensors) out.push_back(tensor.mul(factor));
  return out;
#endif
}

// Whether `kernel` ("aten::_fused_adamw_") runs on `device` with a tensor learning rate.
inline bool has_fused_optimizer_kernel(const char* kernel, const torch::Device& device) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  return has_kernel(kernel, device);
#else
  (void)kernel, (void)device;
  return false;
#endif
}

// One Adam (decoupled: AdamW) update of every tensor in the lists, skipped where found_inf is 1.
// Step counts are read, not advanced. Only where has_fused_optimizer_kernel says so.
inline void fused_adam(bool decoupled_weight_decay, at::TensorList params, at::TensorList grads,
                       at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList steps,
                       const at::Tensor& lr, double beta1, double beta2, double weight_decay, double eps,
                       const at::Tensor& found_inf) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  const std::optional<at::Tensor> inf =
      found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt;
  if (decoupled_weight_decay) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                      inf);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                     weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                     inf);
  }
#else
  (void)decoupled_weight_decay, (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps,
      (void)lr, (void)beta1, (void)beta2, (void)weight_decay, (void)eps, (void)found_inf;
  TORCH_CHECK(false, "fused optimizer kernels need LibTorch >= 2.4, this is ", TORCH_VERSION);
#endif
}

// One SGD update (momentum buffers created from the gradient when `first_step`), skipped where
// found_inf is 1. Only where has_fused_optimizer_kernel says so.
inline void fused_sgd(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                      const at::Tensor& lr, double weight_decay, double momentum, bool nesterov,
                      bool first_step, const at::Tensor& found_inf) {
#if FASTTRAIN_TORCH_AT_LEAST(2, 4)
  const std::optional<at::Tensor> inf =
      found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt;
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, /*dampening=*/0.0, nesterov,
                  /*maximize=*/false, first_step, /*grad_scale=*/std::nullopt, inf);
#else
  (void)params, (void)grads, (void)momentum_buffers, (void)lr, (void)weight_decay, (void)momentum,
      (void)nesterov, (void)first_step, (void)found_inf;
  TORCH_CHECK(false, "fused optimizer kernels need LibTorch >= 2.4, this is ", TORCH_VERSION);
#endif
}

}  // namespace fasttrain::compat
