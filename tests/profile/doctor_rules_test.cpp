// Each doctor rule alone (profile/doctor.h doctor_rules()): a context in which it fires, with what it
// says, and one in which it stays quiet. The contexts are built by hand, the timed comparisons
// answered from a table, so no training runs here; Doctor.* in doctor_test.cpp runs the whole doctor
// on planted problems.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "fasttrain/detail/compat.h"
#include "fasttrain/profile/doctor.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

// A CPU run of 20 steps of 9.5 ms (0.5 ms of it waiting for data), 2 threads on 2 cores, no workers,
// nothing to fix; comparisons answer `speedups[name]` (1.0 when absent).
struct Case {
  DoctorContext context;
  std::map<std::string, double> speedups;
  std::vector<std::string> compared;

  Case() {
    context.config.data.batch_size(128);
    context.config.schedule.name("one-cycle");
    context.config.train.precision("fp32").channels_last(true);
    context.config.model.as<CnnOptions>().widths({16, 32}).hidden({256});
    context.hardware.physical_cores = 2;
    context.threads = 2;
    context.cores = 2;
    context.train_size = 60000;
    context.base.steps = 20;
    context.base.phases.add(Phase::kDataWait, 0.01);
    context.base.phases.add(Phase::kForward, 0.18);
    context.compare = [this](const std::string& name, const Config&, double) {
      compared.push_back(name);
      const auto found = speedups.find(name);
      const double speedup = found == speedups.end() ? 1.0 : found->second;
      return Comparison{1000, 1000 * speedup, speedup};
    };
  }
  // Stops the compare closure pointing at a moved-from Case.
  Case(const Case&) = delete;

  std::vector<Finding> run(const std::string& rule) { return doctor_rules().at(rule)(context); }
};

struct RuleCase {
  std::string rule;
  std::function<void(Case&)> plant;  // makes the rule fire
  Severity severity;
  std::vector<std::string> says;  // in the title or the evidence
};

std::vector<RuleCase> rule_cases() {
  return {
      {"data_bound",
       [](Case& c) { c.context.base.phases.add(Phase::kDataWait, 0.05); },
       Severity::kMedium,
       {"data.workers", "waiting for the next batch"}},
      {"too_many_workers",
       [](Case& c) {
         c.context.workers = 3;
         c.context.base.phases = StepPhases();
         c.context.base.phases.add(Phase::kForward, 0.2);
       },
       Severity::kLow,
       {"fewer loader workers", "3 workers"}},
      {"small_batch",
       [](Case& c) { c.speedups["batch_x4"] = 2.5; },
       Severity::kHigh,
       {"data.batch_size", "batch 512", "2.50x"}},
      {"emulated_bf16",
       [](Case& c) { c.context.config.train.precision("bf16"); },
       Severity::kHigh,
       {"no native bfloat16", "emulated bf16"}},
      {"mixed_precision",
       [](Case& c) {
         c.context.hardware.cpu_native_bf16 = true;
         c.speedups["mixed_precision"] = 1.6;
       },
       Severity::kMedium,
       {"train.precision = \"bf16\"", "1.60x"}},
      {"bf16_slower",
       [](Case& c) {
         c.context.hardware.cpu_native_bf16 = true;
         c.context.config.train.precision("bf16");
         c.speedups["bf16_slower"] = 1.3;
       },
       Severity::kMedium,
       {"train.precision = \"fp32\"", "slower than fp32", "in fp32", "1.30x"}},
      {"implicit_bf16",
       [](Case& c) {
         c.context.hardware.cpu_amx_bf16 = true;
         c.speedups["implicit_bf16"] = 1.6;
       },
       Severity::kLow,
       {"train.fp32_precision = \"bf16\"", "check the accuracy", "1.60x"}},
      {"thread_contention",
       [](Case& c) {
         c.context.blas = BlasLibrary{"OpenBLAS", 2, 2};
         c.speedups["thread_contention_blas"] = 1.8;
         c.speedups["thread_contention"] = 1.3;
       },
       Severity::kMedium,
       {"train.blas_threads = 1", "1.80x"}},
      {"channels_last",
       [](Case& c) {
         c.context.conv_net = true;
         c.context.config.train.channels_last(false);
         c.speedups["channels_last"] = 1.3;
       },
       Severity::kMedium,
       {"train.channels_last = true", "1.30x"}},
      {"own_kernels",
       [](Case& c) {
         c.context.config.model.select("gpt").as<GptOptions>().kernels("aten");
         c.speedups = {{"own_kernels", 1.4}};
       },
       Severity::kMedium,
       {"model.kernels = \"fasttrain\"", "1.40x"}},
      {"pointwise_bound",
       [](Case& c) {
         c.context.base.operators = {{"aten::mm", 400, 80.0},
                                     {"aten::gelu_backward", 80, 50.0},
                                     {"aten::gelu", 80, 20.0},
                                     {"aten::native_layer_norm", 160, 10.0}};
       },
       Severity::kMedium,
       {"pointwise-bound", "bias_gelu", "42.1% of the recorded step", "4.00 of 9.50 ms",
        "aten::gelu_backward 2.50 ms"}},
      {"anomaly_detection",
       [](Case& c) { c.context.config.train.options.detect_anomaly(true); },
       Severity::kHigh,
       {"anomaly detection off"}},
      {"profiler_on", [](Case& c) { c.context.profiler_was_on = true; }, Severity::kMedium, {"profiler"}},
      {"host_sync",
       [](Case& c) { c.context.base.host_reads = 40; },
       Severity::kMedium,
       {"40 device-to-host reads in 20 steps", "2.0 per step"}},
      {"allocator_churn",
       [](Case& c) {
         c.context.cuda = true;
         c.context.alloc_retries = 3;
       },
       Severity::kMedium,
       {"3 allocation retries"}},
      {"conv_bias_before_batchnorm",
       [](Case& c) { c.context.conv_biases_before_bn = 2; },
       Severity::kLow,
       {"bias(false)", "model.bias_before_norm = false", "2 convolution(s)"}},
      {"constant_lr",
       [](Case& c) { c.context.config.schedule.name("constant"); },
       Severity::kLow,
       {"find-lr"}},
      {"cudnn_benchmark",
       [](Case& c) {
         c.context.cuda = c.context.conv_net = true;
         c.context.config.train.cudnn_benchmark(false);
       },
       Severity::kMedium,
       {"train.cudnn_benchmark = true"}},
      {"tensor_core_sizes",
       [](Case& c) {
         c.context.cuda = true;
         c.context.odd_layer_sizes = {"classifier.0.weight [250, 512]"};
       },
       Severity::kLow,
       {"classifier.0.weight [250, 512]"}},
      {"variable_shapes",
       [](Case& c) {
         c.context.cuda = true;
         c.context.config.data.loader.drop_last(false);
         c.context.train_size = 1000;
       },
       Severity::kLow,
       {"memory.warmup = true", "a last batch of 104"}},
  };
}

