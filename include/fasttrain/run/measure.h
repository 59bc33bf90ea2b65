#pragma once
// What the measuring tools share (find-batch, profile, doctor, tune): how long each measurement of a
// run lasts and who hears about it. Each tool's options hold one (`measure`) beside their own.
//
//   fasttrain::diagnose(builder, config, "runs/x",
//                       fasttrain::DoctorOptions().measure(fasttrain::MeasureOptions().steps(40)));
#include <cstdint>
#include <memory>

#include "fasttrain/log/reporter.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct MeasureOptions {
  // Optimizer steps measured (after the warm-up steps).
  FT_ARG(int64_t, steps) = 20;
  // Steps run before measuring: optimizer state, kernel selection, the allocator reaching its peak.
  FT_ARG(int64_t, warmup_steps) = 5;
  // Keep measuring past `steps` until at least this many seconds are timed (0 = exactly `steps`): short
  // runs vary 2x here from one to the next.
  FT_ARG(double, min_seconds) = 0.0;
  // Hears what the measured runs build and the tool's progress; null: nothing said.
  FT_ARG(std::shared_ptr<Reporter>, reporter) = nullptr;
};

// A ConfigError naming `tool`'s option when `options` cannot measure anything.
void check_measure_options(const MeasureOptions& options, const char* tool);

}  // namespace fasttrain
