// Models written in Python (models/torchscript.h): modules scripted or traced by the PyTorch of this
// LibTorch's release (tests/models/scripted_models.py) train as the same network written in C++, under
// PyTorch's state_dict names, with two inputs and named outputs; bad archives and switches that cannot
// reach inside the interpreter are named.
#include "fasttrain/models/torchscript.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "fasttrain/data/loader.h"
#include "fasttrain/data/tensor_source.h"
#include "fasttrain/run/run.h"
#include "support.h"
#include "trainer_support.h"

namespace fasttrain {
namespace {

using testing::kFashion;

using testing::contains_all;
using testing::error_message;

// fasttrain's cnn of configs/default.toml: the network scripted_models.py's Cnn writes in Python.
// ATen's Linears, as the scripted network runs them: in bf16 the cnn's own Linear kernels sum the weight's
// gradient in fp32 where autocast's backward rounds it (their tests: tests/kernels/*linear_test.cpp).
Model cpp_cnn() {
  return make_cnn(CnnOptions().widths({16, 32}).hidden({256}).batchnorm(true).pool_first(true).aten_kernels(
                      {"amx_linear", "narrow_linear"}),
                  kFashion);
}

std::map<std::string, torch::Tensor> state_of(const Model& model) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& item : model.module().named_parameters()) state[item.key()] = item.value();
  for (const auto& item : model.module().named_buffers()) state[item.key()] = item.value();
  return state;
}

double max_difference(const std::map<std::string, torch::Tensor>& a,
                      const std::map<std::string, torch::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    worst = std::max(worst,
                     (tensor.to(torch::kDouble) - b.at(name).to(torch::kDouble)).abs().max().item<double>());
  }
  return worst;
}

TEST(TorchScript, AScriptedModuleHoldsItsTensorsUnderPyTorchsNames) {
  FT_REQUIRE_SCRIPTED_MODELS();
  for (const char* file : {"cnn", "cnn_traced"}) {
    const Model model = load_torchscript(testing::scripted_models().path(file));
    EXPECT_EQ(model.name(), "torchscript");
    // The scripted module's own names (its state_dict's, in PyTorch), each for the very same tensor.
    auto& scripted = dynamic_cast<ScriptedModuleImpl&>(model.module());
    std::map<std::string, torch::Tensor> own;
    for (const auto& item : scripted.scripted().named_parameters()) own[item.name] = item.value;
    for (const auto& item : scripted.scripted().named_buffers()) own[item.name] = item.value;
    const auto mirrored = state_of(model);
    ASSERT_EQ(mirrored.size(), own.size()) << file;
    EXPECT_EQ(own.size(), 16u) << "2 convs, 2 BatchNorms (5 tensors each), 2 Linears";
    for (const auto& [name, tensor] : own) {
      ASSERT_TRUE(mirrored.count(name)) << name;
      EXPECT_TRUE(mirrored.at(name).is_same(tensor)) << name;
    }
    // A change to a parameter changes the scripted forward's output.
    const torch::Tensor images = torch::randn({2, 1, 28, 28});
    model.module().eval();
    const torch::Tensor before = model.forward(Batch(images, {})).tensor();
    {
      torch::NoGradGuard no_grad;
      model.module().named_parameters()["classifier.2.bias"].add_(1.0);
    }
    const torch::Tensor after = model.forward(Batch(images, {})).tensor();
    EXPECT_TRUE(torch::allclose(after, before + 1.0, 1e-5, 1e-5)) << file;
    EXPECT_FALSE(scripted.scripted().is_training()) << "eval() reaches the scripted module";
    model.module().train();
    EXPECT_TRUE(scripted.scripted().is_training());
  }
}

// The same steps of the same network, written in Python and in C++, from the same weights: accumulation,
// clipping, EMA, AdamW, BatchNorm statistics; fp32 and bf16 autocast: the same weights, bit for bit.
TEST(TorchScript, TrainsAsTheSameNetworkWrittenInCpp) {
  FT_REQUIRE_SCRIPTED_MODELS();
  const ImageDataset images = testing::synthetic_images(96, 1, 28, 28, 10);
  for (const torch::ScalarType precision : {torch::kFloat, torch::kBFloat16}) {
    const Model scripted = load_torchscript(testing::scripted_models().path("cnn"));
    Model cpp = cpp_cnn();
    {
      torch::NoGradGuard no_grad;
      const auto from = state_of(scripted);
      for (auto& [name, tensor] : state_of(cpp)) tensor.copy_(from.at(name));
    }
    std::vector<std::unique_ptr<Trainer>> trainers;
    for (const Model* model : std::vector<const Model*>{&scripted, &cpp}) {
      auto options = TrainOptions().max_steps(6).accumulation(2).clip_norm(1.0).precision(precision);
      trainers.push_back(testing::make_trainer(*model, options, 3e-3, "adamw"));
      trainers.back()->enable_ema(EmaOptions(0.9));
      DataLoader loader(images, TransformPipeline({0.3f}, {0.3f}), LoaderOptions(16).seed(2).workers(0));
      trainers.back()->fit(loader, nullptr);
    }
    // The interpreter runs the same ATen kernels in the same order: bit for bit.
    EXPECT_EQ(max_difference(state_of(scripted), state_of(cpp)), 0.0) << c10::toString(precision);
    const auto& shadow_a = trainers[0]->ema()->shadow();
    const auto& shadow_b = trainers[1]->ema()->shadow();
    for (size_t i = 0; i < shadow_a.size(); ++i)
      EXPECT_TRUE(torch::equal(shadow_a[i], shadow_b[i])) << "EMA " << i;
  }
}

