#include "fasttrain/state/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/util/check.h"

// The format is little-endian; tensors are copied byte for byte.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace fasttrain {
namespace {

using nlohmann::json;

constexpr const char* kMetadataKey = "__metadata__";

struct Dtype {
  const char* name;
  torch::ScalarType scalar_type;
  uint64_t bytes;
  // Position in the reference implementation's `enum Dtype` (derive(Ord)): the writer sorts by it,
  // descending, so wider types come first and every tensor starts aligned to its element size.
  int reference_order;
};

// The reference's order: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64.
constexpr Dtype kDtypes[] = {
    {"BOOL", torch::kBool, 1, 0}, {"U8", torch::kByte, 1, 1},    {"I8", torch::kChar, 1, 2},
    {"I16", torch::kShort, 2, 5}, {"F16", torch::kHalf, 2, 7},   {"BF16", torch::kBFloat16, 2, 8},
    {"I32", torch::kInt, 4, 9},   {"F32", torch::kFloat, 4, 11}, {"F64", torch::kDouble, 8, 12},
    {"I64", torch::kLong, 8, 13},
};
// Valid in the format but without a LibTorch 1.13 type: reported as such rather than as unknown.
constexpr const char* kUnsupportedDtypes[] = {"U16", "U32", "U64", "F8_E5M2", "F8_E4M3"};

const Dtype* find_dtype(const std::string& name) {
  for (const Dtype& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const Dtype& dtype_of(torch::ScalarType scalar_type, const std::string& tensor) {
  for (const Dtype& d : kDtypes) {
    if (d.scalar_type == scalar_type) return d;
  }
  FT_FAIL("tensor '{}' has dtype {}, which safetensors cannot store here; valid: {}", tensor,
          c10::toString(scalar_type),
          "float64, float32, float16, bfloat16, int64, int32, int16, int8, uint8, bool");
}

std::string valid_dtype_names() {
  std::vector<std::string> names;
  for (const Dtype& d : kDtypes) names.emplace_back(d.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// One tensor of a parsed header.
struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offsets
  std::map<std::string, std::string> metadata;
};

uint64_t read_le64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

// A JSON number that is an integer >= 0 (nlohmann stores non-negative literals as unsigned).
bool as_unsigned(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  return false;
}

std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

// Arrays and objects nested in one another, the header's own object included: serde_json, the
// reference's parser, allows no more. Deeper values would also overflow the stack in json::dump().
constexpr int kMaxJsonNesting = 127;

// Parses JSON and rejects duplicate keys at any depth (nlohmann, like serde, would keep the last) and
// nesting deeper than kMaxJsonNesting.
json parse_json_without_duplicates(const std::string& text, const std::string& source) {
  struct Level {
    std::set<std::string> keys;
    std::string owner;  // the key this object is the value of ("" for the top level)
  };
  std::vector<Level> stack;
  std::string last_key;
  std::string top_key;  // the last key of the header's own object
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      FT_CHECK(depth < kMaxJsonNesting,
               "{}: the value of '{}' in the header is nested more than {} levels deep (arrays and objects, "
               "the header's own object included)",
               source, top_key, kMaxJsonNesting);
    }
    switch (event) {
      case json::parse_event_t::object_start:
        stack.push_back({{}, stack.empty() ? "" : last_key});
        break;
      case json::parse_event_t::object_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        last_key = parsed.get<std::string>();
        if (stack.size() == 1) top_key = last_key;
        Level& level = stack.back();
        if (!level.keys.insert(last_key).second) {
          if (stack.size() == 1) {
            FT_FAIL("{}: duplicate tensor name '{}' in the header; names must be unique", source, last_key);
          }
          FT_FAIL("{}: duplicate key '{}' inside '{}' in the header", source, last_key, level.owner);
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, callback);
  } catch (const json::parse_error& e) {
    // e.byte counts from 1.
    const size_t at = e.byte > 0 ? e.byte - 1 : 0;
    FT_FAIL("{}: the header is not valid JSON at header byte {} (file offset {}): {}", source, at, at + 8,
            e.what());
  } catch (const json::out_of_range& e) {
    // A number beyond double's range (1e400) is out_of_range rather than a parse error.
    FT_FAIL("{}: the header is not valid JSON: {}", source, e.what());
  }
}

Entry parse_entry(const std::string& name, const json& info, uint64_t buffer_size,
                  const std::string& source) {
  FT_CHECK(info.is_object(), "{}: tensor '{}': expected an object {{dtype, shape, data_offsets}}, found {}",
           source, name, describe(info));
  Entry entry;
  entry.name = name;
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    FT_CHECK(info.contains(field), "{}: tensor '{}': missing field '{}'", source, name, field);
  }
  const json& dtype = info["dtype"];
  FT_CHECK(dtype.is_string(), "{}: tensor '{}': dtype must be a string, found {}", source, name,
           describe(dtype));
  const std::string dtype_name = dtype.get<std::string>();
  entry.dtype = find_dtype(dtype_name);
  if (!entry.dtype) {
    const bool known = std::any_of(std::begin(kUnsupportedDtypes), std::end(kUnsupportedDtypes),
                                   [&](const char* d) { return dtype_name == d; });
    FT_FAIL(
        "{}: tensor '{}': dtype '{}' {}; supported: {}", source, name, dtype_name,
        known ? "is a safetensors dtype that LibTorch 1.13 has no type for" : "is not a safetensors dtype",
        valid_dtype_names());
  }

  const json& shape = info["shape"];
  FT_CHECK(shape.is_array(), "{}: tensor '{}': shape must be an array of integers, found {}", source, name,
           describe(shape));
  uint64_t elements = 1;
  bool overflow = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    uint64_t dim = 0;
    FT_CHECK(as_unsigned(shape[d], &dim), "{}: tensor '{}': shape[{}] is {}, expected an integer >= 0",
             source, name, d, describe(shape[d]));
    FT_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             "{}: tensor '{}': shape[{}] = {} does not fit int64", source, name, d, dim);
    entry.shape.push_back(static_cast<int64_t>(dim));
    // Like the reference (a checked product, left to right): [0, 2^40, 2^40] is fine, [2^40, 2^40, 0] is not.
    if (dim != 0 && elements > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
    if (!overflow) elements *= dim;
  }
  const uint64_t max_elements =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / entry.dtype->bytes;
  FT_CHECK(!overflow && elements <= max_elements,
           "{}: tensor '{}': shape [{}] has more elements than a tensor can hold (the product overflows)",
           source, name, fmt::join(entry.shape, ", "));

  const json& offsets = info["data_offsets"];
  FT_CHECK(offsets.is_array() && offsets.size() == 2,
           "{}: tensor '{}': data_offsets must be [begin, end], found {}", source, name, describe(offsets));
  FT_CHECK(as_unsigned(offsets[0], &entry.begin) && as_unsigned(offsets[1], &entry.end),
           "{}: tensor '{}': data_offsets must be two integers >= 0, found {}", source, name,
           describe(offsets));
  FT_CHECK(entry.begin <= entry.end, "{}: tensor '{}': data_offsets [{}, {}] has begin > end", source, name,
           entry.begin, entry.end);
  FT_CHECK(entry.end <= buffer_size,
           "{}: tensor '{}': data_offsets [{}, {}] end beyond the {}-byte data buffer (truncated file?)",
           source, name, entry.begin, entry.end, buffer_size);
  const uint64_t expected = elements * entry.dtype->bytes;
  FT_CHECK(entry.end - entry.begin == expected,
           "{}: tensor '{}': data_offsets [{}, {}] span {} bytes, but {} x [{}] needs {} bytes", source, name,
           entry.begin, entry.end, entry.end - entry.begin, entry.dtype->name, fmt::join(entry.shape, ", "),
           expected);
  return entry;
}

// Validates the header against the size of the data buffer that follows it.
Header parse_header(const uint8_t* data, uint64_t size, uint64_t buffer_size, const std::string& source) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  FT_CHECK(!text.empty() && text[0] == '{',
           "{}: the header must be a JSON object starting with '{{' at offset 8, "
           "found {}",
           source, text.empty() ? std::string("nothing") : fmt::format("byte 0x{:02x}", data[0]));
  const json root = parse_json_without_duplicates(text, source);
  FT_CHECK(root.is_object(), "{}: the header must be a JSON object, found {}", source, describe(root));

