#include "fasttrain/data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;

bool is_gzip(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

// The IDX type codes, so that a float or int file is reported by name rather than by number.
const char* idx_type_name(uint8_t code) {
  switch (code) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "not an IDX type";
  }
}

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::vector<uint8_t> read_raw(const std::string& path) {
  std::error_code ec;
  FT_CHECK(std::filesystem::exists(path, ec), "{}: no such file", path);
  FT_CHECK(!std::filesystem::is_directory(path, ec), "{}: is a directory, expected a file", path);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  FT_CHECK(in, "{}: cannot open: {}", path, std::strerror(errno));
  const std::streamoff size = in.tellg();
  FT_CHECK(size >= 0, "{}: cannot determine the file size", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  FT_CHECK(in.gcount() == size, "{}: read {} of {} bytes", path, in.gcount(), size);
  return bytes;
}

// Inflates a gzip file (possibly several concatenated members, as `cat a.gz b.gz` makes).
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& path) {
  std::vector<uint8_t> out;
  // IDX files compress about 4:1 (images) to 10:1 (labels); start there and grow geometrically.
  out.resize(std::max<size_t>(compressed.size() * 4, 1 << 16));
  z_stream stream{};
  // 16 + MAX_WBITS: expect the gzip wrapper and check its CRC-32 and length trailer.
  FT_CHECK(inflateInit2(&stream, 16 + MAX_WBITS) == Z_OK, "{}: zlib inflateInit2 failed", path);
  struct Closer {
    z_stream* s;
    ~Closer() { inflateEnd(s); }
  } closer{&stream};

  size_t in_pos = 0;
  size_t out_pos = 0;
  while (true) {
    if (out_pos == out.size()) out.resize(out.size() * 2);
    // zlib counts in uInt: feed at most 1 GiB at a time.
    const size_t in_chunk = std::min<size_t>(compressed.size() - in_pos, 1u << 30);
    const size_t out_chunk = std::min<size_t>(out.size() - out_pos, 1u << 30);
    stream.next_in = const_cast<Bytef*>(compressed.data() + in_pos);
    stream.avail_in = static_cast<uInt>(in_chunk);
    stream.next_out = out.data() + out_pos;
    stream.avail_out = static_cast<uInt>(out_chunk);
    const int rc = inflate(&stream, Z_NO_FLUSH);
    in_pos += in_chunk - stream.avail_in;
    out_pos += out_chunk - stream.avail_out;
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow; anything else after the stream is corruption.
      if (in_pos == compressed.size()) break;
      FT_CHECK(
          compressed.size() - in_pos >= 2 && compressed[in_pos] == 0x1f && compressed[in_pos + 1] == 0x8b,
          "{}: trailing garbage after the gzip stream at compressed byte offset {}: expected end of file "
          "or another gzip member (1f 8b), found {} more byte(s)",
          path, in_pos, compressed.size() - in_pos);
      FT_CHECK(inflateReset(&stream) == Z_OK, "{}: zlib inflateReset failed", path);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && stream.avail_out == 0) continue;  // output full: grow and go on
    if (rc == Z_BUF_ERROR && in_pos == compressed.size()) {
      FT_FAIL(
          "{}: truncated gzip stream: the compressed data ends at byte offset {} before the end of the "
          "stream ({} bytes decompressed so far)",
          path, in_pos, out_pos);
    }
    FT_FAIL("{}: corrupt gzip stream at compressed byte offset {} (of {}): {}", path, in_pos,
            compressed.size(), stream.msg ? stream.msg : "zlib error " + std::to_string(rc));
  }
  out.resize(out_pos);
  return out;
}

std::string source_name(const std::string& path, bool gzipped) {
  return gzipped ? path + " (gunzipped)" : path;
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::vector<uint8_t> bytes = read_raw(path);
  if (is_gzip(bytes)) return gunzip(bytes, path);
  return bytes;
}

torch::Tensor parse_idx(const std::vector<uint8_t>& bytes, const std::string& source) {
  return parse_idx(bytes, source, 0);
}