// forward(x, scale) takes the batch's inputs and its tensor "scale"; Dict[str, Tensor] outputs are named.
TEST(TorchScript, ArgumentsComeFromTheBatchByNameAndDictsAreNamedOutputs) {
  FT_REQUIRE_SCRIPTED_MODELS();
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({64, 6}), scale = torch::rand({64, 1}) + 0.5;
  auto source = std::make_shared<TensorSource>(std::map<std::string, torch::Tensor>{
      {"inputs", x}, {"scale", scale}, {"targets", x.sum(1, true) * scale}});
  const Model regressor = load_torchscript(testing::scripted_models().path("regressor"));
  EXPECT_EQ(dynamic_cast<ScriptedModuleImpl&>(regressor.module()).arguments(),
            (std::vector<std::string>{"x", "scale"}));
  auto trainer = testing::make_trainer(regressor, TrainOptions().max_steps(40), 1e-2, "adamw",
                                       std::make_shared<RegressionTask>());
  DataLoader loader(source, LoaderOptions(16).seed(1).workers(0));
  const double before = trainer->evaluate(loader).metrics.at("loss");
  trainer->fit(loader, nullptr);
  EXPECT_LT(trainer->evaluate(loader).metrics.at("loss"), before / 2) << "the regressor learns";
  // Dropout follows train() and eval(): the scripted module's mode is the trainer's.
  regressor.module().eval();
  const Batch batch = source->largest_batch(8);
  EXPECT_TRUE(torch::equal(regressor.forward(batch).tensor(), regressor.forward(batch).tensor()));
  // A batch without "scale" is named.
  EXPECT_TRUE(contains_all(error_message([&] { regressor.forward(Batch(x.slice(0, 0, 4), {})); }),
                           {"forward takes 'scale'", "it has: inputs"}));
  const Model heads = load_torchscript(testing::scripted_models().path("heads"));
  const ModelOutput output = heads.forward(Batch(x.slice(0, 0, 4), {}));
  EXPECT_EQ(output.names(), (std::vector<std::string>{"code", "prediction"}));
  EXPECT_EQ(output.at("prediction").sizes(), (std::vector<int64_t>{4, 1}));
}

TEST(TorchScript, BadArchivesAreNamed) {
  FT_REQUIRE_SCRIPTED_MODELS();
  testing::TempDir dir;
  EXPECT_TRUE(contains_all(error_message([&] { load_torchscript(dir.file("absent.pt")); }),
                           {"model.path", "absent.pt", "no such file"}));
  std::ofstream(dir.file("notes.pt")) << "not an archive";
  EXPECT_TRUE(contains_all(error_message([&] { load_torchscript(dir.file("notes.pt")); }),
                           {"model.path", "notes.pt", "is not a TorchScript archive"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { load_torchscript(testing::scripted_models().path("no_forward")); }),
                   {"no_forward.pt", "has no forward method", "encode"}));
  EXPECT_TRUE(contains_all(error_message([] { load_torchscript(""); }), {"model.path"}));
}

// The run layer: a scripted module named in a config whose output does not fit the task is refused before
// training, as are the switches that would have to reach inside its forward.
struct FashionShapedRun : RunBuilder {
  DataSplits data(const Config&) override {
    const ImageDataset images = testing::synthetic_images(64, 1, 28, 28, 10);
    auto source = std::make_shared<TensorSource>(std::map<std::string, torch::Tensor>{
        {"inputs", images.images.to(torch::kFloat) / 255}, {"targets", images.labels}});
    return {source, source, "test"};
  }
};

Config scripted_config(const std::string& file) {
  Config config;
  config.data.batch_size(16).workers(0);
  config.train.threads(1).device("cpu");
  config.log.progress("none");
  apply_override(config, "model.name=torchscript");
  apply_override(config, "model.path=" + testing::scripted_models().path(file));
  return config;
}

TEST(TorchScript, WhatCannotApplyIsNamedBeforeTraining) {
  FT_REQUIRE_SCRIPTED_MODELS();
  FashionShapedRun builder;
  const fasttrain::Run run = build_run(builder, scripted_config("cnn"));
  EXPECT_EQ(run.model.name(), "torchscript");
  EXPECT_TRUE(contains_all(error_message([&] { build_run(builder, scripted_config("cnn_7_classes")); }),
                           {"model 'torchscript'", "task 'classification'", "[2, 7]", "10 classes"}));
  Config checkpointed = scripted_config("cnn");
  checkpointed.memory.checkpoint("blocks");
  EXPECT_TRUE(contains_all(
      error_message([&] { build_run(builder, checkpointed); }),
      {"memory.checkpoint", "torchscript", "TorchScript interpreter", "memory.checkpoint = \"none\""}));
  EXPECT_TRUE(contains_all(error_message([&] { run.model.require_blocks("dist.zero = 3", "dist.zero = 2"); }),
                           {"dist.zero = 3", "TorchScript interpreter", "dist.zero = 2"}));
}

}  // namespace
}  // namespace fasttrain
