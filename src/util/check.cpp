#include "fasttrain/util/check.h"

#include <c10/util/Exception.h>

namespace fasttrain {

std::string message_of(const std::exception& error) {
  if (const auto* aten = dynamic_cast<const c10::Error*>(&error)) return aten->what_without_backtrace();
  return error.what();
}

}  // namespace fasttrain
