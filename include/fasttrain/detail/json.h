#pragma once
// Typed reads of JSON objects for state files: a missing key or a wrong type is an Error that names
// `what` (the file or object) and the key.
//
//   int64_t step = fasttrain::json_field<int64_t>(state, "step", "checkpoint state.json");
#include <nlohmann/json.hpp>
#include <string>

#include "fasttrain/util/check.h"

namespace fasttrain {

template <typename T>
T json_field(const nlohmann::json& json, const char* key, const std::string& what) {
  FT_CHECK(json.is_object() && json.contains(key), "{}: missing key '{}'", what, key);
  try {
    return json.at(key).get<T>();
  } catch (const nlohmann::json::exception& error) {
    FT_FAIL("{}: key '{}' has the wrong type ({})", what, key, error.what());
  }
}

}  // namespace fasttrain
