#pragma once
// Errors. Library code reports bad input and broken invariants by throwing fasttrain::Error through
// FT_CHECK; only main() catches, prints `error: ...` and exits non-zero.
//
//   FT_CHECK(batch_size > 0, "data.batch_size must be > 0, got {}", batch_size);
//   FT_FAIL("unknown model '{}'; valid: {}", name, fmt::join(names, ", "));
//
// Messages name the thing (file, key, offset), the value found and what is allowed.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace fasttrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bad config value or command line: the CLI exits with code 2 for these.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(message) {}
};

// An error's message without ATen's C++ backtrace (c10::Error::what() carries one in some builds): what a
// message that quotes a caught error shows.
std::string message_of(const std::exception& error);

}  // namespace fasttrain

#define FT_FAIL(...) throw ::fasttrain::Error(::fmt::format(__VA_ARGS__))
#define FT_CHECK(cond, ...) \
  do {                      \
    if (!(cond)) {          \
      FT_FAIL(__VA_ARGS__); \
    }                       \
  } while (0)
#define FT_CONFIG_FAIL(...) throw ::fasttrain::ConfigError(::fmt::format(__VA_ARGS__))
#define FT_CONFIG_CHECK(cond, ...)                                \
  do {                                                            \
    if (!(cond)) {                                                \
      throw ::fasttrain::ConfigError(::fmt::format(__VA_ARGS__)); \
    }                                                             \
  } while (0)
