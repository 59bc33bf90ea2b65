// IDX parsing: valid raw and gzip files, and every kind of corruption rejected with a message that
// names the file, the offset, and what was expected vs found.
#include "fasttrain/data/idx.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;
using testing::gzip;
using testing::idx_bytes;
using testing::pattern;
using testing::TempDir;
using testing::write_bytes;

TEST(Idx, ReadsRawImages) {
  TempDir dir;
  const auto data = pattern(3 * 2 * 4);
  const std::string path = dir.file("images");
  write_bytes(path, idx_bytes({3, 2, 4}, data));
  const torch::Tensor t = read_idx(path);
  ASSERT_EQ(t.scalar_type(), torch::kUInt8);
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{3, 2, 4}));
  ASSERT_TRUE(t.is_contiguous());
  for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(t.data_ptr<uint8_t>()[i], data[i]) << i;
  EXPECT_EQ(t[2][1][3].item<int>(), data[23]);
}

TEST(Idx, ReadsGzipLikeRawWhateverTheName) {
  TempDir dir;
  const auto bytes = idx_bytes({5}, {9, 1, 0, 4, 255});
  write_bytes(dir.file("labels"), bytes);
  write_bytes(dir.file("labels.gz"), gzip(bytes));
  write_bytes(dir.file("labels.bin"), gzip(bytes));  // detected by the magic, not the name
  const torch::Tensor raw = read_idx(dir.file("labels"), 1);
  EXPECT_TRUE(torch::equal(raw, read_idx(dir.file("labels.gz"), 1)));
  EXPECT_TRUE(torch::equal(raw, read_idx(dir.file("labels.bin"))));
  EXPECT_EQ(raw[4].item<int>(), 255);
  EXPECT_EQ(read_file_bytes(dir.file("labels.gz")), bytes);
}

TEST(Idx, ReadsConcatenatedGzipMembers) {
  TempDir dir;
  const auto bytes = idx_bytes({2, 3, 3}, pattern(18));
  const std::vector<uint8_t> first(bytes.begin(), bytes.begin() + 10);
  const std::vector<uint8_t> second(bytes.begin() + 10, bytes.end());
  auto both = gzip(first);
  const auto tail = gzip(second);
  both.insert(both.end(), tail.begin(), tail.end());
  write_bytes(dir.file("cat.gz"), both);
  EXPECT_EQ(read_file_bytes(dir.file("cat.gz")), bytes);
}

TEST(Idx, ReadsALargeGzipFileThatOutgrowsTheFirstGuess) {
  // Highly compressible: the output buffer has to grow many times.
  TempDir dir;
  const auto bytes = idx_bytes({64, 100, 100}, std::vector<uint8_t>(640000, 17));
  write_bytes(dir.file("big.gz"), gzip(bytes));
  const torch::Tensor t = read_idx(dir.file("big.gz"), 3);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{64, 100, 100}));
  EXPECT_EQ(t.sum().item<int64_t>(), 640000 * 17);
}

TEST(Idx, BadMagic) {
  TempDir dir;
  auto bytes = idx_bytes({2}, {1, 2});
  bytes[0] = 0x01;
  write_bytes(dir.file("magic"), bytes);
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("magic")); }),
                           {dir.file("magic"), "bad magic", "offset 0", "expected 00 00", "found 01 00"}));
}

TEST(Idx, WrongTypeCode) {
  TempDir dir;
  write_bytes(dir.file("floats"), idx_bytes({1}, {0, 0, 0, 0}, 0x0D));
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("floats")); }),
                           {dir.file("floats"), "offset 2", "expected 0x08", "found 0x0d", "float32"}));
}

TEST(Idx, WrongRankLabelsGivenAsImages) {
  TempDir dir;
  write_bytes(dir.file("labels"), idx_bytes({4}, {0, 1, 2, 3}));
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("labels"), 3); }),
                           {dir.file("labels"), "wrong rank", "offset 3", "expected 3", "found 1"}));
  // And the other way round.
  write_bytes(dir.file("images"), idx_bytes({1, 2, 2}, {0, 1, 2, 3}));
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("images"), 1); }),
                           {dir.file("images"), "offset 3", "expected 1", "found 3"}));
}

TEST(Idx, ZeroRank) {
  TempDir dir;
  write_bytes(dir.file("rank0"), {0, 0, 8, 0});
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("rank0")); }),
                           {dir.file("rank0"), "offset 3", "found 0"}));
}

TEST(Idx, ZeroDimension) {
  TempDir dir;
  write_bytes(dir.file("zero"), idx_bytes({3, 0, 2}, {}));
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("zero")); }),
                           {dir.file("zero"), "dimension 1", "offset 8", "is 0"}));
}

TEST(Idx, TruncatedData) {
  TempDir dir;
  auto bytes = idx_bytes({3, 2, 4}, pattern(24));
  bytes.resize(bytes.size() - 4);
  write_bytes(dir.file("short"), bytes);
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("short")); }),
                           {dir.file("short"), "truncated data", "3x2x4", "need 24 data bytes",
                            "16-byte header", "ending at offset 40", "found 20", "ends at offset 36"}));
}

