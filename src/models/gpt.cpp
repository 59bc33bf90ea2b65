// gpt: a byte-level decoder-only transformer (GPT-2's layout): token and position embeddings,
// pre-norm blocks of causal self-attention and a GELU MLP with residual connections, a final
// LayerNorm, and logits through the token embedding (tied weights).
#include <torch/nn.h>

#include <algorithm>
#include <cmath>

#include "fasttrain/kernels/attention.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/kernels/gpu.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/util/check.h"
#include "own_kernels.h"

namespace fasttrain {

namespace {

// Which of fasttrain's kernels the model runs (its blocks and its final norm): on the CPU by model.kernels,
// on a GPU by model.gpu_kernels, and model.aten_kernels on both.
struct GptKernels {
  bool attention = false, layer_norm = false, bias_gelu = false, linear = false, gelu_mlp = false,
       gpu_layer_norm = false, gpu_mlp = false, gpu_linear = false;

  explicit GptKernels(const GptOptions& options)
      : attention(runs_own_kernel(options.kernels(), options.aten_kernels(), "attention")),
        layer_norm(runs_own_kernel(options.kernels(), options.aten_kernels(), "layer_norm")),
        bias_gelu(runs_own_kernel(options.kernels(), options.aten_kernels(), "bias_gelu")),
        linear(runs_own_kernel(options.kernels(), options.aten_kernels(), "linear")),
        gelu_mlp(runs_own_kernel(options.kernels(), options.aten_kernels(), "gelu_mlp")),
        gpu_layer_norm(runs_own_kernel(options.gpu_kernels(), options.aten_kernels(), "layer_norm")),
        gpu_mlp(runs_own_kernel(options.gpu_kernels(), options.aten_kernels(), "bias_gelu")),
        gpu_linear(runs_own_kernel(options.gpu_kernels(), options.aten_kernels(), "linear")) {}
};

// x weight^T + bias through ATen's linear, not the C++ frontend's Linear::forward: on [B, T, C] the latter
// is a matmul and then `+= bias`, a pass over the output each way; ATen's folds the bias into one addmm over
// B * T rows, as Python's nn.Linear does. Where `own` (model.kernels) and it takes them (fp32 on the CPU),
// fasttrain's linear, whose input gradient is oneDNN's matmul. `bias` may be undefined.
torch::Tensor linear(bool own, const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (own && kernels::linear_takes(x, weight, bias)) return kernels::linear(x, weight, bias);
  return torch::linear(x, weight, bias);
}

// Whether fasttrain's LayerNorm runs on x (and a branch of `branch_like`'s shape, where defined): on the
// CPU for an fp32 stream (whether it writes fp32 or autocast's bf16, saving the cast), measured faster than
// ATen's add + layer_norm (+ cast) with the residual gradient's add inside it (BENCHMARKS.md "Own CPU
// kernels"); on a GPU wherever it writes fp32 or bf16 (not fp16 autocast's).
bool own_norm(const GptKernels& own, const torch::Tensor& x, const torch::Tensor& branch_like,
              torch::nn::LayerNorm& ln) {
  const torch::ScalarType y_dtype = kernels::compute_dtype(x);
  const bool wanted = x.is_cuda()
                          ? own.gpu_layer_norm && (y_dtype == torch::kFloat || y_dtype == torch::kBFloat16)
                          : own.layer_norm && x.scalar_type() == torch::kFloat &&
                                (y_dtype == torch::kFloat || y_dtype == torch::kBFloat16);
  return wanted && kernels::layer_norm_takes(x, branch_like, ln->weight, ln->bias);
}

// ln(x) written in the dtype of the matmul it feeds, by fasttrain's kernel where own_norm says.
torch::Tensor norm(const GptKernels& own, torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  if (!own_norm(own, x, {}, ln)) return ln->forward(x);
  return kernels::layer_norm(x, ln->weight, ln->bias, ln->options.eps(), kernels::compute_dtype(x));
}

// x + attention(ln1(x)), then x + mlp(ln2(x)).
class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(int64_t embed, int64_t heads, double dropout, const GptKernels& own_kernels)
      : heads_(heads),
        own_kernels_(own_kernels),
        ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})))),
        qkv_(register_module("qkv", torch::nn::Linear(embed, 3 * embed))),
        attn_proj_(register_module("attn_proj", torch::nn::Linear(embed, embed))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})))),
        fc_(register_module("fc", torch::nn::Linear(embed, 4 * embed))),
        mlp_proj_(register_module("mlp_proj", torch::nn::Linear(4 * embed, embed))),
        dropout_(register_module("dropout", torch::nn::Dropout(dropout))) {}

  torch::Tensor forward(torch::Tensor x) {  // [B, T, C] -> [B, T, C]
    // ---- causal self-attention: heads of C / H ----
    auto [stream, normed1] = pass_norm(ln1_, x);  // x passed on, and ln1(x): [B, T, C] each
    auto attended = attend(normed1);              // [B, T, C]: the heads side by side
    auto [residual, normed] = project_add_norm(attn_proj_, attended, stream, ln2_);  // [B, T, C] each
    // ---- MLP: C -> 4C -> C with the fused tanh GELU ----
    return mlp(normed, residual);  // residual + mlp_proj(gelu(fc(normed))): [B, T, C]
  }

  // The projections that write into the residual stream (GPT-2 scales their init by 1/sqrt(2 L)).
  std::vector<torch::Tensor> residual_projections() { return {attn_proj_->weight, mlp_proj_->weight}; }

 private:
  // Causal attention of qkv(normed) [B, T, 3C]. Where fasttrain's linear and attention both run (fp32 on the
  // CPU), the qkv Linear runs without its bias and the attention kernel adds it as it reads the rows: no
  // copy of the bias into the matmul's output, and the bias-less matmul is oneDNN's.
  torch::Tensor attend(const torch::Tensor& normed) {
    if (own_kernels_.attention && own_kernels_.linear && kernels::linear_takes(normed, qkv_->weight, {}))
      return packed_causal_attention(kernels::linear(normed, qkv_->weight, {}), heads_, qkv_->bias);
    auto qkv = linear(qkv_, normed);  // [B, T, 3C]: q, k, v side by side
    return own_kernels_.attention ? packed_causal_attention(qkv, heads_)
                                  : packed_causal_attention_aten(qkv, heads_);
  }
  // layer(x): on a GPU under bf16 fasttrain's cuBLASLt linear where model.gpu_kernels says (the bias
  // gradient inside the weight gradient's matmul), else as fasttrain::linear.
  torch::Tensor linear(torch::nn::Linear& layer, const torch::Tensor& x) const {
    if (own_kernels_.gpu_linear && kernels::gpu_linear_takes(x, layer->weight, layer->bias))
      return kernels::gpu_linear(x, layer->weight, layer->bias);
    return fasttrain::linear(own_kernels_.linear, x, layer->weight, layer->bias);
  }
  // residual + dropout(layer(x)).
  torch::Tensor project_add(torch::nn::Linear& layer, const torch::Tensor& x, const torch::Tensor& residual) {
    if (projects_into(layer, x, residual)) return kernels::linear(x, layer->weight, layer->bias, residual);
    return residual + dropout_->forward(linear(layer, x));
  }
  // Whether residual + dropout(layer(x)) is one of fasttrain's linears, a matmul adding into residual + bias:
  // on the CPU in fp32, where dropout does nothing.
  bool projects_into(torch::nn::Linear& layer, const torch::Tensor& x, const torch::Tensor& residual) const {
    return dropout_does_nothing() && own_kernels_.linear &&
           kernels::linear_takes(x, layer->weight, layer->bias, residual);
  }
  // residual + mlp_proj(gelu_tanh(fc(x))): on a GPU under bf16 fasttrain's cuBLASLt matmuls where
  // model.gpu_kernels says, the residual added by the last one where dropout does nothing; on the CPU in
  // fp32 fasttrain's GELU matmuls where fuses_mlp says.
  torch::Tensor mlp(const torch::Tensor& normed, const torch::Tensor& residual) {
    if (own_kernels_.gpu_mlp) {
      // The residual joins the last matmul only where nothing comes between them.
      const torch::Tensor added = dropout_does_nothing() ? residual : torch::Tensor();
      if (kernels::gpu_mlp_takes(normed, fc_->weight, fc_->bias, mlp_proj_->weight, mlp_proj_->bias, added)) {
        auto y = kernels::gpu_mlp(normed, fc_->weight, fc_->bias, mlp_proj_->weight, mlp_proj_->bias, added);
        return added.defined() ? y : residual + dropout_->forward(y);
      }
    }
    if (fuses_mlp(normed, residual))
      return kernels::gelu_mlp(normed, fc_->weight, fc_->bias, mlp_proj_->weight, mlp_proj_->bias, residual);
    return project_add(mlp_proj_, mlp_hidden(normed), residual);  // [B, T, 4C] -> [B, T, C]
  }
  // Whether the MLP runs as fasttrain's gelu_mlp, bias + GELU in the fc matmul's epilogue and GELU's
  // derivative in the projection's input gradient: where model.kernels and aten_kernels leave it and both of
  // the kernels it fuses on (bias_gelu, linear; it needs no oneDNN, which fasttrain's linear does), in fp32
  // on a CPU with AVX2 or AVX512 (its matmul in scalar code would lose to BLAS), where dropout does nothing.
  bool fuses_mlp(const torch::Tensor& normed, const torch::Tensor& residual) const {
    return dropout_does_nothing() && own_kernels_.gelu_mlp && own_kernels_.bias_gelu && own_kernels_.linear &&
           kernels::tiled_matmul_pays_here() &&
           kernels::gelu_mlp_takes(normed, fc_->weight, fc_->bias, mlp_proj_->weight, mlp_proj_->bias,
                                   residual);
  }
  // gelu_tanh(fc(x)). On the CPU with fasttrain's kernels the Linear runs without its bias, which the
  // bias + GELU kernel adds: one pass over [B, T, 4C] each way, and a tanh cheaper than ATen's.
  torch::Tensor mlp_hidden(const torch::Tensor& normed) {
    if (!own_kernels_.bias_gelu || !normed.device().is_cpu()) return gelu_tanh(linear(fc_, normed));
    auto pre =
        fasttrain::linear(own_kernels_.linear, normed, fc_->weight, {});  // [B, T, 4C], autocast's dtype
    if (!kernels::bias_gelu_takes(pre, fc_->bias)) return gelu_tanh(pre + fc_->bias);
    return kernels::bias_gelu(pre, fc_->bias);
  }
  // {x, ln(x)}, ln(x) written in the dtype of the matmul it feeds (bf16 under autocast) by fasttrain's
  // kernel where own_norm says, else ATen's. With the kernel x is passed on through it, whose backward adds
  // x's gradient from the residual stream to the norm's in its own pass.
  std::pair<torch::Tensor, torch::Tensor> pass_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
    if (!own_norm(own_kernels_, x, {}, ln)) return {x, norm(own_kernels_, ln, x)};
    return kernels::pass_layer_norm(x, ln->weight, ln->bias, ln->options.eps(), kernels::compute_dtype(x));
  }
  // {x + dropout(layer(input)), ln of it}: in fasttrain's LayerNorm kernel where own_norm says, which in
  // fp32 on the CPU also adds the projection's bias (the matmul runs without it); else the residual add
  // inside the projection's matmul where projects_into says (fp32 on the CPU), or ATen's add.
  std::pair<torch::Tensor, torch::Tensor> project_add_norm(torch::nn::Linear& layer,
                                                           const torch::Tensor& input, const torch::Tensor& x,
                                                           torch::nn::LayerNorm& ln) {
    const double eps = ln->options.eps();
    if (own_norm(own_kernels_, x, x, ln)) {
      if (bias_joins_norm(layer, input, x)) {
        return kernels::add_layer_norm(x, kernels::linear(input, layer->weight, {}), ln->weight, ln->bias,
                                       eps, torch::kFloat, kernels::cpu_capability(), layer->bias);
      }
      return kernels::add_layer_norm(x, dropout_->forward(linear(layer, input)), ln->weight, ln->bias, eps,
                                     kernels::compute_dtype(x));
    }
    if (projects_into(layer, input, x)) {
      auto sum = kernels::linear(input, layer->weight, layer->bias, x);
      return {sum, ln->forward(sum)};
    }
    auto sum = x + dropout_->forward(linear(layer, input));
    return {sum, ln->forward(sum)};
  }
  // Whether the projection into the norm runs as fasttrain's bias-less linear with its bias added by the
  // norm's kernel: fp32 on the CPU, where dropout does nothing.
  bool bias_joins_norm(torch::nn::Linear& layer, const torch::Tensor& input, const torch::Tensor& x) const {
    return dropout_does_nothing() && own_kernels_.linear && x.device().is_cpu() &&
           kernels::compute_dtype(x) == torch::kFloat && kernels::linear_takes(input, layer->weight, {});
  }

  // Where a bias may move past dropout into the next kernel: p = 0, or evaluation.
  bool dropout_does_nothing() const { return dropout_->options.p() == 0.0 || !dropout_->is_training(); }

  int64_t heads_;
  GptKernels own_kernels_;
  torch::nn::LayerNorm ln1_;
  torch::nn::Linear qkv_, attn_proj_;
  torch::nn::LayerNorm ln2_;
  torch::nn::Linear fc_, mlp_proj_;
  torch::nn::Dropout dropout_;
};
TORCH_MODULE(GptBlock);

