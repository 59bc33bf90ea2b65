// The residual add + LayerNorm on a CUDA GPU (layer_norm_cuda.h): what ATen runs as an add, layer_norm and
// autocast's cast of its output forward, and layer_norm's backward, the add's and the cast's backward, in
// one kernel each way plus a pass over the columns for the parameters' gradients. The arithmetic and the
// roundings are the CPU bodies' (cpu/layer_norm_kernel.cpp): fp32 throughout, the sum rounded to x's dtype
// before it is normalised, mean and variance in two passes over the row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "launch.h"
#include "layer_norm_cuda.h"

namespace fasttrain::kernels::detail {

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // warps of a forward or backward block, one row each
constexpr int kGradRows = 8;      // threads down the rows of the parameter-gradient pass's 32 columns

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
// v as it reads back after being stored as a T.
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  return to_float(from_float<T>(v));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// A lane's columns of a row come in groups of V side by side (one 16-byte load of fp32 where V = 4), the
// groups lane, lane + 32, ... of the row; kGroups of them kept in registers (0: none, read again from memory
// each pass, for rows wider than the largest kGroups holds).
template <int V, int kGroups>
struct LaneValues {
  float v[kGroups > 0 ? kGroups : 1][V];
};

// f(k, c) for each group k of the lane, c its first column: unrolled where the lane keeps its values, so that
// v[k] stays in registers.
template <int V, int kGroups, typename F>
__device__ __forceinline__ void each_group(int lane, int64_t width, F&& f) {
  if constexpr (kGroups > 0) {
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
      const int64_t c = V * (lane + static_cast<int64_t>(k) * kWarp);
      if (c < width) f(k, c);
    }
  } else {
    for (int64_t c = V * lane; c < width; c += V * kWarp) f(0, c);
  }
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// V values of a T array from element i (i a multiple of V, the array aligned to V elements) as fp32.
template <typename T, int V>
__device__ __forceinline__ void load(const void* array, int64_t i, float (&out)[V]) {
  const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(static_cast<const T*>(array) + i);
#pragma unroll
  for (int j = 0; j < V; ++j) out[j] = to_float(p.v[j]);
}

template <typename T, int V>
__device__ __forceinline__ void store(void* array, int64_t i, const float (&in)[V]) {
  Pack<T, V> p;
#pragma unroll
  for (int j = 0; j < V; ++j) p.v[j] = from_float<T>(in[j]);
  *reinterpret_cast<Pack<T, V>*>(static_cast<T*>(array) + i) = p;
}

// x + branch rounded to X (x alone without a branch): the values forward normalises.
template <typename X, typename B, int V>
__device__ __forceinline__ void input_at(const LayerNormRows& n, int64_t i, float (&s)[V]) {
  load<X, V>(n.x, i, s);
  if (n.branch == nullptr) return;
  float branch[V];
  load<B, V>(n.branch, i, branch);
#pragma unroll
  for (int j = 0; j < V; ++j) s[j] = rounded<X>(s[j] + branch[j]);
}

// Where the lane keeps its values, each pass either loads or stores: the compiler cannot move a load above a
// store to memory that may alias it, so a pass that does both waits out each load in turn.
template <typename X, typename B, typename Y, int V, int kGroups>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock) add_layer_norm_forward(const LayerNormRows n) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= n.rows) return;
  const int lane = threadIdx.x;
  const int64_t width = n.width, base = row * width;
  LaneValues<V, kGroups> cache{};
  float total = 0;
  if constexpr (kGroups > 0) {
    each_group<V, kGroups>(lane, width,
                           [&](int k, int64_t c) { input_at<X, B, V>(n, base + c, cache.v[k]); });
    each_group<V, kGroups>(lane, width, [&](int k, int64_t c) {
      if (n.sum != nullptr) store<X, V>(n.sum, base + c, cache.v[k]);
      for (int j = 0; j < V; ++j) total += cache.v[k][j];
    });
  } else {
    each_group<V, kGroups>(lane, width, [&](int, int64_t c) {
      float s[V];
      input_at<X, B, V>(n, base + c, s);
      if (n.sum != nullptr) store<X, V>(n.sum, base + c, s);
      for (int j = 0; j < V; ++j) total += s[j];
    });
  }
  // The values again: from registers, or read back (the sum as written, or x).
  const auto values = [&](int k, int64_t c, float(&s)[V]) {
    if constexpr (kGroups > 0) {
      for (int j = 0; j < V; ++j) s[j] = cache.v[k][j];
    } else if (n.sum != nullptr) {
      load<X, V>(n.sum, base + c, s);
    } else {
      load<X, V>(n.x, base + c, s);
    }
  };
  const float mean = warp_sum(total) / static_cast<float>(width);
  float squares = 0;
  each_group<V, kGroups>(lane, width, [&](int k, int64_t c) {
    float s[V];
    values(k, c, s);
    for (int j = 0; j < V; ++j) squares += (s[j] - mean) * (s[j] - mean);
  });
  const float rstd = rsqrtf(warp_sum(squares) / static_cast<float>(width) + n.eps);
  const auto normalise = [&](int k, int64_t c, float(&s)[V]) {
    values(k, c, s);
    float w[V], b[V];
    load<float, V>(n.weight, c, w);
    load<float, V>(n.bias, c, b);
    for (int j = 0; j < V; ++j) s[j] = (s[j] - mean) * rstd * w[j] + b[j];
  };
  if constexpr (kGroups > 0) {
    each_group<V, kGroups>(lane, width, [&](int k, int64_t c) { normalise(k, c, cache.v[k]); });
    each_group<V, kGroups>(lane, width, [&](int k, int64_t c) { store<Y, V>(n.y, base + c, cache.v[k]); });
  } else {
    each_group<V, kGroups>(lane, width, [&](int k, int64_t c) {
      float y[V];
      normalise(k, c, y);
      store<Y, V>(n.y, base + c, y);
    });
  }
  if (lane == 0) n.mean[row] = mean, n.rstd[row] = rstd;
}

