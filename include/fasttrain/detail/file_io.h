#pragma once
// Durable file writes. A run can be killed (SIGKILL, OOM killer, pre-emption) or the machine can lose
// power at any instant; a reader must then find either the old file or the complete new one, never a
// prefix. AtomicFile writes `path` through a hidden temporary file in the same directory, fsyncs it,
// renames it over `path` and fsyncs the directory so that the rename itself is durable.
//
//   fasttrain::AtomicFile out("runs/x/final/model.safetensors");
//   out.write(header.data(), header.size());
//   out.commit();  // without commit() the destructor removes the temporary file; `path` is untouched
//
// Errors name the file and the failing system call with errno's text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fasttrain {

class AtomicFile {
 public:
  // Creates `<dir>/.<name>.tmp-<random>`; the directory of `path` must exist.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // fsync, close, rename over the destination, fsync the directory. Once only.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return temporary_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// Writes `size` bytes to `path` atomically (AtomicFile in one call).
void write_file_atomically(const std::string& path, const void* data, size_t size);

// fsync(2) of an existing file or directory, so that its contents (a file) or its entries (a
// directory: creations, renames) survive a power loss.
void fsync_file(const std::string& path);
void fsync_directory(const std::string& path);

// The whole file; an error naming the file when it is missing, a directory, or larger than `max_bytes`.
std::vector<uint8_t> read_binary_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);

// The whole file as text (read_binary_file's checks).
std::string read_text_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);

// 16 lowercase hex digits from the OS entropy source: names of temporary files and directories.
std::string random_hex_suffix();

}  // namespace fasttrain
