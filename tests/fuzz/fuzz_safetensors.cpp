// libFuzzer target for fasttrain::parse_safetensors. Every input is either rejected with
// fasttrain::Error or parsed into tensors that serialize_safetensors writes out and parse_safetensors
// reads back with the same names, dtypes, shapes, bytes and metadata. Anything else escaping (c10::Error,
// std::bad_alloc, a second fasttrain::Error), a broken property or a sanitizer report is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fasttrain/state/safetensors.h"
#include "fasttrain/util/check.h"

namespace {

using fasttrain::SafetensorsFile;

// A broken property: abort, and libFuzzer saves the input as a crash.
void require(bool ok, const char* property) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_safetensors: property violated: %s\n", property);
    std::abort();
  }
}

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

// What the parser promises about each tensor: CPU, contiguous, its own storage of exactly its size.
void require_well_formed(const SafetensorsFile& file) {
  for (const auto& [name, tensor] : file.tensors()) {
    require(file.contains(name), "a parsed tensor is not found by its name");
    require(tensor.defined() && tensor.device().is_cpu() && tensor.is_contiguous(),
            "a parsed tensor is not a contiguous CPU tensor");
    require(tensor.storage().nbytes() == tensor.nbytes(), "a parsed tensor's storage has the wrong size");
  }
}

void require_same(const SafetensorsFile& a, const SafetensorsFile& b) {
  require(a.metadata() == b.metadata(), "the metadata changed in the round trip");
  require(a.size() == b.size(), "the number of tensors changed in the round trip");
  for (const auto& [name, tensor] : a.tensors()) {
    require(b.contains(name), "a tensor name was lost in the round trip");
    const torch::Tensor& other = b.at(name);
    require(tensor.scalar_type() == other.scalar_type(), "a dtype changed in the round trip");
    require(tensor.sizes() == other.sizes(), "a shape changed in the round trip");
    require(same_bytes(tensor, other), "tensor bytes changed in the round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  SafetensorsFile file;
  try {
    file = fasttrain::parse_safetensors(bytes, "fuzz");
  } catch (const fasttrain::Error&) {
    return 0;  // the expected rejection of a bad file
  }
  require_well_formed(file);

  // The writer refuses empty names, which the reader accepts like the reference implementation does.
  for (const std::string& name : file.names()) {
    if (name.empty()) {
      try {
        fasttrain::serialize_safetensors(file.tensors(), file.metadata());
      } catch (const fasttrain::Error&) {
        return 0;
      }
      require(false, "serialize_safetensors accepted an empty tensor name");
    }
  }
  // From here on a fasttrain::Error is a finding too: it escapes and terminates the process.
  const std::vector<uint8_t> image = fasttrain::serialize_safetensors(file.tensors(), file.metadata());
  const SafetensorsFile again = fasttrain::parse_safetensors(image, "fuzz (written again)");
  require_well_formed(again);
  require_same(file, again);
  require(fasttrain::serialize_safetensors(again.tensors(), again.metadata()) == image,
          "writing the file read back gives different bytes");
  return 0;
}
