// The documentation's code is the code: every block of the README marked `<!-- excerpt: FILE -->` must
// appear in FILE line for line, so that an example that changes takes its README excerpt with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "support.h"

namespace fasttrain {
namespace {

const std::string kSource = FASTTRAIN_SOURCE_DIR;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Excerpt {
  std::string file;
  int readme_line = 0;
  std::vector<std::string> lines;
};

// Each marked block: the marker names the file, the next line opens the code fence.
std::vector<Excerpt> readme_excerpts() {
  const std::vector<std::string> readme = lines_of(testing::read_text(kSource + "/README.md"));
  const std::string marker = "<!-- excerpt: ";
  std::vector<Excerpt> excerpts;
  for (size_t i = 0; i < readme.size(); ++i) {
    if (readme[i].rfind(marker, 0) != 0) continue;
    Excerpt excerpt;
    excerpt.file = readme[i].substr(marker.size(), readme[i].find(" -->") - marker.size());
    excerpt.readme_line = static_cast<int>(i + 1);
    EXPECT_TRUE(i + 1 < readme.size() && readme[i + 1].rfind("```", 0) == 0)
        << "README.md:" << excerpt.readme_line << ": the excerpt marker must be followed by a code fence";
    for (size_t j = i + 2; j < readme.size() && readme[j].rfind("```", 0) != 0; ++j)
      excerpt.lines.push_back(readme[j]);
    excerpts.push_back(excerpt);
  }
  return excerpts;
}

TEST(Docs, EveryReadmeExcerptIsInItsFileLineForLine) {
  const std::vector<Excerpt> excerpts = readme_excerpts();
  ASSERT_GE(excerpts.size(), 4u) << "the README's excerpts of examples/ were not found";
  for (const Excerpt& excerpt : excerpts) {
    ASSERT_FALSE(excerpt.lines.empty()) << "README.md:" << excerpt.readme_line << ": an empty excerpt";
    const std::vector<std::string> file = lines_of(testing::read_text(kSource + "/" + excerpt.file));
    const bool found =
        std::search(file.begin(), file.end(), excerpt.lines.begin(), excerpt.lines.end()) != file.end();
    EXPECT_TRUE(found) << "README.md:" << excerpt.readme_line << ": the excerpt is not in " << excerpt.file
                       << " as written; copy it from there again";
  }
}

}  // namespace
}  // namespace fasttrain