TEST(Idx, TrailingBytes) {
  TempDir dir;
  auto bytes = idx_bytes({3}, {1, 2, 3});
  bytes.push_back(0);
  bytes.push_back(0);
  write_bytes(dir.file("long"), bytes);
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("long")); }),
                           {dir.file("long"), "trailing bytes", "need 3 data bytes", "ending at offset 11",
                            "found 5", "ends at offset 13"}));
}

TEST(Idx, HugeDimensionsAreTruncationNotOverflow) {
  TempDir dir;
  write_bytes(dir.file("huge"), idx_bytes({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {1, 2, 3}));
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("huge")); }),
                           {dir.file("huge"), "truncated data", "more than 2^64", "found 3"}));
}

TEST(Idx, TruncatedHeader) {
  TempDir dir;
  auto bytes = idx_bytes({60000, 28, 28}, {});
  bytes.resize(8);
  write_bytes(dir.file("header"), bytes);
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("header")); }),
                           {dir.file("header"), "truncated header", "rank 3", "16-byte header", "found 8"}));
  write_bytes(dir.file("magic-only"), {0, 0});
  EXPECT_TRUE(
      contains_all(error_message([&] { read_idx(dir.file("magic-only")); }),
                   {dir.file("magic-only"), "truncated header", "offset 0", "4-byte magic", "found 2"}));
}

TEST(Idx, EmptyFile) {
  TempDir dir;
  write_bytes(dir.file("empty"), {});
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("empty")); }),
                           {dir.file("empty"), "empty file", "offset 0"}));
}

TEST(Idx, MissingFile) {
  TempDir dir;
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("absent.gz")); }),
                           {dir.file("absent.gz"), "no such file"}));
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.path()); }), {dir.path(), "is a directory"}));
}

TEST(Idx, CorruptGzipStream) {
  TempDir dir;
  auto compressed = gzip(idx_bytes({200, 10, 10}, pattern(20000, 13, 5)));
  // Scramble the middle of the deflate data; the CRC trailer catches whatever the decoder does not.
  for (size_t i = compressed.size() / 3; i < compressed.size() / 3 + 24; ++i) compressed[i] ^= 0x5A;
  write_bytes(dir.file("corrupt.gz"), compressed);
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("corrupt.gz")); }),
                           {dir.file("corrupt.gz"), "corrupt gzip stream", "compressed byte offset"}));
}

TEST(Idx, CorruptGzipChecksum) {
  TempDir dir;
  auto compressed = gzip(idx_bytes({4}, {1, 2, 3, 4}));
  compressed[compressed.size() - 6] ^= 0xFF;  // inside the CRC-32 trailer
  write_bytes(dir.file("crc.gz"), compressed);
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("crc.gz")); }),
                           {dir.file("crc.gz"), "corrupt gzip stream", "incorrect data check"}));
}

TEST(Idx, TruncatedGzipStream) {
  TempDir dir;
  auto compressed = gzip(idx_bytes({100, 10, 10}, pattern(10000, 13, 5)));
  compressed.resize(compressed.size() / 2);
  write_bytes(dir.file("cut.gz"), compressed);
  EXPECT_TRUE(contains_all(
      error_message([&] { read_idx(dir.file("cut.gz")); }),
      {dir.file("cut.gz"), "truncated gzip stream", fmt::format("offset {}", compressed.size())}));
}

TEST(Idx, GarbageAfterGzipStream) {
  TempDir dir;
  auto compressed = gzip(idx_bytes({2}, {1, 2}));
  const size_t end = compressed.size();
  compressed.push_back(0x42);
  write_bytes(dir.file("tail.gz"), compressed);
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("tail.gz")); }),
                           {dir.file("tail.gz"), "trailing garbage", fmt::format("offset {}", end)}));
}

TEST(Idx, ErrorsInsideGzipFilesSayTheOffsetsAreDecompressed) {
  TempDir dir;
  auto bytes = idx_bytes({3}, {1, 2, 3});
  bytes.pop_back();
  write_bytes(dir.file("short.gz"), gzip(bytes));
  EXPECT_TRUE(contains_all(error_message([&] { read_idx(dir.file("short.gz")); }),
                           {dir.file("short.gz"), "gunzipped", "truncated data", "found 2"}));
}

TEST(Idx, ParseIdxNamesTheSource) {
  EXPECT_TRUE(contains_all(error_message([] {
                             parse_idx({0, 0, 8}, "memory:labels");
                           }),
                           {"memory:labels", "truncated header"}));
  const torch::Tensor t = parse_idx(idx_bytes({2, 2}, {1, 2, 3, 4}), "memory", 2);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 2}));
}

TEST(Idx, FindIdxFilePrefersPlainThenGzip) {
  TempDir dir;
  const auto bytes = idx_bytes({1}, {7});
  EXPECT_TRUE(contains_all(error_message([&] { find_idx_file(dir.path(), "x-labels"); }),
                           {dir.file("x-labels"), dir.file("x-labels.gz"), "not found"}));
  write_bytes(dir.file("x-labels.gz"), gzip(bytes));
  EXPECT_EQ(find_idx_file(dir.path(), "x-labels"), dir.file("x-labels.gz"));
  write_bytes(dir.file("x-labels"), bytes);
  EXPECT_EQ(find_idx_file(dir.path(), "x-labels"), dir.file("x-labels"));
}

}  // namespace
}  // namespace fasttrain
