#pragma once
// The causal self-attention kernel's contract between its dispatcher (src/kernels/attention.cpp) and
// its bodies (attention_kernel.cpp, compiled once per CPU capability with that capability's flags;
// bodies.h declares each one's entry point).
#include <cstdint>

namespace fasttrain::kernels::detail {

// One packed attention: qkv [B, T, 3, H, D] (a Linear's output [B, T, 3C], row-major), out and
// grad_out [B, T, H, D] (= [B, T, C]), lse [B, H, T] fp32 (the rows' log-sum-exp, kept for backward),
// grad_qkv like qkv. Tensors are fp32 or bf16 (all of one dtype but lse); arithmetic is fp32.
struct PackedAttention {
  int64_t batch = 0, length = 0, heads = 0, head_dim = 0;
  float scale = 0;
  bool bf16 = false;
  const void* qkv = nullptr;
  const float* qkv_bias = nullptr;  // [3C] added to q, k and v as they are read; none where null
  const void* out = nullptr;        // backward reads the saved output
  void* out_mut = nullptr;          // forward writes it
  float* lse = nullptr;
  const void* grad_out = nullptr;
  void* grad_qkv = nullptr;
  // Backward with a bias: pair p's sums over its token rows of its head's slices of grad_qkv (before
  // any rounding to bf16), [B * H][3][D] in q, k, v order; their sum over the batch is the bias's gradient.
  float* grad_bias_pairs = nullptr;
};

// Runs the (b, h) pairs [begin, end) of `attention` (pair p is b = p / H, h = p % H).
using AttentionPairs = void (*)(const PackedAttention& attention, int64_t begin, int64_t end);

struct AttentionKernels {
  AttentionPairs forward;
  AttentionPairs backward;
};

}  // namespace fasttrain::kernels::detail