  Header header;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      FT_CHECK(value.is_object(), "{}: '__metadata__' must be an object of strings, found {}", source,
               describe(value));
      for (const auto& [mkey, mvalue] : value.items()) {
        FT_CHECK(mvalue.is_string(), "{}: '__metadata__' key '{}' must have a string value, found {}", source,
                 mkey, describe(mvalue));
        header.metadata[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    header.entries.push_back(parse_entry(key, value, buffer_size, source));
  }

  // The tensors must tile the buffer exactly: sorted by offsets, each begins where the previous ended.
  std::sort(header.entries.begin(), header.entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : header.entries) {
    FT_CHECK(entry.begin >= covered, "{}: tensor '{}' data_offsets [{}, {}] overlap tensor '{}' [{}, {}]",
             source, entry.name, entry.begin, entry.end, previous ? previous->name : "",
             previous ? previous->begin : 0, covered);
    FT_CHECK(entry.begin == covered,
             "{}: data buffer bytes [{}, {}) before tensor '{}' belong to no tensor (a hole; the offsets "
             "must tile "
             "the buffer)",
             source, covered, entry.begin, entry.name);
    covered = entry.end;
    previous = &entry;
  }
  FT_CHECK(covered == buffer_size,
           "{}: {} trailing byte(s) after the last tensor: the tensors cover data buffer bytes [0, {}), the "
           "buffer has {} (file offsets {} to {})",
           source, buffer_size - covered, covered, buffer_size, covered, buffer_size);
  return header;
}

void check_bool_bytes(const torch::Tensor& tensor, const Entry& entry, uint64_t data_start,
                      const std::string& source) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(tensor.data_ptr());
  const uint64_t n = entry.end - entry.begin;
  for (uint64_t i = 0; i < n; ++i) {
    FT_CHECK(p[i] <= 1, "{}: tensor '{}' (BOOL): byte at file offset {} is {}, expected 0 or 1", source,
             entry.name, data_start + entry.begin + i, p[i]);
  }
}

