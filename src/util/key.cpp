#include "fasttrain/util/key.h"

#include <cxxabi.h>

#include <climits>
#include <cstdlib>

namespace fasttrain {

namespace {

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

const char* kind_name(KeyValue::Kind kind) {
  switch (kind) {
    case KeyValue::Kind::kBoolean:
      return "boolean";
    case KeyValue::Kind::kInteger:
      return "integer";
    case KeyValue::Kind::kFloat:
      return "floating-point";
    case KeyValue::Kind::kString:
      return "string";
    case KeyValue::Kind::kArray:
      return "array";
  }
  return "unknown";
}

}  // namespace

std::string KeyValue::literal() const {
  switch (kind) {
    case Kind::kBoolean:
      return key_literal(boolean);
    case Kind::kInteger:
      return key_literal(integer);
    case Kind::kFloat:
      return key_literal(floating);
    case Kind::kString:
      return key_literal(string);
    case Kind::kArray: {
      std::vector<std::string> parts;
      for (const auto& element : array) parts.push_back(element.literal());
      return fmt::format("[{}]", fmt::join(parts, ", "));
    }
  }
  return "";
}

std::string KeyValue::describe() const {
  return fmt::format("{} ({})", literal(), kind_name(kind));
}

std::string key_literal(bool value) {
  return value ? "true" : "false";
}
std::string key_literal(int value) {
  return std::to_string(value);
}
std::string key_literal(int64_t value) {
  return std::to_string(value);
}
std::string key_literal(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // keep it a TOML float
  return text;
}
std::string key_literal(const std::string& value) {
  return quote(value);
}
std::string key_literal(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}
std::string key_literal(const std::vector<double>& values) {
  std::vector<std::string> parts;
  for (double value : values) parts.push_back(key_literal(value));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}
std::string key_literal(const std::vector<std::string>& values) {
  std::vector<std::string> parts;
  for (const auto& value : values) parts.push_back(quote(value));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

void read_key_value(const KeyValue& value, const std::string& name, bool& out) {
  FT_CONFIG_CHECK(value.kind == KeyValue::Kind::kBoolean, "{} must be true or false, got {}", name,
                  value.describe());
  out = value.boolean;
}
void read_key_value(const KeyValue& value, const std::string& name, int64_t& out) {
  FT_CONFIG_CHECK(value.kind == KeyValue::Kind::kInteger, "{} must be an integer, got {}", name,
                  value.describe());
  out = value.integer;
}
void read_key_value(const KeyValue& value, const std::string& name, int& out) {
  int64_t wide = 0;
  read_key_value(value, name, wide);
  FT_CONFIG_CHECK(wide >= INT32_MIN && wide <= INT32_MAX, "{} is out of range, got {}", name, wide);
  out = static_cast<int>(wide);
}
void read_key_value(const KeyValue& value, const std::string& name, double& out) {
  FT_CONFIG_CHECK(value.kind == KeyValue::Kind::kInteger || value.kind == KeyValue::Kind::kFloat,
                  "{} must be a number, got {}", name, value.describe());
  out = value.kind == KeyValue::Kind::kInteger ? static_cast<double>(value.integer) : value.floating;
  FT_CONFIG_CHECK(std::isfinite(out), "{} must be finite, got {}", name, out);
}
void read_key_value(const KeyValue& value, const std::string& name, std::string& out) {
  FT_CONFIG_CHECK(value.kind == KeyValue::Kind::kString, "{} must be a string, got {}", name,
                  value.describe());
  out = value.string;
}

namespace {

template <typename T>
void read_array(const KeyValue& value, const std::string& name, const char* what, std::vector<T>& out) {
  FT_CONFIG_CHECK(value.kind == KeyValue::Kind::kArray, "{} must be an array of {}, got {}", name, what,
                  value.describe());
  std::vector<T> values;
  for (const auto& element : value.array) {
    T item{};
    try {
      read_key_value(element, name, item);
    } catch (const ConfigError&) {
      FT_CONFIG_FAIL("{} must be an array of {}, got {}", name, what, value.describe());
    }
    values.push_back(std::move(item));
  }
  out = std::move(values);
}

}  // namespace

void read_key_value(const KeyValue& value, const std::string& name, std::vector<int64_t>& out) {
  read_array(value, name, "integers", out);
}
void read_key_value(const KeyValue& value, const std::string& name, std::vector<double>& out) {
  read_array(value, name, "numbers", out);
}
void read_key_value(const KeyValue& value, const std::string& name, std::vector<std::string>& out) {
  read_array(value, name, "strings", out);
}

const std::vector<KeyInfo>& AnyOptions::keys() const {
  static const std::vector<KeyInfo> none;
  return holder_ ? holder_->keys() : none;
}

namespace {

std::string type_name(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : type.name();
  std::free(demangled);
  return name;
}

}  // namespace

const void* AnyOptions::checked(const std::type_info& wanted) const {
  FT_CHECK(holder_, "the options hold nothing, not {}", type_name(wanted));
  FT_CHECK(holder_->type() == wanted, "the options are {}, not {}", type_name(holder_->type()),
           type_name(wanted));
  return holder_->data();
}

}  // namespace fasttrain
