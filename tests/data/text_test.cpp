// Text corpus and its batch sources: reading and splitting documents, windows, token-count buckets
// with padding, sharding planned batches over ranks, and the errors a bad corpus gets.
#include "fasttrain/data/text.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "data/data_test_util.h"
#include "fasttrain/data/loader.h"

namespace fasttrain {
namespace {

using testing::epoch_batches;

using testing::contains_all;
using testing::error_message;
using testing::TempDir;

void write_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// `count` documents of lengths 1 + (i * 37) % max_length under dir/src (some in a subdirectory),
// plus files the include pattern leaves out.
std::map<std::string, std::string> write_corpus(const TempDir& dir, int count, int max_length = 300) {
  std::map<std::string, std::string> documents;
  for (int i = 0; i < count; ++i) {
    std::string text;
    const int length = 1 + (i * 37) % max_length;
    for (int j = 0; j < length; ++j) text.push_back(static_cast<char>('a' + (i + j * 7) % 26));
    const std::string name = (i % 3 == 0 ? "pkg/doc" : "doc") + std::to_string(i) + ".py";
    write_file(dir.file("src/" + name), text);
    documents[name] = text;
  }
  write_file(dir.file("src/README.txt"), "not a document");
  return documents;
}

TextCorpus corpus_of(const std::vector<std::string>& documents) {
  TextCorpus corpus;
  std::vector<uint8_t> bytes;
  for (size_t d = 0; d < documents.size(); ++d) {
    bytes.insert(bytes.end(), documents[d].begin(), documents[d].end());
    bytes.push_back(kEndOfDocument);
    corpus.starts.push_back(static_cast<int64_t>(bytes.size()));
    corpus.names.push_back("doc" + std::to_string(d));
  }
  corpus.tokens = torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
  return corpus;
}

std::string document_text(const TextCorpus& corpus, int64_t d) {
  const uint8_t* tokens = corpus.tokens.data_ptr<uint8_t>();
  return std::string(tokens + corpus.starts[d], tokens + corpus.starts[d + 1] - 1);
}

TEST(TextCorpus, ReadsMatchingFilesAsDocumentsAndSplitsThemByPath) {
  TempDir dir;
  const auto documents = write_corpus(dir, 40);
  const TextSplits text =
      load_text_corpus(TextCorpusOptions(dir.file("src")).include("*.py").val_fraction(0.25));
  EXPECT_EQ(text.train.documents() + text.validation.documents(), 40);
  EXPECT_GT(text.validation.documents(), 2);
  EXPECT_GT(text.train.documents(), 20);
  for (const TextCorpus* split : {&text.train, &text.validation}) {
    int64_t bytes = 0;
    for (int64_t d = 0; d < split->documents(); ++d) {
      ASSERT_TRUE(documents.count(split->names[d])) << split->names[d];
      EXPECT_EQ(document_text(*split, d), documents.at(split->names[d]));
      EXPECT_EQ(split->tokens[split->starts[d + 1] - 1].item<int>(), kEndOfDocument);
      bytes += static_cast<int64_t>(documents.at(split->names[d]).size()) + 1;
    }
    EXPECT_EQ(split->size(), bytes);
  }
  // The split is a function of the paths alone: a new file does not move the others.
  write_file(dir.file("src/zzz_new.py"), "print(1)\n");
  const TextSplits again =
      load_text_corpus(TextCorpusOptions(dir.file("src")).include("*.py").val_fraction(0.25));
  std::set<std::string> validation(text.validation.names.begin(), text.validation.names.end());
  std::set<std::string> validation_again(again.validation.names.begin(), again.validation.names.end());
  validation_again.erase("zzz_new.py");
  EXPECT_EQ(validation, validation_again);
}

TEST(TextCorpus, BadCorpusIsAClearErrorNamingIt) {
  TempDir dir;
  write_corpus(dir, 10);
  EXPECT_TRUE(contains_all(error_message([&] { load_text_corpus(TextCorpusOptions(dir.file("missing"))); }),
                           {"data.path", dir.file("missing"), "does not exist"}));
  EXPECT_TRUE(contains_all(
      error_message([&] { load_text_corpus(TextCorpusOptions(dir.file("src")).include("*.rs")); }),
      {"no file matching", "*.rs", dir.file("src")}));
  EXPECT_TRUE(contains_all(
      error_message([&] { load_text_corpus(TextCorpusOptions(dir.file("src")).val_fraction(1.5)); }),
      {"data.val_fraction", "1.5"}));
  EXPECT_TRUE(contains_all(
      error_message([&] { load_text_corpus(TextCorpusOptions(dir.file("src/doc1.py")).include("*.py")); }),
      {"no validation document", "at least two documents"}));
  write_file(dir.file("src/binary.py"), std::string("abc\0def", 7));
  EXPECT_TRUE(contains_all(
      error_message([&] { load_text_corpus(TextCorpusOptions(dir.file("src")).include("*.py")); }),
      {"binary.py", "0 byte at offset 3", "not text"}));
  std::filesystem::remove(dir.file("src/binary.py"));
  EXPECT_TRUE(contains_all(error_message([&] {
                             load_text_corpus(
                                 TextCorpusOptions(dir.file("src")).include("*.py").max_file_bytes(100));
                           }),
                           {"bytes, more than the 100"}));
}

TEST(TextWindows, TargetsAreTheNextTokensAndBatchesAreTheSameForAnyWorkerCount) {
  const TextCorpus corpus = corpus_of({"the quick brown fox", "jumps over", "the lazy dog again and again"});
  const int64_t context = 8;
  auto source = std::make_shared<TextWindowSource>(corpus, context);
  EXPECT_EQ(source->size(), (corpus.size() - 1) / context);
  DataLoader serial(source, LoaderOptions(2).workers(0).seed(3));
  DataLoader threaded(source, LoaderOptions(2).workers(2).seed(3));
  const auto a = epoch_batches(serial, 1), b = epoch_batches(threaded, 1);
  ASSERT_EQ(a.size(), b.size());
  const std::string all(corpus.tokens.data_ptr<uint8_t>(), corpus.tokens.data_ptr<uint8_t>() + corpus.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].inputs, b[i].inputs));
    ASSERT_EQ(a[i].inputs.sizes(), (torch::IntArrayRef{2, context}));
    ASSERT_EQ(a[i].targets.sizes(), (torch::IntArrayRef{2 * context}));
    EXPECT_EQ(a[i].count, 2 * context);
    EXPECT_FALSE(a[i].padded);
    for (int64_t row = 0; row < 2; ++row) {
      // The window is a piece of the corpus, and its targets are the same piece one further.
      std::string input, target;
      for (int64_t t = 0; t < context; ++t) {
        input.push_back(static_cast<char>(a[i].inputs[row][t].item<int64_t>()));
        target.push_back(static_cast<char>(a[i].targets[row * context + t].item<int64_t>()));
      }
      const size_t at = all.find(input + target.back());
      ASSERT_NE(at, std::string::npos);
      EXPECT_EQ(all.substr(at + 1, context), target);
    }
  }
  EXPECT_FALSE(torch::equal(epoch_batches(serial, 2)[0].inputs, a[0].inputs));  // new windows each epoch
  // Without shuffling the windows tile the corpus from its start.
  DataLoader tiled(source, LoaderOptions(1).workers(0).shuffle(false));
  const auto tiles = epoch_batches(tiled, 0);
  for (size_t i = 0; i < tiles.size(); ++i) {
    EXPECT_TRUE(torch::equal(tiles[i].inputs[0],
                             corpus.tokens.slice(0, i * context, (i + 1) * context).to(torch::kLong)));
  }
  EXPECT_TRUE(contains_all(error_message([&] { TextWindowSource(corpus_of({"short"}), 8); }),
                           {"6 tokens", "model.context = 8"}));
}

