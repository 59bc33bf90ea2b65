#include "fasttrain/precision/autocast.h"

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// The dtypes autocast supports on `type`, for error messages and checks. 1.13's CPU autocast
// only knows bf16; CUDA's knows fp16 and bf16.
bool autocast_supports(c10::DeviceType type, torch::ScalarType dtype) {
  if (type == c10::DeviceType::CPU) return dtype == torch::kBFloat16;
  if (type == c10::DeviceType::CUDA) return dtype == torch::kHalf || dtype == torch::kBFloat16;
  return false;
}

}  // namespace

torch::ScalarType parse_precision(const std::string& name, const torch::Device& device) {
  torch::ScalarType dtype;
  if (name == "fp32") {
    dtype = torch::kFloat;
  } else if (name == "bf16") {
    dtype = torch::kBFloat16;
  } else if (name == "fp16") {
    dtype = torch::kHalf;
  } else {
    throw ConfigError(fmt::format("train.precision must be one of auto, fp32, bf16, fp16; got '{}'", name));
  }
  check_precision(dtype, device);
  return dtype;
}

void check_precision(torch::ScalarType dtype, const torch::Device& device) {
  if (dtype == torch::kFloat) return;
  FT_CONFIG_CHECK(dtype == torch::kBFloat16 || dtype == torch::kHalf,
                  "train.precision: autocast runs in bf16 or fp16, not {}", c10::toString(dtype));
  const std::string name = precision_name(dtype);
  FT_CONFIG_CHECK(
      device.is_cpu() || device.is_cuda(),
      "train.precision = '{}' needs autocast, which fasttrain supports on cpu and cuda, not on {}; "
      "use fp32",
      name, device.str());
  FT_CONFIG_CHECK(
      !(device.is_cpu() && dtype == torch::kHalf),
      "train.precision = 'fp16' is not supported on cpu (CPU autocast runs in bfloat16); use bf16");
}

std::string precision_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat:
      return "fp32";
    case torch::kBFloat16:
      return "bf16";
    case torch::kHalf:
      return "fp16";
    default:
      FT_FAIL("precision_name: {} is not a training precision (fp32, bf16, fp16)", c10::toString(dtype));
  }
}

AutocastGuard::AutocastGuard(torch::Device device, torch::ScalarType dtype, bool enabled) {
  if (!enabled || dtype == torch::kFloat) return;
  FT_CHECK(autocast_supports(device.type(), dtype),
           "AutocastGuard: autocast to {} is not supported on {} (cpu: bf16; cuda: fp16, bf16)",
           c10::toString(dtype), device.str());
  AutocastState state = AutocastState::current();
  if (device.is_cpu()) {
    state.cpu_enabled = true;
    state.cpu_dtype = dtype;
  } else {
    state.cuda_enabled = true;
    state.cuda_dtype = dtype;
  }
  guard_.emplace(state);
}

}  // namespace fasttrain
