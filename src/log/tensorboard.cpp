#include "fasttrain/log/tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "fasttrain/util/check.h"

// Fixed-width protobuf and TFRecord fields are little-endian; doubles and floats are copied bytewise.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the TensorBoard writer assumes a little-endian host");

namespace fasttrain {
namespace {

constexpr uint32_t kMaskDelta = 0xa282ead8u;

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    table[i] = crc;
  }
  return table;
}

// Protobuf wire types.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (uint64_t{field} << 3) | type);
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

template <typename T>
void put_fixed(std::string& out, uint32_t field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "fixed32 or fixed64");
  put_key(out, field, sizeof(T) == 8 ? kFixed64 : kFixed32);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(p[i]);
  return value;
}

// A protobuf message being decoded: fields in order, with offsets for errors.
class WireReader {
 public:
  WireReader(const std::string& bytes, size_t begin, size_t end, const std::string& source,
             const char* message)
      : bytes_(bytes), pos_(begin), end_(end), source_(source), message_(message) {}

  bool done() const { return pos_ >= end_; }

  uint64_t varint() {
    uint64_t value = 0;
    const size_t start = pos_;
    for (int shift = 0; shift < 64; shift += 7) {
      FT_CHECK(pos_ < end_, "{}: {}: truncated varint at byte {}", source_, message_, start);
      const uint8_t byte = static_cast<uint8_t>(bytes_[pos_++]);
      value |= uint64_t{byte & 0x7fu} << shift;
      if (!(byte & 0x80)) return value;
    }
    FT_FAIL("{}: {}: varint at byte {} is longer than 10 bytes", source_, message_, start);
  }

  // The next field's number and wire type.
  std::pair<uint32_t, uint32_t> key() {
    const size_t at = pos_;
    const uint64_t key = varint();
    FT_CHECK((key >> 3) > 0 && (key >> 3) <= 0x1fffffff, "{}: {}: bad field number {} at byte {}", source_,
             message_, key >> 3, at);
    return {static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7)};
  }

  // [begin, end) of a length-delimited payload.
  std::pair<size_t, size_t> span() {
    const size_t at = pos_;
    const uint64_t length = varint();
    FT_CHECK(length <= end_ - pos_, "{}: {}: length {} at byte {} runs past the end of the message (byte {})",
             source_, message_, length, at, end_);
    const size_t begin = pos_;
    pos_ += length;
    return {begin, pos_};
  }

  const char* fixed(int size) {
    FT_CHECK(end_ - pos_ >= static_cast<size_t>(size), "{}: {}: truncated {}-byte field at byte {}", source_,
             message_, size, pos_);
    const char* p = bytes_.data() + pos_;
    pos_ += size;
    return p;
  }

  void expect(uint32_t field, uint32_t type, uint32_t expected) {
    FT_CHECK(type == expected, "{}: {}: field {} has wire type {}, expected {} (byte {})", source_, message_,
             field, type, expected, pos_);
  }

  void skip(uint32_t field, uint32_t type) {
    switch (type) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        fixed(8);
        return;
      case kLengthDelimited:
        span();
        return;
      case kFixed32:
        fixed(4);
        return;
      default:
        FT_FAIL("{}: {}: field {} has unsupported wire type {} (byte {})", source_, message_, field, type,
                pos_);
    }
  }

 private:
  const std::string& bytes_;
  size_t pos_;
  size_t end_;
  const std::string& source_;
  const char* message_;
};

TensorBoardScalar decode_value(const std::string& bytes, std::pair<size_t, size_t> span,
                               const std::string& source, bool* has_value) {
  TensorBoardScalar scalar;
  WireReader in(bytes, span.first, span.second, source, "Summary.Value");
  while (!in.done()) {
    const auto [field, type] = in.key();
    if (field == 1) {
      in.expect(field, type, kLengthDelimited);
      const auto [b, e] = in.span();
      scalar.tag = bytes.substr(b, e - b);
    } else if (field == 2) {
      in.expect(field, type, kFixed32);
      std::memcpy(&scalar.value, in.fixed(4), 4);
      *has_value = true;
    } else {
      in.skip(field, type);
    }
  }
  return scalar;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t mask_crc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

uint32_t unmask_crc32c(uint32_t masked) {
  const uint32_t rotated = masked - kMaskDelta;
  return (rotated >> 17) | (rotated << 15);
}

std::string encode_tfrecord(const std::string& data) {
  std::string record;
  put_le(record, data.size(), 8);
  put_le(record, mask_crc32c(crc32c(record.data(), 8)), 4);
  record += data;
  put_le(record, mask_crc32c(crc32c(data.data(), data.size())), 4);
  return record;
}

std::vector<std::string> parse_tfrecords(const std::string& bytes, const std::string& source) {
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t index = records.size();
    FT_CHECK(
        bytes.size() - pos >= 12,
        "{}: record {} at byte {}: truncated header ({} byte(s), expected 12: length + CRC; a writer killed "
        "mid-write?)",
        source, index, pos, bytes.size() - pos);
    const uint64_t length = get_le(bytes.data() + pos, 8);
    const uint32_t length_crc = static_cast<uint32_t>(get_le(bytes.data() + pos + 8, 4));
    const uint32_t expected_length_crc = mask_crc32c(crc32c(bytes.data() + pos, 8));
    FT_CHECK(
        length_crc == expected_length_crc,
        "{}: record {} at byte {}: length CRC mismatch (stored 0x{:08x}, computed 0x{:08x}): corrupt file",
        source, index, pos, length_crc, expected_length_crc);
    const size_t available = bytes.size() - pos - 12;
    FT_CHECK(length <= available && available - length >= 4,
             "{}: record {} at byte {}: truncated: {} data bytes + 4 CRC bytes declared, {} byte(s) left",
             source, index, pos, length, available);
    const size_t data = pos + 12;
    const uint32_t data_crc = static_cast<uint32_t>(get_le(bytes.data() + data + length, 4));
    const uint32_t expected_data_crc = mask_crc32c(crc32c(bytes.data() + data, length));
    FT_CHECK(data_crc == expected_data_crc,
             "{}: record {} at byte {}: data CRC mismatch (stored 0x{:08x}, computed 0x{:08x}) over bytes "
             "[{}, {}): "
             "corrupt file",
             source, index, pos, data_crc, expected_data_crc, data, data + length);
    records.push_back(bytes.substr(data, length));
    pos = data + length + 4;
  }
  return records;
}

