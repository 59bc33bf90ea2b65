#include "fasttrain/profile/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/detail/json.h"
#include "fasttrain/log/metrics.h"
#include "fasttrain/memory/snapshot.h"
#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// What a reader of the page is told when an optional input is absent: which command records it.
constexpr const char* kNoSummary =
    "summary.json is absent: <code>fasttrain train</code> writes it when the run ends (the run may have "
    "crashed or still be running).";
constexpr const char* kNoStepPhases =
    "summary.json has no <code>step_phases_s</code>: <code>fasttrain train</code> records it in every "
    "run (this run predates the step-phase timers).";
constexpr const char* kNoMemoryTimeline =
    "memory_timeline.csv is absent: <code>fasttrain profile CONFIG --run-dir RUN_DIR</code> records the "
    "allocator's timeline.";
constexpr const char* kNoDoctor =
    "doctor.json is absent: <code>fasttrain doctor CONFIG --run-dir RUN_DIR</code> writes the findings.";
constexpr const char* kNoConfig =
    "config.toml is absent: <code>fasttrain train</code> saves the effective config in the run directory.";
constexpr const char* kNoTrainRecords =
    "metrics.jsonl has no train records (written every <code>log.every_steps</code>).";
constexpr const char* kNoEvalRecords =
    "metrics.jsonl has no eval records (written every <code>train.eval_every_steps</code> from "
    "<code>train.eval_from_step</code>).";

// ---------------------------------------------------------------------------------------------
// Escaping: every text from the run directory goes through one of these two.
// ---------------------------------------------------------------------------------------------

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// JSON for a <script> element: '<', '>' and '&' can only occur inside JSON strings, where \u003c is
// the same character to JSON.parse, but raw they could end the element (`</script>`) or switch the
// parser into its comment-like states (`<!--`).
std::string json_for_script(const json& value) {
  const std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<':
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      case '&':
        out += "\\u0026";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

json read_json_file(const fs::path& path) {
  try {
    return json::parse(read_text_file(path.string()));
  } catch (const json::parse_error& error) {
    FT_FAIL("'{}' is not valid JSON at byte {}: the file is corrupt or was cut off", path.string(),
            error.byte);
  }
}

// ---------------------------------------------------------------------------------------------
// Series: the charts' data, read from metrics.jsonl and memory_timeline.csv.
// ---------------------------------------------------------------------------------------------

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
};

struct Chart {
  std::string id, title, x_label, y_label;
  std::string y_format;  // "number", "percent" (0..1 shown as %) or "bytes"
  std::vector<Series> series;
  std::string missing;  // HTML: why the chart has no data

  int64_t points() const {
    int64_t count = 0;
    for (const auto& s : series) count += static_cast<int64_t>(s.points.size());
    return count;
  }
};

// A resumed run repeats the steps after its checkpoint: the later records replace the earlier ones,
// as TensorBoard's purge does, so the curve never runs backwards.
void add_step_point(Series& series, double step, double value) {
  while (!series.points.empty() && series.points.back().first >= step) series.points.pop_back();
  series.points.emplace_back(step, value);
}

// Thins to at most `max_points`: each bucket of consecutive points keeps its first, minimum, maximum
// and last point (in order), so the ends and every spike survive.
std::vector<std::pair<double, double>> thin(const std::vector<std::pair<double, double>>& points,
                                            int64_t max_points) {
  const auto size = static_cast<int64_t>(points.size());
  if (size <= max_points) return points;
  const int64_t buckets = max_points / 4;
  std::vector<std::pair<double, double>> out;
  out.reserve(static_cast<size_t>(buckets) * 4);
  for (int64_t b = 0; b < buckets; ++b) {
    const int64_t begin = size * b / buckets, end = size * (b + 1) / buckets;
    int64_t low = begin, high = begin;
    for (int64_t i = begin; i < end; ++i) {
      if (points[i].second < points[low].second) low = i;
      if (points[i].second > points[high].second) high = i;
    }
    std::vector<int64_t> keep = {begin, low, high, end - 1};
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    for (int64_t i : keep) out.push_back(points[i]);
  }
  return out;
}