// dx = rstd (g - mean(g) - x̂ mean(g x̂)) + grad_sum, g = grad_y * weight, x̂ = (x - mean) rstd.
template <typename X, typename B, typename Y, int V, int kGroups>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock) add_layer_norm_backward(const LayerNormRows n) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= n.rows) return;
  const int lane = threadIdx.x;
  const int64_t width = n.width, base = row * width;
  const float mean = n.mean[row], rstd = n.rstd[row];
  LaneValues<V, kGroups> xhat{}, g{};
  // x̂ and g of a group, from memory.
  const auto read = [&](int64_t c, float(&h)[V], float(&gc)[V]) {
    float w[V];
    load<X, V>(n.x, base + c, h);
    load<Y, V>(n.grad_y, base + c, gc);
    load<float, V>(n.weight, c, w);
    for (int j = 0; j < V; ++j) h[j] = (h[j] - mean) * rstd, gc[j] *= w[j];
  };
  float sum_g = 0, sum_gx = 0;
  const auto accumulate = [&](const float(&h)[V], const float(&gc)[V]) {
    for (int j = 0; j < V; ++j) sum_g += gc[j], sum_gx += gc[j] * h[j];
  };
  each_group<V, kGroups>(lane, width, [&](int k, int64_t c) {
    if constexpr (kGroups > 0) {
      read(c, xhat.v[k], g.v[k]);
      accumulate(xhat.v[k], g.v[k]);
    } else {
      float h[V], gc[V];
      read(c, h, gc);
      accumulate(h, gc);
    }
  });
  const float mean_g = warp_sum(sum_g) / static_cast<float>(width);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(width);
  // dx of a group into gc (x̂ and g in h and gc).
  const auto grad_input = [&](int64_t c, const float(&h)[V], float(&gc)[V]) {
    float grad_sum[V] = {};
    if (n.grad_sum != nullptr) load<X, V>(n.grad_sum, base + c, grad_sum);
    for (int j = 0; j < V; ++j) gc[j] = rstd * (gc[j] - mean_g - h[j] * mean_gx) + grad_sum[j];
  };
  const auto write = [&](int64_t c, const float(&dx)[V]) {
    store<X, V>(n.grad_x, base + c, dx);
    if (n.grad_branch != nullptr) store<B, V>(n.grad_branch, base + c, dx);
  };
  if constexpr (kGroups > 0) {
    each_group<V, kGroups>(lane, width, [&](int k, int64_t c) { grad_input(c, xhat.v[k], g.v[k]); });
    each_group<V, kGroups>(lane, width, [&](int k, int64_t c) { write(c, g.v[k]); });
  } else {
    each_group<V, kGroups>(lane, width, [&](int, int64_t c) {
      float h[V], gc[V];
      read(c, h, gc);
      grad_input(c, h, gc);
      write(c, gc);
    });
  }
}

