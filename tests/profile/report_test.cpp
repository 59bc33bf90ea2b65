// The run report: sections from fixture run directories, escaping of every text from the files,
// errors that name the file and line, thinning of long series, and the page loaded in headless
// Chromium, which must draw every chart without a script error.
#include "fasttrain/profile/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "support.h"

namespace fasttrain {
namespace {

namespace fs = std::filesystem;
using testing::contains_all;
using testing::error_message;
using testing::TempDir;

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// A fixture run: 8 train records (steps 25..200), 2 eval records, a checkpoint record.
constexpr int kTrainRecords = 8, kEvalRecords = 2, kTimelineRows = 40;

std::string fixture_metrics() {
  std::string text;
  for (int i = 1; i <= kTrainRecords; ++i) {
    text += nlohmann::json{{"kind", "train"},       {"step", 25 * i},       {"epoch", 0},
                           {"loss", 2.0 / i},       {"lr", 1e-3 * i},       {"grad_norm", 1.5},
                           {"samples_per_s", 9000}, {"elapsed_s", 0.1 * i}, {"data_wait_fraction", 0.01}}
                .dump() +
            "\n";
  }
  text +=
      R"({"kind":"eval","step":100,"epoch":0,"test_loss":0.6,"test_accuracy":0.81,"ema":false,"elapsed_s":0.5})"
      "\n";
  text +=
      R"({"kind":"eval","step":200,"epoch":0,"test_loss":0.4,"test_accuracy":0.88,"ema":false,"elapsed_s":1.0})"
      "\n";
  text += R"({"kind":"checkpoint","step":200,"dir":"ckpt/step-200","save_s":0.03})"
          "\n";
  return text;
}

// Every input a run directory can have.
void write_full_run(const std::string& dir) {
  write(dir + "/metrics.jsonl", fixture_metrics());
  write(dir + "/summary.json", R"({"test_accuracy": 0.88, "best_test_accuracy": 0.88, "wall_s": 1.2,
    "train_samples_per_s": 9000.5, "steps": 200, "peak_memory_bytes": 77060444, "data_wait_fraction": 0.01,
    "time_to_target_s": null, "interrupted": false, "checkpoint": "ckpt/step-200",
    "step_phases_s": {"data_wait": 0.05, "host_to_device": 0.02, "forward": 0.4, "backward": 0.5,
                      "optimizer": 0.15, "other": 0.08}})");
  write(dir + "/config.toml", "[model]\nname = \"cnn\"\n\n[train]\nmax_steps = 200\n");
  std::string timeline = "time_s,allocated_bytes\n";
  for (int i = 0; i < kTimelineRows; ++i) {
    timeline += fmt::format("{:.2f},{}\n", 0.05 * i, 50'000'000 + (i % 10) * 3'000'000);
  }
  write(dir + "/memory_timeline.csv", timeline);
  write(dir + "/doctor.json", R"({"findings": [
    {"rule": "data_wait", "title": "The step waits for data", "evidence": "data wait 31% of step time",
     "estimated_gain": "up to 1.4x", "severity": "high"},
    {"rule": "channels_last", "title": "Convolutions run in NCHW", "evidence": "cnn model, channels_last off",
     "estimated_gain": "1.2-1.6x", "severity": "medium"}]})");
}

// The JSON of <script type="application/json" id="report-data">, parsed.
nlohmann::json report_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const auto begin = html.find(open);
  if (begin == std::string::npos) throw std::runtime_error("no report-data block");
  const auto end = html.find("</script>", begin);
  return nlohmann::json::parse(html.substr(begin + open.size(), end - begin - open.size()));
}

const nlohmann::json* chart_data(const nlohmann::json& data, const std::string& id) {
  for (const auto& chart : data["charts"]) {
    if (chart["id"] == id) return &chart;
  }
  return nullptr;
}

