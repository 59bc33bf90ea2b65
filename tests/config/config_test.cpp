#include "fasttrain/config/config.h"

#include <gtest/gtest.h>

#include <functional>
#include <type_traits>

#include "fasttrain/data/loader.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

// Expects a ConfigError whose message contains every one of `parts`.
template <typename Fn>
void expect_config_error(Fn&& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a ConfigError mentioning " << parts.front();
  } catch (const ConfigError& error) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << "message: " << error.what() << "\nmissing: " << part;
  }
}

// A section as the option structs declare theirs: keys, a plain option between them, rules.
struct SampleSection {
  FT_KEYS(SampleSection);
  explicit SampleSection(std::string name) : name_(std::move(name)) {}
  FT_KEY(std::string, name, "What it is called", one_of({"a", "b"}));
  FT_ARG(int64_t, not_a_key) = 7;
  FT_KEY(int64_t, steps, "How many", at_least(1)) = 3;
  FT_KEY(int, workers, "Threads, or \"auto\"", integer_or_auto<int>(-1, 0)) = -1;
  FT_KEY(double, fraction,
         "A fraction written over "
         "two lines",
         in_unit_interval()) = 0.5;
};

struct SeenKey {
  std::string name, help;
  std::function<void()> check_bad_value;
};

TEST(ConfigKeys, ASectionListsItsKeysInDeclarationOrderWithHelpRuleAndMember) {
  std::vector<SeenKey> seen;
  SampleSection section("a");
  for_each_key<SampleSection>([&](const auto& key) {
    using T = typename std::decay_t<decltype(key)>::Type;
    SeenKey entry{key.name, key.help, nullptr};
    if constexpr (std::is_same_v<T, int64_t>) {
      EXPECT_EQ(section.*(key.member), 3);  // the member the key sets, with its default
      entry.check_bad_value = [rule = key.rule] { rule.check("sample.steps", 0); };
    }
    if constexpr (std::is_same_v<T, std::string>) {
      entry.check_bad_value = [rule = key.rule] { rule.check("sample.name", "c"); };
    }
    if constexpr (std::is_same_v<T, int>) {
      EXPECT_EQ(key.rule.auto_value, -1);
      entry.check_bad_value = [rule = key.rule] { rule.check("sample.workers", -2); };
    }
    if constexpr (std::is_same_v<T, double>) {
      entry.check_bad_value = [rule = key.rule] { rule.check("sample.fraction", 1.5); };
    }
    seen.push_back(entry);
  });
  ASSERT_EQ(seen.size(), 4u) << "not_a_key is an FT_ARG: an option, not a key";
  EXPECT_EQ(seen[0].name, "name");
  EXPECT_EQ(seen[1].name, "steps");
  EXPECT_EQ(seen[2].name, "workers");
  EXPECT_EQ(seen[3].name, "fraction");
  EXPECT_EQ(seen[3].help, "A fraction written over two lines");
  expect_config_error(seen[0].check_bad_value, {"sample.name 'c' is not allowed; valid: a, b"});
  expect_config_error(seen[1].check_bad_value, {"sample.steps must be >= 1, got 0"});
  expect_config_error(seen[2].check_bad_value,
                      {"sample.workers must be an integer >= 0 or \"auto\", got -2"});
  expect_config_error(seen[3].check_bad_value, {"sample.fraction must be in [0, 1], got 1.5"});
  // Still an options struct: chained setters, getters.
  EXPECT_EQ(SampleSection("b").steps(5).not_a_key(), 7);
}

// The schema is the FT_KEYs of Config's sections: every key documented, every default written back as
// it reads.
TEST(ConfigKeys, EverySectionKeyIsDocumentedAndItsDefaultRoundTrips) {
  const std::string reference = config_reference();
  int keys = 0;
  auto documented = [&](const auto& key) {
    ++keys;
    EXPECT_NE(reference.find(fmt::format("| `{}` |", key.name)), std::string::npos) << key.name;
    EXPECT_FALSE(std::string(key.help).empty()) << key.name;
  };
  for_each_key<TrainOptions>(documented);
  for_each_key<TrainConfig>(documented);
  EXPECT_EQ(keys, 23) << "[train]: the Trainer's keys and the run's";
  for_each_key<GptOptions>(documented);
  for_each_key<RegressionOptions>(documented);
  for_each_key<TextDataOptions>(documented);
  EXPECT_NE(reference.find("### name = \"gpt\""), std::string::npos);
  EXPECT_NE(reference.find("### dataset = \"text\""), std::string::npos);
  EXPECT_NE(reference.find("### name = \"reconstruction\"\n\nNo keys of its own."), std::string::npos);
  Config defaults;
  Config reread;
  apply_toml(reread, to_toml(defaults), "defaults");
  EXPECT_EQ(to_toml(reread), to_toml(defaults));
}

