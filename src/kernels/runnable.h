#pragma once
// What every kernel's dispatcher checks before it runs a capability's build.
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <string>

#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"

namespace fasttrain::kernels::detail {

// An Error naming `kernel` unless this CPU runs `capability`.
void check_runnable(CpuCapability capability, const char* kernel);

// An Error naming `kernel` where its backward runs to be differentiated again (backward with
// create_graph): the bodies' gradients are not themselves differentiable, and a second derivative
// through them would come out as zero without a word.
void check_first_order(const char* kernel);

// A defined tensor on the CPU in fp32 or bf16: what every kernel reads and writes.
inline bool cpu_float_or_bf16(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() &&
         (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16);
}

// A defined fp32 tensor on the CPU: what the fp32-only kernels (linear, gelu_mlp) read.
inline bool fp32_cpu(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat;
}

// "[4, 8] Float", or "none" for an undefined tensor: what a kernel's refusal names.
inline std::string describe_tensor(const torch::Tensor& t) {
  return t.defined() ? fmt::format("{} {}", t.sizes(), c10::toString(t.scalar_type())) : std::string("none");
}

// An fp32 tensor's values rounded to bf16 (c10's rule) and kept in fp32, as autocast's cast rounds them: for
// a small operand (a bias, a narrow weight), a loop rather than two operators.
inline torch::Tensor bf16_rounded(const torch::Tensor& t) {
  const torch::Tensor values = t.detach().contiguous();
  torch::Tensor rounded = torch::empty_like(values);
  const float* in = values.data_ptr<float>();
  float* out = rounded.data_ptr<float>();
  for (int64_t i = 0; i < values.numel(); ++i) out[i] = static_cast<float>(static_cast<c10::BFloat16>(in[i]));
  return rounded;
}

// Rows of at least ~16k values per parallel task: fewer would cost more in scheduling than they compute.
inline int64_t rows_per_task(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}

// Row chunks for a backward that sums over rows: one per thread, each with its own partial sums.
struct RowChunks {
  int64_t count, rows_each;
};
inline RowChunks row_chunks(int64_t rows) {
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  return {count, (rows + count - 1) / count};
}

// body(begin, end, chunk) for each of `chunks`' row ranges of [0, rows), in parallel.
template <typename Body>
void for_each_row_chunk(int64_t rows, const RowChunks& chunks, const Body& body) {
  at::parallel_for(0, chunks.count, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c)
      body(c * chunks.rows_each, std::min(rows, (c + 1) * chunks.rows_each), c);
  });
}

}  // namespace fasttrain::kernels::detail

namespace fasttrain::kernels {

constexpr auto kChannelsLast = torch::MemoryFormat::ChannelsLast;

}  // namespace fasttrain::kernels
