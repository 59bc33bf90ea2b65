// TensorValuesGuard: values put back in place; a tensor that cannot be put back is an error, or, while
// another error unwinds, a warning that leaves that error to go on.
#include "fasttrain/detail/tensor_guard.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace fasttrain {
namespace {

TEST(TensorValuesGuard, PutsTheValuesBackInPlace) {
  auto a = torch::arange(3.0), b = torch::ones({2, 2});
  const void* where = a.data_ptr();
  {
    TensorValuesGuard keep({a, b});
    a.mul_(7), b.zero_();
  }
  EXPECT_TRUE(torch::equal(a, torch::arange(3.0)));
  EXPECT_TRUE(torch::equal(b, torch::ones({2, 2})));
  EXPECT_EQ(a.data_ptr(), where);
}

TEST(TensorValuesGuard, ATensorThatCannotBePutBackIsAnErrorAfterTheOthersArePutBack) {
  auto resized = torch::zeros({3}), other = torch::ones({2});
  try {
    TensorValuesGuard keep({resized, other});
    resized.resize_({5});
    other.fill_(9);
  } catch (const c10::Error&) {
    EXPECT_TRUE(torch::equal(other, torch::ones({2})));
    return;
  }
  ADD_FAILURE() << "no error for a tensor resized under the guard";
}

TEST(TensorValuesGuard, WhileAnotherErrorUnwindsThatErrorGoesOn) {
  auto resized = torch::zeros({3}), other = torch::ones({2});
  ::testing::internal::CaptureStderr();
  try {
    TensorValuesGuard keep({resized, other});
    resized.resize_({5});
    other.fill_(9);
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "the step failed");
  }
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("could not be put back"), std::string::npos) << printed;
  EXPECT_TRUE(torch::equal(other, torch::ones({2})));
}

}  // namespace
}  // namespace fasttrain
