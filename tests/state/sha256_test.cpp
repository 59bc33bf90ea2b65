// SHA-256: the FIPS 180-4 example vectors, chunking that must not matter, and agreement with
// coreutils' sha256sum on lengths around the padding boundaries.
#include "fasttrain/detail/sha256.h"

#include <gtest/gtest.h>

#include <random>

#include "state/state_test_util.h"

namespace fasttrain {
namespace {

using testing::error_message;
using testing::TempDir;
using testing::write_raw;

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, ChunkingDoesNotMatter) {
  std::mt19937 rng(7);
  std::string data(300, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const std::string whole = sha256_hex(data);
  for (size_t split = 0; split <= data.size(); ++split) {
    Sha256 hash;
    hash.update(data.data(), split);
    hash.update(data.data() + split, data.size() - split);
    ASSERT_EQ(hash.hex_digest(), whole) << split;
  }
  Sha256 bytewise;
  for (char c : data) bytewise.update(&c, 1);
  EXPECT_EQ(bytewise.hex_digest(), whole);
  EXPECT_FALSE(error_message([&] { bytewise.update("x"); }).empty());
}

TEST(Sha256, AgreesWithCoreutilsAroundThePaddingBoundaries) {
  if (testing::run_command("command -v sha256sum").exit_code != 0) GTEST_SKIP() << "no sha256sum";
  TempDir dir;
  std::mt19937 rng(11);
  for (size_t length : {1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 1000u, (1u << 20) + 3}) {
    std::string data(length, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const std::string path = dir.file("data");
    write_raw(path, data);
    const auto result = testing::run_command("sha256sum " + path);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    uint64_t bytes = 0;
    EXPECT_EQ(sha256_file(path, &bytes), result.output.substr(0, 64)) << length;
    EXPECT_EQ(bytes, length);
    EXPECT_EQ(sha256_hex(data), result.output.substr(0, 64)) << length;
  }
  EXPECT_TRUE(testing::contains_all(error_message([&] { sha256_file(dir.file("absent")); }),
                                    {"absent", "cannot open"}));
}

}  // namespace
}  // namespace fasttrain
