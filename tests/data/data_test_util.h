#pragma once
// Fixtures for the data tests: temporary directories, IDX and gzip writers, error-message checks.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "fasttrain/util/check.h"

namespace fasttrain::testing {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fasttrain-data-XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// IDX header (magic 00 00 type rank, big-endian dimensions) followed by `data`.
inline std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                                      uint8_t type = 0x08) {
  std::vector<uint8_t> bytes = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(d >> shift));
  }
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

// Bytes i * multiplier + offset (mod 256), enough to tell samples apart.
inline std::vector<uint8_t> pattern(size_t count, int multiplier = 7, int offset = 3) {
  std::vector<uint8_t> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<uint8_t>(i * multiplier + offset);
  return data;
}

// One gzip member, as `gzip` writes it.
inline std::vector<uint8_t> gzip(const std::vector<uint8_t>& data) {
  z_stream stream{};
  if (deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("deflateInit2 failed");
  }
  std::vector<uint8_t> out(deflateBound(&stream, data.size()) + 64);
  stream.next_in = const_cast<Bytef*>(data.data());
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  if (rc != Z_STREAM_END) throw std::runtime_error("deflate failed");
  return out;
}

// The message of the fasttrain::Error `fn` throws; a test failure (and "") when it throws none.
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fasttrain::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a fasttrain::Error";
  return "";
}

// Every one of `parts` occurs in `message`.
inline ::testing::AssertionResult contains_all(const std::string& message,
                                               const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace fasttrain::testing
