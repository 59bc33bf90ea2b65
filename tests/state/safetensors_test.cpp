// safetensors: byte-exact output of the reference implementation, round trips of every dtype, and
// every kind of corruption rejected with a message that names the file, the tensor and the offsets.
#include "fasttrain/state/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "state/state_test_util.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;
using testing::read_raw;
using testing::TempDir;
using testing::write_raw;

std::string as_string(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}
std::vector<uint8_t> as_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  return bytes;
}

// A file image from a header text (padded to 8 bytes like the reference) and a data buffer.
std::string image(std::string header, const std::string& buffer, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + buffer;
}

TEST(Safetensors, MatchesTheReferenceImplementationByteForByte) {
  // The expected bytes are the reference's own tests: bindings/python/tests/test_simple.py
  // test_serialization (np.zeros((2, 2), int32) saved as "test"), padded to 64 bytes with spaces ...
  const std::string zeros_i32 = std::string("@\0\0\0\0\0\0\0", 8) +
                                R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" + "    " +
                                std::string(16, '\0');
  EXPECT_EQ(as_string(serialize_safetensors({{"test", torch::zeros({2, 2}, torch::kInt)}})), zeros_i32);

  // ... and safetensors/src/tensor.rs test_serialization ("attn.0", F32 [1, 2, 3] = 0..5, 64-byte
  // header that needs no padding).
  const std::vector<uint8_t> attn = {
      64,  0,   0,   0,   0,   0,  0,  0,  123, 34, 97,  116, 116, 110, 46,  48,  34,  58,  123, 34,
      100, 116, 121, 112, 101, 34, 58, 34, 70,  51, 50,  34,  44,  34,  115, 104, 97,  112, 101, 34,
      58,  91,  49,  44,  50,  44, 51, 93, 44,  34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101,
      116, 115, 34,  58,  91,  48, 44, 50, 52,  93, 125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
      0,   0,   0,   64,  0,   0,  64, 64, 0,   0,  128, 64,  0,   0,   160, 64};
  const torch::Tensor values = torch::arange(6, torch::kFloat).reshape({1, 2, 3});
  EXPECT_EQ(serialize_safetensors({{"attn.0", values}}), attn);

  // And both parse back.
  const SafetensorsFile zeros = parse_safetensors(as_bytes(zeros_i32), "zeros");
  ASSERT_EQ(zeros.names(), std::vector<std::string>{"test"});
  EXPECT_TRUE(torch::equal(zeros.at("test"), torch::zeros({2, 2}, torch::kInt)));
  EXPECT_TRUE(zeros.metadata().empty());
  EXPECT_TRUE(torch::equal(parse_safetensors(attn, "attn").at("attn.0"), values));
}

TEST(Safetensors, LaysOutTensorsByDescendingDtypeThenNameWithMetadataFirst) {
  const std::string bytes = as_string(serialize_safetensors({{"b", torch::ones({3}, torch::kByte)},
                                                             {"a", torch::ones({1}, torch::kFloat)},
                                                             {"z", torch::ones({1}, torch::kLong)},
                                                             {"flag", torch::ones({2}, torch::kBool)},
                                                             {"c", torch::ones({1}, torch::kFloat)},
                                                             {"h", torch::ones({1}, torch::kHalf)},
                                                             {"d", torch::ones({1}, torch::kDouble)}},
                                                            {{"format", "pt"}, {"b-key", "x\"y"}}));
  const std::string expected_header = R"({"__metadata__":{"b-key":"x\"y","format":"pt"},)"
                                      R"("z":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                                      R"("d":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
                                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
                                      R"("c":{"dtype":"F32","shape":[1],"data_offsets":[20,24]},)"
                                      R"("h":{"dtype":"F16","shape":[1],"data_offsets":[24,26]},)"
                                      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[26,29]},)"
                                      R"("flag":{"dtype":"BOOL","shape":[2],"data_offsets":[29,31]}})";
  const size_t padded = (expected_header.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.substr(0, 8), le64(padded));
  EXPECT_EQ(bytes.substr(8, padded), expected_header + std::string(padded - expected_header.size(), ' '));
  EXPECT_EQ(bytes.size(), 8 + padded + 31);
}

