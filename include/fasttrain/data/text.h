#pragma once
// Byte-level text: a corpus of documents read from files, and the two ways a GPT batches it.
//
//   fasttrain::TextSplits text = fasttrain::load_text_corpus(
//       fasttrain::TextCorpusOptions("/usr/lib/python3.11").include("*.py").val_fraction(0.05));
//   auto windows = std::make_shared<fasttrain::TextWindowSource>(text.train, /*context=*/128);
//   fasttrain::DataLoader loader(windows, fasttrain::LoaderOptions(32));   // tokens [32, 128]
//
//   auto documents = std::make_shared<fasttrain::TextDocumentSource>(
//       text.train, fasttrain::TextDocumentOptions(/*context=*/128).max_tokens(4096));
//   fasttrain::DataLoader buckets(documents, fasttrain::LoaderOptions(1));  // [B, T<=128], B*T<=4096
//
// Tokens are the bytes of the files (vocabulary 256); every document is followed by a 0 byte, the
// end-of-document token (source text has no NUL bytes). A batch is inputs [B, T] int64 and targets
// [B * T]: target b * T + t is the token after input (b, t).
#include <cstdint>
#include <string>
#include <vector>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

// The end-of-document token, after every document.
constexpr uint8_t kEndOfDocument = 0;
constexpr int64_t kByteVocabulary = 256;

struct TextCorpus {
  // Every document's bytes then kEndOfDocument, back to back: [N] uint8, CPU, contiguous.
  torch::Tensor tokens;
  // Document d is tokens[starts[d], starts[d + 1]) (its end-of-document token included).
  std::vector<int64_t> starts{0};
  std::vector<std::string> names;  // each document's path relative to the corpus root

  int64_t documents() const { return static_cast<int64_t>(names.size()); }
  int64_t size() const { return starts.back(); }  // tokens
};

struct TextSplits {
  TextCorpus train;
  TextCorpus validation;
};

struct TextCorpusOptions {
  explicit TextCorpusOptions(std::string path) : path_(std::move(path)) {}
  // A directory, walked recursively (sorted, symlinks not followed), or one file.
  FT_ARG(std::string, path);
  // Files whose name matches this shell pattern (fnmatch: *, ?, [...]) are documents.
  FT_ARG(std::string, include) = "*";
  // Documents go to validation by a hash of their relative path: the split is the same on every
  // machine and does not move when files are added. Each split must get at least one document.
  FT_ARG(double, val_fraction) = 0.05;
  // Files larger than this are an error (a corpus of text, not a disk image); 0 = no limit.
  FT_ARG(int64_t, max_file_bytes) = int64_t{64} << 20;
};

// Reads the corpus. A missing path, no matching file, an unreadable or oversized file, a file with
// a 0 byte (not text), or an empty split is an error naming the path and the value.
TextSplits load_text_corpus(const TextCorpusOptions& options);

// Random fixed-length windows: sample i of an epoch is T tokens from a position drawn from (seed,
// epoch, i), anywhere in the corpus (across document boundaries, as GPT-2 trained). Without
// shuffling (evaluation) window i starts at i * T: the corpus tiled once. size() = (N - 1) / T.
class TextWindowSource : public BatchSource {
 public:
  TextWindowSource(TextCorpus corpus, int64_t context);

  int64_t size() const override { return windows_; }
  Batch build(const BatchRequest& request) const override;
  DataShape shape() const override;
  std::string describe() const override;

 private:
  TextCorpus corpus_;
  int64_t context_;
  int64_t windows_;
};

struct TextDocumentOptions {
  explicit TextDocumentOptions(int64_t context) : context_(context) {}
  // The longest sequence; longer documents are cut into pieces of this many targets.
  FT_ARG(int64_t, context);
  // Token budget of a batch: B x (its longest sequence) <= max_tokens, padding included. 0 = no
  // bucketing: the loader's batch_size documents per batch in random order, padded to the longest
  // (random batching, the baseline bucketing is measured against).
  FT_ARG(int64_t, max_tokens) = 0;
};

// A ConfigError naming data.max_tokens and model.context unless max_tokens is 0 (no bucketing) or
// holds one sequence of `context` tokens.
void check_token_budget(int64_t max_tokens, int64_t context);

// Whole documents (or their pieces), padded on the right to the batch's longest: padding inputs are
// 0 and padding targets kIgnoreTarget. With causal attention a real position never attends to the
// padding after it, so no attention mask is needed; the loss skips the padding targets.
//
// Length bucketing (max_tokens > 0): pieces are sorted by length (ties broken at random per epoch)
// and packed greedily under the token budget, then the batches are shuffled. The lengths, hence the
// batches' sizes and count, are the same every epoch; which pieces share a batch is not.
class TextDocumentSource : public BatchSource {
 public:
  TextDocumentSource(TextCorpus corpus, TextDocumentOptions options);

  int64_t size() const override { return static_cast<int64_t>(pieces_.size()); }
  Batch build(const BatchRequest& request) const override;
  std::optional<EpochPlan> batch_plan(int64_t epoch, bool shuffle, uint64_t seed) const override;
  bool fixed_shape() const override { return false; }  // padded to each batch's longest piece
  DataShape shape() const override;
  // The most tokens at the longest sequences (attention's [B, H, T, T] scores are largest there):
  // max_tokens / context full-length sequences, or batch_size of them without bucketing.
  Batch largest_batch(int64_t batch_size) const override;
  std::string describe() const override;

  // Targets of piece i (its tokens - 1).
  int64_t length(int64_t piece) const { return pieces_[piece].length; }

 private:
  struct Piece {
    int64_t start;   // first input token in the corpus
    int64_t length;  // targets: inputs are tokens[start, start + length), targets one further
  };
  TextCorpus corpus_;
  TextDocumentOptions options_;
  std::vector<Piece> pieces_;
};

// Padding in an epoch's batches: the fraction of target slots that are padding.
double padding_fraction(const TextDocumentSource& source, const EpochPlan& plan);

}  // namespace fasttrain
