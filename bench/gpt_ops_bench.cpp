// The gpt's pointwise and attention kernels on/off, at the shapes of configs/gpt_text.toml (batch 32,
// context 128, width 128, 4 heads): the fused tanh GELU against the formula's seven ops, the MLP's
// Linear + bias + GELU with fasttrain's bias + GELU kernel against ATen's addmm and gelu, and
// fasttrain's causal attention kernel against ATen's (scaled_dot_product_attention where the LibTorch
// build has it, else the math path), and its residual add + LayerNorm against ATen's add and
// layer_norm, in fp32 and bf16; and beside them the main job's 2x2 max-pool (the cnn's), fasttrain's
// kernel against ATen's max_pool2d, its first conv fused with its max-pool against conv2d and the
// max-pool, its BatchNorm + ReLU against batch_norm and relu, the flatten of its last channels_last maps
// against ATen's strided copies, its hidden Linear + ReLU on AMX's tiles (where the CPU has AMX-BF16)
// against autocast's linear and relu, its output Linear (256 -> 10) against autocast's linear, and muon's
// Newton-Schulz on its matrices; and for both, the
// cross-entropy kernel against ATen's ops on bf16 logits (the gpt's [4096, 256] without label smoothing,
// the main job's [128, 10] with 0.1).
// Forward + backward, median of --repeats timed calls after a warm-up, fasttrain's and ATen's called in
// turn; one JSON line.
//
//   gpt_ops_bench [--threads 1] [--repeats 50] [--only gpt|cnn]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fasttrain/detail/compat.h"
#include "fasttrain/detail/json.h"
#include "fasttrain/kernels/attention.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/task/tasks.h"

namespace {

double median_ms(const std::function<void()>& run, int repeats) {
  for (int i = 0; i < 5; ++i) run();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Forward and backward of `op` on a fresh leaf copy of `input`.
std::function<void()> forward_backward(const torch::Tensor& input,
                                       std::function<torch::Tensor(const torch::Tensor&)> op) {
  return [input, op] {
    auto x = input.detach().requires_grad_(true);
    op(x).sum().backward();
  };
}

// {shape, fasttrain_ms, aten_ms, speedup} (medians; the minima too): `step(true)` runs fasttrain's kernel,
// `step(false)` ATen's ops, call by call in turn (which goes first alternating), so that a VM's drift lands
// on both sides alike.
nlohmann::json own_against_aten(const std::string& shape, const std::function<void(bool own)>& step,
                                int repeats) {
  for (int i = 0; i < 5; ++i) step(true), step(false);
  std::vector<double> times[2];
  const auto time = [&](bool own) {
    const auto start = std::chrono::steady_clock::now();
    step(own);
    times[own].push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  };
  for (int i = 0; i < repeats; ++i) {
    time(i % 2 == 0);
    time(i % 2 != 0);
  }
  const auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  nlohmann::json row{{"shape", shape}};
  row["fasttrain_ms"] = median(times[1]);
  row["aten_ms"] = median(times[0]);
  // The fastest calls too (median sorted them): on a VM whose speed drifts within a run they move less.
  row["fasttrain_min_ms"] = times[1].front();
  row["aten_min_ms"] = times[0].front();
  row["speedup"] = row["aten_ms"].get<double>() / row["fasttrain_ms"].get<double>();
  return row;
}

}  // namespace

void gpt_rows(nlohmann::json& out, int repeats);
void cnn_rows(nlohmann::json& out, int repeats);
void cross_entropy_row(nlohmann::json& out, const std::string& name, int64_t rows, int64_t classes,
                       double smoothing, int repeats);

int main(int argc, char** argv) {
  int threads = 1, repeats = 50;
  std::string only;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i], value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--threads" && std::atoi(value.c_str()) > 0) {
      threads = std::atoi(value.c_str());
    } else if (flag == "--repeats" && std::atoi(value.c_str()) > 0) {
      repeats = std::atoi(value.c_str());
    } else if (flag == "--only" && (value == "gpt" || value == "cnn")) {
      only = value;
    } else {  // a lone flag (--help), a missing or bad value, or an unknown flag
      std::cerr << "gpt_ops_bench: '" << flag << (value.empty() ? "" : " " + value)
                << "' is not an option with a valid value\n"
                << "usage: gpt_ops_bench [--threads N>0] [--repeats N>0] [--only gpt|cnn]\n";
      return 2;
    }
  }
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  nlohmann::json out{
      {"torch", fasttrain::compat::torch_version()}, {"threads", threads}, {"repeats", repeats}};

  if (only != "cnn") gpt_rows(out, repeats);
  if (only != "gpt") cnn_rows(out, repeats);
  std::cout << out.dump() << "\n";
  return 0;
}

