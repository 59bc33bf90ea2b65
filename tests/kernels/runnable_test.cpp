// The kernels' parallel loops (src/kernels/runnable.h): pieces taken in turn cover a range once, whatever the
// thread count, grain and offset, also inside another parallel region, and a piece's error reaches the
// caller; row chunks cover the rows once with none empty; and the kernels that sum over chunks give the same
// bits on every call, whichever thread ran which chunk.
#include "runnable.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "fasttrain/kernels/cpu.h"
#include "support.h"

namespace fasttrain {
namespace {

// Restores the thread count a test changes.
struct ThreadCount {
  explicit ThreadCount(int threads) : saved(at::get_num_threads()) { at::set_num_threads(threads); }
  ~ThreadCount() { at::set_num_threads(saved); }
  int saved;
};

TEST(KernelLoops, PiecesCoverTheRangeOnceAtAnyThreadCountAndGrain) {
  for (const int threads : {1, 2, 3, 16}) {
    const ThreadCount scoped(threads);
    if (at::get_num_threads() != threads)
      GTEST_SKIP() << "this ATen's thread pool stays at " << at::get_num_threads();
    for (const int64_t n : {0, 1, 7, 100, 1001}) {
      for (const int64_t grain : {1, 3, 64, 5000}) {
        SCOPED_TRACE(c10::str(threads, " threads, n ", n, ", grain ", grain));
        const int64_t offset = 5;
        std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
        std::atomic<int64_t> calls{0};
        kernels::detail::parallel_pieces(offset, offset + n, grain, [&](int64_t begin, int64_t end) {
          ASSERT_LT(begin, end);
          ASSERT_GE(begin, offset);
          ASSERT_LE(end, offset + n);
          ++calls;
          for (int64_t i = begin; i < end; ++i) ++visits[static_cast<size_t>(i - offset)];
        });
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(visits[static_cast<size_t>(i)].load(), 1) << "index " << i;
        // No piece under the grain but the last, and a few a thread where the range allows.
        EXPECT_LE(
            calls.load(),
            std::max<int64_t>(n > 0 ? 1 : 0, std::min<int64_t>(threads * kernels::detail::kPiecesPerThread,
                                                               (n + grain - 1) / grain)));
      }
    }
  }
}

TEST(KernelLoops, RowChunksCoverTheRowsOnceWithNoneEmpty) {
  for (const int threads : {1, 2, 16}) {
    const ThreadCount scoped(threads);
    if (at::get_num_threads() != threads)
      GTEST_SKIP() << "this ATen's thread pool stays at " << at::get_num_threads();
    for (const int64_t pieces : {int64_t{1}, kernels::detail::kPiecesPerThread}) {
      for (const int64_t rows : {1, 2, 7, 75, 128, 1792}) {
        SCOPED_TRACE(c10::str(threads, " threads, ", pieces, " a thread, ", rows, " rows"));
        const kernels::detail::RowChunks chunks = kernels::detail::row_chunks(rows, pieces);
        EXPECT_GE(chunks.count, 1);
        EXPECT_LE(chunks.count, std::min<int64_t>(rows, threads * pieces));
        std::vector<std::atomic<int>> visits(static_cast<size_t>(rows));
        std::vector<std::atomic<int>> chunk_calls(static_cast<size_t>(chunks.count));
        kernels::detail::for_each_row_chunk(rows, chunks, [&](int64_t begin, int64_t end, int64_t chunk) {
          ASSERT_LT(begin, end) << "chunk " << chunk << " is empty";
          ++chunk_calls[static_cast<size_t>(chunk)];
          for (int64_t r = begin; r < end; ++r) ++visits[static_cast<size_t>(r)];
        });
        for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(visits[static_cast<size_t>(r)].load(), 1) << "row " << r;
        for (int64_t c = 0; c < chunks.count; ++c) EXPECT_EQ(chunk_calls[static_cast<size_t>(c)].load(), 1);
      }
    }
  }
}

TEST(KernelLoops, PiecesInsideAParallelRegionAndAThrowingPieceBehave) {
  const ThreadCount scoped(2);
  // Inside another parallel region the pool runs it on the calling thread: still every index once.
  std::vector<std::atomic<int>> visits(2 * 100);
  at::parallel_for(0, 2, 1, [&](int64_t first, int64_t last) {
    for (int64_t outer = first; outer < last; ++outer)
      kernels::detail::parallel_pieces(0, 100, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ++visits[static_cast<size_t>(outer * 100 + i)];
      });
  });
  for (size_t i = 0; i < visits.size(); ++i) EXPECT_EQ(visits[i].load(), 1) << "index " << i;
  // A piece's error reaches the caller, the other pieces having run or been skipped.
  EXPECT_THROW(kernels::detail::parallel_pieces(0, 64, 1,
                                                [&](int64_t begin, int64_t) {
                                                  if (begin == 0) throw std::runtime_error("piece 0 failed");
                                                }),
               std::exception);
}

TEST(KernelLoops, SumsOverChunksTakenInTurnGiveTheSameBitsEveryCall) {
  // BatchNorm + ReLU's statistics and parameter gradients and the conv's weight gradient sum each chunk's
  // partials in chunk order: threads taking the chunks in a different order each call change nothing.
  const ThreadCount scoped(2);
  torch::manual_seed(11);
  const auto x = torch::randn({64, 16, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto grad_y = torch::randn({64, 16, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto weight = torch::rand({16}) + 0.5, bias = torch::randn({16});
  const auto images = torch::randn({64, 16, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto kernel = torch::randn({32, 16, 3, 3}) * 0.1;
  const auto grad_pooled = torch::randn({64, 32, 7, 7}).contiguous(torch::MemoryFormat::ChannelsLast);
  // One input channel: the direct path's weight gradient, chunked by output rows.
  const auto one_channel = torch::randn({64, 1, 28, 28}).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto small_kernel = torch::randn({16, 1, 3, 3}) * 0.3;
  const auto grad_small = torch::randn({64, 16, 14, 14}).contiguous(torch::MemoryFormat::ChannelsLast);
  std::vector<torch::Tensor> first;
  for (int call = 0; call < 6; ++call) {
    auto xr = x.clone().requires_grad_(true), wr = weight.clone().requires_grad_(true),
         br = bias.clone().requires_grad_(true);
    torch::Tensor mean = torch::zeros({16}), var = torch::ones({16});
    kernels::batch_norm_relu(xr, wr, br, mean, var, true, 0.1, 1e-5, kernels::cpu_capability())
        .backward(grad_y);
    auto ir = images.clone().requires_grad_(true), kr = kernel.clone().requires_grad_(true);
    kernels::conv3x3_max_pool2x2(ir, kr, {}, torch::kFloat, kernels::cpu_capability()).backward(grad_pooled);
    auto small_r = small_kernel.clone().requires_grad_(true);
    kernels::conv3x3_max_pool2x2(one_channel, small_r, {}, torch::kFloat, kernels::cpu_capability())
        .backward(grad_small);
    std::vector<torch::Tensor> now = {mean,      var,       xr.grad(), wr.grad(),
                                      br.grad(), ir.grad(), kr.grad(), small_r.grad()};
    if (kernels::conv3x3_max_pool2x2_runs_on_amx(16, 32, torch::kBFloat16)) {  // the tiles' weight gradient
      auto tiles_images = images.to(torch::kBFloat16).requires_grad_(true);
      auto tiles_kernel = kernel.clone().requires_grad_(true);
      kernels::conv3x3_max_pool2x2(tiles_images, tiles_kernel, {}, torch::kBFloat16,
                                   kernels::cpu_capability(), kernels::WideConvForward::amx)
          .backward(grad_pooled.to(torch::kBFloat16));
      now.push_back(tiles_images.grad());
      now.push_back(tiles_kernel.grad());
    }
    if (call == 0) {
      first = now;
      continue;
    }
    for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(torch::equal(now[i], first[i])) << "result " << i;
  }
}

}  // namespace
}  // namespace fasttrain