// A number of a metrics record; nullopt when absent or null (non-finite values are written as null).
std::optional<double> number_field(const json& record, const char* key, const std::string& where) {
  auto it = record.find(key);
  if (it == record.end() || it->is_null()) return std::nullopt;
  FT_CHECK(it->is_number(), "{}: key '{}' must be a number, got {}", where, key, it->dump());
  return it->get<double>();
}

struct RecordedMetrics {
  Series train_loss{"train loss", {}}, lr{"learning rate", {}};
  // Keyed by the record's "ema" flag: evaluations of the EMA weights are their own series.
  std::map<bool, Series> test_loss;
  // Every other test_<metric> of the eval records (accuracy, rmse, bits_per_byte, ...), in the order first
  // seen, each keyed by the "ema" flag.
  std::vector<std::pair<std::string, std::map<bool, Series>>> test_metrics;
  int64_t train_records = 0, eval_records = 0;

  std::map<bool, Series>& metric(const std::string& name) {
    for (auto& [known, series] : test_metrics) {
      if (known == name) return series;
    }
    test_metrics.emplace_back(name, std::map<bool, Series>());
    return test_metrics.back().second;
  }
};

RecordedMetrics read_metrics(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "cannot open '{}' for reading", path.string());
  RecordedMetrics metrics;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("'{}' line {}", path.string(), number);
    json record;
    try {
      record = json::parse(line);
    } catch (const json::parse_error& error) {
      FT_FAIL("{}: not valid JSON at column {} ({}{}); the file is corrupt or was cut off", where, error.byte,
              line.substr(0, 60), line.size() > 60 ? "..." : "");
    }
    FT_CHECK(record.is_object(), "{}: a record must be a JSON object, got {}", where, line.substr(0, 60));
    const std::string kind = json_field<std::string>(record, "kind", where);
    if (kind == "train") {
      const auto step = number_field(record, "step", where);
      FT_CHECK(step.has_value(), "{}: train record without a 'step'", where);
      ++metrics.train_records;
      if (auto loss = number_field(record, "loss", where)) add_step_point(metrics.train_loss, *step, *loss);
      if (auto lr = number_field(record, "lr", where)) add_step_point(metrics.lr, *step, *lr);
    } else if (kind == "eval") {
      const auto step = number_field(record, "step", where);
      FT_CHECK(step.has_value(), "{}: eval record without a 'step'", where);
      ++metrics.eval_records;
      bool ema = false;
      if (record.contains("ema")) {
        FT_CHECK(record["ema"].is_boolean(), "{}: key 'ema' must be true or false, got {}", where,
                 record["ema"].dump());
        ema = record["ema"].get<bool>();
      }
      const std::string suffix = ema ? " (EMA weights)" : "";
      if (auto loss = number_field(record, "test_loss", where)) {
        Series& series = metrics.test_loss[ema];
        series.name = "test loss" + suffix;
        add_step_point(series, *step, *loss);
      }
      for (const auto& item : record.items()) {
        const std::string& key = item.key();
        if (key.rfind("test_", 0) != 0 || key == "test_loss") continue;
        const std::string name = key.substr(5);
        if (auto value = number_field(record, key.c_str(), where)) {
          Series& series = metrics.metric(name)[ema];
          series.name = "test " + name + suffix;
          add_step_point(series, *step, *value);
        }
      }
    }
    // Other kinds (checkpoint, and whatever later versions add) are not charted.
  }
  FT_CHECK(!in.bad(), "reading '{}' failed", path.string());
  return metrics;
}

// Splits a CSV line on commas (the timeline has no quoted fields).
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) {
    const auto first = field.find_first_not_of(" \t\r");
    const auto last = field.find_last_not_of(" \t\r");
    fields.push_back(first == std::string::npos ? "" : field.substr(first, last - first + 1));
  }
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

