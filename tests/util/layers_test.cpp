// The concerns are layers: a folder includes only from the folders below it, so no include runs back
// up (docs/DESIGN.md "Layers"). Read from the tree itself, headers and sources both.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "support.h"

namespace fasttrain {
namespace {

// Bottom to top.
const std::vector<std::string> kLayers = {"util",      "detail", "log",  "kernels", "optim", "state",
                                          "precision", "memory", "data", "models",  "task",  "dist",
                                          "train",     "config", "run",  "profile"};

int layer_of(const std::string& concern) {
  const auto found = std::find(kLayers.begin(), kLayers.end(), concern);
  return found == kLayers.end() ? -1 : static_cast<int>(found - kLayers.begin());
}

TEST(Layers, NoIncludeRunsBackUp) {
  namespace fs = std::filesystem;
  const std::regex include(R"re(#include "fasttrain/(\w+)/)re");
  std::vector<std::string> upward;
  int files = 0;
  for (const std::string root : {"include/fasttrain", "src"}) {
    const fs::path base = fs::path(FASTTRAIN_SOURCE_DIR) / root;
    for (const auto& entry : fs::recursive_directory_iterator(base)) {
      if (!entry.is_regular_file()) continue;
      const std::string concern = fs::relative(entry.path(), base).begin()->string();
      const int own = layer_of(concern);
      if (own < 0) continue;
      ++files;
      std::ifstream in(entry.path());
      for (std::string line; std::getline(in, line);) {
        std::smatch match;
        if (!std::regex_search(line, match, include)) continue;
        const int target = layer_of(match[1]);
        ASSERT_GE(target, 0) << entry.path() << " includes an unknown concern: " << line;
        if (target > own) upward.push_back(entry.path().string() + ": " + line);
      }
    }
  }
  EXPECT_GT(files, 100);
  EXPECT_TRUE(upward.empty()) << "includes from a lower concern to a higher one:\n"
                              << [&] {
                                   std::ostringstream out;
                                   for (const auto& line : upward) out << "  " << line << "\n";
                                   return out.str();
                                 }();
}

}  // namespace
}  // namespace fasttrain
