// The gpt's Linear shapes through MKL (ATen's linear and mm) and through oneDNN's fp32 matmul
// (at::native::mkldnn_matmul), GF/s at 2 threads: what kernels::linear's choices rest on (BENCHMARKS.md "Own
// CPU kernels, tenth part"). Built with the other benchmarks (bench/CMakeLists.txt):
// build/bin/onednn_matmul_shapes.
#include <torch/torch.h>

#include <chrono>
#include <iostream>
namespace at::native {
TORCH_API void mkldnn_matmul(const at::Tensor&, const at::Tensor&, const at::Tensor&, float, float);
}
template <class F>
double bench(F f, int n = 100) {
  for (int i = 0; i < 10; ++i) f();
  auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count() / n;
}
int main() {
  at::set_num_threads(2);
  int64_t shapes[][3] = {
      {4096, 128, 512}, {4096, 512, 128}, {4096, 128, 384}, {4096, 128, 128}, {4096, 128, 256}};
  for (auto& s : shapes) {
    int64_t M = s[0], K = s[1], N = s[2];
    auto x = torch::randn({M, K}), w = torch::randn({N, K}), b = torch::randn({N}), g = torch::randn({M, N});
    double fl = 2.0 * M * K * N / 1e6;
    auto y = torch::empty({M, N}), dx = torch::empty({M, K}), dw = torch::empty({N, K});
    double a1 = bench([&] { torch::linear(x, w, b); });
    double a2 = bench([&] { g.mm(w); });
    double a3 = bench([&] { g.t().mm(x); });
    double o1 = bench([&] {
      auto y = torch::empty({M, N});
      at::native::mkldnn_matmul(x, w.t(), y, 0.f, 1.f);
    });
    double o1b = bench([&] {
      auto y = b.expand({M, N}).contiguous();
      at::native::mkldnn_matmul(x, w.t(), y, 1.f, 1.f);
    });
    double o2 = bench([&] {
      auto dx = torch::empty({M, K});
      at::native::mkldnn_matmul(g, w, dx, 0.f, 1.f);
    });
    double o3 = bench([&] {
      auto dw = torch::empty({N, K});
      at::native::mkldnn_matmul(g.t(), x, dw, 0.f, 1.f);
    });
    auto check = torch::empty({M, K});
    at::native::mkldnn_matmul(g, w, check, 0.f, 1.f);
    std::cout << M << "x" << K << "x" << N << " MKL linear " << fl / a1 << " dgrad " << fl / a2 << " wgrad "
              << fl / a3 << " | oneDNN fwd " << fl / o1 << " fwd+bias " << fl / o1b << " dgrad " << fl / o2
              << " wgrad " << fl / o3 << " GF/s; maxdiff " << (check - g.mm(w)).abs().max().item<float>()
              << "\n";
  }
}
