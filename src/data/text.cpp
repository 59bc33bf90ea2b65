#include "fasttrain/data/text.h"

#include <fmt/format.h>
#include <fnmatch.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace fs = std::filesystem;

namespace {

// Row `row` of a batch: inputs tokens[start, start + length), targets one position further.
void copy_shifted(const uint8_t* tokens, int64_t start, int64_t length, int64_t* inputs, int64_t* targets) {
  for (int64_t t = 0; t < length; ++t) {
    inputs[t] = tokens[start + t];
    targets[t] = tokens[start + t + 1];
  }
}

// FNV-1a: a stable hash of a document's relative path (std::hash may differ between libraries).
uint64_t stable_hash(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

std::vector<fs::path> matching_files(const TextCorpusOptions& options) {
  const fs::path root(options.path());
  std::error_code error;
  const fs::file_status status = fs::status(root, error);
  FT_CHECK(!error && fs::exists(status),
           "data.path '{}' does not exist (a directory of text files or one file)", options.path());
  std::vector<fs::path> files;
  auto matches = [&](const fs::path& file) {
    return fnmatch(options.include().c_str(), file.filename().c_str(), 0) == 0;
  };
  if (fs::is_regular_file(status)) {
    if (matches(root)) files.push_back(root);
  } else {
    FT_CHECK(fs::is_directory(status), "data.path '{}' is neither a directory nor a file", options.path());
    fs::recursive_directory_iterator it(root, error), end;
    FT_CHECK(!error, "data.path '{}' cannot be read: {}", options.path(), error.message());
    for (; it != end; it.increment(error)) {
      FT_CHECK(!error, "data.path '{}': cannot walk into {}: {}", options.path(), it->path().string(),
               error.message());
      if (it->is_regular_file(error) && matches(it->path())) files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());
  FT_CHECK(!files.empty(), "data.path '{}' has no file matching data.include = \"{}\"", options.path(),
           options.include());
  return files;
}

std::string read_document(const fs::path& file, int64_t max_bytes) {
  std::error_code error;
  const auto bytes = static_cast<int64_t>(fs::file_size(file, error));
  FT_CHECK(!error, "cannot read the size of {}: {}", file.string(), error.message());
  FT_CHECK(max_bytes == 0 || bytes <= max_bytes,
           "{} is {} bytes, more than the {} a text document may have: exclude it with data.include",
           file.string(), bytes, max_bytes);
  std::ifstream in(file, std::ios::binary);
  FT_CHECK(in.good(), "cannot open {} for reading", file.string());
  std::string text(static_cast<size_t>(bytes), '\0');
  in.read(text.data(), bytes);
  FT_CHECK(in.gcount() == bytes, "{}: read {} of its {} bytes", file.string(), in.gcount(), bytes);
  const void* nul = std::memchr(text.data(), kEndOfDocument, text.size());
  FT_CHECK(nul == nullptr, "{} has a 0 byte at offset {}: it is not text (exclude it with data.include)",
           file.string(), static_cast<const char*>(nul) - text.data());
  return text;
}

void append(TextCorpus& corpus, std::string name, const std::string& text, std::vector<uint8_t>& bytes) {
  bytes.insert(bytes.end(), text.begin(), text.end());
  bytes.push_back(kEndOfDocument);
  corpus.starts.push_back(static_cast<int64_t>(bytes.size()));
  corpus.names.push_back(std::move(name));
}

torch::Tensor to_tensor(std::vector<uint8_t>& bytes) {
  auto tensor = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(tensor.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return tensor;
}

}  // namespace

TextSplits load_text_corpus(const TextCorpusOptions& options) {
  FT_CONFIG_CHECK(options.val_fraction() > 0 && options.val_fraction() < 1,
                  "data.val_fraction must be in (0, 1), got {}", options.val_fraction());
  const std::vector<fs::path> files = matching_files(options);
  const fs::path root(options.path());
  const bool single_file = fs::is_regular_file(root);
  TextSplits splits;
  std::vector<uint8_t> train_bytes, validation_bytes;
  const auto threshold = static_cast<uint64_t>(options.val_fraction() * 1e9);
  for (const auto& file : files) {
    std::string name = single_file ? file.filename().string() : file.lexically_relative(root).string();
    const std::string text = read_document(file, options.max_file_bytes());
    const bool validation = stable_hash(name) % 1000000000ull < threshold;
    append(validation ? splits.validation : splits.train, std::move(name), text,
           validation ? validation_bytes : train_bytes);
  }
  auto check_split = [&](const TextCorpus& split, const char* which) {
    FT_CHECK(split.documents() > 0,
             "data.val_fraction = {} leaves no {} document among the {} files of '{}' matching \"{}\": {}",
             options.val_fraction(), which, files.size(), options.path(), options.include(),
             files.size() < 2 ? "a corpus needs at least two documents" : "change data.val_fraction");
  };
  check_split(splits.train, "training");
  check_split(splits.validation, "validation");
  splits.train.tokens = to_tensor(train_bytes);
  splits.validation.tokens = to_tensor(validation_bytes);
  return splits;
}

// ---- windows ----

TextWindowSource::TextWindowSource(TextCorpus corpus, int64_t context)
    : corpus_(std::move(corpus)), context_(context) {
  FT_CONFIG_CHECK(context_ >= 1, "model.context must be >= 1, got {}", context_);
  FT_CHECK(corpus_.tokens.defined() && corpus_.tokens.scalar_type() == torch::kUInt8,
           "TextWindowSource needs a corpus of uint8 tokens");
  FT_CHECK(corpus_.size() > context_,
           "a text corpus of {} tokens ({} documents) is too short for windows of "
           "model.context = {} tokens and their targets: lower model.context or add documents",
           corpus_.size(), corpus_.documents(), context_);
  corpus_.tokens = corpus_.tokens.contiguous();
  windows_ = (corpus_.size() - 1) / context_;
}

DataShape TextWindowSource::shape() const {
  return DataShape::tokens(context_, kByteVocabulary);
}

std::string TextWindowSource::describe() const {
  return fmt::format("{} windows of {} tokens over {} documents ({} bytes)", windows_, context_,
                     corpus_.documents(), corpus_.size());
}

Batch TextWindowSource::build(const BatchRequest& request) const {
  const int64_t count = request.count, length = context_;
  const auto options = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(request.pinned);
  Batch batch;
  batch.count = count * length;
  batch.inputs = torch::empty({count, length}, options);    // [B, T]
  batch.targets = torch::empty({count * length}, options);  // [B * T]
  const uint8_t* tokens = corpus_.tokens.data_ptr<uint8_t>();
  int64_t* inputs = batch.inputs.data_ptr<int64_t>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  const auto positions = static_cast<uint64_t>(corpus_.size() - length);  // starts with a full target
  for (int64_t i = 0; i < count; ++i) {
    if (request.abandoned()) return batch;
    const int64_t sample = request.samples[i];
    const int64_t start =
        request.shuffle ? static_cast<int64_t>(SampleRng(request.seed, static_cast<uint64_t>(request.epoch),
                                                         static_cast<uint64_t>(sample))
                                                   .below(positions))
                        : sample * length;
    copy_shifted(tokens, start, length, inputs + i * length, targets + i * length);
  }
  return batch;
}

// ---- documents ----

void check_token_budget(int64_t max_tokens, int64_t context) {
  FT_CONFIG_CHECK(
      max_tokens == 0 || max_tokens >= context,
      "data.max_tokens = {} cannot hold one sequence of model.context = {} tokens: use at least {} "
      "(or 0: batches of data.batch_size documents)",
      max_tokens, context, context);
}

TextDocumentSource::TextDocumentSource(TextCorpus corpus, TextDocumentOptions options)
    : corpus_(std::move(corpus)), options_(std::move(options)) {
  const int64_t context = options_.context();
  FT_CONFIG_CHECK(context >= 1, "model.context must be >= 1, got {}", context);
  check_token_budget(options_.max_tokens(), context);
  FT_CHECK(corpus_.tokens.defined() && corpus_.tokens.scalar_type() == torch::kUInt8,
           "TextDocumentSource needs a corpus of uint8 tokens");
  corpus_.tokens = corpus_.tokens.contiguous();
  // Document [s, e) has e - s - 1 targets (its last token, the end of document, is only a target).
  for (int64_t d = 0; d < corpus_.documents(); ++d) {
    const int64_t last = corpus_.starts[d + 1] - 1;
    for (int64_t start = corpus_.starts[d]; start < last; start += context)
      pieces_.push_back({start, std::min(context, last - start)});
  }
  FT_CHECK(!pieces_.empty(), "the text corpus has no document with at least one target");
}

DataShape TextDocumentSource::shape() const {
  return DataShape::tokens(options_.context(), kByteVocabulary);
}

Batch TextDocumentSource::largest_batch(int64_t batch_size) const {
  const int64_t context = options_.context();
  const int64_t sequences = options_.max_tokens() > 0 ? options_.max_tokens() / context : batch_size;
  Batch batch;
  batch.inputs = torch::zeros({sequences, context}, torch::kLong);  // [B, T]
  batch.targets = torch::zeros({sequences * context}, torch::kLong);
  batch.count = sequences * context;
  return batch;
}

std::string TextDocumentSource::describe() const {
  return fmt::format("{} documents in {} pieces of <= {} tokens ({} bytes){}", corpus_.documents(),
                     pieces_.size(), options_.context(), corpus_.size(),
                     options_.max_tokens() > 0
                         ? fmt::format(", length-bucketed under {} tokens per batch", options_.max_tokens())
                         : std::string(", random batches"));
}

std::optional<EpochPlan> TextDocumentSource::batch_plan(int64_t epoch, bool shuffle, uint64_t seed) const {
  if (options_.max_tokens() == 0) return std::nullopt;
  // ---- sort by length; equal lengths in an order drawn per epoch ----
  const int64_t n = size();
  std::vector<std::pair<int64_t, uint64_t>> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t tie = shuffle
                             ? SampleRng(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(i)).next()
                             : static_cast<uint64_t>(i);
    keys[static_cast<size_t>(i)] = {pieces_[static_cast<size_t>(i)].length, tie};
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });

  // ---- pack greedily: ascending, so the newest piece is the batch's longest ----
  EpochPlan sorted;
  int64_t first = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t longest = pieces_[static_cast<size_t>(order[i])].length;
    if (i > first && (i - first + 1) * longest > options_.max_tokens()) {
      sorted.add_batch(order.data() + first, i - first);
      first = i;
    }
  }
  sorted.add_batch(order.data() + first, n - first);
  if (!shuffle) return sorted;

