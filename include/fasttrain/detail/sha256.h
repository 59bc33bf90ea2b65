#pragma once
// SHA-256 (FIPS 180-4), for the checkpoint manifests: a checkpoint file is trusted only when its
// digest matches. Our own ~100 lines because no library we already link has one (OpenSSL is not a
// dependency and is not worth becoming one for this).
//
//   fasttrain::Sha256 hash;
//   hash.update(data, size);             // any number of times
//   std::string hex = hash.hex_digest();  // 64 lowercase hex digits; the object is then spent
//   fasttrain::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fasttrain {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(const std::string& text) { update(text.data(), text.size()); }
  // Pads and finishes; further update() or digest() calls are an error.
  std::array<uint8_t, 32> digest();
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

std::string sha256_hex(const std::string& data);
// The digest of a file's contents, read in chunks; an error naming the file when it cannot be read.
// `bytes_read` (optional) receives the number of bytes hashed.
std::string sha256_file(const std::string& path, uint64_t* bytes_read = nullptr);

}  // namespace fasttrain