TEST(Config, TomlMapsOntoTheOptionStructs) {
  Config config;
  apply_toml(config,
             "[data]\nbatch_size = 64\nworkers = \"auto\"\nhflip = 0.5\n"
             "[model]\nwidths = [16, 32]\nname = \"resnet\"\n"
             "[optim]\nname = \"sgd\"\nlr = 0.1\nnesterov = true\n"
             "[schedule]\nname = \"one-cycle\"\npct_start = 0.25\n"
             "[train]\nepochs = 3\naccumulation = 2\n",
             "inline");
  EXPECT_EQ(config.data.batch_size(), 64);
  EXPECT_EQ(config.data.workers(), -1);
  EXPECT_DOUBLE_EQ(config.data.dataset.as<ImageDataOptions>().hflip(), 0.5);
  EXPECT_EQ(config.model.name(), "resnet");  // read first: widths is resnet's key
  EXPECT_EQ(config.model.as<ResnetOptions>().widths(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(config.optim.name(), "sgd");
  EXPECT_DOUBLE_EQ(config.optim.lr(), 0.1);
  EXPECT_TRUE(config.optim.nesterov());
  EXPECT_EQ(config.schedule.name(), "one-cycle");
  EXPECT_DOUBLE_EQ(config.schedule.pct_start(), 0.25);
  EXPECT_EQ(config.train.options.epochs(), 3);
  EXPECT_EQ(config.train.options.accumulation(), 2);
}

// [model], [task] and [data] hold the named component's own keys: another name brings its keys (at
// their defaults), a key of another component is an error that lists the named one's.
TEST(Config, AComponentsKeysFollowItsName) {
  Config config;
  apply_override(config, "model.widths=[8, 8]");
  apply_override(config, "model.name=gpt");
  EXPECT_EQ(config.model.as<GptOptions>().layers(), 4);
  expect_config_error(
      [&] { apply_override(config, "model.widths=[8]"); },
      {"unknown config key model.widths", "(name = \"gpt\")", "layers, heads, embed, context"});
  apply_override(config, "model.name=gpt");  // the same name keeps the keys set
  apply_override(config, "model.layers=2");
  apply_override(config, "model.name=gpt");
  EXPECT_EQ(config.model.as<GptOptions>().layers(), 2);
  const std::string text = to_toml(config);
  EXPECT_NE(text.find("[model]\nname = \"gpt\"\nlayers = 2\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("widths"), std::string::npos) << "a cnn key under a gpt";
  // task.name = "auto" has no keys; a named task has its own.
  expect_config_error([&] { apply_override(config, "task.label_smoothing=0.1"); },
                      {"task.label_smoothing", "(name = \"auto\")"});
  apply_toml(config, "[task]\nlabel_smoothing = 0.1\nname = \"classification\"\n", "task.toml");
  EXPECT_DOUBLE_EQ(config.task.as<ClassificationOptions>().label_smoothing(), 0.1);
  expect_config_error(
      [&] { apply_override(config, "task.name=ranking"); },
      {"task.name 'ranking'", "auto, classification, language_modeling, regression, reconstruction"});
  // A key that moved says where to.
  expect_config_error([&] { apply_override(config, "train.label_smoothing=0.1"); },
                      {"train.label_smoothing has moved", "task.label_smoothing", "classification"});
  // The dataset's keys: text's are not the images'.
  apply_override(config, "data.dataset=text");
  apply_override(config, "data.include=\"*.c\"");
  expect_config_error([&] { apply_override(config, "data.hflip=0.5"); },
                      {"data.hflip", "(dataset = \"text\")"});
}

// A library caller who builds the options meets the rules a config file does, checked by the
// component: one rule, in one place.
TEST(ConfigKeys, ComponentsCheckTheKeysTheConfigChecks) {
  expect_config_error([] { make_schedule(ScheduleOptions("one-cycle").pct_start(1.0), 0.1, 0.9, 100); },
                      {"schedule.pct_start", "(0, 1)", "1"});
  expect_config_error(
      [] {
        make_optimizer(torch::OrderedDict<std::string, torch::Tensor>(),
                       OptimizerOptions("sgd").momentum(1.0));
      },
      {"optim.momentum", "[0, 1)", "1"});
  expect_config_error(
      [] {
        DataLoader(testing::synthetic_images(8), TransformPipeline({0.5f}, {0.25f}),
                   LoaderOptions(4).prefetch(0));
      },
      {"data.prefetch", ">= 1", "0"});
  expect_config_error([] { check_keys(EmaOptions(1.5), "ema"); }, {"ema.decay", "[0, 1]", "1.5"});
  expect_config_error([] { check_keys(TrainOptions().accumulation(0), "train"); },
                      {"train.accumulation", "0"});
  // The same bound in the config and in the component: a beta of 1 is refused by both.
  Config config;
  expect_config_error([&] { apply_override(config, "optim.beta1=1.0"); }, {"optim.beta1", "[0, 1)"});
}

// What a key does to a run is a trait of the key: neutral keys and the run's length stay out of the
// fingerprint a resume compares.
TEST(ConfigKeys, TheFingerprintLeavesOutNeutralAndRunLengthKeys) {
  Config base;
  const std::string fingerprint = training_fingerprint(base);
  for (const char* neutral :
       {"data.workers=2", "data.prefetch=8", "train.threads=1", "train.device=\"cpu\"",
        "train.eval_every_steps=5", "train.target=\"loss <= 1\"", "optim.kernel=foreach", "log.every_steps=7",
        "checkpoint.keep=5", "memory.checkpoint=blocks", "train.epochs=9", "dist.zero=2", "run.name=other"}) {
    Config changed = base;
    apply_override(changed, neutral);
    EXPECT_EQ(training_fingerprint(changed), fingerprint) << neutral;
  }
  for (const char* shaping : {"optim.lr=0.5", "train.seed=3", "data.batch_size=7", "model.hidden=[8]",
                              "data.hflip=0.5", "train.precision=bf16", "ema.enabled=true"}) {
    Config changed = base;
    apply_override(changed, shaping);
    EXPECT_NE(training_fingerprint(changed), fingerprint) << shaping;
    EXPECT_EQ(training_differences(base, changed).size(), 1u) << shaping;
  }
  Config other_model = base;
  apply_override(other_model, "model.name=mlp");
  EXPECT_TRUE(
      testing::contains_all(fmt::format("{}", fmt::join(training_differences(base, other_model), "; ")),
                            {"model.name (\"cnn\" vs \"mlp\")", "model.widths ([32, 64] vs (none))"}));
}

TEST(Config, OverridesTakeTomlValuesAndBareWords) {
  Config config;
  apply_override(config, "train.epochs=7");
  apply_override(config, "optim.lr=3e-3");
  apply_override(config, "model.name=mlp");
  apply_override(config, "model.hidden=[256, 64]");
  apply_override(config, "data.workers=3");
  apply_override(config, "run.name=\"quoted name\"");
  EXPECT_EQ(config.train.options.epochs(), 7);
  EXPECT_DOUBLE_EQ(config.optim.lr(), 3e-3);
  EXPECT_EQ(config.model.name(), "mlp");
  EXPECT_EQ(config.model.as<MlpOptions>().hidden(), (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(config.data.workers(), 3);
  EXPECT_EQ(config.run.name(), "quoted name");
}

TEST(Config, EffectiveConfigRoundTrips) {
  Config config;
  apply_override(config, "optim.lr=0.0123");
  apply_override(config, "model.widths=[8, 16, 32]");
  apply_override(config, "data.workers=auto");
  apply_override(config, "schedule.div_factor=10");
  std::string text = to_toml(config);
  Config reread;
  apply_toml(reread, text, "effective");
  EXPECT_EQ(to_toml(reread), text);
  EXPECT_DOUBLE_EQ(reread.schedule.div_factor(), 10.0);
  EXPECT_NE(text.find("div_factor = 10.0"), std::string::npos) << text;
}

TEST(Config, ErrorsNameTheKeyTheValueAndWhatIsAllowed) {
  Config config;
  expect_config_error([&] { apply_override(config, "train.epoch=3"); }, {"train.epoch", "epochs"});
  expect_config_error([&] { apply_override(config, "trian.epochs=3"); }, {"[trian]", "train"});
  expect_config_error([&] { apply_override(config, "data.batch_size=0"); }, {"data.batch_size", ">= 1", "0"});
  expect_config_error([&] { apply_override(config, "data.batch_size=-5"); }, {"data.batch_size", "-5"});
  expect_config_error([&] { apply_override(config, "data.batch_size=big"); },
                      {"data.batch_size", "integer", "big"});
  expect_config_error([&] { apply_override(config, "train.accumulation=0"); }, {"train.accumulation", "0"});
  expect_config_error([&] { apply_override(config, "optim.lr=nan"); }, {"optim.lr", "nan"});
  expect_config_error([&] { apply_override(config, "optim.lr=inf"); }, {"optim.lr", "inf"});
  expect_config_error([&] { apply_override(config, "optim.lr=-1"); }, {"optim.lr", "-1"});
  expect_config_error([&] { apply_override(config, "optim.name=lamb"); },
                      {"optim.name", "lamb", "adamw", "sgd"});
  expect_config_error([&] { apply_override(config, "model.name=vit"); }, {"model.name", "vit", "resnet"});
  expect_config_error([&] { apply_override(config, "train.cuda_graphs=yes"); },
                      {"train.cuda_graphs", "true, false or \"auto\"", "yes"});
  expect_config_error([&] { apply_override(config, "train.device=tpu"); }, {"train.device", "tpu"});
  expect_config_error([&] { apply_override(config, "schedule.name=poly"); },
                      {"schedule.name", "poly", "one-cycle"});
  expect_config_error([&] { apply_override(config, "data.workers=many"); }, {"data.workers", "auto", "many"});
  expect_config_error([&] { apply_override(config, "data.hflip=2"); }, {"data.hflip", "[0, 1]", "2"});
  expect_config_error([&] { apply_override(config, "model.widths=[8, \"x\"]"); },
                      {"model.widths", "integers"});
  expect_config_error([&] { apply_override(config, "noequals"); }, {"section.key=value", "noequals"});
  expect_config_error([&] { apply_toml(config, "[train\nepochs = 1", "broken.toml"); },
                      {"broken.toml", "1:"});
  expect_config_error([&] { apply_toml(config, "epochs = 1", "flat.toml"); },
                      {"flat.toml", "epochs", "section"});
}

TEST(Config, BatchSizeAutoAndTheMemorySection) {
  Config config;
  apply_toml(config,
             "[data]\nbatch_size = \"auto\"\n[memory]\ncheckpoint = \"every_k\"\ncheckpoint_every = 3\n"
             "budget = \"1.5GiB\"\nwarmup = true\n",
             "memory.toml");
  EXPECT_EQ(config.data.batch_size(), 0);
  EXPECT_EQ(config.memory.budget_bytes(), int64_t{3} << 29);
  EXPECT_EQ(config.memory.checkpoint_policy().every, 3);
  const std::string text = to_toml(config);
  EXPECT_NE(text.find("batch_size = \"auto\""), std::string::npos) << text;
  Config reread;
  apply_toml(reread, text, "effective");
  EXPECT_EQ(to_toml(reread), text);
  // [memory] changes how a run computes, not what: a resume may switch it.
  Config plain;
  EXPECT_EQ(training_fingerprint(plain), training_fingerprint([&] {
              Config c;
              c.memory.checkpoint("blocks").warmup(true).budget("2GiB");
              return c;
            }()));
  expect_config_error([&] { apply_override(config, "data.batch_size=\"big\""); },
                      {"data.batch_size", "auto", "big"});
  expect_config_error([&] { apply_override(config, "memory.checkpoint=all"); },
                      {"memory.checkpoint", "all", "every_k"});
  expect_config_error([&] { apply_override(config, "memory.checkpoint_every=0"); },
                      {"memory.checkpoint_every", "0"});
  expect_config_error([&] { apply_override(config, "memory.budget=lots"); },
                      {"memory.budget", "lots", "2GiB"});
  expect_config_error([&] { apply_override(config, "memory.budget=\"-1GB\""); }, {"memory.budget", "-1GB"});
}

TEST(Bytes, ParsesUnitsAndFormatsBinary) {
  EXPECT_EQ(parse_bytes("1000000", "k"), 1000000);
  EXPECT_EQ(parse_bytes("512MiB", "k"), int64_t{512} << 20);
  EXPECT_EQ(parse_bytes("2 GiB", "k"), int64_t{2} << 30);
  EXPECT_EQ(parse_bytes("1.5GB", "k"), 1500000000);
  EXPECT_EQ(parse_bytes("4kib", "k"), 4096);
  EXPECT_EQ(parse_bytes("0", "k"), 0);
  for (const char* bad : {"", "GiB", "12 parsecs", "nan", "inf", "-5", " 5", "1e30"}) {
    expect_config_error([&] { parse_bytes(bad, "memory.budget"); },
                        {"memory.budget", std::string("'") + bad + "'"});
  }
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(int64_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(format_bytes(int64_t{48} << 20), "48.00 MiB");
}

TEST(Config, MissingFileIsNamed) {
  expect_config_error([] { load_config("/nonexistent/fasttrain.toml"); }, {"/nonexistent/fasttrain.toml"});
}

// Every shipped config loads, and its effective config reads back as written.
TEST(Config, ShippedConfigsLoad) {
  int configs = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(FASTTRAIN_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    const Config config = load_config(entry.path().string());
    Config reread;
    apply_toml(reread, to_toml(config), "effective");
    EXPECT_EQ(to_toml(reread), to_toml(config));
    ++configs;
  }
  EXPECT_GE(configs, 3);
}

TEST(Config, DocsConfigMdIsGeneratedFromTheSchema) {
  std::string docs = testing::read_text(std::string(FASTTRAIN_SOURCE_DIR) + "/docs/CONFIG.md");
  EXPECT_EQ(docs, config_reference()) << "docs/CONFIG.md is stale: regenerate it with `build/bin/fasttrain "
                                         "config --reference > docs/CONFIG.md`";
}

}  // namespace
}  // namespace fasttrain