  // ---- batches in an order drawn per epoch (long and short ones mixed over the epoch) ----
  EpochPlan plan;
  plan.samples.reserve(sorted.samples.size());
  for (int64_t b : shuffled_order(sorted.batches(), seed, epoch)) {
    plan.add_batch(sorted.samples.data() + sorted.starts[b], sorted.starts[b + 1] - sorted.starts[b]);
  }
  return plan;
}

Batch TextDocumentSource::build(const BatchRequest& request) const {
  const int64_t count = request.count;
  int64_t longest = 0, real = 0;
  for (int64_t i = 0; i < count; ++i) {
    longest = std::max(longest, pieces_[static_cast<size_t>(request.samples[i])].length);
    real += pieces_[static_cast<size_t>(request.samples[i])].length;
  }
  const auto options = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(request.pinned);
  Batch batch;
  batch.count = real;
  batch.padded = real < count * longest;
  batch.inputs = torch::empty({count, longest}, options);    // [B, T], padding 0
  batch.targets = torch::empty({count * longest}, options);  // [B * T], padding kIgnoreTarget
  const uint8_t* tokens = corpus_.tokens.data_ptr<uint8_t>();
  int64_t* inputs = batch.inputs.data_ptr<int64_t>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  std::fill(inputs, inputs + count * longest, int64_t{0});
  std::fill(targets, targets + count * longest, kIgnoreTarget);
  for (int64_t i = 0; i < count; ++i) {
    if (request.abandoned()) return batch;
    const Piece& piece = pieces_[static_cast<size_t>(request.samples[i])];
    copy_shifted(tokens, piece.start, piece.length, inputs + i * longest, targets + i * longest);
  }
  return batch;
}

double padding_fraction(const TextDocumentSource& source, const EpochPlan& plan) {
  double slots = 0, real = 0;
  for (int64_t b = 0; b < plan.batches(); ++b) {
    int64_t longest = 0;
    for (int64_t i = plan.starts[b]; i < plan.starts[b + 1]; ++i) {
      longest = std::max(longest, source.length(plan.samples[i]));
      real += static_cast<double>(source.length(plan.samples[i]));
    }
    slots += static_cast<double>(longest * (plan.starts[b + 1] - plan.starts[b]));
  }
  return slots > 0 ? 1.0 - real / slots : 0.0;
}

}  // namespace fasttrain