std::vector<std::string> read_tfrecords(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  FT_CHECK(file, "{}: cannot open: {}", path, std::strerror(errno));
  std::string bytes;
  char chunk[1 << 16];
  while (size_t n = std::fread(chunk, 1, sizeof chunk, file)) bytes.append(chunk, n);
  const bool failed = std::ferror(file);
  std::fclose(file);
  FT_CHECK(!failed, "{}: read error after {} bytes", path, bytes.size());
  return parse_tfrecords(bytes, path);
}

std::string encode_file_version_event(double wall_time) {
  std::string event;
  put_fixed(event, 1, wall_time);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string encode_session_start_event(double wall_time, int64_t step) {
  std::string session_log;
  put_key(session_log, 1, kVarint);  // SessionLog.status
  put_varint(session_log, 1);        // START
  std::string event;
  put_fixed(event, 1, wall_time);
  put_key(event, 2, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes(event, 7, session_log);
  return event;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_fixed(summary_value, 2, value);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event;
  put_fixed(event, 1, wall_time);
  put_key(event, 2, kVarint);
  put_varint(event, static_cast<uint64_t>(step));  // int64: negative steps take 10 bytes, as in protobuf
  put_bytes(event, 5, summary);
  return event;
}

TensorBoardEvent decode_event(const std::string& record, const std::string& source) {
  TensorBoardEvent event;
  WireReader in(record, 0, record.size(), source, "Event");
  while (!in.done()) {
    const auto [field, type] = in.key();
    if (field == 1) {
      in.expect(field, type, kFixed64);
      std::memcpy(&event.wall_time, in.fixed(8), 8);
    } else if (field == 2) {
      in.expect(field, type, kVarint);
      event.step = static_cast<int64_t>(in.varint());
    } else if (field == 3) {
      in.expect(field, type, kLengthDelimited);
      const auto [b, e] = in.span();
      event.file_version = record.substr(b, e - b);
    } else if (field == 7) {
      in.expect(field, type, kLengthDelimited);
      const auto log_span = in.span();
      WireReader session_log(record, log_span.first, log_span.second, source, "SessionLog");
      while (!session_log.done()) {
        const auto [lfield, ltype] = session_log.key();
        if (lfield != 1) {
          session_log.skip(lfield, ltype);
          continue;
        }
        session_log.expect(lfield, ltype, kVarint);
        event.session_status = static_cast<int>(session_log.varint());
      }
    } else if (field == 5) {
      in.expect(field, type, kLengthDelimited);
      const auto summary_span = in.span();
      WireReader summary(record, summary_span.first, summary_span.second, source, "Summary");
      while (!summary.done()) {
        const auto [sfield, stype] = summary.key();
        if (sfield != 1) {
          summary.skip(sfield, stype);
          continue;
        }
        summary.expect(sfield, stype, kLengthDelimited);
        bool has_value = false;
        TensorBoardScalar scalar = decode_value(record, summary.span(), source, &has_value);
        if (has_value) event.scalars.push_back(std::move(scalar));
      }
    } else {
      in.skip(field, type);
    }
  }
  return event;
}

std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path) {
  std::vector<TensorBoardEvent> events;
  const std::vector<std::string> records = read_tfrecords(path);
  for (size_t i = 0; i < records.size(); ++i) {
    events.push_back(decode_event(records[i], fmt::format("{}: record {}", path, i)));
  }
  return events;
}

TensorBoardWriter::TensorBoardWriter(const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  FT_CHECK(!ec, "cannot create the TensorBoard directory '{}': {}", run_dir, ec.message());
  static std::atomic<int> counter{0};
  const double wall_time = now_seconds();
  path_ = (std::filesystem::path(run_dir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}",
                                                        static_cast<int64_t>(wall_time), hostname(),
                                                        ::getpid(), counter++))
              .string();
  // "x": never append to (or truncate) another writer's file.
  file_ = std::fopen(path_.c_str(), "wbx");
  FT_CHECK(file_, "cannot create the TensorBoard event file '{}': {}", path_, std::strerror(errno));
  write_record(encode_file_version_event(wall_time));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);  // flushes; errors here cannot be reported
}

void TensorBoardWriter::purge_from(int64_t step) {
  write_record(encode_session_start_event(now_seconds(), step));
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalar(tag, value, step, now_seconds());
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  FT_CHECK(!tag.empty(), "{}: a TensorBoard scalar needs a tag", path_);
  const std::string event = encode_scalar_event(wall_time, step, tag, static_cast<float>(value));
  std::lock_guard<std::mutex> lock(mutex_);
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& event) {
  const std::string record = encode_tfrecord(event);
  FT_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(),
           "writing the TensorBoard event file '{}' failed: {} (disk full?)", path_, std::strerror(errno));
}

void TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  FT_CHECK(std::fflush(file_) == 0, "flushing the TensorBoard event file '{}' failed: {} (disk full?)", path_,
           std::strerror(errno));
}

}  // namespace fasttrain