TEST(DoctorRules, EachFiresOnItsPlantedProblemAndSaysWhatToDo) {
  for (const auto& rule_case : rule_cases()) {
    // Before LibTorch 2.9 there is no fp32 precision to set on the CPU (train.fp32_precision is refused).
    if (rule_case.rule == "implicit_bf16" && !compat::has_cpu_fp32_precision()) continue;
    Case c;
    rule_case.plant(c);
    const std::vector<Finding> findings = c.run(rule_case.rule);
    ASSERT_EQ(findings.size(), 1u) << rule_case.rule;
    const Finding& finding = findings.front();
    EXPECT_EQ(finding.rule(), rule_case.rule);
    EXPECT_EQ(finding.severity(), rule_case.severity) << rule_case.rule;
    for (const auto& text : rule_case.says) {
      EXPECT_NE((finding.title() + " | " + finding.evidence() + " | " + finding.estimated_gain()).find(text),
                std::string::npos)
          << rule_case.rule << " should say '" << text << "': " << finding.title() << " | "
          << finding.evidence();
    }
  }
}

TEST(DoctorRules, EachStaysQuietOnACleanRun) {
  for (const auto& rule : doctor_rules().names()) {
    Case c;
    EXPECT_TRUE(c.run(rule).empty()) << rule << " fired on a clean run";
  }
}

TEST(DoctorRules, ASpeedupUnderTheThresholdIsNoFinding) {
  for (const std::string rule :
       {"small_batch", "mixed_precision", "channels_last", "own_kernels", "bf16_slower", "implicit_bf16"}) {
    if (rule == "implicit_bf16" && !compat::has_cpu_fp32_precision()) continue;
    Case c;
    c.context.hardware.cpu_native_bf16 = true;
    c.context.hardware.cpu_amx_bf16 = true;
    c.context.conv_net = true;
    c.context.config.train.channels_last(false);
    if (rule == "own_kernels") c.context.config.model.select("gpt").as<GptOptions>().kernels("aten");
    if (rule == "bf16_slower") c.context.config.train.precision("bf16");
    c.speedups = {{"batch_x4", 1.4},    {"mixed_precision", 1.1}, {"channels_last", 1.1},
                  {"own_kernels", 1.1}, {"bf16_slower", 1.1},     {"implicit_bf16", 1.1}};
    EXPECT_TRUE(c.run(rule).empty()) << rule;
    EXPECT_FALSE(c.compared.empty()) << rule << ": the rule measured nothing";
  }
}

