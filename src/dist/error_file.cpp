#include "fasttrain/dist/error_file.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace fasttrain {

bool write_torchelastic_error_file(const std::string& kind, const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return false;
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  // torchrun's summary prints py_callstack as the "traceback": a Python one ends in "Type: message" too.
  const std::string error = kind + ": " + message;
  const nlohmann::json record = {
      {"message",
       {{"message", error},
        {"extraInfo", {{"py_callstack", error}, {"timestamp", std::to_string(seconds.count())}}}}}};
  std::ofstream out(path);
  out << record.dump();
  return static_cast<bool>(out.flush());
}

}  // namespace fasttrain
