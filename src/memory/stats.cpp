#include "fasttrain/memory/stats.h"

#include <fstream>
#include <string>

namespace fasttrain {

int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // reported in kB
  }
  return 0;
}

}  // namespace fasttrain