// The gpt's kernels.
void gpt_rows(nlohmann::json& out, int repeats) {
  // ---- GELU on the MLP's hidden activations [B, T, 4C] ----
  const auto hidden = torch::randn({32, 128, 512});
  const double fused = median_ms(forward_backward(hidden, fasttrain::gelu_tanh), repeats);
  const double unfused = median_ms(forward_backward(hidden, fasttrain::gelu_tanh_unfused), repeats);
  out["gelu_shape"] = "[32, 128, 512] fp32, forward + backward";
  out["gelu_fused_ms"] = fused;
  out["gelu_unfused_ms"] = unfused;
  out["gelu_speedup"] = unfused / fused;

  // ---- bias + tanh GELU alone on the MLP's pre-activation [B * T, 4C]: ATen's gelu(pre + bias) ----
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto pre = torch::randn({32 * 128, 512}).to(dtype), bias = torch::randn({512});
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    out["bias_gelu_" + name] = own_against_aten(
        "pre [4096, 512] + bias [512], forward + backward",
        [&](bool own) {
          auto p = pre.detach().requires_grad_(true), b = bias.detach().requires_grad_(true);
          auto y = own ? fasttrain::kernels::bias_gelu(p, b) : torch::gelu(p + b.to(dtype), "tanh");
          y.sum().backward();
        },
        repeats);
  }

  // ---- the MLP's first half, x [B * T, C] -> Linear(C, 4C) -> tanh GELU, as each block runs it ----
  // ATen: the Linear with its bias (addmm), then gelu. fasttrain: the Linear without it, then the bias +
  // GELU kernel. bf16 as under autocast: x and the weight bf16, fasttrain's bias fp32.
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto x = torch::randn({32 * 128, 128}).to(dtype);
    const auto weight = (0.1 * torch::randn({512, 128})).to(dtype), bias = 0.1 * torch::randn({512});
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    out["linear_bias_gelu_" + name] = own_against_aten(
        "x [4096, 128] -> [4096, 512], forward + backward",
        [&](bool own) {
          auto xx = x.detach().requires_grad_(true), w = weight.detach().requires_grad_(true);
          auto b = bias.detach().requires_grad_(true);
          auto hidden = own ? fasttrain::kernels::bias_gelu(torch::linear(xx, w), b)
                            : torch::gelu(torch::linear(xx, w, b.to(dtype)), "tanh");
          hidden.sum().backward();
        },
        repeats);
  }

  // ---- fasttrain's fp32 linear against ATen's, forward + backward of x, weight and bias: the MLP's two
  // Linears as the gpt's blocks run them (fc without its bias, mlp_proj adding into the residual stream) ----
  if (fasttrain::kernels::linear_takes(torch::ones({1, 1}), torch::ones({1, 1}), {})) {
    struct Case {
      std::string name, shape;
      int64_t in, out;
      bool bias, residual;
    };
    for (const Case& c :
         {Case{"linear_fc_fp32", "x [4096, 128] -> [4096, 512], no bias", 128, 512, false, false},
          Case{"linear_proj_residual_fp32", "residual + x [4096, 512] -> [4096, 128] + bias", 512, 128, true,
               true}}) {
      const auto x = torch::randn({32 * 128, c.in}), weight = 0.05 * torch::randn({c.out, c.in});
      const auto bias = c.bias ? torch::randn({c.out}) : torch::Tensor();
      const auto residual = c.residual ? torch::randn({32 * 128, c.out}) : torch::Tensor();
      out[c.name] = own_against_aten(
          c.shape + ", forward + backward",
          [&](bool own) {
            const auto leaf = [](const torch::Tensor& t) {
              return t.defined() ? t.detach().requires_grad_(true) : torch::Tensor();
            };
            auto xx = leaf(x), w = leaf(weight), b = leaf(bias), r = leaf(residual);
            torch::Tensor y;
            if (own) {
              y = fasttrain::kernels::linear(xx, w, b, r);
            } else {
              y = torch::linear(xx, w, b);
              if (r.defined()) y = r + y;
            }
            y.sum().backward();
          },
          repeats);
    }
  }

  // ---- the whole MLP with its residual add, fp32, as the gpt's blocks run it: fasttrain's gelu_mlp (bias +
  // GELU in the fc matmul's epilogue, GELU's derivative in the projection's input gradient's) against ATen's
  // ops, and against fasttrain's unfused kernels (linear without bias, bias_gelu, linear into the residual),
  // which the gpt ran before it; on this CPU's widest capability and on its AVX2 build ----
  {
    const auto x = torch::randn({32 * 128, 128}), residual = torch::randn({32 * 128, 128});
    const auto fc_weight = 0.1 * torch::randn({512, 128}), fc_bias = 0.1 * torch::randn({512});
    const auto proj_weight = 0.05 * torch::randn({128, 512}), proj_bias = 0.1 * torch::randn({128});
    const auto mlp_row =
        [&](const std::string& shape,
            const std::function<torch::Tensor(const std::vector<torch::Tensor>& in)>& baseline,
            fasttrain::kernels::CpuCapability capability) {
          return own_against_aten(
              shape + ", forward + backward",
              [&](bool own) {
                std::vector<torch::Tensor> in;
                for (const auto& t : {x, fc_weight, fc_bias, proj_weight, proj_bias, residual})
                  in.push_back(t.detach().requires_grad_(true));
                auto y =
                    own ? fasttrain::kernels::gelu_mlp(in[0], in[1], in[2], in[3], in[4], in[5], capability)
                        : baseline(in);
                y.sum().backward();
              },
              repeats);
        };
    const auto aten_mlp = [](const std::vector<torch::Tensor>& in) {
      return in[5] + torch::linear(torch::gelu(torch::linear(in[0], in[1], in[2]), "tanh"), in[3], in[4]);
    };
    const std::string shape = "residual + x [4096, 128] -> [4096, 512] -> [4096, 128]";
    const auto best = fasttrain::kernels::cpu_capability();
    out["gelu_mlp_fp32"] = mlp_row(shape, aten_mlp, best);
    if (fasttrain::kernels::linear_takes(x, fc_weight, {})) {
      out["gelu_mlp_over_unfused_fp32"] = mlp_row(
          shape + " (the baseline: fasttrain's linear, bias_gelu, linear)",
          [](const std::vector<torch::Tensor>& in) {
            const auto h = fasttrain::kernels::bias_gelu(fasttrain::kernels::linear(in[0], in[1], {}), in[2]);
            return fasttrain::kernels::linear(h, in[3], in[4], in[5]);
          },
          best);
    }
    if (best == fasttrain::kernels::CpuCapability::avx512)
      out["gelu_mlp_avx2_build_fp32"] =
          mlp_row(shape + " (fasttrain's AVX2 build)", aten_mlp, fasttrain::kernels::CpuCapability::avx2);
  }

  // ---- causal attention of the packed qkv [B, T, 3C], as the gpt's blocks call it ----
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto qkv = torch::randn({32, 128, 3 * 128}).to(dtype);
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    nlohmann::json row{{"shape", "qkv [32, 128, 384], 4 heads, forward + backward"}};
    row["fasttrain_ms"] = median_ms(
        forward_backward(
            qkv, [](const torch::Tensor& x) { return fasttrain::kernels::packed_causal_attention(x, 4); }),
        repeats);
    row["aten_ms"] = median_ms(
        forward_backward(
            qkv, [](const torch::Tensor& x) { return fasttrain::packed_causal_attention_aten(x, 4); }),
        repeats);
    torch::Tensor probe;
    row["aten_path"] =
        fasttrain::compat::fused_causal_attention(qkv.view({32, 128, 3, 4, 32}).select(2, 0),
                                                  qkv.view({32, 128, 3, 4, 32}).select(2, 1),
                                                  qkv.view({32, 128, 3, 4, 32}).select(2, 2), probe)
            ? "scaled_dot_product_attention"
            : "math (no scaled_dot_product_attention in this LibTorch)";
    row["speedup"] = row["aten_ms"].get<double>() / row["fasttrain_ms"].get<double>();
    row["capability"] = fasttrain::kernels::to_string(fasttrain::kernels::cpu_capability());
    out["attention_" + name] = row;
  }
  // ---- residual add + LayerNorm on the residual stream [B * T, C], as each block's second norm ----
  // fp32: x + branch, layer_norm; bf16 (autocast's case): an fp32 stream, a bf16 branch, the result cast
  // to bf16 for the matmul after it, which fasttrain's kernel writes directly.
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto x = torch::randn({32 * 128, 128}), branch = torch::randn({32 * 128, 128}).to(dtype);
    const auto weight = torch::randn({128}), bias = torch::randn({128});
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    out["add_layer_norm_" + name] = own_against_aten(
        "[4096, 128] stream + branch, forward + backward",
        [&](bool own) {
          auto xx = x.detach().requires_grad_(true), bb = branch.detach().requires_grad_(true);
          auto w = weight.detach().requires_grad_(true), b = bias.detach().requires_grad_(true);
          torch::Tensor sum, y;
          if (own) {
            std::tie(sum, y) = fasttrain::kernels::add_layer_norm(xx, bb, w, b, 1e-5, dtype);
          } else {
            sum = xx + bb;
            y = torch::layer_norm(sum, {128}, w, b, 1e-5).to(dtype);
          }
          (sum.sum() + y.sum()).backward();
        },
        repeats);
  }
  cross_entropy_row(out, "4096x256", 32 * 128, 256, 0.0, repeats);
}