torch::Tensor parse_idx(const std::vector<uint8_t>& bytes, const std::string& source, int expected_rank) {
  const size_t size = bytes.size();
  FT_CHECK(size > 0, "{}: empty file, expected an IDX header of at least 4 bytes at offset 0", source);
  FT_CHECK(size >= 4, "{}: truncated header at offset {}: expected a 4-byte magic number, found {} byte(s)",
           source, 0, size);
  FT_CHECK(
      bytes[0] == 0 && bytes[1] == 0,
      "{}: bad magic at offset 0: expected 00 00 followed by the type and rank bytes, found {:02x} {:02x} "
      "(not an IDX file{})",
      source, bytes[0], bytes[1], is_gzip(bytes) ? "; it is gzip data" : "");
  const uint8_t type = bytes[2];
  FT_CHECK(type == kUnsignedByte,
           "{}: unsupported IDX type at offset 2: expected 0x08 (unsigned byte), found 0x{:02x} ({})", source,
           type, idx_type_name(type));
  const int rank = bytes[3];
  FT_CHECK(rank >= 1, "{}: bad rank at offset 3: expected at least 1 dimension, found 0", source);
  FT_CHECK(expected_rank <= 0 || rank == expected_rank,
           "{}: wrong rank at offset 3: expected {} dimension(s) ({}), found {}", source, expected_rank,
           expected_rank == 1   ? "a labels file"
           : expected_rank == 3 ? "an images file"
                                : "as requested",
           rank);

  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  FT_CHECK(size >= header,
           "{}: truncated header: rank {} needs a {}-byte header (magic + {} big-endian uint32 dimensions), "
           "found {} byte(s)",
           source, rank, header, rank, size);
  std::vector<int64_t> dims(rank);
  size_t expected_data = 1;
  bool overflow = false;  // a corrupt header can claim more bytes than size_t holds
  for (int d = 0; d < rank; ++d) {
    const size_t offset = 4 + 4 * static_cast<size_t>(d);
    const uint32_t dim = read_be32(bytes.data() + offset);
    FT_CHECK(dim > 0, "{}: dimension {} at offset {} is 0: expected at least 1", source, d, offset);
    dims[d] = dim;
    if (expected_data > std::numeric_limits<size_t>::max() / dim) overflow = true;
    if (!overflow) expected_data *= dim;
  }
  const size_t found_data = size - header;
  FT_CHECK(
      !overflow,
      "{}: truncated data: dimensions {} need more than 2^64 data bytes after the {}-byte header, found {}",
      source, fmt::join(dims, "x"), header, found_data);
  FT_CHECK(
      found_data == expected_data,
      "{}: {}: dimensions {} need {} data bytes after the {}-byte header (ending at offset {}), found {} "
      "(the file ends at offset {})",
      source, found_data < expected_data ? "truncated data" : "trailing bytes", fmt::join(dims, "x"),
      expected_data, header, header + expected_data, found_data, size);

  torch::Tensor tensor = torch::empty(dims, torch::kUInt8);
  std::memcpy(tensor.data_ptr<uint8_t>(), bytes.data() + header, expected_data);
  return tensor;
}

torch::Tensor read_idx(const std::string& path) {
  return read_idx(path, 0);
}

torch::Tensor read_idx(const std::string& path, int expected_rank) {
  std::vector<uint8_t> raw = read_raw(path);
  const bool gzipped = is_gzip(raw);
  if (gzipped) raw = gunzip(raw, path);
  return parse_idx(raw, source_name(path, gzipped), expected_rank);
}

std::string find_idx_file(const std::string& directory, const std::string& name) {
  const std::filesystem::path plain = std::filesystem::path(directory) / name;
  const std::filesystem::path gz = std::filesystem::path(directory) / (name + ".gz");
  std::error_code ec;
  if (std::filesystem::is_regular_file(plain, ec)) return plain.string();
  if (std::filesystem::is_regular_file(gz, ec)) return gz.string();
  FT_FAIL("IDX file '{}' not found: neither {} nor {} exists", name, plain.string(), gz.string());
}

}  // namespace fasttrain