TEST(Report, RendersEverySectionOfAFullRunDirectory) {
  TempDir dir;
  write_full_run(dir.path());
  const std::string html = render_report(dir.path());

  EXPECT_TRUE(
      contains_all(html, {"<!DOCTYPE html>", "id=\"summary\"", "id=\"curves\"", "id=\"step-time\"",
                          "id=\"memory\"", "id=\"doctor\"", "id=\"config\"", "id=\"script-errors\""}));
  for (const char* chart : {"loss", "accuracy", "lr", "memory"}) {
    EXPECT_NE(html.find(fmt::format("<div class=\"chart\" data-chart=\"{}\">", chart)), std::string::npos)
        << chart;
  }
  EXPECT_EQ(html.find("Not recorded"), std::string::npos);
  // Summary: readable forms of bytes and fractions.
  EXPECT_TRUE(contains_all(html, {"77060444 (73.49 MiB)", "0.88 (88.00%)", "fasttrain run "}));
  // Step phases: shares of the 1.2 s total, ms per step from summary.json's steps.
  EXPECT_TRUE(contains_all(html, {"data-phase=\"forward\"", "data-phase=\"backward\"", "33.3%", "41.7%",
                                  "host to device", "<td class=\"num\">2.500</td>"}));
  // Doctor: ranked rows with their severity.
  EXPECT_TRUE(contains_all(html, {"The step waits for data", "severity-high", "up to 1.4x",
                                  "<code>channels_last</code>", "severity-medium"}));
  EXPECT_LT(html.find("The step waits for data"), html.find("Convolutions run in NCHW"));
  EXPECT_TRUE(contains_all(html, {"<pre class=\"config\">[model]\nname = &quot;cnn&quot;"}));

  // The embedded data: every series with every point.
  const nlohmann::json data = report_data(html);
  ASSERT_NE(chart_data(data, "loss"), nullptr);
  const auto& loss = *chart_data(data, "loss");
  ASSERT_EQ(loss["series"].size(), 2u);
  EXPECT_EQ(loss["series"][0]["name"], "train loss");
  EXPECT_EQ(loss["series"][0]["points"].size(), static_cast<size_t>(kTrainRecords));
  EXPECT_EQ(loss["series"][0]["points"][0], nlohmann::json({25, 2.0}));
  EXPECT_EQ(loss["series"][1]["name"], "test loss");
  EXPECT_EQ((*chart_data(data, "accuracy"))["series"][0]["points"][1], nlohmann::json({200, 0.88}));
  EXPECT_EQ((*chart_data(data, "lr"))["series"][0]["points"].size(), static_cast<size_t>(kTrainRecords));
  EXPECT_EQ((*chart_data(data, "memory"))["series"][0]["points"].size(), static_cast<size_t>(kTimelineRows));
  EXPECT_EQ(data["summary"]["steps"], 200);

  // Self-contained: nothing is fetched.
  for (const char* fetch : {"src=", "<link", "@import", "url(", "href=\"http"}) {
    EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
  }
}

