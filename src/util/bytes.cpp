#include "fasttrain/util/bytes.h"

#include <cctype>
#include <cmath>
#include <utility>
#include <vector>

#include "fasttrain/util/check.h"

namespace fasttrain {

int64_t parse_bytes(const std::string& text, const std::string& key) {
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1},      {"b", 1},        {"kb", 1e3},        {"mb", 1e6},           {"gb", 1e9},
      {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  auto fail = [&]() {
    throw ConfigError(
        fmt::format("{} must be a byte size such as 2GiB, 512MiB, 1.5GB or 1000000, got '{}'", key, text));
  };
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    fail();
  }
  if (!std::isfinite(value) || value < 0 || std::isspace(static_cast<unsigned char>(text[0]))) fail();
  std::string unit;
  for (size_t i = end; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i])) && unit.empty()) continue;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  for (const auto& [name, scale] : units) {
    if (unit != name) continue;
    const double bytes = std::round(value * scale);
    if (bytes > 9.0e18) fail();
    return static_cast<int64_t>(bytes);
  }
  fail();
  return 0;
}

std::string format_bytes(int64_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, units[unit]);
}

}  // namespace fasttrain
