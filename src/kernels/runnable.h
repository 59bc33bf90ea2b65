#pragma once
// What every kernel's dispatcher checks before it runs a capability's build.
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
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

// Pieces per thread for a loop whose threads may run at different paces (the cnn's kernels and the
// cross-entropy: calls of well under a millisecond, where a vCPU that another tenant's work slows, or a
// worker woken late, would leave the other thread waiting at the join): the threads take the pieces in turn
// as they finish. The GPT's own kernels keep one piece a thread (more cost it a few percent).
constexpr int64_t kPiecesPerThread = 4;

// body(i) for each of `pieces` indices, each run once, the pool's threads taking the next index as they
// finish the one before (at::parallel_for's split gives each thread the same share, whatever its pace).
template <typename Body>
void take_pieces_in_turn(int64_t pieces, const Body& body) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), pieces);
  if (threads <= 1) {
    for (int64_t i = 0; i < pieces; ++i) body(i);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < pieces; i = next.fetch_add(1)) body(i);
  });
}

// body(begin, end) over [begin, end) in kPiecesPerThread pieces a thread (each of `grain` indices or more but
// the last), taken in turn: for loops whose pieces write disjoint outputs, so that the result does not depend
// on which thread ran a piece.
template <typename Body>
void parallel_pieces(int64_t begin, int64_t end, int64_t grain, const Body& body) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t wanted = at::get_num_threads() * kPiecesPerThread;
  const int64_t piece = std::max<int64_t>({grain, int64_t{1}, (n + wanted - 1) / wanted});
  take_pieces_in_turn((n + piece - 1) / piece,
                      [&](int64_t i) { body(begin + i * piece, std::min(end, begin + (i + 1) * piece)); });
}

// Row chunks for a backward that sums over rows: up to `pieces_per_thread` a thread (kPiecesPerThread where
// the threads' paces may differ), none empty where there are rows (0 rows: one chunk [0, 0)), each with its
// own partial sums, which the caller adds in chunk order: the same sums whichever thread ran a chunk.
struct RowChunks {
  int64_t count, rows_each;
};
inline RowChunks row_chunks(int64_t rows, int64_t pieces_per_thread = 1) {
  const int64_t wanted =
      std::clamp<int64_t>(at::get_num_threads() * pieces_per_thread, 1, std::max<int64_t>(rows, 1));
  const int64_t rows_each = std::max<int64_t>(1, (rows + wanted - 1) / wanted);
  return {std::max<int64_t>(1, (rows + rows_each - 1) / rows_each), rows_each};
}

// body(begin, end, chunk) for each of `chunks`' row ranges of [0, rows), in parallel, taken in turn.
template <typename Body>
void for_each_row_chunk(int64_t rows, const RowChunks& chunks, const Body& body) {
  take_pieces_in_turn(chunks.count, [&](int64_t c) {
    body(c * chunks.rows_each, std::min(rows, (c + 1) * chunks.rows_each), c);
  });
}

}  // namespace fasttrain::kernels::detail

namespace fasttrain::kernels {

constexpr auto kChannelsLast = torch::MemoryFormat::ChannelsLast;

}  // namespace fasttrain::kernels