TEST(Report, EscapesEveryTextFromTheRunDirectory) {
  TempDir dir;
  write_full_run(dir.path());
  const std::string attack = "</script><script>alert(1)</script><!--";
  write(dir.file("config.toml"), "[run]\nname = \"" + attack + "\" # a & b <b>\n");
  write(dir.file("doctor.json"), nlohmann::json{{"findings",
                                                 {{{"rule", "r<1>"},
                                                   {"title", attack},
                                                   {"evidence", "<img src=x onerror=alert(2)>"},
                                                   {"estimated_gain", "\"quoted\" & 'single'"},
                                                   {"severity", "low"}}}}}
                                     .dump());
  auto summary = nlohmann::json::parse(testing::read_text(dir.file("summary.json")));
  summary["checkpoint"] = attack;
  write(dir.file("summary.json"), summary.dump());
  const std::string title = "run " + attack;
  const std::string html = render_report(dir.path(), ReportOptions().title(title));

  // Only the report's own two scripts, the error collector and the data block open a script.
  size_t scripts = 0;
  for (size_t at = html.find("<script"); at != std::string::npos; at = html.find("<script", at + 1))
    ++scripts;
  EXPECT_EQ(scripts, 3u);
  EXPECT_EQ(html.find("alert(1)</script>"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<!--"), std::string::npos);
  EXPECT_TRUE(contains_all(html, {"&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;!--",
                                  "# a &amp; b &lt;b&gt;", "&lt;img src=x onerror=alert(2)&gt;",
                                  "&quot;quoted&quot; &amp; &#39;single&#39;", "r&lt;1&gt;"}));
  // The JSON block holds the texts unchanged to JSON.parse, with no "<" that could end the element.
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const auto begin = html.find(open) + open.size();
  const std::string block = html.substr(begin, html.find("</script>", begin) - begin);
  EXPECT_EQ(block.find('<'), std::string::npos);
  const nlohmann::json data = report_data(html);
  EXPECT_EQ(data["title"], title);
  EXPECT_EQ(data["summary"]["checkpoint"], attack);
}

TEST(Report, AbsentOptionalInputsSayTheyWereNotRecordedAndWhichCommandRecordsThem) {
  TempDir dir;
  write(dir.file("metrics.jsonl"), fixture_metrics());
  std::string html = render_report(dir.path());
  EXPECT_TRUE(contains_all(
      html,
      {"Not recorded: summary.json is absent", "<code>fasttrain train</code>",
       "Not recorded: memory_timeline.csv is absent",
       "<code>fasttrain profile CONFIG --run-dir RUN_DIR</code>", "Not recorded: doctor.json is absent",
       "<code>fasttrain doctor CONFIG --run-dir RUN_DIR</code>", "Not recorded: config.toml is absent"}));
  EXPECT_EQ(html.find("data-chart=\"memory\""), std::string::npos);
  EXPECT_EQ(chart_data(report_data(html), "memory"), nullptr);

  // Runs from before the step-phase timers: a summary without step_phases_s.
  write(dir.file("summary.json"), R"({"steps": 200, "peak_memory_bytes": 1048576})");
  html = render_report(dir.path());
  EXPECT_TRUE(contains_all(html, {"Not recorded: summary.json has no <code>step_phases_s</code>",
                                  "Allocator peak of the fit: 1.00 MiB"}));

  // metrics.jsonl without evaluations: the accuracy chart says why it is missing.
  write(dir.file("metrics.jsonl"), R"({"kind":"train","step":10,"loss":1.0,"lr":0.1})"
                                   "\n");
  html = render_report(dir.path());
  EXPECT_TRUE(contains_all(html, {"Not recorded: metrics.jsonl has no eval records", "data-chart=\"loss\""}));
  EXPECT_EQ(html.find("data-chart=\"accuracy\""), std::string::npos);
}

TEST(Report, MissingRunDirectoryOrMetricsIsAnErrorNamingThePath) {
  TempDir dir;
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.file("nope")); }),
                           {dir.file("nope"), "does not exist"}));
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }),
                           {dir.path() + "/metrics.jsonl", "is missing"}));
  write(dir.file("metrics.jsonl"), fixture_metrics());
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path(), ReportOptions().max_points(3)); }),
                           {"max_points", ">= 4", "3"}));
}

