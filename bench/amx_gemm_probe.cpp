// Could fasttrain's own AMX kernel beat oneDNN on the main job's hidden Linear in bf16? The three
// matmuls of its step (forward x W^T, input gradient dy W, weight gradient dy^T x at batch 128, 1568 ->
// 256) through torch::mm (oneDNN's AMX brgemm, which packs its operand on every call) and through a
// plain AMX-BF16 kernel over an operand packed beforehand (32 x 32 output blocks, four accumulator tiles,
// K in steps of 32; the packing not timed), microseconds at 2 threads, side by side in one process
// (BENCHMARKS.md "Own CPU kernels, twelfth part"). Needs a CPU with AMX-BF16 (elsewhere it says so and
// exits 1); the AMX code is compiled for it by target attributes, so the build needs no flag:
//   build/bin/amx_gemm_probe
// The layer built on this kernel (kernels::amx_linear, commit b25734d) came out even with ATen once its
// packing was counted, and was reverted.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#define FASTTRAIN_AMX __attribute__((target("amx-tile,amx-bf16")))

// Eight tiles of 16 rows x 64 bytes: C00 C01 C10 C11 (fp32), A0 A1 (bf16 rows), B0 B1 (bf16 pairs).
FASTTRAIN_AMX void configure_tiles() {
  static thread_local TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

// b [K, N] bf16 row-major as AMX's B operand: [K / 32][N / 16] tiles, each 16 rows of (k, k + 1) pairs.
std::vector<uint16_t> pack_pairs(const uint16_t* b, int k_size, int n_size) {
  std::vector<uint16_t> packed(static_cast<size_t>(k_size) * n_size);
  for (int kb = 0; kb < k_size / 32; ++kb)
    for (int nb = 0; nb < n_size / 16; ++nb) {
      uint16_t* tile = packed.data() + (static_cast<size_t>(kb) * (n_size / 16) + nb) * 512;
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 16; ++n)
          for (int half = 0; half < 2; ++half)
            tile[r * 32 + n * 2 + half] =
                b[static_cast<size_t>(kb * 32 + 2 * r + half) * n_size + nb * 16 + n];
    }
  return packed;
}

// c [M, N] fp32 = a [M, K] bf16 x the packed b, output blocks [begin, end) of 32 x 32.
FASTTRAIN_AMX void amx_blocks(const uint16_t* a, const uint16_t* packed, float* c, int n_size, int k_size,
                              int64_t begin, int64_t end) {
  configure_tiles();  // per thread: the configuration is a thread's register state
  const int column_blocks = n_size / 32;
  for (int64_t block = begin; block < end; ++block) {
    const int i = static_cast<int>(block) / column_blocks, j = static_cast<int>(block) % column_blocks;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int kb = 0; kb < k_size / 32; ++kb) {
      _tile_loadd(4, a + static_cast<size_t>(i * 32) * k_size + kb * 32, k_size * 2);
      _tile_loadd(5, a + static_cast<size_t>(i * 32 + 16) * k_size + kb * 32, k_size * 2);
      _tile_loadd(6, packed + (static_cast<size_t>(kb) * (n_size / 16) + 2 * j) * 512, 64);
      _tile_loadd(7, packed + (static_cast<size_t>(kb) * (n_size / 16) + 2 * j + 1) * 512, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    float* out = c + static_cast<size_t>(i * 32) * n_size + j * 32;
    _tile_stored(0, out, n_size * 4);
    _tile_stored(1, out + 16, n_size * 4);
    _tile_stored(2, out + 16 * n_size, n_size * 4);
    _tile_stored(3, out + 16 * n_size + 16, n_size * 4);
  }
  _tile_release();
}

// M, N multiples of 32, K of 32.
void amx_mm(const uint16_t* a, const uint16_t* packed, float* c, int m_size, int n_size, int k_size) {
  at::parallel_for(0, (m_size / 32) * (n_size / 32), 1,
                   [&](int64_t begin, int64_t end) { amx_blocks(a, packed, c, n_size, k_size, begin, end); });
}

template <typename F>
double microseconds(const F& f, int repeats) {
  for (int i = 0; i < 20; ++i) f();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
         repeats;
}

}  // namespace

int main() {
  constexpr long kRequestPermission = 0x1023, kTileData = 18;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)
  if (syscall(SYS_arch_prctl, kRequestPermission, kTileData) != 0) {
    std::puts("this CPU or kernel gives no AMX tile data: nothing to measure");
    return 1;
  }
  torch::set_num_threads(2);
  const struct {
    const char* what;
    int m, n, k;
  } shapes[] = {{"forward x W^T", 128, 256, 1568},
                {"input grad dy W", 128, 1568, 256},
                {"weight grad dy^T x", 256, 1568, 128}};
  for (const auto& s : shapes) {
    const torch::Tensor a = torch::randn({s.m, s.k}).to(torch::kBFloat16);
    const torch::Tensor b = torch::randn({s.k, s.n}).to(torch::kBFloat16);
    const auto packed = pack_pairs(reinterpret_cast<const uint16_t*>(b.data_ptr()), s.k, s.n);
    torch::Tensor c = torch::empty({s.m, s.n});
    const auto* a_bits = reinterpret_cast<const uint16_t*>(a.data_ptr());
    const double aten = microseconds([&] { torch::mm(a, b); }, 200);
    const double own =
        microseconds([&] { amx_mm(a_bits, packed.data(), c.data_ptr<float>(), s.m, s.n, s.k); }, 200);
    const double error = (c - torch::mm(a.to(torch::kFloat), b.to(torch::kFloat))).abs().max().item<double>();
    const double flops = 2.0 * s.m * s.n * s.k;
    std::printf(
        "%-20s [%d x %d] x [%d x %d]: torch::mm %.1f us (%.2f TFLOP/s), AMX kernel %.1f us (%.2f TFLOP/s), "
        "%.2fx; max |diff| %.1e\n",
        s.what, s.m, s.k, s.k, s.n, aten, flops / aten / 1e6, own, flops / own / 1e6, aten / own, error);
  }
}
#else
int main() {
  std::puts("amx_gemm_probe: built without AMX intrinsics (GCC 11 or later on x86-64): nothing to measure");
  return 1;
}
#endif