struct Header8 {
  uint64_t header_bytes;
  uint64_t buffer_bytes;
};

Header8 check_prefix(const uint8_t* first8, uint64_t file_size, const std::string& source) {
  FT_CHECK(
      file_size >= 8,
      "{}: truncated file: {} byte(s), expected at least the 8-byte header length (not a safetensors file?)",
      source, file_size);
  const uint64_t n = read_le64(first8);
  FT_CHECK(
      n <= kSafetensorsMaxHeaderBytes,
      "{}: header length at offset 0 is {} bytes, more than the {} allowed (corrupt or not a safetensors "
      "file)",
      source, n, kSafetensorsMaxHeaderBytes);
  FT_CHECK(n <= file_size - 8,
           "{}: header length at offset 0 is {} bytes but only {} byte(s) follow (truncated file?)", source,
           n, file_size - 8);
  return {n, file_size - 8 - n};
}

torch::Tensor empty_for(const Entry& entry) {
  return torch::empty(entry.shape, torch::TensorOptions().dtype(entry.dtype->scalar_type));
}

// A tensor ready for writing: validated name and dtype, the byte range it will occupy.
struct Planned {
  std::string name;
  const Dtype* dtype;
  const torch::Tensor* tensor;
  uint64_t bytes;
};

std::vector<Planned> plan(const NamedTensors& tensors) {
  std::vector<Planned> planned;
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    FT_CHECK(!name.empty(), "safetensors: a tensor name is empty");
    FT_CHECK(name != kMetadataKey, "safetensors: '__metadata__' is reserved and cannot name a tensor");
    FT_CHECK(seen.insert(name).second, "safetensors: duplicate tensor name '{}'", name);
    FT_CHECK(tensor.defined(), "safetensors: tensor '{}' is undefined", name);
    const Dtype& dtype = dtype_of(tensor.scalar_type(), name);
    planned.push_back({name, &dtype, &tensor, static_cast<uint64_t>(tensor.numel()) * dtype.bytes});
  }
  std::stable_sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    if (a.dtype->reference_order != b.dtype->reference_order) {
      return a.dtype->reference_order > b.dtype->reference_order;
    }
    return a.name < b.name;
  });
  return planned;
}