TEST(Report, MalformedFilesAreErrorsNamingTheFileAndTheLine) {
  TempDir dir;
  write_full_run(dir.path());
  const std::string metrics = dir.file("metrics.jsonl");
  const std::string good = R"({"kind":"train","step":10,"loss":1.0})"
                           "\n";
  write(metrics, good + "\n" + R"({"kind":"train","step":20,"loss":)" + "\n" + good);
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }),
                           {metrics, "line 3", "not valid JSON", "cut off"}));
  write(metrics, good + R"({"kind":"train","step":20,"loss":"low"})" + "\n");
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }),
                           {metrics, "line 2", "'loss'", "\"low\""}));
  write(metrics, good + "[1, 2]\n");
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }), {metrics, "line 2", "object"}));
  write(metrics, good + R"({"step":20})" + "\n");
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }), {metrics, "line 2", "'kind'"}));
  write(metrics, fixture_metrics());

  const std::string timeline = dir.file("memory_timeline.csv");
  write(timeline, "time_s,allocated_bytes\n0.0,100\n0.1,lots\n");
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }),
                           {timeline, "line 3", "allocated_bytes", "'lots'"}));
  write(timeline, "time,bytes\n0.0,100\n");
  EXPECT_TRUE(
      contains_all(error_message([&] { render_report(dir.path()); }), {timeline, "line 1", "'time_s'"}));
  write(timeline, "time_s,allocated_bytes\n0.0,100\n");

  const std::string doctor = dir.file("doctor.json");
  write(doctor, R"({"findings": [{"rule": "a", "title": "A", "severity": "low"},
                                 {"rule": "b", "title": "B", "severity": "urgent"}]})");
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }),
                           {doctor, "finding 2", "'urgent'", "high, medium, low"}));
  write(doctor, R"({"findings": [{"rule": "a", "severity": "low"}]})");
  EXPECT_TRUE(
      contains_all(error_message([&] { render_report(dir.path()); }), {doctor, "finding 1", "'title'"}));
  write(doctor, R"({"findings": )");
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }), {doctor, "not valid JSON"}));
  write(doctor, R"({"findings": []})");
  EXPECT_TRUE(contains_all(render_report(dir.path()), {"The doctor found nothing to change"}));

  const std::string summary = dir.file("summary.json");
  write(summary, R"({"step_phases_s": {"forward": -1}})");
  EXPECT_TRUE(contains_all(error_message([&] { render_report(dir.path()); }),
                           {summary, "step_phases_s.forward", ">= 0", "-1"}));
}

TEST(Report, UnknownKeysAndKindsAreIgnored) {
  TempDir dir;
  write(dir.file("metrics.jsonl"),
        R"({"kind":"train","step":10,"loss":1.0,"lr":0.1,"new_key":[1,2],"loss_scale":65536})"
        "\n"
        R"({"kind":"future_kind","step":"not a number","whatever":{}})"
        "\n"
        R"({"kind":"train","step":20,"loss":null,"lr":0.2})"
        "\n");
  write(dir.file("summary.json"), R"({"steps": 20, "new_summary_key": {"nested": [1]},
    "step_phases_s": {"forward": 1.0, "backward": 1.0, "all_reduce": 2.0}})");
  const std::string html = render_report(dir.path());
  const nlohmann::json data = report_data(html);
  // A null loss (non-finite) is a gap, not a point.
  EXPECT_EQ((*chart_data(data, "loss"))["series"][0]["points"], nlohmann::json({{10, 1.0}}));
  EXPECT_EQ((*chart_data(data, "lr"))["series"][0]["points"].size(), 2u);
  // A phase added later is shown after the known ones.
  EXPECT_TRUE(contains_all(html, {"data-phase=\"all_reduce\"", "50.0%", "new_summary_key"}));
  EXPECT_LT(html.find("data-phase=\"backward\""), html.find("data-phase=\"all_reduce\""));
}

TEST(Report, AResumedRunsRepeatedStepsReplaceTheEarlierOnes) {
  TempDir dir;
  std::string metrics;
  for (int step : {10, 20, 30, 40}) {
    metrics += nlohmann::json{{"kind", "train"}, {"step", step}, {"loss", 1.0}, {"lr", 0.1}}.dump() + "\n";
  }
  // Resumed from the step-20 checkpoint: steps 30 and 40 again, with other values.
  for (int step : {30, 40, 50}) {
    metrics += nlohmann::json{{"kind", "train"}, {"step", step}, {"loss", 0.5}, {"lr", 0.1}}.dump() + "\n";
  }
  write(dir.file("metrics.jsonl"), metrics);
  const nlohmann::json data = report_data(render_report(dir.path()));
  EXPECT_EQ((*chart_data(data, "loss"))["series"][0]["points"],
            nlohmann::json({{10, 1.0}, {20, 1.0}, {30, 0.5}, {40, 0.5}, {50, 0.5}}));
}