TEST(TextDocuments, BucketsRespectTheTokenBudgetCoverEveryPieceOnceAndPadWithIgnoredTargets) {
  std::vector<std::string> documents;
  for (int i = 0; i < 60; ++i)
    documents.push_back(std::string(1 + (i * 53) % 90, static_cast<char>('a' + i % 26)));
  const TextCorpus corpus = corpus_of(documents);
  const int64_t context = 32, budget = 128;
  auto source = std::make_shared<TextDocumentSource>(corpus, TextDocumentOptions(context).max_tokens(budget));
  // Pieces: each document's targets cut at the context.
  int64_t targets = 0;
  for (const auto& d : documents) targets += static_cast<int64_t>(d.size());  // + end of document - 1
  int64_t piece_targets = 0;
  for (int64_t p = 0; p < source->size(); ++p) piece_targets += source->length(p);
  EXPECT_EQ(piece_targets, targets);

  DataLoader loader(source, LoaderOptions(1).workers(2).seed(5));
  for (int64_t epoch : {0, 1}) {
    int64_t real = 0;
    std::multiset<std::string> seen;
    std::set<int64_t> sizes;
    for (const Batch& batch : epoch_batches(loader, epoch)) {
      const int64_t rows = batch.inputs.size(0), longest = batch.inputs.size(1);
      EXPECT_LE(rows * longest, budget);
      EXPECT_LE(longest, context);
      EXPECT_EQ(batch.targets.numel(), rows * longest);
      const torch::Tensor valid = batch.targets.ne(kIgnoreTarget);
      EXPECT_EQ(valid.sum().item<int64_t>(), batch.count);
      EXPECT_EQ(batch.padded, batch.count < rows * longest);
      // Padding: inputs 0 after each row's real tokens, and targets ignored exactly there.
      EXPECT_TRUE(torch::equal(batch.inputs.masked_select(~valid.view({rows, longest})),
                               torch::zeros({rows * longest - batch.count}, torch::kLong)));
      for (int64_t r = 0; r < rows; ++r) {
        std::string row;
        for (int64_t t = 0; t < longest && valid[r * longest + t].item<bool>(); ++t)
          row.push_back(static_cast<char>(batch.inputs[r][t].item<int64_t>()));
        seen.insert(row);
      }
      real += batch.count;
      sizes.insert(rows);
    }
    EXPECT_EQ(real, targets);                                      // every target once
    EXPECT_EQ(static_cast<int64_t>(seen.size()), source->size());  // every piece once
    EXPECT_GT(sizes.size(), 1u);                                   // short pieces share batches
  }
  // The same lengths every epoch, so the same batch count; the shuffle changes which batch comes first.
  const EpochPlan e0 = loader.epoch_plan(0), e1 = loader.epoch_plan(1);
  EXPECT_EQ(e0.batches(), e1.batches());
  EXPECT_NE(e0.samples, e1.samples);
  // Bucketing wastes far less than random batches of the same worst-case size.
  auto random = std::make_shared<TextDocumentSource>(corpus, TextDocumentOptions(context));
  DataLoader random_loader(random, LoaderOptions(budget / context).seed(5));
  const double bucketed = padding_fraction(*source, e0),
               unbucketed = padding_fraction(*random, random_loader.epoch_plan(0));
  EXPECT_LT(bucketed, 0.1);
  EXPECT_GT(unbucketed, 2 * bucketed + 0.1);
  EXPECT_TRUE(contains_all(
      error_message([&] { TextDocumentSource(corpus, TextDocumentOptions(context).max_tokens(16)); }),
      {"data.max_tokens = 16", "model.context = 32"}));
}