Series read_memory_timeline(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "cannot open '{}' for reading", path.string());
  std::string line;
  FT_CHECK(std::getline(in, line), "'{}' is empty: expected the header time_s,allocated_bytes",
           path.string());
  const std::vector<std::string> header = split_csv(line);
  const auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    FT_CHECK(it != header.end(),
             "'{}' line 1: the header has no column '{}' (expected time_s,allocated_bytes)", path.string(),
             name);
    return static_cast<size_t>(it - header.begin());
  };
  const size_t time_column = column("time_s"), bytes_column = column("allocated_bytes");
  Series series{"allocated", {}};
  for (int64_t number = 2; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<std::string> fields = split_csv(line);
    FT_CHECK(fields.size() == header.size(), "'{}' line {}: {} fields, the header has {}", path.string(),
             number, fields.size(), header.size());
    double values[2];
    const size_t columns[2] = {time_column, bytes_column};
    for (int i = 0; i < 2; ++i) {
      const std::string& text = fields[columns[i]];
      char* end = nullptr;
      errno = 0;
      values[i] = std::strtod(text.c_str(), &end);
      FT_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(values[i]),
               "'{}' line {}: {} '{}' is not a number", path.string(), number, header[columns[i]], text);
    }
    series.points.emplace_back(values[0], values[1]);
  }
  FT_CHECK(!in.bad(), "reading '{}' failed", path.string());
  return series;
}

// ---------------------------------------------------------------------------------------------
// Sections: HTML fragments. Text from files is escaped here, at the point it enters the page.
// ---------------------------------------------------------------------------------------------

std::string not_recorded(const std::string& why_html) {
  return "<p class=\"not-recorded\">Not recorded: " + why_html + "</p>\n";
}

// summary.json's value for the table, with a readable form of bytes, fractions and seconds.
std::string format_summary_value(const std::string& key, const json& value) {
  if (value.is_null()) return "—";
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_number()) return value.dump();
  const double number = value.get<double>();
  std::string text = value.is_number_float() ? fmt::format("{:.6g}", number) : value.dump();
  if (ends_with(key, "_bytes")) {
    text += " (" + format_bytes(static_cast<int64_t>(number)) + ")";
  } else if (ends_with(key, "_accuracy") || ends_with(key, "_fraction")) {
    text += fmt::format(" ({:.2f}%)", 100 * number);
  } else if (ends_with(key, "_s") && !ends_with(key, "_per_s")) {
    text += " s";
  }
  return text;
}

std::string summary_section(const std::optional<json>& summary) {
  std::string html = "<section id=\"summary\">\n<h2>Summary</h2>\n";
  if (!summary) return html + not_recorded(kNoSummary) + "</section>\n";
  // The headline numbers first, then the rest in key order.
  static const std::vector<std::string> first = {"test_accuracy",       "best_test_accuracy",
                                                 "time_to_target_s",    "wall_s",
                                                 "train_samples_per_s", "steps",
                                                 "skipped_steps",       "data_wait_fraction",
                                                 "peak_memory_bytes",   "peak_resident_bytes"};
  std::vector<std::string> keys;
  for (const auto& key : first) {
    if (summary->contains(key)) keys.push_back(key);
  }
  for (const auto& item : summary->items()) {
    if (item.key() != "step_phases_s" && std::find(first.begin(), first.end(), item.key()) == first.end())
      keys.push_back(item.key());
  }
  html += "<table class=\"summary\">\n";
  for (const auto& key : keys) {
    html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", escape_html(key),
                        escape_html(format_summary_value(key, summary->at(key))));
  }
  return html + "</table>\n</section>\n";
}

std::string chart_html(const Chart& chart) {
  if (chart.points() == 0) return "<div class=\"chart-missing\">" + not_recorded(chart.missing) + "</div>\n";
  return fmt::format("<div class=\"chart\" data-chart=\"{}\"></div>\n", chart.id);
}

json chart_json(const Chart& chart, int64_t max_points) {
  json series = json::array();
  for (const auto& s : chart.series) {
    if (s.points.empty()) continue;
    json points = json::array();
    for (const auto& [x, y] : thin(s.points, max_points)) points.push_back({x, y});
    series.push_back({{"name", s.name}, {"points", std::move(points)}});
  }
  return {{"id", chart.id},           {"title", chart.title},       {"x_label", chart.x_label},
          {"y_label", chart.y_label}, {"y_format", chart.y_format}, {"series", std::move(series)}};
}

struct Phase {
  std::string key, label, color;
};

