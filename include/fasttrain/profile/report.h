#pragma once
// The run report: one self-contained HTML page for a run directory (`fasttrain report RUN_DIR`).
//
//   fasttrain::write_report("runs/default", "runs/default/report.html");
//   std::string html = fasttrain::render_report("runs/default", fasttrain::ReportOptions().max_points(500));
//
// What it reads from the run directory:
//   metrics.jsonl        required: loss, test loss and accuracy, and LR curves vs step
//   summary.json         the summary table; its "step_phases_s" object (total seconds of the run per
//                        phase: data_wait, host_to_device, forward, backward, optimizer, other, and
//                        any later ones) is the step-time breakdown, per step with summary's "steps"
//   config.toml          the effective config, shown verbatim
//   memory_timeline.csv  `time_s,allocated_bytes` rows, the memory timeline (fasttrain profile)
//   doctor.json          {"findings": [{rule, title, evidence, estimated_gain, severity}, ...]}, ranked
//                        (fasttrain doctor); severity is high, medium or low; evidence and
//                        estimated_gain may be absent
// An optional file that is absent gives a section that says it was not recorded and which command
// records it. A missing run directory or metrics.jsonl, and a malformed file, are errors naming the
// file (and the line for metrics.jsonl and the CSV). Unknown keys and record kinds are ignored, so
// the report keeps reading runs whose writers gained fields.
//
// The page needs nothing from the network: CSS and a small script are inline, the series are
// embedded as JSON in <script type="application/json" id="report-data"> and drawn as SVG line
// charts. Every text from the run directory is escaped. For tests and tools the page exposes:
//   - each chart container `div.chart[data-chart=ID]` gets data-rendered="true" and
//     data-points="N" once its SVG is drawn (ID: loss, accuracy, lr, memory);
//   - script errors (window.onerror, and exceptions while drawing) become one <li> each in
//     <ul id="script-errors">.
// A series with more than max_points points is thinned into buckets that keep their first, minimum,
// maximum and last points, so spikes (a loss blow-up, a memory peak) and the ends survive.
#include <cstdint>
#include <string>

#include "fasttrain/util/arg.h"

namespace fasttrain {

struct ReportOptions {
  // The page's heading; "" = "fasttrain run <name of the run directory>".
  FT_ARG(std::string, title) = "";
  // Points per chart series (>= 4); longer series are thinned.
  FT_ARG(int64_t, max_points) = 2000;
};

// The HTML page for `run_dir`. Throws fasttrain::Error when the run directory or its metrics.jsonl
// is missing, or when a file in it is malformed.
std::string render_report(const std::string& run_dir, const ReportOptions& options = ReportOptions());

// render_report written to `out_path` (atomically: a temporary file renamed into place).
void write_report(const std::string& run_dir, const std::string& out_path,
                  const ReportOptions& options = ReportOptions());

}  // namespace fasttrain