TEST(TextDocuments, PlannedBatchesAreDealtWholeToRanks) {
  std::vector<std::string> documents;
  for (int i = 0; i < 25; ++i) documents.push_back(std::string(1 + (i * 29) % 60, 'x'));
  auto source =
      std::make_shared<TextDocumentSource>(corpus_of(documents), TextDocumentOptions(16).max_tokens(48));
  DataLoader whole(source, LoaderOptions(1).seed(2));
  const EpochPlan all = whole.epoch_plan(3);
  for (bool even : {true, false}) {
    std::vector<int64_t> dealt_batches;
    for (int64_t rank = 0; rank < 3; ++rank) {
      DataLoader shard(source, LoaderOptions(1).seed(2).rank(rank).world_size(3).even_shards(even));
      const EpochPlan mine = shard.epoch_plan(3);
      for (int64_t b = 0; b < mine.batches(); ++b) {
        const int64_t global = (rank + 3 * b) % all.batches();
        EXPECT_EQ(std::vector<int64_t>(mine.samples.begin() + mine.starts[b],
                                       mine.samples.begin() + mine.starts[b + 1]),
                  std::vector<int64_t>(all.samples.begin() + all.starts[global],
                                       all.samples.begin() + all.starts[global + 1]));
      }
      dealt_batches.push_back(mine.batches());
      EXPECT_EQ(shard.batches_per_epoch(), mine.batches());
    }
    const int64_t total = dealt_batches[0] + dealt_batches[1] + dealt_batches[2];
    if (even) {
      EXPECT_EQ(dealt_batches[0], dealt_batches[2]);  // ranks step together
      EXPECT_EQ(total, (all.batches() + 2) / 3 * 3);
    } else {
      EXPECT_EQ(total, all.batches());  // evaluation: each batch once
    }
  }
}

}  // namespace
}  // namespace fasttrain

namespace fasttrain {
namespace {

TEST(TextWindows, CannotBeDeviceResidentAndSaysSo) {
  const TextCorpus corpus = corpus_of({"the quick brown fox", "jumps over", "the lazy dog again and again"});
  auto source = std::make_shared<TextWindowSource>(corpus, 8);
  EXPECT_EQ(source->resident_bytes(), 0);
  const std::string message =
      testing::error_message([&] { DataLoader loader(source, LoaderOptions(2).device_resident(true)); });
  EXPECT_TRUE(testing::contains_all(message, {"data.device_resident", "set data.device_resident = false"}))
      << message;
}

}  // namespace
}  // namespace fasttrain