// Every switch between fasttrain's CPU kernels and ATen's that is at "aten" (the cnn's max-pool, the
// classification task's cross-entropy, muon's Newton-Schulz) is turned in the one comparison, and the
// finding names each.
TEST(DoctorRules, OwnKernelsTurnsEveryKernelSwitchLeftToATen) {
  Case c;
  c.context.config.model.as<CnnOptions>().kernels("aten");
  c.context.config.task.select("classification").as<ClassificationOptions>().kernels("aten");
  c.context.config.optim.name("muon").muon_newton_schulz("aten");
  std::vector<Config> seen;
  c.context.compare = [&](const std::string&, const Config& config, double) {
    seen.push_back(config);
    return Comparison{1000, 1400, 1.4};
  };
  auto findings = c.run("own_kernels");
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_TRUE(testing::contains_all(findings[0].title(),
                                    {"model.kernels = \"fasttrain\"", "task.kernels = \"fasttrain\"",
                                     "optim.muon_newton_schulz = \"fasttrain\""}));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].model.as<CnnOptions>().kernels(), "fasttrain");
  EXPECT_EQ(seen[0].task.as<ClassificationOptions>().kernels(), "fasttrain");
  EXPECT_EQ(seen[0].optim.muon_newton_schulz(), "fasttrain");
  c.context.config.model.as<CnnOptions>().kernels("fasttrain");
  findings = c.run("own_kernels");
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].title().find("model.kernels"), std::string::npos) << findings[0].title();
  c.context.config.task.as<ClassificationOptions>().kernels("fasttrain");
  c.context.config.optim.name("adamw");  // muon's switch only counts under muon
  EXPECT_TRUE(c.run("own_kernels").empty());
}

// On a GPU the switch is the gpt's model.gpu_kernels (model.kernels = "aten" changes nothing there).
TEST(DoctorRules, OwnKernelsOnAGpuTurnsTheGptsGpuKernels) {
  Case c;
  c.context.cuda = true;
  c.context.config.model.select("gpt").as<GptOptions>().kernels("aten").gpu_kernels("aten");
  std::vector<Config> seen;
  c.context.compare = [&](const std::string&, const Config& config, double) {
    seen.push_back(config);
    return Comparison{1000, 1300, 1.3};
  };
  auto findings = c.run("own_kernels");
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_TRUE(
      testing::contains_all(findings[0].title(), {"GPU kernels", "model.gpu_kernels = \"fasttrain\""}))
      << findings[0].title();
  EXPECT_EQ(findings[0].title().find("model.kernels"), std::string::npos) << findings[0].title();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].model.as<GptOptions>().gpu_kernels(), "fasttrain");
  EXPECT_EQ(seen[0].model.as<GptOptions>().kernels(), "aten");
  c.context.config.model.as<GptOptions>().gpu_kernels("fasttrain");
  EXPECT_TRUE(c.run("own_kernels").empty());
  c.context.cuda = false;  // on the CPU the gpt's model.kernels counts, gpu_kernels not
  findings = c.run("own_kernels");
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_TRUE(testing::contains_all(findings[0].title(), {"CPU kernels", "model.kernels = \"fasttrain\""}));
}

// Below its threshold, on CUDA (host times of launches), and with matmuls and reductions, which are no
// elementwise work, it stays quiet; with the gpt's kernels in ATen it names the switch.
TEST(DoctorRules, PointwiseBoundCountsOnlyElementwiseOperatorsOnTheCpu) {
  Case c;
  c.context.base.operators = {{"aten::mm", 400, 150.0}, {"aten::sum", 80, 20.0}, {"aten::gelu", 80, 35.0}};
  EXPECT_TRUE(c.run("pointwise_bound").empty()) << "35 of 190 ms is 18.4%";
  c.context.base.operators.push_back({"aten::_to_copy", 200, 10.0});
  const auto findings = c.run("pointwise_bound");
  ASSERT_EQ(findings.size(), 1u) << "45 of 190 ms is 23.7%";
  EXPECT_EQ(findings[0].severity(), Severity::kLow);
  c.context.config.model.select("gpt").as<GptOptions>().kernels("aten");
  EXPECT_NE(c.run("pointwise_bound").at(0).title().find("model.kernels = \"fasttrain\""), std::string::npos);
  c.context.cuda = true;
  EXPECT_TRUE(c.run("pointwise_bound").empty());
}

TEST(DoctorRules, EveryRegisteredRuleHasACaseAndUnknownNamesAreErrors) {
  std::set<std::string> covered;
  for (const auto& rule_case : rule_cases()) covered.insert(rule_case.rule);
  for (const auto& rule : doctor_rules().names()) {
    EXPECT_EQ(covered.count(rule), 1u) << rule << " has no case in DoctorRules.EachFires...";
    EXPECT_FALSE(doctor_rules().help(rule).empty()) << rule;
  }
  const std::string message = testing::error_message([] { doctor_rules().at("gremlins"); });
  EXPECT_TRUE(testing::contains_all(message, {"'gremlins'", "data_bound", "host_sync"})) << message;
}

}  // namespace
}  // namespace fasttrain
