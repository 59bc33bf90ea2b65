#include "fasttrain/log/metrics.h"

#include <cstdio>
#include <filesystem>

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// The file's directory, made when missing (a run directory a program names before anything wrote it).
const std::string& with_directory(const std::string& path) {
  const auto directory = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!directory.empty()) std::filesystem::create_directories(directory, error);
  FT_CHECK(!error, "cannot create the directory '{}' of '{}': {}", directory.string(), path, error.message());
  return path;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path)
    : path_(path), out_(with_directory(path), std::ios::app) {
  FT_CHECK(out_.good(), "cannot open metrics file '{}' for writing", path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  FT_CHECK(out_.good(), "writing metrics file '{}' failed (disk full?)", path_);
}

void write_text_file(const std::string& path, const std::string& text) {
  std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    FT_CHECK(out.good(), "cannot open '{}' for writing", temporary);
    out << text;
    out.flush();
    FT_CHECK(out.good(), "writing '{}' failed (disk full?)", temporary);
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  FT_CHECK(!error, "cannot rename '{}' to '{}': {}", temporary, path, error.message());
}

void write_json_file(const std::string& path, const nlohmann::json& value) {
  write_text_file(path, value.dump(2) + "\n");
}

}  // namespace fasttrain