TEST(Safetensors, RoundTripsEveryDtypeIncludingNonContiguousInputs) {
  TempDir dir;
  torch::manual_seed(3);
  const torch::Tensor base = torch::randn({4, 6}, torch::kDouble) * 100;
  NamedTensors tensors = {
      {"f64", base.t()},                                  // transposed
      {"f32", base.to(torch::kFloat).slice(1, 0, 6, 2)},  // strided slice
      {"f16", base.to(torch::kHalf).t().contiguous()},
      {"bf16", base.to(torch::kBFloat16).slice(0, 1, 3)},  // offset into storage
      {"i64", (base * 1e6).to(torch::kLong)},
      {"i32", base.to(torch::kInt).t()},
      {"i16", base.to(torch::kShort)},
      {"i8", base.to(torch::kChar).flip(0)},
      {"u8", torch::arange(256, torch::kLong).to(torch::kByte).reshape({16, 16}).t()},
      {"bool", (base > 0).t()},
      {"expanded", torch::tensor({1.5f, -2.5f}).expand({3, 2})},  // stride 0
      {"scalar", torch::tensor(7.25)},
      {"empty", torch::zeros({0, 3}, torch::kFloat)},
      {"grad", torch::ones({2}, torch::requires_grad())},
  };
  ASSERT_FALSE(tensors[0].second.is_contiguous());
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, {{"step", "12"}, {"note", "ünïcode ✓"}});

  for (const SafetensorsFile& file :
       {load_safetensors(path), parse_safetensors(as_bytes(read_raw(path)), path)}) {
    ASSERT_EQ(file.size(), tensors.size());
    EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"step", "12"}, {"note", "ünïcode ✓"}}));
    for (const auto& [name, original] : tensors) {
      const torch::Tensor& loaded = file.at(name);
      EXPECT_EQ(loaded.scalar_type(), original.scalar_type()) << name;
      EXPECT_EQ(loaded.sizes(), original.sizes()) << name;
      EXPECT_TRUE(loaded.is_contiguous()) << name;
      EXPECT_TRUE(loaded.device().is_cpu()) << name;
      EXPECT_FALSE(loaded.requires_grad()) << name;
      EXPECT_TRUE(torch::equal(loaded, original.detach())) << name;
    }
  }
  // The file image of save_safetensors is the one serialize_safetensors makes.
  EXPECT_EQ(read_raw(path),
            as_string(serialize_safetensors(tensors, {{"step", "12"}, {"note", "ünïcode ✓"}})));
  // No temporary file is left next to it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(Safetensors, RejectsWhatItCannotWrite) {
  const torch::Tensor t = torch::zeros({1});
  EXPECT_TRUE(contains_all(error_message([&] {
                             serialize_safetensors({{"a", t}, {"a", t}});
                           }),
                           {"duplicate", "'a'"}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             serialize_safetensors({{"__metadata__", t}});
                           }),
                           {"__metadata__", "reserved"}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             serialize_safetensors({{"c", torch::zeros({1}, torch::kComplexFloat)}});
                           }),
                           {"'c'", "ComplexFloat", "valid:"}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             serialize_safetensors({{"u", torch::Tensor()}});
                           }),
                           {"'u'", "undefined"}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             serialize_safetensors({{std::string("bad\xff"), t}});
                           }),
                           {"UTF-8"}));
  TempDir dir;
  EXPECT_TRUE(contains_all(error_message([&] {
                             save_safetensors(dir.file("missing/x.safetensors"), {{"a", t}});
                           }),
                           {"missing/x.safetensors", "No such file"}));
}

