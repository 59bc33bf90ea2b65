// libFuzzer target for fasttrain::parse_idx. Every input is either rejected with fasttrain::Error or
// parsed into a uint8 tensor that encodes back to the input byte for byte (IDX has one encoding of a
// tensor), accepted with its own rank and rejected with any other. Anything else escaping (c10::Error,
// std::bad_alloc, a fasttrain::Error on the second parse), a broken property or a sanitizer report is a
// finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fasttrain/data/idx.h"
#include "fasttrain/util/check.h"

namespace {

// A broken property: abort, and libFuzzer saves the input as a crash.
void require(bool ok, const char* property) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_idx: property violated: %s\n", property);
    std::abort();
  }
}

// The IDX encoding of a uint8 tensor: 00 00 08 rank, big-endian uint32 dimensions, the data.
std::vector<uint8_t> encode(const torch::Tensor& tensor) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(tensor.dim())};
  for (const int64_t dim : tensor.sizes()) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(dim >> shift));
  }
  const uint8_t* data = tensor.data_ptr<uint8_t>();
  bytes.insert(bytes.end(), data, data + tensor.numel());
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  torch::Tensor tensor;
  try {
    tensor = fasttrain::parse_idx(bytes, "fuzz");
  } catch (const fasttrain::Error&) {
    return 0;  // the expected rejection of a bad file
  }
  require(tensor.defined() && tensor.device().is_cpu() && tensor.scalar_type() == torch::kUInt8 &&
              tensor.is_contiguous(),
          "the parsed tensor is not a contiguous CPU uint8 tensor");
  require(size >= 4 && tensor.dim() == bytes[3], "the parsed tensor's rank is not the header's");
  require(encode(tensor) == bytes, "encoding the parsed tensor does not give the input back");

  // From here on a fasttrain::Error is a finding too: it escapes and terminates the process.
  const int rank = static_cast<int>(tensor.dim());
  const torch::Tensor again = fasttrain::parse_idx(bytes, "fuzz", rank);
  require(again.sizes() == tensor.sizes() &&
              std::memcmp(again.data_ptr<uint8_t>(), tensor.data_ptr<uint8_t>(), tensor.numel()) == 0,
          "parsing with the expected rank gives a different tensor");
  try {
    fasttrain::parse_idx(bytes, "fuzz", rank % 255 + 1);
    require(false, "a file was accepted with the wrong expected rank");
  } catch (const fasttrain::Error&) {
  }
  return 0;
}
