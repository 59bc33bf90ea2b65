// TensorBoard event files: CRC-32C known answers, TFRecord framing and Event encoding checked
// against bytes derived by hand from the formats, written files read back with every CRC verified,
// and corruption detected.
#include "fasttrain/log/tensorboard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a fasttrain::Error";
  return "";
}

::testing::AssertionResult mentions(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos)
      return ::testing::AssertionFailure() << "'" << part << "' not in: " << message;
  }
  return ::testing::AssertionSuccess();
}

std::string bytes_of(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out += static_cast<char>(v);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(TensorBoard, Crc32cKnownVectors) {
  // The check value of CRC-32C, and the test vectors of RFC 3720 (iSCSI) appendix B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0');
  const std::string ones(32, '\xff');
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending += static_cast<char>(i);
    descending += static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(crc32c(ascending.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c(descending.data(), 32), 0x113fdb5cu);
  // Continuation.
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xe3069283u);
  // The TFRecord mask and its inverse.
  EXPECT_EQ(mask_crc32c(0xe3069283u), 0xc78ab0e5u);
  for (uint32_t c : {0u, 1u, 0xe3069283u, 0xffffffffu, 0x80000000u})
    EXPECT_EQ(unmask_crc32c(mask_crc32c(c)), c);
}

TEST(TensorBoard, EncodesEventsAsTheProtobufWireFormat) {
  // Event{wall_time: 1.5, file_version: "brain.Event:2"}: key 0x09 (field 1, fixed64) + 1.5 as a
  // little-endian double, key 0x1a (field 3, length-delimited) + length 13 + the string.
  EXPECT_EQ(encode_file_version_event(1.5),
            bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x1a, 13}) + "brain.Event:2");
  // Event{wall_time: 2, step: 3, summary: {value: [{tag: "loss", simple_value: 0.5}]}}.
  const std::string value = bytes_of({0x0a, 4}) + "loss" + bytes_of({0x15, 0, 0, 0, 0x3f});  // 11 bytes
  const std::string summary = bytes_of({0x0a, 11}) + value;                                  // 13 bytes
  EXPECT_EQ(encode_scalar_event(2.0, 3, "loss", 0.5f),
            bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 3, 0x2a, 13}) + summary);
  // A multi-byte varint step (300 = 0xac 0x02) and a negative one (10 bytes, two's complement).
  const std::string big = encode_scalar_event(0.0, 300, "t", 1.0f);
  EXPECT_EQ(big.substr(9, 3), bytes_of({0x10, 0xac, 0x02}));
  EXPECT_EQ(decode_event(big).step, 300);
  const std::string negative = encode_scalar_event(0.0, -1, "t", 1.0f);
  EXPECT_EQ(negative.substr(9, 11),
            bytes_of({0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  EXPECT_EQ(decode_event(negative).step, -1);
  // Event{wall_time: 2, step: 7, session_log: {status: START}}: key 0x3a (field 7, length-delimited),
  // length 2, key 0x08 (field 1, varint) and 1 (START); the bytes event_pb2.Event.SerializeToString()
  // gives. (Field 6 is the deprecated LogMessage: TensorBoard ignores a START written there.)
  const std::string start = encode_session_start_event(2.0, 7);
  EXPECT_EQ(start, bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 7, 0x3a, 2, 0x08, 1}));
  EXPECT_EQ(decode_event(start).session_status, 1);
  EXPECT_EQ(decode_event(start).step, 7);
  EXPECT_EQ(decode_event(big).session_status, 0);
}

TEST(TensorBoard, FramesRecordsWithMaskedCrcs) {
  const std::string record = encode_tfrecord("abc");
  ASSERT_EQ(record.size(), 8 + 4 + 3 + 4u);
  EXPECT_EQ(record.substr(0, 8), bytes_of({3, 0, 0, 0, 0, 0, 0, 0}));
  const auto le32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(record[at + i]);
    return v;
  };
  EXPECT_EQ(le32(8), mask_crc32c(crc32c(record.data(), 8)));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(le32(15), mask_crc32c(crc32c("abc", 3)));
  EXPECT_EQ(parse_tfrecords(record + encode_tfrecord("") + encode_tfrecord("xy"), "mem"),
            (std::vector<std::string>{"abc", "", "xy"}));
}