// Checks that both readers reject `bytes` with a message naming the file and every one of `parts`.
void expect_rejected(const std::string& bytes, std::initializer_list<std::string> parts) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_raw(path, bytes);
  const std::string from_file = error_message([&] { load_safetensors(path); });
  EXPECT_TRUE(contains_all(from_file, {path})) << from_file;
  EXPECT_TRUE(contains_all(from_file, parts));
  const std::string from_memory = error_message([&] { parse_safetensors(as_bytes(bytes), "in-memory"); });
  EXPECT_TRUE(contains_all(from_memory, {"in-memory"}));
  EXPECT_TRUE(contains_all(from_memory, parts));
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype, shape, begin,
                     end);
}

TEST(Safetensors, RejectsABadHeaderLength) {
  expect_rejected("", {"truncated", "0 byte(s)"});
  expect_rejected(std::string("\x10\0\0", 3), {"truncated", "3 byte(s)"});
  expect_rejected(le64(1000) + "{}", {"header length", "1000", "only 2 byte(s) follow"});
  expect_rejected(le64(200'000'000) + std::string(64, ' '), {"200000000", "more than the 100000000 allowed"});
  expect_rejected(le64(~uint64_t{0}) + "{}", {"18446744073709551615", "more than the 100000000 allowed"});
}

TEST(Safetensors, RejectsAHeaderThatIsNotAJsonObject) {
  expect_rejected(image("{not json", ""), {"not valid JSON", "header byte 2"});
  expect_rejected(image("[1, 2]", ""), {"JSON object", "0x5b"});
  expect_rejected(image("", ""), {"JSON object", "nothing"});
  expect_rejected(image("{\"a\": 5}", ""), {"tensor 'a'", "expected an object", "found 5"});
  expect_rejected(image("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", std::string(4, '\0')),
                  {"tensor 'a'", "missing field 'data_offsets'"});
  expect_rejected(image("{\"__metadata__\": {\"k\": 1}}", ""),
                  {"'__metadata__' key 'k'", "string value", "found 1"});
  expect_rejected(image("{\"__metadata__\": [\"k\"]}", ""), {"'__metadata__'", "object of strings"});
  // nlohmann reports a number beyond double's range with another exception type than a syntax error;
  // it used to escape as nlohmann::json::out_of_range (found by tests/fuzz/fuzz_safetensors).
  expect_rejected(
      image(R"({"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}})", std::string(4, '\0')),
      {"not valid JSON", "number overflow", "1e400"});
}

