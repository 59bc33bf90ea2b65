#include "fasttrain/detail/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

void fsync_fd_path(const std::string& path, int flags, const char* what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  FT_CHECK(fd >= 0, "cannot open {} '{}' to fsync it: {}", what, path, errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  FT_CHECK(rc == 0, "fsync of {} '{}' failed: {} (the data may not be on disk)", what, path,
           std::strerror(saved));
}

}  // namespace

std::string random_hex_suffix() {
  std::random_device device;
  const uint64_t value = (uint64_t{device()} << 32) ^ uint64_t { device() };
  return fmt::format("{:016x}", value);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const std::filesystem::path target(path_);
  FT_CHECK(!target.filename().empty(), "cannot write '{}': the path names a directory, expected a file",
           path_);
  const std::filesystem::path directory = target.has_parent_path() ? target.parent_path() : ".";
  temporary_ = (directory / ("." + target.filename().string() + ".tmp-" + random_hex_suffix())).string();
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  FT_CHECK(fd_ >= 0, "cannot create temporary file '{}' for '{}': {}", temporary_, path_, errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());  // best effort: the destination was never touched
}

void AtomicFile::write(const void* data, size_t size) {
  FT_CHECK(!committed_ && fd_ >= 0, "'{}': write after commit", path_);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    // write(2) may write less than asked (and at most ~2 GiB at once on Linux): loop.
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    FT_CHECK(n > 0, "writing '{}' failed after {} bytes: {} (disk full?)", temporary_, written_,
             n < 0 ? errno_text() : std::string("wrote nothing"));
    p += n;
    size -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void AtomicFile::commit() {
  FT_CHECK(!committed_ && fd_ >= 0, "'{}': commit called twice", path_);
  FT_CHECK(::fsync(fd_) == 0, "fsync of '{}' failed: {} (the data may not be on disk)", temporary_,
           errno_text());
  const int rc = ::close(fd_);
  fd_ = -1;
  FT_CHECK(rc == 0, "closing '{}' failed: {}", temporary_, errno_text());
  FT_CHECK(::rename(temporary_.c_str(), path_.c_str()) == 0, "cannot rename '{}' to '{}': {}", temporary_,
           path_, errno_text());
  committed_ = true;
  const std::filesystem::path target(path_);
  fsync_directory(target.has_parent_path() ? target.parent_path().string() : ".");
}

void write_file_atomically(const std::string& path, const void* data, size_t size) {
  AtomicFile out(path);
  out.write(data, size);
  out.commit();
}

void fsync_file(const std::string& path) {
  fsync_fd_path(path, O_RDONLY, "file");
}

void fsync_directory(const std::string& path) {
  fsync_fd_path(path, O_RDONLY | O_DIRECTORY, "directory");
}

std::vector<uint8_t> read_binary_file(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FT_CHECK(fd >= 0, "cannot open '{}': {}", path, errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  FT_CHECK(::fstat(fd, &info) == 0, "cannot stat '{}': {}", path, errno_text());
  FT_CHECK(S_ISREG(info.st_mode), "'{}' is not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  FT_CHECK(size <= max_bytes, "'{}' is {} bytes, more than the {} allowed here", path, size, max_bytes);
  std::vector<uint8_t> bytes(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, std::min<size_t>(size - done, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    FT_CHECK(n >= 0, "reading '{}' failed at offset {}: {}", path, done, errno_text());
    FT_CHECK(n > 0, "'{}' shrank while being read: {} of {} bytes", path, done, size);
    done += static_cast<size_t>(n);
  }
  return bytes;
}

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  std::vector<uint8_t> bytes = read_binary_file(path, max_bytes);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace fasttrain
