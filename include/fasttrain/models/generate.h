#pragma once
// Sampling text from a trained gpt model, one byte at a time.
//
//   std::string text = fasttrain::generate_text(model, "def main(", fasttrain::GenerateOptions(128));
//
// Each step runs the model on the last `context` tokens (no key-value cache: at byte-level contexts
// of a few hundred tokens a full forward is cheap) and draws the next byte from the softmax of its
// logits / temperature, restricted to the top_k most likely. Draws come from a generator keyed on
// (seed, step): the same options give the same text.
#include <cstdint>
#include <string>

#include "fasttrain/models/model.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct GenerateOptions {
  // The model's model.context: the longest window it was trained on.
  explicit GenerateOptions(int64_t context) : context_(context) {}
  FT_ARG(int64_t, context);
  // Bytes to generate (after the prompt).
  FT_ARG(int64_t, max_new_tokens) = 256;
  // 0 = greedy (always the most likely byte); higher is more random.
  FT_ARG(double, temperature) = 0.8;
  // Sample among the k most likely bytes; 0 = all.
  FT_ARG(int64_t, top_k) = 40;
  FT_ARG(uint64_t, seed) = 0;
  // Stop at the end-of-document token (not included in the text).
  FT_ARG(bool, stop_at_end_of_document) = true;
};

// The generated continuation of `prompt` (not including it). The model is run in eval mode under
// no-grad on its own device; an empty prompt starts from the end-of-document token, as a new
// document does. Bad options are a ConfigError naming them.
std::string generate_text(const Model& model, const std::string& prompt, const GenerateOptions& options);

}  // namespace fasttrain
