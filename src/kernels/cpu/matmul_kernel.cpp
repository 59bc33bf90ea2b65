// fasttrain's fp32 matmul (matmul_kernel.h), plain and with the epilogues that make it worth having: the
// MLP's fc writes its output and the GELU of it + bias from the same register tile, and the projection's
// input gradient is multiplied by GELU's derivative before it leaves the tile. Plain, it ran x [4096, 128] @
// w^T 8-28% faster than oneDNN's fp32 matmul for w of 128-512 rows on an AMX Xeon (packing w each call
// included), about even at depths of 256 and more (BENCHMARKS.md "Own CPU kernels, seventeenth part").
//
// The product is a GEMM's micro-kernel: a register tile of kTileRows rows of a by kTileVectors vectors of a
// panel of b, the depth inner (one vector load of b per column vector and one broadcast of a per row per
// step), as BLIS and oneDNN lay theirs out. A thread takes blocks of kBlockRows rows of a (in L1/L2) and runs
// each of b's panels (depth x panel_width, in L1 for the gpt's depths) over them, so that a is read from
// memory once and each block's outputs are written once. Compiled once per CPU capability (CMakeLists.txt);
// on AVX512 the tile is 6 x 4 vectors (24 of the 32 registers), on AVX2 6 x 2 (12 of 16), in the scalar
// build 6 x 2 Vectorized<float>s of 8.
#include <algorithm>
#include <cstring>

#include "bodies.h"
#include "gelu.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

constexpr int kTileRows = 6;
constexpr int kTileVectors = kLanes >= 16 ? 4 : 2;
constexpr int64_t kPanelWidth = kTileVectors * kLanes;
// Rows of a a thread runs every panel over before the next: 24 measured fastest on the gpt's shapes
// (x [4096, 128] @ fc^T [128, 512], 2 threads; 24 and 48 alike, 96 5% and 192 15% slower).
constexpr int64_t kBlockRows = 24;

void pack(const float* b, int64_t depth, int64_t width, bool transposed, float* panels, int64_t begin,
          int64_t end) {
  for (int64_t p = begin; p < end; ++p) {
    float* panel = panels + p * depth * kPanelWidth;
    const int64_t first = p * kPanelWidth, columns = std::min(kPanelWidth, width - first);
    std::fill(panel, panel + depth * kPanelWidth, 0.f);
    if (transposed) {  // b[k][first + j] = weight[first + j][k]: a weight row is a panel column
      for (int64_t j = 0; j < columns; ++j) {
        const float* column = b + (first + j) * depth;
        for (int64_t k = 0; k < depth; ++k) panel[k * kPanelWidth + j] = column[k];
      }
    } else {
      for (int64_t k = 0; k < depth; ++k)
        std::memcpy(panel + k * kPanelWidth, b + k * width + first,
                    static_cast<size_t>(columns) * sizeof(float));
    }
  }
}

// c [R][kPanelWidth] = a [R rows, lda apart][depth] @ panel [depth][kPanelWidth], the tile in registers.
template <int R>
void product_tile(const float* a, int64_t lda, const float* panel, int64_t depth, float* c) {
  Vec acc[R][kTileVectors];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kTileVectors; ++v) acc[r][v] = Vec(0.f);
  for (int64_t k = 0; k < depth; ++k) {
    Vec b[kTileVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kTileVectors; ++v) b[v] = Vec::loadu(panel + k * kPanelWidth + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec ar(a[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < kTileVectors; ++v) acc[r][v] = at::vec::fmadd(ar, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kTileVectors; ++v) acc[r][v].store(c + r * kPanelWidth + v * kLanes);
}

// The tiles of 1 to kTileRows - 1 rows, for the rows a block leaves over.
using ProductTile = void (*)(const float* a, int64_t lda, const float* panel, int64_t depth, float* c);
constexpr ProductTile kTailTiles[] = {nullptr,          &product_tile<1>, &product_tile<2>,
                                      &product_tile<3>, &product_tile<4>, &product_tile<5>};
static_assert(sizeof(kTailTiles) / sizeof(kTailTiles[0]) == kTileRows,
              "a tail tile for every count of rows left");

// epilogue(row, column, count, product) for each vector of a @ b over rows [begin, end): whole tiles, then
// the rows a block leaves over as one tile of that many. The product reaches the epilogue through a tile in
// L1 (`c`), so the accumulators' loop keeps all its registers.
template <typename Epilogue>
void products(const detail::TiledMatmul& m, int64_t begin, int64_t end, const Epilogue& epilogue) {
  const int64_t panels = (m.width + kPanelWidth - 1) / kPanelWidth;
  alignas(64) float c[kTileRows * kPanelWidth];
  for (int64_t block = begin; block < end; block += kBlockRows) {
    const int64_t block_end = std::min(end, block + kBlockRows);
    for (int64_t p = 0; p < panels; ++p) {
      const float* panel = m.b_panels + p * m.depth * kPanelWidth;
      const int64_t first = p * kPanelWidth, columns = std::min(kPanelWidth, m.width - first);
      const auto finish = [&](int64_t row, int64_t rows) {
        for (int64_t r = 0; r < rows; ++r) {
          by_vectors(columns, [&](int64_t j, int64_t count) {
            epilogue(row + r, first + j, count, Vec::loadu(c + r * kPanelWidth + j));
          });
        }
      };
      int64_t row = block;
      for (; row + kTileRows <= block_end; row += kTileRows) {
        product_tile<kTileRows>(m.a + row * m.depth, m.depth, panel, m.depth, c);
        finish(row, kTileRows);
      }
      const int64_t left = block_end - row;  // fewer than kTileRows: one tile of that many rows
      if (left > 0) {
        kTailTiles[left](m.a + row * m.depth, m.depth, panel, m.depth, c);
        finish(row, left);
      }
    }
  }
}

void product(const detail::TiledMatmul& m, int64_t begin, int64_t end) {
  products(m, begin, end, [&](int64_t row, int64_t column, int64_t count, const Vec& product) {
    product.store(m.out + row * m.width + column, count);
  });
}

void gelu_forward(const detail::TiledMatmul& m, int64_t begin, int64_t end) {
  products(m, begin, end, [&](int64_t row, int64_t column, int64_t count, const Vec& product) {
    const int64_t at = row * m.width + column;
    product.store(m.pre + at, count);
    gelu(product + Vec::loadu(m.bias + column, count)).store(m.y + at, count);
  });
}

void gelu_backward(const detail::TiledMatmul& m, int64_t begin, int64_t end, int64_t chunk) {
  float* grad_bias = m.grad_bias_partial + chunk * m.width;
  products(m, begin, end, [&](int64_t row, int64_t column, int64_t count, const Vec& product) {
    const int64_t at = row * m.width + column;
    const Vec u = Vec::loadu(m.pre + at, count) + Vec::loadu(m.bias + column, count);
    const Vec grad = product * gelu_derivative(u);
    grad.store(m.grad_pre + at, count);
    accumulate(grad_bias, column, count, grad);
  });
}

}  // namespace

detail::MatmulKernels matmul_kernels() {
  return {kPanelWidth, &pack, &product, &gelu_forward, &gelu_backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
