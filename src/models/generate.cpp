#include "fasttrain/models/generate.h"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "fasttrain/data/text.h"
#include "fasttrain/data/transforms.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

std::string generate_text(const Model& model, const std::string& prompt, const GenerateOptions& options) {
  FT_CONFIG_CHECK(options.context() >= 1, "generate: context must be >= 1, got {}", options.context());
  FT_CONFIG_CHECK(options.max_new_tokens() >= 0, "generate: --tokens must be >= 0, got {}",
                  options.max_new_tokens());
  FT_CONFIG_CHECK(options.temperature() >= 0, "generate: --temperature must be >= 0, got {}",
                  options.temperature());
  FT_CONFIG_CHECK(options.top_k() >= 0 && options.top_k() <= kByteVocabulary,
                  "generate: --top-k must be in [0, {}], got {}", kByteVocabulary, options.top_k());
  torch::nn::Module& module = model.module();
  const bool was_training = module.is_training();
  module.eval();
  torch::NoGradGuard no_grad;
  const torch::Device device =
      module.parameters().empty() ? torch::kCPU : module.parameters().front().device();

  std::vector<int64_t> tokens;
  if (prompt.empty()) tokens.push_back(kEndOfDocument);
  for (unsigned char c : prompt) tokens.push_back(c);
  std::string text;
  std::vector<float> probabilities(kByteVocabulary);
  std::vector<int64_t> ranked(kByteVocabulary);
  for (int64_t step = 0; step < options.max_new_tokens(); ++step) {
    // ---- logits of the next byte from the last `context` tokens ----
    const int64_t length = std::min<int64_t>(options.context(), static_cast<int64_t>(tokens.size()));
    torch::Tensor window =
        torch::tensor(std::vector<int64_t>(tokens.end() - length, tokens.end()), torch::kLong)
            .view({1, length});
    Batch batch;
    batch.inputs = window.to(device);  // [1, T]
    torch::Tensor logits = model.forward(batch).tensor().select(0, length - 1).to(torch::kCPU, torch::kFloat);
    const float* raw = logits.data_ptr<float>();  // [V]

    // ---- pick: the argmax, or a draw from the top-k softmax at the temperature ----
    std::iota(ranked.begin(), ranked.end(), int64_t{0});
    std::stable_sort(ranked.begin(), ranked.end(), [&](int64_t a, int64_t b) { return raw[a] > raw[b]; });
    int64_t next = ranked[0];
    if (options.temperature() > 0) {
      const int64_t k = options.top_k() == 0 ? kByteVocabulary : options.top_k();
      double total = 0;
      for (int64_t i = 0; i < k; ++i) {
        probabilities[i] =
            static_cast<float>(std::exp((raw[ranked[i]] - raw[ranked[0]]) / options.temperature()));
        total += probabilities[i];
      }
      double draw = SampleRng(options.seed(), 0, static_cast<uint64_t>(step)).uniform() * total;
      next = ranked[k - 1];
      for (int64_t i = 0; i < k; ++i) {
        draw -= probabilities[i];
        if (draw < 0) {
          next = ranked[i];
          break;
        }
      }
    }
    if (options.stop_at_end_of_document() && next == kEndOfDocument) break;
    tokens.push_back(next);
    text.push_back(static_cast<char>(next));
  }
  module.train(was_training);
  return text;
}

}  // namespace fasttrain