// Partial row blockIdx.y of grad_weight (sum of grad_y x̂) and grad_bias (sum of grad_y) over its rows, for
// 32 columns a block: threads across the columns read each row coalesced, kGradRows of them down the rows.
template <typename X, typename Y>
__global__ void __launch_bounds__(kWarp* kGradRows)
    layer_norm_param_grads(const LayerNormRows n, int64_t rows_per_partial) {
  __shared__ float weight_sums[kGradRows][kWarp + 1], bias_sums[kGradRows][kWarp + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kWarp + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_partial;
  const int64_t last = first + rows_per_partial < n.rows ? first + rows_per_partial : n.rows;
  const X* x = static_cast<const X*>(n.x);
  const Y* grad_y = static_cast<const Y*>(n.grad_y);
  float dw = 0, db = 0;
  if (c < n.width) {
    for (int64_t r = first + threadIdx.y; r < last; r += kGradRows) {
      const float gy = to_float(grad_y[r * n.width + c]);
      dw += gy * (to_float(x[r * n.width + c]) - n.mean[r]) * n.rstd[r];
      db += gy;
    }
  }
  weight_sums[threadIdx.y][threadIdx.x] = dw;
  bias_sums[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y != 0 || c >= n.width) return;
  for (int i = 1; i < kGradRows; ++i) dw += weight_sums[i][threadIdx.x], db += bias_sums[i][threadIdx.x];
  n.grad_weight_partial[blockIdx.y * n.width + c] = dw;
  n.grad_bias_partial[blockIdx.y * n.width + c] = db;
}

template <typename T>
struct Type {
  using type = T;
};
template <int N>
using Cached = std::integral_constant<int, N>;
template <int N>
using Vector = std::integral_constant<int, N>;

// Whether every row and tensor of `n` starts on a 4-element boundary of its dtype.
bool vectorisable(const LayerNormRows& n) {
  const auto aligned = [](const void* p, bool bf16) {
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % (bf16 ? 8 : 16) == 0;
  };
  return n.width % 4 == 0 && aligned(n.x, n.x_bf16) && aligned(n.branch, n.branch_bf16) &&
         aligned(n.sum, n.x_bf16) && aligned(n.y, n.y_bf16) && aligned(n.weight, false) &&
         aligned(n.bias, false) && aligned(n.grad_y, n.y_bf16) && aligned(n.grad_sum, n.x_bf16) &&
         aligned(n.grad_x, n.x_bf16) && aligned(n.grad_branch, n.branch_bf16);
}

// f(Type<X>, Type<B>, Type<Y>) for the dtypes the flags name (B = X without a branch).
template <typename F>
void with_dtypes(const LayerNormRows& n, F&& f) {
  using bf16 = __nv_bfloat16;
  const bool branch_bf16 = n.branch != nullptr ? n.branch_bf16 : n.x_bf16;
  const auto with_y = [&](auto x, auto b) {
    return n.y_bf16 ? f(x, b, Type<bf16>()) : f(x, b, Type<float>());
  };
  const auto with_b = [&](auto x) {
    return branch_bf16 ? with_y(x, Type<bf16>()) : with_y(x, Type<float>());
  };
  return n.x_bf16 ? with_b(Type<bf16>()) : with_b(Type<float>());
}

// g(Vector<V>, Cached<kGroups>): groups of 4 where the row's width and every pointer allow 16-byte (fp32) and
// 8-byte (bf16) accesses, else single columns; the fewest registers that hold a lane's groups (none past
// 1024 columns).
template <typename G>
void with_groups(const LayerNormRows& n, G&& g) {
  if (vectorisable(n)) {
    if (n.width <= 2 * 4 * kWarp) return g(Vector<4>(), Cached<2>());
    if (n.width <= 4 * 4 * kWarp) return g(Vector<4>(), Cached<4>());
    if (n.width <= 6 * 4 * kWarp) return g(Vector<4>(), Cached<6>());  // 768 (GPT-2 small)
    if (n.width <= 8 * 4 * kWarp) return g(Vector<4>(), Cached<8>());
    return g(Vector<4>(), Cached<0>());
  }
  if (n.width <= 8 * kWarp) return g(Vector<1>(), Cached<8>());
  if (n.width <= 32 * kWarp) return g(Vector<1>(), Cached<32>());
  return g(Vector<1>(), Cached<0>());
}

// The kernels' template arguments for `n`: its dtypes and its lane's groups.
template <typename X_, typename B_, typename Y_, int V_, int kGroups_>
struct RowKernel {
  using X = X_;
  using B = B_;
  using Y = Y_;
  static constexpr int V = V_, kGroups = kGroups_;
};

// f(RowKernel<...>) for n's dtypes (with_dtypes) and groups (with_groups).
template <typename F>
void with_row_kernel(const LayerNormRows& n, F&& f) {
  with_dtypes(n, [&](auto x, auto branch, auto y) {
    with_groups(n, [&](auto vector, auto cached) {
      f(RowKernel<typename decltype(x)::type, typename decltype(branch)::type, typename decltype(y)::type,
                  decltype(vector)::value, decltype(cached)::value>());
    });
  });
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

bool cuda_kernels_load_on_current_device() {
  cudaFuncAttributes attributes;
  const cudaError_t error =
      cudaFuncGetAttributes(&attributes, add_layer_norm_forward<float, float, float, 1, 8>);
  if (error == cudaSuccess) return true;
  cudaGetLastError();  // clears cudaErrorInvalidDeviceFunction ("no kernel image for the device")
  return false;
}

void layer_norm_forward_cuda(const LayerNormRows& n, void* stream) {
  if (n.rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  with_row_kernel(n, [&](auto kernel) {
    using K = decltype(kernel);
    add_layer_norm_forward<typename K::X, typename K::B, typename K::Y, K::V, K::kGroups>
        <<<row_blocks(n.rows), dim3(kWarp, kRowsPerBlock), 0, s>>>(n);
  });
  check_launch("layer_norm forward");
}

int64_t layer_norm_backward_partials(int64_t rows, int64_t width) {
  return row_partials(rows, (width + kWarp - 1) / kWarp);
}

void layer_norm_backward_cuda(const LayerNormRows& n, int64_t partials, void* stream) {
  if (n.rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t rows_per_partial = (n.rows + partials - 1) / partials;
  const dim3 grad_grid(static_cast<unsigned>((n.width + kWarp - 1) / kWarp), static_cast<unsigned>(partials));
  with_row_kernel(n, [&](auto kernel) {
    using K = decltype(kernel);
    add_layer_norm_backward<typename K::X, typename K::B, typename K::Y, K::V, K::kGroups>
        <<<row_blocks(n.rows), dim3(kWarp, kRowsPerBlock), 0, s>>>(n);
    layer_norm_param_grads<typename K::X, typename K::Y>
        <<<grad_grid, dim3(kWarp, kGradRows), 0, s>>>(n, rows_per_partial);
  });
  check_launch("layer_norm backward");
}

}  // namespace fasttrain::kernels::detail