std::string step_time_section(const std::optional<json>& summary, const fs::path& summary_path) {
  std::string html = "<section id=\"step-time\">\n<h2>Step-time breakdown</h2>\n";
  if (!summary) return html + not_recorded(kNoSummary) + "</section>\n";
  if (!summary->contains("step_phases_s")) return html + not_recorded(kNoStepPhases) + "</section>\n";
  const json& phases = summary->at("step_phases_s");
  FT_CHECK(phases.is_object(), "'{}': step_phases_s must be an object of seconds per phase, got {}",
           summary_path.string(), phases.dump());
  // The known phases in the order a step runs them; phases added later follow, in key order.
  std::vector<Phase> order = {
      {"data_wait", "data wait", "#d62728"}, {"host_to_device", "host to device", "#ff7f0e"},
      {"forward", "forward", "#1f77b4"},     {"backward", "backward", "#2ca02c"},
      {"optimizer", "optimizer", "#9467bd"}, {"other", "other", "#8c8c8c"}};
  const char* spare_colors[] = {"#17becf", "#bcbd22", "#e377c2", "#8c564b"};
  size_t spare = 0;
  for (const auto& item : phases.items()) {
    const bool known =
        std::any_of(order.begin(), order.end(), [&](const Phase& phase) { return phase.key == item.key(); });
    if (!known) order.push_back({item.key(), item.key(), spare_colors[spare++ % 4]});
  }
  std::vector<std::pair<Phase, double>> present;
  double total = 0;
  for (const auto& phase : order) {
    if (!phases.contains(phase.key)) continue;
    const json& seconds = phases.at(phase.key);
    FT_CHECK(seconds.is_number() && seconds.get<double>() >= 0 && std::isfinite(seconds.get<double>()),
             "'{}': step_phases_s.{} must be a number of seconds >= 0, got {}", summary_path.string(),
             phase.key, seconds.dump());
    present.emplace_back(phase, seconds.get<double>());
    total += seconds.get<double>();
  }
  if (present.empty() || total <= 0) {
    return html + "<p class=\"not-recorded\">step_phases_s records no time.</p>\n</section>\n";
  }
  const int64_t steps = summary->contains("steps") && summary->at("steps").is_number_integer()
                            ? summary->at("steps").get<int64_t>()
                            : 0;
  html += "<div class=\"stack\" role=\"img\" aria-label=\"share of step time per phase\">";
  for (const auto& [phase, seconds] : present) {
    if (seconds <= 0) continue;
    html += fmt::format(
        "<div class=\"segment\" data-phase=\"{0}\" style=\"width:{1:.3f}%;background:{2}\" "
        "title=\"{3}: {1:.1f}%\"></div>",
        escape_html(phase.key), 100 * seconds / total, phase.color, escape_html(phase.label));
  }
  html += "</div>\n<table class=\"phases\">\n<tr><th>phase</th><th>seconds</th>";
  html += steps > 0 ? "<th>ms per step</th>" : "";
  html += "<th>share</th></tr>\n";
  for (const auto& [phase, seconds] : present) {
    html += fmt::format(
        "<tr><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td>"
        "<td class=\"num\">{:.3f}</td>",
        phase.color, escape_html(phase.label), seconds);
    if (steps > 0) html += fmt::format("<td class=\"num\">{:.3f}</td>", 1000 * seconds / steps);
    html += fmt::format("<td class=\"num\">{:.1f}%</td></tr>\n", 100 * seconds / total);
  }
  html += fmt::format("<tr class=\"total\"><td>total</td><td class=\"num\">{:.3f}</td>", total);
  if (steps > 0) html += fmt::format("<td class=\"num\">{:.3f}</td>", 1000 * total / steps);
  return html + "<td class=\"num\">100%</td></tr>\n</table>\n</section>\n";
}

// memory.snapshot's summary (memory_snapshot.json), beside the pickle it describes.
std::string memory_snapshot_paragraph(const fs::path& path) {
  if (!fs::exists(path)) return "";
  const json snapshot = read_json_file(path);
  const std::string what = fmt::format("'{}'", path.string());
  FT_CHECK(snapshot.is_object(), "{} must be a JSON object", what);
  const auto count = [&](const char* key) { return json_field<int64_t>(snapshot, key, what); };
  return fmt::format(
      "<p>The CUDA caching allocator's history (memory.snapshot): <code>{}</code>, {} events of which {} "
      "allocations (the largest {}), {} segments holding {} when it was written. Open it in "
      "<a href=\"https://pytorch.org/memory_viz\">pytorch.org/memory_viz</a>.</p>\n",
      escape_html(json_field<std::string>(snapshot, "file", what)), count("events"), count("allocations"),
      format_bytes(count("largest_allocation_bytes")), count("segments"),
      format_bytes(count("reserved_bytes")));
}

