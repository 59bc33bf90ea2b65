#pragma once
// metrics.jsonl: one JSON object per line, flushed as it is written so a crashed run keeps them.
//
//   fasttrain::MetricsWriter metrics("runs/default/metrics.jsonl");
//   metrics.write({{"step", 10}, {"loss", 0.5}});
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace fasttrain {

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// Writes `value` to `path` (pretty-printed) via a temporary file and a rename, so readers never see
// a half-written file.
void write_json_file(const std::string& path, const nlohmann::json& value);
void write_text_file(const std::string& path, const std::string& text);

}  // namespace fasttrain