// The training loss on bf16 logits (autocast's): fasttrain's cross-entropy kernel against ATen's ops on
// their fp32 copy, as the task runs them with task.kernels = "aten" (the cast inside autocast's region).
void cross_entropy_row(nlohmann::json& out, const std::string& name, int64_t rows, int64_t classes,
                       double smoothing, int repeats) {
  const auto logits = torch::randn({rows, classes}).to(torch::kBFloat16);
  const auto targets = torch::randint(0, classes, {rows}, torch::kLong);
  out["cross_entropy_" + name] = own_against_aten(
      "bf16 [" + std::to_string(rows) + ", " + std::to_string(classes) + "], label smoothing " +
          std::to_string(smoothing) + ", forward + backward",
      [&](bool own) {
        auto x = logits.detach().requires_grad_(true);
        (own ? fasttrain::kernels::cross_entropy(x, targets, smoothing)
             : fasttrain::cross_entropy(x.to(torch::kFloat), targets, smoothing))
            .backward();
      },
      repeats);
}

// The main job's: the cnn's and muon's.
void cnn_rows(nlohmann::json& out, int repeats) {
  cross_entropy_row(out, "128x10", 128, 10, 0.1, repeats);
  // ---- the main job's two 2x2 max-pools (configs/default.toml: batch 128, conv widths 16 and 32 on
  // 28x28 images), channels_last as it runs them: fasttrain's kernel against ATen's max_pool2d ----
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    for (const auto& [channels, side] : {std::pair<int64_t, int64_t>{16, 28}, {32, 14}}) {
      const auto maps =
          torch::randn({128, channels, side, side}).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
      const auto grad = torch::randn({128, channels, side / 2, side / 2})
                            .to(dtype)
                            .contiguous(torch::MemoryFormat::ChannelsLast);
      out["max_pool_" + std::to_string(channels) + "x" + std::to_string(side) + "_" + name] =
          own_against_aten(
              "NHWC [128, " + std::to_string(channels) + ", " + std::to_string(side) + ", " +
                  std::to_string(side) + "] -> 2x2 max-pool, forward + backward",
              [&](bool own) {
                auto x = maps.detach().requires_grad_(true);
                auto y = own ? fasttrain::kernels::max_pool2x2(x) : torch::max_pool2d(x, 2);
                y.backward(grad);
              },
              repeats);
    }
  }
  // ---- the main job's first conv and its max-pool (pool_first: [128, 1, 28, 28] -> 16 channels, 3x3, no
  // bias), fp32 images and weight as the model holds them, computed in fp32 or in bf16 (as under
  // autocast): fasttrain's fused kernel against ATen's conv2d (its inputs cast, as autocast casts them)
  // and then fasttrain's max-pool kernel, what the cnn runs with aten_kernels = ["conv_max_pool"] ----
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    // channels_last's own strides, as the cnn's batches and weights have them: over one channel
    // .contiguous(ChannelsLast) keeps NCHW's, and conv2d then takes its slow NCHW path (7-8 ms here).
    auto channels_last = [](const torch::Tensor& t) {
      return torch::empty(t.sizes(), t.options().memory_format(torch::MemoryFormat::ChannelsLast)).copy_(t);
    };
    const auto images = channels_last(torch::randn({128, 1, 28, 28}));
    auto weight = channels_last(torch::randn({16, 1, 3, 3})).requires_grad_(true);
    const auto grad = torch::randn({128, 16, 14, 14}).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
    out["conv_max_pool_1to16x28_" + name] = own_against_aten(
        "NHWC [128, 1, 28, 28] -> conv 3x3 to 16 channels -> 2x2 max-pool, forward + backward (weight)",
        [&](bool own) {
          torch::Tensor y;
          if (own) {
            y = fasttrain::kernels::conv3x3_max_pool2x2(images, weight, {}, dtype);
          } else {
            const auto maps = torch::conv2d(images.to(dtype), weight.to(dtype), {}, 1, 1);
            y = fasttrain::kernels::max_pool2x2_takes(maps) ? fasttrain::kernels::max_pool2x2(maps)
                                                            : torch::max_pool2d(maps, 2);
          }
          y.backward(grad);
        },
        repeats);
  }
  // ---- the main job's second conv (16 -> 32 on 14 x 14) and its max-pool: fasttrain's (Winograd's forward
  // with the max-pool in its output transform, backward from the winners) against oneDNN's conv and the
  // max-pool kernel forward and oneDNN's conv backward of the unpooled gradient, the input's gradient
  // included ----
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    const auto maps = torch::randn({128, 16, 14, 14}).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
    auto weight =
        torch::randn({32, 16, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
    const auto grad = torch::randn({128, 32, 7, 7}).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
    out["conv_max_pool_16to32x14_" + name] = own_against_aten(
        "NHWC [128, 16, 14, 14] -> conv 3x3 to 32 channels -> 2x2 max-pool, forward + backward (weight, "
        "input)",
        [&](bool own) {
          auto x = maps.detach().requires_grad_(true);
          torch::Tensor y;
          if (own) {
            y = fasttrain::kernels::conv3x3_max_pool2x2(x, weight, {}, dtype);
          } else {
            y = fasttrain::kernels::max_pool2x2(torch::conv2d(x.to(dtype), weight.to(dtype), {}, 1, 1));
          }
          y.backward(grad);
        },
        repeats);
    // The forward alone, as an evaluation runs it: Winograd's against oneDNN's conv and the max-pool kernel
    // (model.aten_kernels = ["winograd_conv"]).
    out["conv_winograd_16to32x14_" + name] = own_against_aten(
        "NHWC [128, 16, 14, 14] -> conv 3x3 to 32 channels -> 2x2 max-pool, forward (no gradient): "
        "Winograd's "
        "F(2x2, 3x3) against oneDNN's conv",
        [&](bool own) {
          const torch::NoGradGuard no_gradient;
          fasttrain::kernels::conv3x3_max_pool2x2(maps, weight, {}, dtype,
                                                  fasttrain::kernels::cpu_capability(),
                                                  own ? fasttrain::kernels::WideConvForward::winograd
                                                      : fasttrain::kernels::WideConvForward::onednn);
        },
        repeats);
  }
  // ---- the same conv in bf16 on AMX's tiles (where this CPU lends them): the implicit GEMM with the
  // max-pool in its epilogue, backward oneDNN's from the winners' gradient, against what the cnn runs with
  // aten_kernels = ["amx_conv"] (oneDNN's conv, the max-pool kernel, oneDNN's conv backward); and the forward
  // alone, as an evaluation runs it ----
  if (fasttrain::kernels::conv3x3_max_pool2x2_runs_on_amx(16, 32, torch::kBFloat16)) {
    using fasttrain::kernels::WideConvForward;
    const auto maps =
        torch::randn({128, 16, 14, 14}).to(torch::kBFloat16).contiguous(torch::MemoryFormat::ChannelsLast);
    auto weight =
        torch::randn({32, 16, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
    const auto grad =
        torch::randn({128, 32, 7, 7}).to(torch::kBFloat16).contiguous(torch::MemoryFormat::ChannelsLast);
    out["amx_conv_max_pool_16to32x14_bf16"] = own_against_aten(
        "NHWC [128, 16, 14, 14] bf16 -> conv 3x3 to 32 channels -> 2x2 max-pool, forward + backward (weight, "
        "input): AMX's forward against oneDNN's conv and the max-pool kernel",
        [&](bool own) {
          auto x = maps.detach().requires_grad_(true);
          const auto y =
              own ? fasttrain::kernels::conv3x3_max_pool2x2(x, weight, {}, torch::kBFloat16,
                                                            fasttrain::kernels::cpu_capability(),
                                                            WideConvForward::amx)
                  : fasttrain::kernels::max_pool2x2(torch::conv2d(x, weight.to(torch::kBFloat16), {}, 1, 1));
          y.backward(grad);
        },
        repeats);
    out["amx_conv_forward_16to32x14_bf16"] = own_against_aten(
        "NHWC [128, 16, 14, 14] bf16 -> conv 3x3 to 32 channels -> 2x2 max-pool, forward (no gradient): "
        "AMX's "
        "against oneDNN's conv and the max-pool kernel",
        [&](bool own) {
          const torch::NoGradGuard no_gradient;
          if (own) {
            fasttrain::kernels::conv3x3_max_pool2x2(maps, weight, {}, torch::kBFloat16,
                                                    fasttrain::kernels::cpu_capability(),
                                                    WideConvForward::amx);
          } else {
            fasttrain::kernels::max_pool2x2(torch::conv2d(maps, weight.to(torch::kBFloat16), {}, 1, 1));
          }
        },
        repeats);
  }
  // ---- the main job's first conv in bf16 on AMX's tiles (a pooling window's 4x4 patch per tile row): its
  // forward against the direct forward (model.aten_kernels = ["amx_conv"]), both with the winners' weight
  // gradient, and the forward alone, as an evaluation runs it ----
  if (fasttrain::kernels::conv3x3_max_pool2x2_runs_on_amx(1, 16, torch::kBFloat16)) {
    using fasttrain::kernels::WideConvForward;
    auto channels_last = [](const torch::Tensor& t) {
      return torch::empty(t.sizes(), t.options().memory_format(torch::MemoryFormat::ChannelsLast)).copy_(t);
    };
    const auto images = channels_last(torch::randn({128, 1, 28, 28}));
    auto weight = channels_last(torch::randn({16, 1, 3, 3})).requires_grad_(true);
    const auto grad =
        torch::randn({128, 16, 14, 14}).to(torch::kBFloat16).contiguous(torch::MemoryFormat::ChannelsLast);
    const auto conv = [&](bool amx) {
      return fasttrain::kernels::conv3x3_max_pool2x2(images, weight, {}, torch::kBFloat16,
                                                     fasttrain::kernels::cpu_capability(),
                                                     amx ? WideConvForward::amx : WideConvForward::onednn);
    };
    out["amx_conv_max_pool_1to16x28_bf16"] = own_against_aten(
        "NHWC [128, 1, 28, 28] -> conv 3x3 to 16 channels -> 2x2 max-pool in bf16, forward + backward "
        "(weight): AMX's forward against the direct one",
        [&](bool own) { conv(own).backward(grad); }, repeats);
    out["amx_conv_forward_1to16x28_bf16"] = own_against_aten(
        "NHWC [128, 1, 28, 28] -> conv 3x3 to 16 channels -> 2x2 max-pool in bf16, forward (no gradient): "
        "AMX's against the direct one",
        [&](bool own) {
          const torch::NoGradGuard no_gradient;
          conv(own);
        },
        repeats);
  }
  // ---- the main job's BatchNorm + ReLU after each pool (pool_first: [128, 16, 14, 14] and [128, 32, 7, 7]),
  // training mode: fasttrain's kernel against ATen's batch_norm and relu ----
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    for (const auto& [channels, side] : {std::pair<int64_t, int64_t>{16, 14}, {32, 7}}) {
      const auto maps =
          torch::randn({128, channels, side, side}).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
      const auto grad = torch::randn_like(maps);
      auto weight = torch::rand({channels}).requires_grad_(true),
           bias = torch::randn({channels}).requires_grad_(true);
      auto running_mean = torch::zeros({channels}), running_var = torch::ones({channels});
      out["batch_norm_relu_" + std::to_string(channels) + "x" + std::to_string(side) + "_" + name] =
          own_against_aten(
              "NHWC [128, " + std::to_string(channels) + ", " + std::to_string(side) + ", " +
                  std::to_string(side) + "] -> BatchNorm (batch statistics) + ReLU, forward + backward",
              [&](bool own) {
                auto x = maps.detach().requires_grad_(true);
                auto y = own ? fasttrain::kernels::batch_norm_relu(x, weight, bias, running_mean, running_var,
                                                                   true, 0.1, 1e-5)
                             : torch::batch_norm(x, weight, bias, running_mean, running_var, true, 0.1, 1e-5,
                                                 false)
                                   .relu_();
                y.backward(grad);
              },
              repeats);
    }
  }
  // ---- the main job's last maps flattened for the classifier ([128, 32, 7, 7] channels_last -> [128, 1568]
  // in NCHW order) and their gradient back to channels_last: fasttrain's transpose against ATen's flatten
  // (forward) and the strided copy the stage before makes of its gradient (backward) ----
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto maps = torch::randn({128, 32, 7, 7}).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
    const auto grad = torch::randn({128, 32 * 7 * 7}).to(dtype);
    out[std::string("flatten_32x7_") + (dtype == torch::kFloat ? "fp32" : "bf16")] = own_against_aten(
        "NHWC [128, 32, 7, 7] -> [128, 1568] in NCHW order, forward + backward to channels_last",
        [&](bool own) {
          auto x = maps.detach().requires_grad_(true);
          auto y = own ? fasttrain::kernels::flatten_channels_last(x) : x.flatten(1);
          y.backward(grad);
          if (!own)
            x.grad().contiguous(torch::MemoryFormat::ChannelsLast);  // what BatchNorm + ReLU then does
        },
        repeats);
  }
  // ---- the main job's hidden Linear + ReLU in bf16 ([128, 1568] -> [128, 256]) on a CPU with AMX-BF16:
  // fasttrain's AMX kernel against autocast's linear (a cast of the weight, oneDNN's matmul) and relu ----
  if (fasttrain::kernels::amx_linear_runs_here()) {
    const auto x = torch::randn({128, 1568}).to(torch::kBFloat16), weight = torch::randn({256, 1568}) * 0.03;
    const auto bias = torch::randn({256}) * 0.1, grad = torch::randn({128, 256}).to(torch::kBFloat16);
    out["amx_linear_relu_1568x256"] = own_against_aten(
        "bf16 autocast, x [128, 1568] -> [128, 256] + ReLU, forward + backward (x, weight, bias)",
        [&](bool own) {
          auto input = x.detach().requires_grad_(true);
          auto w = weight.detach().requires_grad_(true), b = bias.detach().requires_grad_(true);
          fasttrain::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
          auto y =
              own ? fasttrain::kernels::amx_linear(input, w, b, true) : torch::linear(input, w, b).relu_();
          y.backward(grad);
        },
        repeats);
  }
  // ---- the main job's hidden Linear + ReLU in fp32 ([128, 1568] -> [128, 256]): fasttrain's linear_relu,
  // its backward forced through the sparse sums, against ATen's linear + relu, at shares of outputs the ReLU
  // passes (15-30% in the main job after its first 150 steps; the bias set from the outputs' quantile) ----
  for (const int percent : {15, 30, 50, 70}) {
    const auto x = torch::randn({128, 1568}).relu(), weight = torch::randn({256, 1568}) * 0.03;
    const auto z = torch::linear(x, weight);
    const auto bias = -z.flatten().quantile(1.0 - percent / 100.0).expand({256}).contiguous();
    const auto grad = torch::randn({128, 256});
    out["linear_relu_1568x256_fp32_pass" + std::to_string(percent)] = own_against_aten(
        "fp32, x [128, 1568] -> [128, 256] + ReLU passing " + std::to_string(percent) +
            "% of outputs, forward + backward (x, weight, bias), the sparse backward against dense",
        [&](bool own) {
          auto input = x.detach().requires_grad_(true);
          auto w = weight.detach().requires_grad_(true), b = bias.detach().requires_grad_(true);
          auto y =
              own ? fasttrain::kernels::linear_relu(input, w, b, fasttrain::kernels::cpu_capability(), 1.0)
                  : torch::linear(input, w, b).relu_();
          y.backward(grad);
        },
        repeats);
  }
  // ---- the main job's output Linear in bf16 ([128, 256] -> [128, 10]): fasttrain's narrow_linear against
  // autocast's linear (casts, oneDNN's bf16 matmul) ----
  {
    const auto x = torch::randn({128, 256}).to(torch::kBFloat16), weight = torch::randn({10, 256}) * 0.06;
    const auto bias = torch::randn({10}) * 0.1, grad = torch::randn({128, 10}).to(torch::kBFloat16);
    out["narrow_linear_256x10"] = own_against_aten(
        "bf16 autocast, x [128, 256] -> [128, 10], forward + backward (x, weight, bias)",
        [&](bool own) {
          auto input = x.detach().requires_grad_(true);
          auto w = weight.detach().requires_grad_(true), b = bias.detach().requires_grad_(true);
          fasttrain::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
          auto y = own ? fasttrain::kernels::narrow_linear(input, w, b) : torch::linear(input, w, b);
          y.backward(grad);
        },
        repeats);
  }
  // ---- muon's Newton-Schulz (5 steps) on the main job's matrices: the conv kernels [16, 1x3x3] and
  // [32, 16x3x3] and the last layer [10, 256] ----
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 9}, {32, 144}, {10, 256}}) {
    const auto update = torch::randn({rows, cols});
    out["newton_schulz_" + std::to_string(rows) + "x" + std::to_string(cols)] = own_against_aten(
        "[" + std::to_string(rows) + ", " + std::to_string(cols) + "], 5 steps",
        [&](bool own) {
          if (own) {
            fasttrain::kernels::newton_schulz(update, 5);
          } else {
            fasttrain::kernels::newton_schulz_aten(update, 5);
          }
        },
        repeats);
  }
  // ---- muon's whole step of each of those matrices: muon_matrix_step against the dozen ATen ops muon
  // composes around the same Newton-Schulz kernel (momentum lerp, Nesterov lerp, casts, decay, update) ----
  fasttrain::kernels::MuonMatrixStep step;
  step.decay = 1 - 6e-3 * 5e-4;
  step.scale = 6e-3 * 0.2 * 16;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{16, 1, 3, 3}, {32, 16, 3, 3}, {10, 256}}) {
    const auto param = torch::randn(shape), grad = torch::randn(shape), buffer = torch::randn(shape);
    const auto lr = torch::tensor(6e-3, torch::kFloat);
    const int64_t rows = shape[0], cols = param.numel() / rows;
    out["muon_step_" + std::to_string(rows) + "x" + std::to_string(cols)] = own_against_aten(
        "[" + std::to_string(rows) + ", " + std::to_string(cols) +
            "], 5 Newton-Schulz steps (fasttrain's) inside",
        [&](bool own) {
          if (own) {
            fasttrain::kernels::muon_matrix_step(param, grad, buffer, step);
            return;
          }
          // src/optim/muon.cpp's composed path
          const torch::Tensor lr64 = lr.to(torch::kDouble), decay = 1 - lr64 * 5e-4;
          buffer.lerp_(grad, 1 - step.momentum);
          const torch::Tensor update = grad.lerp(buffer, step.momentum);
          const torch::Tensor orthogonal =
              fasttrain::kernels::newton_schulz(update.reshape({rows, -1}), 5).reshape(update.sizes());
          param.mul_(decay.to(param.scalar_type()));
          param.sub_(orthogonal.to(param.scalar_type()) * (lr64 * (0.2 * 16)).to(param.scalar_type()));
        },
        repeats);
  }
}