TEST(Report, LongSeriesAreThinnedKeepingTheEndsAndTheSpikes) {
  TempDir dir;
  std::string metrics;
  for (int step = 1; step <= 10000; ++step) {
    const double loss = step == 6789 ? 50.0 : step == 1234 ? -1.0 : 1.0 / step;
    metrics += nlohmann::json{{"kind", "train"}, {"step", step}, {"loss", loss}, {"lr", 0.1}}.dump() + "\n";
  }
  write(dir.file("metrics.jsonl"), metrics);
  const nlohmann::json data = report_data(render_report(dir.path(), ReportOptions().max_points(200)));
  const auto& points = (*chart_data(data, "loss"))["series"][0]["points"];
  EXPECT_LE(points.size(), 200u);
  EXPECT_GE(points.size(), 100u);
  EXPECT_EQ(points.front(), nlohmann::json({1, 1.0}));
  EXPECT_EQ(points.back(), nlohmann::json({10000, 1.0 / 10000}));
  bool spike = false, dip = false;
  for (size_t i = 0; i < points.size(); ++i) {
    spike |= points[i] == nlohmann::json({6789, 50.0});
    dip |= points[i] == nlohmann::json({1234, -1.0});
    if (i > 0) {
      EXPECT_LT(points[i - 1][0].get<double>(), points[i][0].get<double>());
    }
  }
  EXPECT_TRUE(spike);
  EXPECT_TRUE(dip);
}

TEST(Report, WriteReportWritesThePage) {
  TempDir dir;
  write_full_run(dir.path());
  write_report(dir.path(), dir.file("report.html"));
  EXPECT_EQ(testing::read_text(dir.file("report.html")), render_report(dir.path()));
  EXPECT_FALSE(fs::exists(dir.file("report.html.tmp")));
}

// ---------------------------------------------------------------------------------------------
// Headless Chromium: the page's scripts run and draw every chart.
// ---------------------------------------------------------------------------------------------

// The DOM of `html_path` after its scripts ran, as Chromium serialises it.
std::string chromium_dom(const TempDir& dir, const std::string& html_path) {
  // --no-sandbox: Chromium refuses to run as root with its sandbox; a profile of our own keeps
  // parallel test runs apart and leaves the user's alone.
  const std::string command = fmt::format(
      "{{ timeout 120 chromium --headless --no-sandbox --disable-gpu --user-data-dir={} "
      "--virtual-time-budget=5000 --dump-dom file://{} > {}; }}",
      dir.file("chromium-profile"), html_path, dir.file("dom.html"));
  const auto result = testing::run_command(command);
  EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.output;
  return testing::read_text(dir.file("dom.html"));
}

