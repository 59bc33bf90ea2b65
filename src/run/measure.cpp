#include "fasttrain/run/measure.h"

#include "fasttrain/util/check.h"

namespace fasttrain {

void check_measure_options(const MeasureOptions& options, const char* tool) {
  FT_CONFIG_CHECK(options.steps() >= 1, "{} --steps must be >= 1, got {}", tool, options.steps());
  FT_CONFIG_CHECK(options.warmup_steps() >= 0, "{} --warmup-steps must be >= 0, got {}", tool,
                  options.warmup_steps());
  FT_CONFIG_CHECK(options.min_seconds() >= 0, "{} --min-seconds must be >= 0, got {}", tool,
                  options.min_seconds());
}

}  // namespace fasttrain