TEST(Safetensors, RejectsDeeplyNestedJsonWithoutExhaustingTheStack) {
  // A 2 MB header of nested arrays in place of a tensor used to overflow the stack while the error
  // message printed the value (a crash instead of an error). Like serde_json in the reference, at most
  // 127 arrays and objects may nest, the header's own object included; unknown fields within that are
  // still ignored.
  const auto nested = [](size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  expect_rejected(image("{\"a\":" + nested(1'000'000) + "}", ""), {"'a'", "more than 127 levels"});
  expect_rejected(image("{\"__metadata__\":{\"k\":" + nested(1'000'000) + "}}", ""),
                  {"more than 127 levels"});
  expect_rejected(image("{\"a\":" + nested(127) + "}", ""), {"more than 127 levels"});
  expect_rejected(image("{\"a\":" + nested(126) + "}", ""), {"tensor 'a'", "expected an object"});
  const SafetensorsFile file = parse_safetensors(
      as_bytes(image(R"({"s":{"dtype":"U8","shape":[],"data_offsets":[0,1],"extra":)" + nested(125) + "}}",
                     "\x07")),
      "nested");
  EXPECT_EQ(file.at("s").item<uint8_t>(), 7);
}

TEST(Safetensors, RejectsDuplicateNames) {
  expect_rejected(
      image("{" + entry("a", "U8", "[1]", 0, 1) + "," + entry("a", "U8", "[1]", 1, 2) + "}", "xy"),
      {"duplicate tensor name 'a'"});
  expect_rejected(image(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"),
                  {"duplicate key 'dtype' inside 'a'"});
}

TEST(Safetensors, RejectsUnknownDtypesAndBadShapes) {
  expect_rejected(image("{" + entry("w", "F17", "[1]", 0, 4) + "}", std::string(4, '\0')),
                  {"tensor 'w'", "'F17' is not a safetensors dtype", "supported: BOOL"});
  expect_rejected(image("{" + entry("w", "U16", "[1]", 0, 2) + "}", std::string(2, '\0')),
                  {"tensor 'w'", "'U16'", "LibTorch 1.13 has no type"});
  expect_rejected(image("{" + entry("w", "F32", "[-1,2]", 0, 4) + "}", std::string(4, '\0')),
                  {"tensor 'w'", "shape[0] is -1", "integer >= 0"});
  expect_rejected(image("{" + entry("w", "F32", "[2.5]", 0, 4) + "}", std::string(4, '\0')),
                  {"tensor 'w'", "shape[0] is 2.5"});
  expect_rejected(image("{" + entry("w", "F32", "3", 0, 12) + "}", std::string(12, '\0')),
                  {"tensor 'w'", "shape must be an array"});
  expect_rejected(image("{" + entry("w", "F32", "[4294967296,4294967296]", 0, 4) + "}", std::string(4, '\0')),
                  {"tensor 'w'", "[4294967296, 4294967296]", "overflows"});
  expect_rejected(image("{" + entry("w", "F32", "[4294967296,4294967296,0]", 0, 0) + "}", ""),
                  {"tensor 'w'", "overflows"});
  expect_rejected(image("{" + entry("w", "F64", "[2305843009213693952]", 0, 4) + "}", std::string(4, '\0')),
                  {"tensor 'w'", "overflows"});
  expect_rejected(image("{" + entry("w", "F32", "[18446744073709551615]", 0, 4) + "}", std::string(4, '\0')),
                  {"tensor 'w'", "does not fit int64"});
}

TEST(Safetensors, RejectsBadOffsets) {
  const std::string buffer(16, '\0');
  expect_rejected(image("{" + entry("w", "F32", "[4]", 0, 1000) + "}", buffer),
                  {"tensor 'w'", "[0, 1000]", "16-byte data buffer"});
  expect_rejected(image("{" + entry("w", "F32", "[0]", 12, 8) + "}", buffer),
                  {"tensor 'w'", "[12, 8]", "begin > end"});
  expect_rejected(image("{" + entry("w", "F32", "[2,2]", 0, 12) + "}", std::string(12, '\0')),
                  {"tensor 'w'", "[0, 12] span 12 bytes", "F32 x [2, 2] needs 16 bytes"});
  expect_rejected(image(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(4, '\0')),
                  {"tensor 'w'", "[begin, end]"});
  expect_rejected(image(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", std::string(4, '\0')),
                  {"tensor 'w'", "two integers >= 0"});
  expect_rejected(image("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}",
                        std::string(12, '\0')),
                  {"tensor 'b'", "[4, 12] overlap tensor 'a' [0, 8]"});
  expect_rejected(image("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}",
                        std::string(12, '\0')),
                  {"bytes [4, 8) before tensor 'b'", "hole"});
  expect_rejected(image("{" + entry("a", "F32", "[1]", 4, 8) + "}", std::string(8, '\0')),
                  {"bytes [0, 4) before tensor 'a'", "hole"});
  expect_rejected(image("{" + entry("a", "F32", "[2]", 0, 8) + "}", std::string(12, '\0')),
                  {"4 trailing byte(s)", "[0, 8)", "buffer has 12"});
  expect_rejected(image("{}", "x"), {"1 trailing byte(s)"});
  expect_rejected(image("{" + entry("ok", "BOOL", "[2]", 0, 2) + "}", std::string("\x01\x02", 2)),
                  {"tensor 'ok'", "BOOL", "is 2, expected 0 or 1"});
}

TEST(Safetensors, AcceptsZeroSizedTensorsAndIgnoresUnknownFields) {
  // Like the reference: empty tensors may share an offset; extra fields in an entry are ignored.
  const std::string bytes = image(R"({"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                                  R"("e2":{"dtype":"I64","shape":[3,0],"data_offsets":[0,0]},)"
                                  R"("s":{"dtype":"U8","shape":[],"data_offsets":[0,1],"extra":"x"}})",
                                  "\x07");
  const SafetensorsFile file = parse_safetensors(as_bytes(bytes), "zero");
  EXPECT_EQ(file.at("e2").sizes(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(file.at("s").dim(), 0);
  EXPECT_EQ(file.at("s").item<uint8_t>(), 7);
  EXPECT_TRUE(
      contains_all(error_message([&] { file.at("nope"); }), {"zero", "no tensor 'nope'", "e1, e2, s"}));
}

TEST(Safetensors, ReportsATruncatedFileByName) {
  TempDir dir;
  const std::string path = dir.file("cut.safetensors");
  save_safetensors(path, {{"w", torch::ones({100})}});
  const std::string full = read_raw(path);
  write_raw(path, full.substr(0, full.size() - 1));
  EXPECT_TRUE(contains_all(error_message([&] { load_safetensors(path); }),
                           {path, "tensor 'w'", "[0, 400]", "399-byte data buffer", "truncated"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { load_safetensors(dir.file("none")); }), {"none", "cannot open"}));
}

torch::nn::Sequential small_model() {
  return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::ReLU(),
                               torch::nn::Linear(torch::nn::LinearOptions(3, 2).bias(false)));
}

TEST(Safetensors, SavesAndLoadsAModuleInPlace) {
  TempDir dir;
  torch::manual_seed(1);
  auto source = small_model();
  source->train();
  source->forward(torch::randn({8, 4}));  // moves the BatchNorm running stats off their defaults
  const std::string path = dir.file("model.safetensors");
  save_module_safetensors(*source, path, {{"step", "5"}});
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_TRUE(file.contains("0.weight") && file.contains("1.running_mean") &&
              file.contains("1.num_batches_tracked"));
  EXPECT_FALSE(file.contains("3.bias"));
  EXPECT_EQ(file.at("1.num_batches_tracked").scalar_type(), torch::kLong);

  torch::manual_seed(2);
  auto target = small_model();
  const torch::Tensor weight = target->named_parameters()["0.weight"];
  const void* storage = weight.data_ptr();
  EXPECT_EQ(load_module_safetensors(*target, path), (std::map<std::string, std::string>{{"step", "5"}}));
  for (const auto& [name, tensor] : module_state(*source)) {
    EXPECT_TRUE(torch::equal(tensor, file.at(name))) << name;
  }
  for (const auto& [name, tensor] : module_state(*target)) {
    EXPECT_TRUE(torch::equal(tensor, file.at(name))) << name;
  }
  // The parameter was filled in place: same storage, still a leaf that requires grad.
  EXPECT_EQ(target->named_parameters()["0.weight"].data_ptr(), storage);
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_TRUE(weight.is_leaf());
}

TEST(Safetensors, ModuleLoadIsStrictAndAllOrNothing) {
  TempDir dir;
  const std::string path = dir.file("other.safetensors");
  torch::manual_seed(4);
  save_safetensors(path, {{"0.weight", torch::zeros({3, 5})},  // wrong shape
                          {"0.bias", torch::zeros({3})},
                          {"extra.weight", torch::zeros({1})}});
  auto model = small_model();
  const torch::Tensor before = model->named_parameters()["0.bias"].clone();
  const std::string message = error_message([&] { load_module_safetensors(*model, path); });
  EXPECT_TRUE(contains_all(
      message,
      {path, "missing from the file: 1.weight, 1.bias, 3.weight, 1.running_mean",
       "not in the module: extra.weight", "0.weight (module [3, 4], file [3, 5])", "nothing was loaded"}));
  EXPECT_TRUE(torch::equal(model->named_parameters()["0.bias"], before));
}

}  // namespace
}  // namespace fasttrain
