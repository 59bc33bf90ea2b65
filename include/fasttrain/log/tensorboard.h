#pragma once
// TensorBoard event files, written without TensorFlow or protobuf: `tensorboard --logdir runs/`
// shows the scalars of every run.
//
//   fasttrain::TensorBoardWriter tb("runs/default");  //
//   runs/default/events.out.tfevents.<time>.<host>.<pid>.<n> tb.add_scalar("train/loss", 0.42, step);
//   tb.flush();                                      // also done by the destructor
//
// The file is a sequence of TFRecords: uint64 length (little-endian), masked CRC-32C of those 8
// bytes, the data, masked CRC-32C of the data (mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8).
// Each record is an `Event` protobuf, hand-encoded: the first carries file_version "brain.Event:2",
// the others a `Summary` with one `Value {tag, simple_value}`:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }    Value { string tag = 1; float simple_value = 2; }
// The file name follows PyTorch's SummaryWriter (time, host, pid, a per-process counter) so that two
// writers started in the same second never share a file.
//
// The reader (read_tfrecords, read_tensorboard_events) verifies every CRC and is strict: a truncated
// or corrupt record is an error naming the file, the record index and the byte offset.
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace fasttrain {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), software table. `crc` continues a previous
// result: crc32c(b, nb, crc32c(a, na)) == crc32c(a + b).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The TFRecord mask, so that a CRC of data that contains CRCs stays well distributed.
uint32_t mask_crc32c(uint32_t crc);
uint32_t unmask_crc32c(uint32_t masked);

// One framed record (length, masked CRCs).
std::string encode_tfrecord(const std::string& data);
// The records of a file image / a file, every CRC verified.
std::vector<std::string> parse_tfrecords(const std::string& bytes, const std::string& source);
std::vector<std::string> read_tfrecords(const std::string& path);

// Event protobuf encoders (exposed for tests and tools).
std::string encode_file_version_event(double wall_time);
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
// Event { step, session_log = SessionLog { status = START } } (SessionLog is Event field 7; field 6
// is the deprecated LogMessage, which TensorBoard ignores).
std::string encode_session_start_event(double wall_time, int64_t step);

struct TensorBoardScalar {
  std::string tag;
  float value = 0;
};

// The fields of an Event that fasttrain writes; other fields are skipped.
struct TensorBoardEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                // "" unless the event carries one
  int session_status = 0;                  // SessionLog.status (1 = START), 0 without a session_log
  std::vector<TensorBoardScalar> scalars;  // summary values that have a simple_value
};

// Decodes one Event protobuf; an error naming `source` and the byte offset when it is malformed.
TensorBoardEvent decode_event(const std::string& record, const std::string& source = "event");
std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path);

// Appends events to a new file in `run_dir` (created if missing). Thread-safe. Errors (cannot create,
// disk full) name the file.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& run_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // `value` is stored as float32 (TensorBoard's simple_value); wall_time is now unless given.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);
  // A resumed run restarting at `step`: writes a SessionLog START there, on which TensorBoard drops
  // the events of earlier files at steps >= `step` (what PyTorch's SummaryWriter(purge_step) does),
  // so the steps the resumed run repeats are not shown twice.
  void purge_from(int64_t step);
  // Hands buffered events to the OS, so that TensorBoard (and a crash) sees them.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

}  // namespace fasttrain
