#pragma once
// The safetensors format (https://github.com/huggingface/safetensors), readable by
// `safetensors.torch.load_file` and the Hugging Face tools:
//
//   8 bytes   N, the header length, little-endian uint64
//   N bytes   JSON header: {"__metadata__": {str: str} (optional),
//                           name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//             padded with spaces to a multiple of 8 bytes
//   rest      the byte buffer; offsets are relative to its start, little-endian, row-major
//
//   fasttrain::save_safetensors("model.safetensors", {{"w", w}, {"b", b}}, {{"step", "100"}});
//   fasttrain::SafetensorsFile file = fasttrain::load_safetensors("model.safetensors");
//   torch::Tensor w2 = file.at("w");   // CPU, contiguous, same dtype and shape
//
// Writing follows the reference implementation byte for byte: tensors are laid out sorted by
// dtype (descending in the reference's Dtype order: I64, F64, F32, I32, BF16, F16, I16, I8, U8, BOOL,
// which puts 8-byte types first so every tensor is aligned to its element size), then by name; the
// header is compact JSON with "__metadata__" first (keys sorted) and each tensor's fields in the
// order dtype, shape, data_offsets; the header is padded with spaces to 8 bytes.
//
// Reading is strict, like the reference's `SafeTensors::deserialize`: header length within the file
// and at most 100 MB, a JSON object, known dtypes, non-negative shapes without overflow, offsets
// that tile the buffer exactly (no overlaps, no holes, no trailing bytes), sizes equal to
// dtype x shape, no duplicate names. Every error names the file, the tensor and the offsets or
// sizes expected vs found.
//
// Dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL (the ones LibTorch has).
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fasttrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// A loaded file: tensors in the order of their data in the file, plus the "__metadata__" map.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  SafetensorsFile(NamedTensors tensors, std::map<std::string, std::string> metadata, std::string source);

  const NamedTensors& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  // The tensor called `name`; an error listing the names in the file when there is none.
  const torch::Tensor& at(const std::string& name) const;
  std::vector<std::string> names() const;
  size_t size() const { return tensors_.size(); }

 private:
  NamedTensors tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, size_t> index_;
  std::string source_;
};

// The header N: the largest the reference implementation accepts.
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// The complete file image (header + buffer). Tensors may live on any device, be non-contiguous and
// require grad; their values are copied. Names must be unique, non-empty and not "__metadata__".
std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// serialize_safetensors written atomically (temporary file, fsync, rename, fsync of the directory),
// streaming the tensors so that the file image is never in memory at once.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Parses a file image; `source` names it in errors.
SafetensorsFile parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& source);

// Reads `path`: the header first, validated against the file size, then each tensor straight into
// its own storage (the file is not held in memory twice).
SafetensorsFile load_safetensors(const std::string& path);

// The safetensors dtype name ("F32", ...) of a LibTorch dtype; an error for dtypes the format lacks.
std::string safetensors_dtype_name(torch::ScalarType dtype);

// A module's named parameters and buffers (recursively, the names of `named_parameters()` and
// `named_buffers()`), as `save_safetensors` writes them.
NamedTensors module_state(const torch::nn::Module& module);

void save_module_safetensors(const torch::nn::Module& module, const std::string& path,
                             const std::map<std::string, std::string>& metadata = {});

// Copies the file's tensors into the module's existing parameters and buffers (under NoGradGuard,
// so parameters keep their identity, device, layout and dtype; values are converted like PyTorch's
// `load_state_dict`, which copies with `copy_`). Strict: names missing from the file, names the
// module lacks and shape mismatches are one error listing all of them, and nothing is copied.
// Returns the file's metadata.
std::map<std::string, std::string> load_module_safetensors(torch::nn::Module& module,
                                                           const std::string& path);

}  // namespace fasttrain