// The padded header of the reference implementation (serde_json compact output).
std::string header_text(const std::vector<Planned>& planned,
                        const std::map<std::string, std::string>& metadata) {
  try {
    std::string text = "{";
    if (!metadata.empty()) text += fmt::format("\"{}\":{}", kMetadataKey, json(metadata).dump());
    uint64_t offset = 0;
    for (const Planned& p : planned) {
      if (text.size() > 1) text += ',';
      text +=
          fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", json(p.name).dump(),
                      p.dtype->name, fmt::join(p.tensor->sizes(), ","), offset, offset + p.bytes);
      offset += p.bytes;
    }
    text += '}';
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  } catch (const json::exception& e) {
    FT_FAIL("safetensors: a tensor name or metadata string is not valid UTF-8: {}", e.what());
  }
}

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

torch::Tensor cpu_contiguous(const torch::Tensor& tensor) {
  return tensor.detach().to(torch::kCPU).contiguous();
}

std::string list_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 20;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
  std::string text = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > kShown) text += fmt::format(" and {} more", names.size() - kShown);
  return text;
}

}  // namespace

SafetensorsFile::SafetensorsFile(NamedTensors tensors, std::map<std::string, std::string> metadata,
                                 std::string source)
    : tensors_(std::move(tensors)), metadata_(std::move(metadata)), source_(std::move(source)) {
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].first] = i;
}

const torch::Tensor& SafetensorsFile::at(const std::string& name) const {
  const auto it = index_.find(name);
  FT_CHECK(it != index_.end(), "{}: no tensor '{}'; the file has: {}", source_, name, list_names(names()));
  return tensors_[it->second].second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  for (const auto& [name, tensor] : tensors_) result.push_back(name);
  return result;
}

std::string safetensors_dtype_name(torch::ScalarType dtype) {
  return dtype_of(dtype, "?").name;
}

std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  const std::vector<Planned> planned = plan(tensors);
  const std::string header = header_text(planned, metadata);
  std::vector<uint8_t> bytes;
  const std::string length = le64(header.size());
  bytes.insert(bytes.end(), length.begin(), length.end());
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (const Planned& p : planned) {
    const torch::Tensor t = cpu_contiguous(*p.tensor);
    const uint8_t* data = static_cast<const uint8_t*>(t.data_ptr());
    bytes.insert(bytes.end(), data, data + p.bytes);
  }
  return bytes;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::vector<Planned> planned = plan(tensors);
  const std::string header = header_text(planned, metadata);
  AtomicFile out(path);
  out.write(le64(header.size()));
  out.write(header);
  for (const Planned& p : planned) {
    // One tensor at a time on the CPU: the file image is never in memory as a whole.
    const torch::Tensor t = cpu_contiguous(*p.tensor);
    out.write(t.data_ptr(), p.bytes);
  }
  out.commit();
}