// What is wrong with the rendered page: charts of `expected` that are missing, not marked rendered,
// without a point count or without a drawn line, and every entry of #script-errors.
std::vector<std::string> page_problems(const std::string& dom, const std::vector<std::string>& expected) {
  std::vector<std::string> problems;
  if (dom.find("</html>") == std::string::npos) return {"no DOM came back"};
  const std::regex attribute(R"(([\w-]+)="([^"]*)\")");
  const std::regex drawn_line(R"(<path[^>]*\sd="M[-\d.]+ [-\d.]+L)");
  for (const std::string& id : expected) {
    const std::string marker = "data-chart=\"" + id + "\"";
    const auto at = dom.find(marker);
    if (at == std::string::npos) {
      problems.push_back("chart " + id + ": missing from the page");
      continue;
    }
    const auto tag_begin = dom.rfind('<', at), tag_end = dom.find('>', at);
    const std::string tag = dom.substr(tag_begin, tag_end - tag_begin);
    std::map<std::string, std::string> attributes;
    for (std::sregex_iterator it(tag.begin(), tag.end(), attribute), end; it != end; ++it) {
      attributes[(*it)[1]] = (*it)[2];
    }
    const std::string inner = dom.substr(tag_end, dom.find("</div>", tag_end) - tag_end);
    if (attributes["data-rendered"] != "true") {
      problems.push_back("chart " + id + ": data-rendered is '" + attributes["data-rendered"] + "'");
    }
    if (attributes["data-points"].empty() || attributes["data-points"] == "0") {
      problems.push_back("chart " + id + ": no data-points");
    }
    if (!std::regex_search(inner, drawn_line)) problems.push_back("chart " + id + ": no line drawn");
  }
  const auto list = dom.find("id=\"script-errors\"");
  if (list == std::string::npos) {
    problems.push_back("#script-errors is missing");
  } else {
    const std::string errors = dom.substr(list, dom.find("</ul>", list) - list);
    const std::regex item(R"(<li>([^<]*)</li>)");
    for (std::sregex_iterator it(errors.begin(), errors.end(), item), end; it != end; ++it) {
      problems.push_back("script error: " + (*it)[1].str());
    }
  }
  return problems;
}

// Skips, visibly, where Chromium is absent (the GPU machine has none); scripts/test installs it, so CI
// never skips.
#define FT_REQUIRE_CHROMIUM()                                                                             \
  if (testing::run_command("command -v chromium").exit_code != 0) {                                       \
    GTEST_SKIP() << "chromium is not installed: run scripts/install-deps (it installs Debian's chromium " \
                    "package, which the report test renders the page with)";                              \
  }

TEST(Report, HeadlessChromiumDrawsEveryChartWithoutScriptErrors) {
  FT_REQUIRE_CHROMIUM();
  TempDir dir;
  write_full_run(dir.path());
  write_report(dir.path(), dir.file("report.html"));
  const std::string dom = chromium_dom(dir, dir.file("report.html"));
  const auto problems = page_problems(dom, {"loss", "accuracy", "lr", "memory"});
  EXPECT_TRUE(problems.empty()) << fmt::format("{}", fmt::join(problems, "\n"));
  // The point counts the page drew are those of the fixture.
  for (const auto& [id, points] :
       std::vector<std::pair<std::string, int>>{{"loss", kTrainRecords + kEvalRecords},
                                                {"accuracy", kEvalRecords},
                                                {"lr", kTrainRecords},
                                                {"memory", kTimelineRows}}) {
    EXPECT_NE(
        dom.find(fmt::format("data-chart=\"{}\" data-points=\"{}\" data-rendered=\"true\"", id, points)),
        std::string::npos)
        << id;
  }
  // Titles, axis labels and the legend were drawn as text.
  for (const char* text : {">Learning rate</text>", ">step</text>", ">allocated (MiB)</text>",
                           ">test accuracy (%)</text>", "<span class=\"swatch\""}) {
    EXPECT_NE(dom.find(text), std::string::npos) << text;
  }
}

// The check above would catch a broken page: a syntax error in the chart script, and an exception
// while drawing, each fail it.
TEST(Report, TheChromiumCheckCatchesABrokenScript) {
  FT_REQUIRE_CHROMIUM();
  TempDir dir;
  write_full_run(dir.path());
  const std::string html = render_report(dir.path());
  const std::vector<std::pair<std::string, std::string>> breakages = {
      {"'use strict';", "'use strict'; var broken = ;"},
      {"function drawChart(box, spec) {", "function drawChart(box, spec) { undefinedFunction();"}};
  for (const auto& [token, broken] : breakages) {
    const auto at = html.find(token);
    ASSERT_NE(at, std::string::npos) << token;
    std::string page = html;
    page.replace(at, token.size(), broken);
    write(dir.file("broken.html"), page);
    const auto problems =
        page_problems(chromium_dom(dir, dir.file("broken.html")), {"loss", "accuracy", "lr", "memory"});
    bool script_error = false, unrendered = false;
    for (const auto& problem : problems) {
      script_error |= problem.rfind("script error: ", 0) == 0;
      unrendered |= problem.find("data-rendered") != std::string::npos;
    }
    EXPECT_TRUE(script_error) << broken;
    EXPECT_TRUE(unrendered) << broken;
  }
}

}  // namespace
}  // namespace fasttrain
