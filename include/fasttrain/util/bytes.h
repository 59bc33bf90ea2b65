#pragma once
// Byte sizes as people write them.
//
//   fasttrain::parse_bytes("1.5GiB", "memory.budget");   // 1610612736
//   fasttrain::format_bytes(1610612736);                 // "1.50 GiB"
#include <cstdint>
#include <string>

namespace fasttrain {

// A non-negative number with an optional unit: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB
// (powers of 1024), case-insensitive, spaces allowed before the unit. Anything else is a ConfigError
// naming `key` and the text.
int64_t parse_bytes(const std::string& text, const std::string& key);

// Bytes with a binary unit and two decimals ("512 B", "1.50 GiB").
std::string format_bytes(int64_t bytes);

}  // namespace fasttrain