SafetensorsFile parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& source) {
  const Header8 prefix = check_prefix(bytes.data(), bytes.size(), source);
  const uint64_t data_start = 8 + prefix.header_bytes;
  Header header = parse_header(bytes.data() + 8, prefix.header_bytes, prefix.buffer_bytes, source);
  NamedTensors tensors;
  for (const Entry& entry : header.entries) {
    torch::Tensor tensor = empty_for(entry);
    if (entry.end > entry.begin)
      std::memcpy(tensor.data_ptr(), bytes.data() + data_start + entry.begin, entry.end - entry.begin);
    if (entry.dtype->scalar_type == torch::kBool) check_bool_bytes(tensor, entry, data_start, source);
    tensors.emplace_back(entry.name, std::move(tensor));
  }
  return SafetensorsFile(std::move(tensors), std::move(header.metadata), source);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FT_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  FT_CHECK(::fstat(fd, &info) == 0, "{}: cannot stat: {}", path, std::strerror(errno));
  FT_CHECK(S_ISREG(info.st_mode), "{}: not a regular file", path);
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);

  // pread everything: exact offsets, no stream state, EINTR and short reads handled in one place.
  auto read_at = [&](void* out, uint64_t size, uint64_t offset, const std::string& what) {
    uint8_t* p = static_cast<uint8_t*>(out);
    uint64_t done = 0;
    while (done < size) {
      const ssize_t n = ::pread(fd, p + done, std::min<uint64_t>(size - done, uint64_t{1} << 30),
                                static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      FT_CHECK(n >= 0, "{}: reading {} at offset {} failed: {}", path, what, offset + done,
               std::strerror(errno));
      FT_CHECK(n > 0, "{}: the file shrank while reading {}: expected {} bytes at offset {}", path, what,
               size, offset);
      done += static_cast<uint64_t>(n);
    }
  };

  uint8_t first8[8] = {};
  if (file_size >= 8) read_at(first8, 8, 0, "the header length");
  const Header8 prefix = check_prefix(first8, file_size, path);
  std::vector<uint8_t> header_bytes(prefix.header_bytes);
  read_at(header_bytes.data(), prefix.header_bytes, 8, "the header");
  Header header = parse_header(header_bytes.data(), prefix.header_bytes, prefix.buffer_bytes, path);

  const uint64_t data_start = 8 + prefix.header_bytes;
  NamedTensors tensors;
  for (const Entry& entry : header.entries) {
    torch::Tensor tensor = empty_for(entry);
    read_at(tensor.data_ptr(), entry.end - entry.begin, data_start + entry.begin,
            "tensor '" + entry.name + "'");
    if (entry.dtype->scalar_type == torch::kBool) check_bool_bytes(tensor, entry, data_start, path);
    tensors.emplace_back(entry.name, std::move(tensor));
  }
  return SafetensorsFile(std::move(tensors), std::move(header.metadata), path);
}

NamedTensors module_state(const torch::nn::Module& module) {
  NamedTensors state;
  // Undefined tensors (an optional parameter that is absent) are skipped, as state_dict() does.
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().defined()) state.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) state.emplace_back(item.key(), item.value());
  }
  return state;
}

void save_module_safetensors(const torch::nn::Module& module, const std::string& path,
                             const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, module_state(module), metadata);
}

std::map<std::string, std::string> load_module_safetensors(torch::nn::Module& module,
                                                           const std::string& path) {
  const SafetensorsFile file = load_safetensors(path);
  NamedTensors state = module_state(module);

  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  std::set<std::string> expected;
  for (const auto& [name, target] : state) {
    expected.insert(name);
    if (!file.contains(name)) {
      missing.push_back(name);
      continue;
    }
    const torch::Tensor& source = file.at(name);
    if (source.sizes() != target.sizes()) {
      mismatched.push_back(fmt::format("{} (module [{}], file [{}])", name, fmt::join(target.sizes(), ", "),
                                       fmt::join(source.sizes(), ", ")));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : file.tensors()) {
    if (!expected.count(name)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::vector<std::string> problems;
    if (!missing.empty()) problems.push_back(fmt::format("missing from the file: {}", list_names(missing)));
    if (!unexpected.empty()) problems.push_back(fmt::format("not in the module: {}", list_names(unexpected)));
    if (!mismatched.empty()) problems.push_back(fmt::format("shape mismatch: {}", list_names(mismatched)));
    FT_FAIL("{}: does not match the module ({}); nothing was loaded", path, fmt::join(problems, "; "));
  }

  torch::NoGradGuard no_grad;
  for (auto& [name, target] : state) target.copy_(file.at(name));
  return file.metadata();
}

}  // namespace fasttrain
