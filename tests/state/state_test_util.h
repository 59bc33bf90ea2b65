#pragma once
// Fixtures for the state tests: raw file writes and error-message checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain::testing {

inline void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The message of the fasttrain::Error that `body` throws; a test failure when it throws nothing.
inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const fasttrain::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a fasttrain::Error";
  return "";
}

// Every one of `parts` occurs in `message`.
inline ::testing::AssertionResult mentions(const std::string& message,
                                           std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << part << "' not in: " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace fasttrain::testing
