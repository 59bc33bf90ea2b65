// parse_device: what train.device accepts, and errors that name the key and the value.
#include "fasttrain/util/device.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

void expect_names_key_and_value(const std::string& spec) {
  try {
    parse_device(spec);
    ADD_FAILURE() << "no error for '" << spec << "'";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.device"), std::string::npos) << what;
    EXPECT_NE(what.find("'" + spec + "'"), std::string::npos) << what;
  }
}

TEST(ParseDevice, TakesCpuAndAutoAndNamesTheKeyForAnythingElse) {
  EXPECT_EQ(parse_device("cpu"), torch::Device(torch::kCPU));
  EXPECT_EQ(parse_device("auto").is_cuda(), torch::cuda::is_available());
  for (const char* spec : {"tpu", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda0", "cuda:1:2", "cudax", ""})
    expect_names_key_and_value(spec);
  if (!torch::cuda::is_available()) {
    expect_names_key_and_value("cuda");  // no CUDA device to take
    expect_names_key_and_value("cuda:0");
  }
}

TEST(ParseDevice, TakesTheRanksGpuOrTheOneNamed_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int gpus = static_cast<int>(torch::cuda::device_count());
  EXPECT_EQ(parse_device("cuda:0"), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(parse_device("cuda", 1), torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(1 % gpus)));
  expect_names_key_and_value("cuda:" + std::to_string(gpus));
}

}  // namespace
}  // namespace fasttrain