class Gpt : public torch::nn::Module {
 public:
  Gpt(const GptOptions& options, int64_t vocabulary)
      : context_(options.context()), vocab_(vocabulary), own_kernels_(options) {
    const int64_t embed = options.embed();
    token_embedding_ = register_module("token_embedding", torch::nn::Embedding(vocab_, embed));
    position_embedding_ = register_module("position_embedding", torch::nn::Embedding(context_, embed));
    dropout_ = register_module("dropout", torch::nn::Dropout(options.dropout()));
    blocks_ = register_module("blocks", Stage());
    for (int64_t i = 0; i < options.layers(); ++i)
      blocks_->push_back(GptBlock(embed, options.heads(), options.dropout(), GptKernels(options)));
    final_norm_ = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));

    // ---- GPT-2's initialisation: N(0, 0.02), biases 0, residual projections / sqrt(2 L) ----
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      torch::Tensor& p = item.value();
      const std::string& name = item.key();
      if (name.find("ln") != std::string::npos || name.find("norm") != std::string::npos) continue;
      if (p.dim() == 1) {
        p.zero_();
      } else {
        p.normal_(0.0, 0.02);
      }
    }
    for (const auto& child : *blocks_) {
      for (auto& w : child.ptr<GptBlockImpl>()->residual_projections()) {
        w.normal_(0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(options.layers())));
      }
    }
  }

  // tokens [B, T] int64 in [0, vocab), T <= context -> logits [B * T, vocab]: row b * T + t predicts
  // token t + 1 of sequence b (flat, so the trainer's cross-entropy against targets [B * T] is the
  // next-token loss).
  torch::Tensor forward(torch::Tensor tokens) {
    FT_CHECK(tokens.dim() == 2 && tokens.size(1) <= context_,
             "gpt takes tokens [B, T] with T <= model.context = {}, got {}", context_, tokens.sizes());
    const int64_t length = tokens.size(1);
    auto positions = torch::arange(length, tokens.options().dtype(torch::kLong));
    auto x = dropout_->forward(token_embedding_->forward(tokens) + position_embedding_->forward(positions));
    x = blocks_->forward(x);
    x = norm(own_kernels_, final_norm_, x);  // [B, T, C], by the blocks' rule
    auto logits = linear(own_kernels_.linear, x, token_embedding_->weight, {});  // [B, T, vocab], tied
    return logits.reshape({-1, vocab_});
  }

 private:
  int64_t context_;
  int64_t vocab_;
  GptKernels own_kernels_;
  torch::nn::Embedding token_embedding_{nullptr}, position_embedding_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  Stage blocks_{nullptr};
  torch::nn::LayerNorm final_norm_{nullptr};
};

}  // namespace

Model make_gpt(const GptOptions& options, const DataShape& shape) {
  check_keys(options, "model");
  FT_CONFIG_CHECK(shape.vocabulary > 0 && shape.input.size() == 1,
                  "model 'gpt' takes token sequences [T] (data.dataset = \"text\"); the data gives {}",
                  shape.describe());
  FT_CONFIG_CHECK(options.embed() % options.heads() == 0,
                  "model.embed ({}) must be a multiple of model.heads ({})", options.embed(),
                  options.heads());
  return Model(std::make_shared<Gpt>(options, shape.vocabulary));
}

}  // namespace fasttrain