std::string memory_section(const Chart& chart, bool timeline_present, const std::optional<json>& summary,
                           const fs::path& snapshot_summary) {
  std::string html = "<section id=\"memory\">\n<h2>Memory timeline</h2>\n";
  if (summary && summary->contains("peak_memory_bytes") && summary->at("peak_memory_bytes").is_number()) {
    html += fmt::format("<p>Allocator peak of the fit: {} (summary.json peak_memory_bytes).</p>\n",
                        format_bytes(summary->at("peak_memory_bytes").get<int64_t>()));
  }
  html += memory_snapshot_paragraph(snapshot_summary);
  if (!timeline_present) return html + not_recorded(kNoMemoryTimeline) + "</section>\n";
  return html + "<div class=\"charts\">\n" + chart_html(chart) + "</div>\n</section>\n";
}

std::string doctor_section(const fs::path& path) {
  std::string html = "<section id=\"doctor\">\n<h2>Doctor's findings</h2>\n";
  if (!fs::exists(path)) return html + not_recorded(kNoDoctor) + "</section>\n";
  const json doctor = read_json_file(path);
  FT_CHECK(doctor.is_object() && doctor.contains("findings") && doctor["findings"].is_array(),
           "'{}' must be an object with a \"findings\" array", path.string());
  const json& findings = doctor["findings"];
  if (findings.empty()) return html + "<p>The doctor found nothing to change in this run.</p>\n</section>\n";
  html +=
      "<table class=\"findings\">\n<tr><th>#</th><th>severity</th><th>finding</th><th>evidence</th>"
      "<th>estimated gain</th><th>rule</th></tr>\n";
  for (size_t i = 0; i < findings.size(); ++i) {
    const std::string what = fmt::format("'{}' finding {}", path.string(), i + 1);
    const json& finding = findings[i];
    const auto title = json_field<std::string>(finding, "title", what);
    const auto rule = json_field<std::string>(finding, "rule", what);
    const auto severity = json_field<std::string>(finding, "severity", what);
    FT_CHECK(severity == "high" || severity == "medium" || severity == "low",
             "{}: severity '{}' is not allowed; valid: high, medium, low", what, severity);
    const auto optional_text = [&](const char* key) {
      return finding.contains(key) ? json_field<std::string>(finding, key, what) : std::string("—");
    };
    // `severity` is one of three words, safe in a class name.
    html += fmt::format(
        "<tr><td class=\"num\">{}</td><td><span class=\"severity severity-{}\">{}</span></td><td>{}</td>"
        "<td>{}</td><td>{}</td><td><code>{}</code></td></tr>\n",
        i + 1, severity, severity, escape_html(title), escape_html(optional_text("evidence")),
        escape_html(optional_text("estimated_gain")), escape_html(rule));
  }
  return html + "</table>\n</section>\n";
}

std::string config_section(const fs::path& path) {
  std::string html = "<section id=\"config\">\n<h2>Effective config</h2>\n";
  if (!fs::exists(path)) return html + not_recorded(kNoConfig) + "</section>\n";
  return html + "<pre class=\"config\">" + escape_html(read_text_file(path.string())) +
         "</pre>\n</section>\n";
}

// ---------------------------------------------------------------------------------------------
// The page: CSS, the error collector (first, so it sees every later script error), the sections,
// the data and the chart script.
// ---------------------------------------------------------------------------------------------

constexpr const char* kStyle = R"CSS(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330;
       background: #fff; max-width: 1120px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 12px; padding-bottom: 4px; border-bottom: 1px solid #dde2ea; }