TEST(TensorBoard, WriterOutputReadsBackWithVerifiedCrcs) {
  TempDir dir;
  const std::string run = dir.file("run");  // created by the writer
  std::string path;
  {
    TensorBoardWriter writer(run);
    path = writer.path();
    writer.add_scalar("train/loss", 0.25, 0, 1000.5);
    writer.add_scalar("train/loss", 0.125, 10, 1001.5);
    writer.add_scalar("eval/accuracy", 0.9137, 10);
    writer.flush();
    // Flushed: readable while the writer is still open.
    EXPECT_EQ(read_tensorboard_events(path).size(), 4u);
    writer.add_scalar("lr", 3e-3, 1ll << 40);
  }
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(run));

  const std::vector<TensorBoardEvent> events = read_tensorboard_events(path);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].scalars.empty());
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(events[0].wall_time, now, 60.0);
  EXPECT_EQ(events[1].wall_time, 1000.5);
  EXPECT_EQ(events[1].step, 0);
  ASSERT_EQ(events[1].scalars.size(), 1u);
  EXPECT_EQ(events[1].scalars[0].tag, "train/loss");
  EXPECT_EQ(events[1].scalars[0].value, 0.25f);
  EXPECT_EQ(events[2].step, 10);
  EXPECT_EQ(events[2].scalars[0].value, 0.125f);
  EXPECT_EQ(events[3].scalars[0].tag, "eval/accuracy");
  EXPECT_EQ(events[3].scalars[0].value, static_cast<float>(0.9137));
  EXPECT_NEAR(events[3].wall_time, now, 60.0);
  EXPECT_EQ(events[4].step, 1ll << 40);
  EXPECT_EQ(events[4].scalars[0].value, 3e-3f);
}

TEST(TensorBoard, TwoWritersInOneDirectoryUseTwoFiles) {
  TempDir dir;
  TensorBoardWriter a(dir.path());
  TensorBoardWriter b(dir.path());
  EXPECT_NE(a.path(), b.path());
  a.add_scalar("x", 1, 1);
  b.add_scalar("x", 2, 1);
  a.flush();
  b.flush();
  EXPECT_EQ(read_tensorboard_events(a.path())[1].scalars[0].value, 1.0f);
  EXPECT_EQ(read_tensorboard_events(b.path())[1].scalars[0].value, 2.0f);
}

TEST(TensorBoard, ConcurrentWritersProduceWholeRecords) {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer(dir.path());
    path = writer.path();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) writer.add_scalar("thread" + std::to_string(t), i, i);
      });
    }
    for (auto& thread : threads) thread.join();
  }
  EXPECT_EQ(read_tensorboard_events(path).size(), 1u + 4 * 200);
}

TEST(TensorBoard, DetectsCorruptionAndTruncation) {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer(dir.path());
    path = writer.path();
    writer.add_scalar("loss", 1.0, 1, 5.0);
  }
  const std::string good = read_file(path);
  const size_t second = encode_tfrecord(encode_file_version_event(0)).size();  // offset of record 1
  ASSERT_EQ(good.size(), second + encode_tfrecord(encode_scalar_event(5.0, 1, "loss", 1.0f)).size());
  auto write = [&](const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  };

  // A flipped bit in the data of record 1, in its length, in its data CRC.
  for (size_t at : {second + 12 + 3, second + 1, good.size() - 1}) {
    std::string bad = good;
    bad[at] ^= 0x20;
    write(bad);
    const std::string message = error_of([&] { read_tfrecords(path); });
    EXPECT_TRUE(mentions(message, {path, "record 1 at byte " + std::to_string(second), "CRC mismatch"}))
        << at;
  }
  // Truncated in the middle of a record, and inside a header.
  write(good.substr(0, good.size() - 2));
  EXPECT_TRUE(mentions(error_of([&] { read_tfrecords(path); }), {"record 1", "truncated"}));
  write(good.substr(0, second + 5));
  EXPECT_TRUE(
      mentions(error_of([&] { read_tfrecords(path); }), {"record 1", "truncated header", "5 byte(s)"}));
  EXPECT_TRUE(mentions(error_of([&] { read_tfrecords(dir.file("absent")); }), {"absent", "cannot open"}));

  // Well-framed but malformed protobuf.
  EXPECT_TRUE(mentions(error_of([&] {
                         decode_event(bytes_of({0x09, 1, 2}), "ev");
                       }),
                       {"ev", "truncated 8-byte field"}));
  EXPECT_TRUE(mentions(error_of([&] {
                         decode_event(bytes_of({0x2a, 50, 0}), "ev");
                       }),
                       {"length 50", "past the end"}));
  EXPECT_TRUE(mentions(error_of([&] {
                         decode_event(bytes_of({0x11, 0}), "ev");
                       }),
                       {"field 2", "wire type 1"}));
  EXPECT_TRUE(mentions(error_of([&] { decode_event(bytes_of({0x10, 0x80}), "ev"); }), {"truncated varint"}));
  // Unknown fields are skipped (TensorBoard's own files carry many): a varint field 15 and a
  // LogMessage (field 6, length-delimited).
  const TensorBoardEvent skipped =
      decode_event(bytes_of({0x78, 7, 0x32, 1, 'x'}) + encode_scalar_event(1, 2, "a", 3));
  EXPECT_EQ(skipped.step, 2);
  EXPECT_EQ(skipped.scalars.size(), 1u);
}

}  // namespace
}  // namespace fasttrain
