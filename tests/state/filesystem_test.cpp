// std::filesystem::remove_all in a binary that links LibTorch: PyTorch 2.x's wheels export their own
// copies of it from libtorch.so, one of which jumps to address 0 (pytorch/pytorch#133437). Checkpoint
// pruning and every TempDir call it; CMakeLists.txt links libstdc++ ahead of LibTorch so that the
// dynamic linker binds it to libstdc++'s. This proves the binding of this test binary (the library's
// code is linked into it, so it shares the binding), then removes a nested tree both ways.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "support.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;

// The file of the shared object that defines the code at `address` ("" when none does).
std::string defining_object(const void* address) {
  Dl_info info{};
  if (::dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

void make_tree(const fs::path& root) {
  fs::create_directories(root / "a" / "b" / "c");
  fs::create_directories(root / "d");
  std::ofstream(root / "top.txt") << "top";
  std::ofstream(root / "a" / "b" / "c" / "deep.bin") << std::string(4096, 'x');
  std::ofstream(root / "d" / "other.txt") << "other";
  fs::create_symlink(root / "a", root / "d" / "link-to-a");  // removed as a link, not followed
}

TEST(FileSystem, RemoveAllBindsToLibstdcxx) {
  // In a position-independent executable a function's address is the one its calls resolve to.
  using Throwing = std::uintmax_t (*)(const fs::path&);
  using NonThrowing = std::uintmax_t (*)(const fs::path&, std::error_code&);
  const auto* throwing = reinterpret_cast<const void*>(static_cast<Throwing>(&fs::remove_all));
  const auto* non_throwing = reinterpret_cast<const void*>(static_cast<NonThrowing>(&fs::remove_all));
  // libstdc++'s copy, or one the compiler put in this executable itself (GCC 13 on the GPU machine
  // did): anything but LibTorch's.
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (const void* address : {throwing, non_throwing}) {
    const std::string object = defining_object(address);
    const bool safe = object.find("libstdc++") != std::string::npos || fs::equivalent(object, self);
    EXPECT_TRUE(safe) << "std::filesystem::remove_all binds to '" << object
                      << "', not libstdc++: libstdc++ must come before libtorch in the binary's NEEDED list";
  }
}

TEST(FileSystem, RemoveAllRemovesANestedTree) {
  testing::TempDir dir;
  const fs::path root = fs::path(dir.path()) / "tree";
  make_tree(root);
  ASSERT_TRUE(fs::exists(root / "a" / "b" / "c" / "deep.bin"));
  EXPECT_EQ(fs::remove_all(root), 9u);  // 5 directories (root among them), 3 files, 1 link
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(dir.path())) << "only the tree asked for goes";

  make_tree(root);
  std::error_code error;
  EXPECT_GT(fs::remove_all(root, error), 0u);
  EXPECT_FALSE(error) << error.message();
  EXPECT_FALSE(fs::exists(root));
  EXPECT_EQ(fs::remove_all(root, error), 0u) << "a missing path is not an error";
  EXPECT_FALSE(error) << error.message();
}

}  // namespace
}  // namespace fasttrain