.subtitle { color: #5b6475; margin: 0; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
table { border-collapse: collapse; }
th, td { text-align: left; padding: 4px 12px 4px 0; border-bottom: 1px solid #eceff4; vertical-align: top; }
th { font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: 600; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); gap: 16px; }
.chart { border: 1px solid #dde2ea; border-radius: 6px; padding: 6px; }
.chart svg { display: block; width: 100%; height: auto; }
.chart svg text { font: 11px system-ui, sans-serif; fill: #5b6475; }
.chart svg text.title { font-size: 13px; font-weight: 600; fill: #1d2330; }
.chart svg .grid line { stroke: #eceff4; }
.chart svg rect.frame { fill: none; stroke: #9aa3b2; }
.legend { margin: 2px 0 0 8px; font-size: 12px; color: #5b6475; }
.legend span { margin-right: 14px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; border-radius: 2px; }
.not-recorded { color: #5b6475; background: #f6f7f9; border-left: 3px solid #b8c0cc; padding: 8px 12px; }
.stack { display: flex; height: 28px; border-radius: 4px; overflow: hidden; margin: 4px 0 12px; }
pre.config { background: #f6f7f9; padding: 12px; overflow-x: auto; line-height: 1.4; }
.severity { font-size: 11px; font-weight: 600; text-transform: uppercase; padding: 1px 6px; border-radius: 3px; }
.severity-high { background: #fde2e1; color: #a4161a; }
.severity-medium { background: #fff1d6; color: #8a5a00; }
.severity-low { background: #e3eefc; color: #1d4f91; }
#script-errors { color: #a4161a; border: 1px solid #a4161a; border-radius: 4px; padding: 8px 8px 8px 28px; }
)CSS";

constexpr const char* kErrorCollector = R"JS(
function reportScriptError(message) {
  var list = document.getElementById('script-errors');
  var item = document.createElement('li');
  item.textContent = String(message);
  list.appendChild(item);
  list.hidden = false;
}
window.onerror = function (message, source, line, column) {
  reportScriptError(message + ' (line ' + line + ', column ' + column + ')');
};
)JS";

// Draws each chart of the embedded data as an SVG line chart into div.chart[data-chart=ID] and marks
// the div when done; failures go to #script-errors, and a chart div left without data is one too.
constexpr const char* kChartScript = R"JS(
(function () {
  'use strict';
  var SVG_NS = 'http://www.w3.org/2000/svg';
  var WIDTH = 640, HEIGHT = 300;
  var MARGIN = {left: 70, right: 18, top: 34, bottom: 46};
  var COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e'];
  var BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

  function svgNode(name, attributes, parent, text) {
    var node = document.createElementNS(SVG_NS, name);
    for (var key in attributes) node.setAttribute(key, attributes[key]);
    if (text !== undefined) node.textContent = text;
    parent.appendChild(node);
    return node;
  }

  // [lo, hi] of the values, widened when they are all equal so that the axis has a span.
  function extent(values) {
    var lo = Infinity, hi = -Infinity;
    for (var i = 0; i < values.length; i++) {
      lo = Math.min(lo, values[i]);
      hi = Math.max(hi, values[i]);
    }
    if (lo === hi) {
      var pad = lo === 0 ? 1 : Math.abs(lo) * 0.05;
      lo -= pad;
      hi += pad;
    }
    return [lo, hi];
  }

  // A 1-2-5 step that cuts `span` into about `count` intervals.
  function niceStep(span, count) {
    var raw = span / count;
    var magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
    var ratio = raw / magnitude;
    return (ratio <= 1 ? 1 : ratio <= 2 ? 2 : ratio <= 5 ? 5 : 10) * magnitude;
  }

  function ticks(lo, hi, step) {
    var values = [];
    for (var i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) values.push(i * step);
    return values;
  }

  // A tick label with as many decimals as the tick step needs.
  function tickLabel(value, step) {
    var decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
    if (decimals > 6 || Math.abs(value) >= 1e7) return value.toExponential(1);
    return String(parseFloat(value.toFixed(decimals)));
  }

  function drawChart(box, spec) {
    var xs = [], ys = [], points = 0;
    spec.series.forEach(function (series) {
      series.points.forEach(function (p) {
        xs.push(p[0]);
        ys.push(p[1]);
      });
      points += series.points.length;
    });
    if (points === 0) throw new Error('no points');

    var xRange = extent(xs), yRange = extent(ys);
    var scale = 1, yLabel = spec.y_label;
    if (spec.y_format === 'percent') {
      scale = 100;
      yLabel += ' (%)';
    } else if (spec.y_format === 'bytes') {
      var unit = 0, top = Math.max(Math.abs(yRange[0]), Math.abs(yRange[1]));
      while (unit < BYTE_UNITS.length - 1 && top >= Math.pow(1024, unit + 1)) unit++;
      scale = 1 / Math.pow(1024, unit);
      yLabel += ' (' + BYTE_UNITS[unit] + ')';
    }
    var yStep = niceStep((yRange[1] - yRange[0]) * scale, 5);
    var yLo = Math.floor(yRange[0] * scale / yStep) * yStep, yHi = Math.ceil(yRange[1] * scale / yStep) * yStep;
    var xStep = niceStep(xRange[1] - xRange[0], 6);
    var plotWidth = WIDTH - MARGIN.left - MARGIN.right, plotHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
    function px(x) { return MARGIN.left + (x - xRange[0]) / (xRange[1] - xRange[0]) * plotWidth; }
    function pyScaled(y) { return MARGIN.top + (yHi - y) / (yHi - yLo) * plotHeight; }
    function py(y) { return pyScaled(y * scale); }

    var svg = svgNode('svg', {viewBox: '0 0 ' + WIDTH + ' ' + HEIGHT, role: 'img', 'aria-label': spec.title}, box);
    svgNode('text', {x: MARGIN.left, y: 20, 'class': 'title'}, svg, spec.title);
    var grid = svgNode('g', {'class': 'grid'}, svg);
    ticks(yLo, yHi, yStep).forEach(function (value) {
      var y = pyScaled(value);
      svgNode('line', {x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y, y2: y}, grid);
      svgNode('text', {x: MARGIN.left - 6, y: y + 4, 'text-anchor': 'end'}, svg, tickLabel(value, yStep));
    });
    ticks(xRange[0], xRange[1], xStep).forEach(function (value) {
      var x = px(value);
      svgNode('line', {x1: x, x2: x, y1: MARGIN.top, y2: HEIGHT - MARGIN.bottom}, grid);
      svgNode('text', {x: x, y: HEIGHT - MARGIN.bottom + 16, 'text-anchor': 'middle'}, svg, tickLabel(value, xStep));
    });
    svgNode('rect', {x: MARGIN.left, y: MARGIN.top, width: plotWidth, height: plotHeight, 'class': 'frame'}, svg);
    svgNode('text', {x: MARGIN.left + plotWidth / 2, y: HEIGHT - 8, 'text-anchor': 'middle'}, svg, spec.x_label);
    var middle = MARGIN.top + plotHeight / 2;
    svgNode('text', {x: 16, y: middle, 'text-anchor': 'middle', transform: 'rotate(-90 16 ' + middle + ')'}, svg,
            yLabel);

    var legend = document.createElement('p');
    legend.className = 'legend';
    spec.series.forEach(function (series, index) {
      var color = COLORS[index % COLORS.length];
      var d = series.points.map(function (p, i) {
        return (i === 0 ? 'M' : 'L') + px(p[0]).toFixed(1) + ' ' + py(p[1]).toFixed(1);
      }).join('');
      svgNode('path', {d: d, fill: 'none', stroke: color, 'stroke-width': 1.6, 'stroke-linejoin': 'round'}, svg);
      // Sparse series (evaluations) get a dot per point, so a single point is visible too.
      if (series.points.length <= 60) {
        series.points.forEach(function (p) {
          svgNode('circle', {cx: px(p[0]).toFixed(1), cy: py(p[1]).toFixed(1), r: 2.5, fill: color}, svg);
        });
      }
      var entry = document.createElement('span');
      var swatch = document.createElement('span');
      swatch.className = 'swatch';
      swatch.style.background = color;
      entry.appendChild(swatch);
      entry.appendChild(document.createTextNode(series.name));
      legend.appendChild(entry);
    });
    box.appendChild(legend);
    box.setAttribute('data-points', String(points));
    box.setAttribute('data-rendered', 'true');
  }

  var data = JSON.parse(document.getElementById('report-data').textContent);
  data.charts.forEach(function (spec) {
    var box = document.querySelector('div.chart[data-chart="' + spec.id + '"]');
    if (!box) return;
    try {
      drawChart(box, spec);
    } catch (error) {
      box.setAttribute('data-rendered', 'error');
      reportScriptError('chart ' + spec.id + ': ' + error.message);
    }
  });
  document.querySelectorAll('div.chart:not([data-rendered])').forEach(function (box) {
    reportScriptError('chart ' + box.getAttribute('data-chart') + ' has no data');
  });
})();
)JS";

}  // namespace

std::string render_report(const std::string& run_dir, const ReportOptions& options) {
  FT_CHECK(options.max_points() >= 4, "report max_points must be >= 4, got {}", options.max_points());
  const fs::path dir(run_dir);
  FT_CHECK(fs::is_directory(dir),
           "run directory '{}' does not exist (fasttrain train --run-dir DIR writes one)", run_dir);
  const fs::path metrics_path = dir / "metrics.jsonl";
  FT_CHECK(fs::exists(metrics_path),
           "'{}' is missing: '{}' is not a fasttrain run directory, or its run has not logged yet",
           metrics_path.string(), run_dir);

  const RecordedMetrics metrics = read_metrics(metrics_path);
  const fs::path summary_path = dir / "summary.json";
  std::optional<json> summary;
  if (fs::exists(summary_path)) {
    summary = read_json_file(summary_path);
    FT_CHECK(summary->is_object(), "'{}' must be a JSON object", summary_path.string());
  }
  const fs::path timeline_path = dir / "memory_timeline.csv";
  const bool timeline_present = fs::exists(timeline_path);

  auto eval_series = [](const std::map<bool, Series>& by_ema) {
    std::vector<Series> series;
    for (const auto& item : by_ema) series.push_back(item.second);
    return series;
  };
  Chart loss{"loss", "Loss", "step", "loss", "number", {metrics.train_loss}, kNoTrainRecords};
  for (const auto& series : eval_series(metrics.test_loss)) loss.series.push_back(series);
  // One chart per test metric (their scales differ); a placeholder that says why when there is none.
  std::vector<Chart> metric_charts;
  for (const auto& [name, by_ema] : metrics.test_metrics) {
    const bool percent = ends_with(name, "accuracy");
    metric_charts.push_back(Chart{name, "Test " + name, "step", "test " + name,
                                  percent ? "percent" : "number", eval_series(by_ema), kNoEvalRecords});
  }
  if (metric_charts.empty())
    metric_charts.push_back(Chart{"metrics", "Test metrics", "step", "", "number", {}, kNoEvalRecords});
  Chart lr{"lr", "Learning rate", "step", "learning rate", "number", {metrics.lr}, kNoTrainRecords};
  Chart memory{
      "memory", "Allocated memory", "time (s)", "allocated", "bytes", {}, "memory_timeline.csv has no rows."};
  if (timeline_present) memory.series.push_back(read_memory_timeline(timeline_path));

  std::string title = options.title();
  if (title.empty()) {
    fs::path name = fs::absolute(dir).lexically_normal();
    if (name.filename().empty()) name = name.parent_path();
    title = "fasttrain run " + name.filename().string();
  }

  json data = {{"title", title}, {"run_dir", run_dir}, {"charts", json::array()}};
  std::vector<const Chart*> charts = {&loss};
  for (const Chart& chart : metric_charts) charts.push_back(&chart);
  charts.push_back(&lr);
  charts.push_back(&memory);
  for (const Chart* chart : charts) {
    if (chart->points() > 0) data["charts"].push_back(chart_json(*chart, options.max_points()));
  }
  if (summary) data["summary"] = *summary;

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>" + escape_html(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  html += "<ul id=\"script-errors\" hidden></ul>\n<script>" + std::string(kErrorCollector) + "</script>\n";
  html += "<header>\n<h1>" + escape_html(title) + "</h1>\n<p class=\"subtitle\">run directory <code>" +
          escape_html(run_dir) + "</code></p>\n</header>\n";
  html += summary_section(summary);
  html += "<section id=\"curves\">\n<h2>Training curves</h2>\n<div class=\"charts\">\n" + chart_html(loss);
  for (const Chart& chart : metric_charts) html += chart_html(chart);
  html += chart_html(lr) + "</div>\n</section>\n";
  html += step_time_section(summary, summary_path);
  html += memory_section(memory, timeline_present, summary, dir / CudaMemoryHistory::kSummary);
  html += doctor_section(dir / "doctor.json");
  html += config_section(dir / "config.toml");
  html += "<script type=\"application/json\" id=\"report-data\">" + json_for_script(data) + "</script>\n";
  html += "<script>" + std::string(kChartScript) + "</script>\n</body>\n</html>\n";
  return html;
}

void write_report(const std::string& run_dir, const std::string& out_path, const ReportOptions& options) {
  write_text_file(out_path, render_report(run_dir, options));
}

}  // namespace fasttrain
