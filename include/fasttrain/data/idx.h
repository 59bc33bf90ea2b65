#pragma once
// The IDX format (MNIST and its family): big-endian magic 0x0000TTRR (TT = type code, RR = rank),
// RR big-endian uint32 dimensions, then the data. Only unsigned bytes (type 0x08) are accepted.
//
//   torch::Tensor images = fasttrain::read_idx("train-images-idx3-ubyte.gz");  // [60000, 28, 28] uint8
//
// Every inconsistency (magic, type, rank, dimensions, truncated or trailing bytes, bad gzip) is an
// error that names the file, the byte offset, and what was expected vs found.
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fasttrain {

// Whole file contents, gunzipped when the file starts with the gzip magic (whatever its name).
std::vector<uint8_t> read_file_bytes(const std::string& path);

// Parses IDX bytes; `source` names the origin in errors.
torch::Tensor parse_idx(const std::vector<uint8_t>& bytes, const std::string& source);
// The same, and the rank byte must be `expected_rank` (a labels file given as images is an error).
torch::Tensor parse_idx(const std::vector<uint8_t>& bytes, const std::string& source, int expected_rank);

// read_file_bytes + parse_idx. Offsets in errors about a gzip file count decompressed bytes.
torch::Tensor read_idx(const std::string& path);
torch::Tensor read_idx(const std::string& path, int expected_rank);

// `directory/name` if it exists, else `directory/name.gz`; an error listing both when neither does.
std::string find_idx_file(const std::string& directory, const std::string& name);

}  // namespace fasttrain
