#include "fasttrain/task/task.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "fasttrain/task/tasks.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;

Batch batch_of(torch::Tensor inputs, torch::Tensor targets) {
  Batch batch;
  batch.count = inputs.size(0);
  batch.inputs = std::move(inputs);
  batch.targets = std::move(targets);
  return batch;
}

// The task's metrics over `batches`, as Trainer::evaluate computes them: sums added up, then metrics().
Metrics evaluate(Task& task, const std::vector<std::pair<ModelOutput, Batch>>& batches) {
  torch::Tensor totals;
  for (const auto& [output, batch] : batches) {
    torch::Tensor sums = task.evaluation_sums(output, batch);
    totals = totals.defined() ? totals + sums : sums;
  }
  std::vector<double> values(totals.data_ptr<double>(), totals.data_ptr<double>() + totals.numel());
  return task.metrics(values);
}

// fasttrain::cross_entropy is LibTorch's label-smoothed cross-entropy (value and gradient) without
// its host reads.
TEST(Loss, LabelSmoothedCrossEntropyMatchesLibTorchs) {
  torch::manual_seed(8);
  const torch::Tensor targets = torch::randint(0, 7, {33}, torch::kLong);
  for (double smoothing : {0.0, 0.1, 0.4}) {
    SCOPED_TRACE(smoothing);
    torch::Tensor a = torch::randn({33, 7}).requires_grad_(true);
    torch::Tensor b = a.detach().clone().requires_grad_(true);
    torch::Tensor ours = cross_entropy(a, targets, smoothing);
    torch::Tensor theirs = torch::nn::functional::cross_entropy(
        b, targets, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(smoothing));
    EXPECT_NEAR(ours.item<double>(), theirs.item<double>(), 1e-6);
    ours.backward();
    theirs.backward();
    EXPECT_TRUE(torch::allclose(a.grad(), b.grad(), 0, 1e-7));
  }
  // bf16 logits (autocast's output) are computed in fp32.
  torch::Tensor logits = torch::randn({33, 7});
  EXPECT_NEAR(cross_entropy(logits.to(torch::kBFloat16), targets, 0.1).item<double>(),
              cross_entropy(logits.to(torch::kBFloat16).to(torch::kFloat), targets, 0.1).item<double>(),
              1e-6);
}

TEST(ClassificationTask, LossAndMetricsAreCrossEntropyAndAccuracyOverTheBatches) {
  torch::manual_seed(1);
  ClassificationTask task(ClassificationOptions().label_smoothing(0.1));
  const torch::Tensor logits = torch::randn({20, 5}), targets = torch::randint(0, 5, {20}, torch::kLong);
  const Batch first = batch_of(torch::zeros({12, 3}), targets.slice(0, 0, 12));
  const Batch second = batch_of(torch::zeros({8, 3}), targets.slice(0, 12));
  // (On the CPU the task runs fasttrain's cross-entropy kernel: its fp32 sums differ in the last bits.)
  EXPECT_NEAR(task.loss(logits.slice(0, 0, 12), first).item<double>(),
              cross_entropy(logits.slice(0, 0, 12), targets.slice(0, 0, 12), 0.1).item<double>(), 1e-6);
  const Metrics metrics = evaluate(task, {{logits.slice(0, 0, 12), first}, {logits.slice(0, 12), second}});
  // Evaluation reports the plain cross-entropy, not the smoothed training loss.
  EXPECT_NEAR(metrics.at("loss"), torch::nn::functional::cross_entropy(logits, targets).item<double>(), 1e-6);
  EXPECT_DOUBLE_EQ(metrics.at("accuracy"),
                   logits.argmax(1).eq(targets).to(torch::kDouble).mean().item<double>());
  EXPECT_EQ(metrics.names(), (std::vector<std::string>{"loss", "accuracy"}));
  EXPECT_TRUE(task.higher_is_better("accuracy"));
  EXPECT_FALSE(task.higher_is_better("loss"));
}

TEST(ClassificationTask, SequencesAndPaddingAreClassesPerToken) {
  torch::manual_seed(2);
  LanguageModelTask task(ClassificationOptions(), /*bytes_per_target=*/1.0);
  const torch::Tensor logits = torch::randn({2, 3, 6});  // [B, T, V]
  torch::Tensor targets = torch::randint(0, 6, {6}, torch::kLong);
  targets[5] = kIgnoreTarget;  // padding
  Batch batch = batch_of(torch::zeros({2, 3}, torch::kLong), targets);
  batch.count = 5;
  batch.padded = true;
  const Metrics metrics = evaluate(task, {{logits, batch}});
  const torch::Tensor real = logits.reshape({-1, 6}).slice(0, 0, 5);
  const double expected = torch::nn::functional::cross_entropy(real, targets.slice(0, 0, 5)).item<double>();
  EXPECT_NEAR(metrics.at("loss"), expected, 1e-6);
  EXPECT_NEAR(metrics.at("bits_per_byte"), expected / std::log(2.0), 1e-6);
  EXPECT_NEAR(task.loss(logits, batch).item<double>(), expected, 1e-6);
}

// task.kernels: fasttrain's cross-entropy kernel (the default on the CPU) against ATen's ops, the same loss
// and logits' gradient, on fp32 and bf16 logits (autocast's output), with padding, with and without
// smoothing. The kernel computes in fp32, as ATen's ops do on bf16 logits under autocast (the training
// loss runs there), so ATen's side gets them in fp32 through a cast the gradient flows back through.
TEST(ClassificationTask, OwnCrossEntropyKernelMatchesATensOps) {
  torch::manual_seed(3);
  torch::Tensor targets = torch::randint(0, 10, {24}, torch::kLong);
  targets[3] = kIgnoreTarget;
  Batch batch = batch_of(torch::zeros({24, 3}), targets);
  batch.count = 23;
  batch.padded = true;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (double smoothing : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " smoothing " + std::to_string(smoothing));
      const torch::Tensor logits = (2 * torch::randn({24, 10})).to(dtype);
      torch::Tensor losses[2], grads[2];
      for (int own = 0; own < 2; ++own) {
        ClassificationTask task(
            ClassificationOptions().label_smoothing(smoothing).kernels(own ? "fasttrain" : "aten"));
        torch::Tensor x = logits.detach().requires_grad_(true);
        losses[own] = task.loss(own ? x : x.to(torch::kFloat), batch);
        losses[own].backward();
        grads[own] = x.grad();
      }
      EXPECT_EQ(losses[1].scalar_type(), torch::kFloat);
      EXPECT_NEAR(losses[1].item<double>(), losses[0].item<double>(), 2e-6);
      EXPECT_EQ(grads[1].scalar_type(), dtype);
      // bf16: both round the fp32 gradient once; a last-bit difference in the sum can move one rounding.
      const double tolerance = dtype == torch::kBFloat16 ? 4e-3 * grads[0].abs().max().item<double>() : 1e-7;
      EXPECT_LE((grads[1].to(torch::kDouble) - grads[0].to(torch::kDouble)).abs().max().item<double>(),
                tolerance);
      EXPECT_EQ(grads[1][3].abs().max().item<double>(), 0.0);
    }
  }
}

TEST(ClassificationTask, TargetsAndOutputsThatDoNotFitAreErrorsNamingBoth) {
  ClassificationTask task;
  const Batch values = batch_of(torch::zeros({4, 3}), torch::zeros({4, 1}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             task.loss(torch::zeros({4, 10}), values);
                           }),
                           {"classification", "class ids", "Float", "regression"}));
  const Batch labels = batch_of(torch::zeros({4, 3}), torch::zeros({4}, torch::kLong));
  EXPECT_TRUE(contains_all(error_message([&] {
                             task.loss(torch::zeros({3, 10}), labels);
                           }),
                           {"classification", "[3, 10]", "[4]"}));
  // Where the data says how many classes there are, the output layer must have as many logits, even when
  // the batch's labels happen to fit a smaller one.
  ClassificationTask ten(ClassificationOptions(), 10);
  EXPECT_NO_THROW(ten.loss(torch::zeros({4, 10}), labels));
  EXPECT_TRUE(contains_all(error_message([&] {
                             ten.loss(torch::zeros({4, 7}), labels);
                           }),
                           {"classification", "[4, 7]", "7 logits", "10 classes"}));
  EXPECT_TRUE(
      contains_all(error_message([&] {
                     task.loss(std::map<std::string, torch::Tensor>{{"a", torch::zeros({4, 2})}}, labels);
                   }),
                   {"named outputs", "a"}));
  EXPECT_THROW(LanguageModelTask(ClassificationOptions(), 0.0), ConfigError);
  EXPECT_THROW(ClassificationTask(ClassificationOptions().label_smoothing(1.0)), ConfigError);
}

// R² as scikit-learn's r2_score computes it (uniform average over outputs), from sums on the device.
TEST(RegressionTask, MetricsAreRmseMaeAndR2PerOutput) {
  torch::manual_seed(3);
  RegressionTask task(RegressionOptions(), /*outputs=*/2);
  const torch::Tensor targets =
      torch::randn({30, 2}) * torch::tensor({1.0, 5.0}) + torch::tensor({3.0, -2.0});
  const torch::Tensor prediction = targets + 0.3 * torch::randn({30, 2});
  const Batch first = batch_of(torch::zeros({10, 4}), targets.slice(0, 0, 10));
  const Batch second = batch_of(torch::zeros({20, 4}), targets.slice(0, 10));
  const Metrics metrics =
      evaluate(task, {{prediction.slice(0, 0, 10), first}, {prediction.slice(0, 10), second}});
  const torch::Tensor p = prediction.to(torch::kDouble), y = targets.to(torch::kDouble);
  const torch::Tensor error = p - y;
  EXPECT_NEAR(metrics.at("rmse"), error.square().mean().sqrt().item<double>(), 1e-9);
  EXPECT_NEAR(metrics.at("mae"), error.abs().mean().item<double>(), 1e-9);
  EXPECT_NEAR(metrics.at("loss"), error.square().mean().item<double>(), 1e-6);  // mse
  const torch::Tensor r2 = 1 - error.square().sum(0) / (y - y.mean(0)).square().sum(0);
  EXPECT_NEAR(metrics.at("r2"), r2.mean().item<double>(), 1e-9);
  EXPECT_TRUE(task.higher_is_better("r2"));
  EXPECT_FALSE(task.higher_is_better("rmse"));
}

TEST(RegressionTask, LossesAreTorchsAndShapesMustAgree) {
  torch::manual_seed(4);
  const torch::Tensor targets = torch::randn({8, 1}), prediction = torch::randn({8, 1}) * 3;
  const Batch batch = batch_of(torch::zeros({8, 2}), targets);
  namespace F = torch::nn::functional;
  EXPECT_NEAR(RegressionTask(RegressionOptions().loss("l1")).loss(prediction, batch).item<double>(),
              F::l1_loss(prediction, targets).item<double>(), 1e-7);
  EXPECT_NEAR(RegressionTask(RegressionOptions().loss("huber").huber_delta(0.5))
                  .loss(prediction, batch)
                  .item<double>(),
              F::huber_loss(prediction, targets, F::HuberLossFuncOptions().delta(0.5)).item<double>(), 1e-7);
  RegressionTask task;
  EXPECT_TRUE(contains_all(error_message([&] { task.loss(torch::zeros({8}), batch); }),
                           {"regression", "[8] Float", "[8, 1]"}));
  const Batch classes = batch_of(torch::zeros({8, 2}), torch::zeros({8}, torch::kLong));
  EXPECT_TRUE(contains_all(error_message([&] { task.loss(torch::zeros({8}), classes); }),
                           {"regression", "Long", "classification"}));
  EXPECT_THROW(RegressionTask(RegressionOptions().loss("cubic")), ConfigError);
}

TEST(ReconstructionTask, ScoresTheOutputAgainstTheInputs) {
  torch::manual_seed(5);
  const torch::Tensor inputs = torch::rand({6, 1, 4, 4}), output = inputs + 0.1 * torch::randn({6, 1, 4, 4});
  ReconstructionTask task;
  Batch batch = batch_of(inputs, torch::Tensor());
  const Metrics metrics = evaluate(task, {{output, batch}});
  EXPECT_NEAR(metrics.at("loss"), (output - inputs).square().mean().item<double>(), 1e-7);
  EXPECT_NEAR(metrics.at("rmse"), std::sqrt(metrics.at("loss")), 1e-12);
  EXPECT_NEAR(task.loss(output, batch).item<double>(), metrics.at("loss"), 1e-6);
  EXPECT_TRUE(contains_all(error_message([&] {
                             task.loss(torch::zeros({6, 16}), batch);
                           }),
                           {"reconstruction", "[6, 16]", "[6, 1, 4, 4]"}));
}

// A task with only a loss: evaluation reports its mean, weighted by what each batch counts.
TEST(Task, ALossAloneEvaluatesToItsMean) {
  struct Mean : Task {
    std::string name() const override { return "mean"; }
    torch::Tensor loss(const ModelOutput& output, const Batch&) override { return output.tensor().mean(); }
  } task;
  Batch a = batch_of(torch::zeros({2, 1}), torch::Tensor()),
        b = batch_of(torch::zeros({6, 1}), torch::Tensor());
  const Metrics metrics = evaluate(task, {{torch::full({2}, 1.0), a}, {torch::full({6}, 3.0), b}});
  EXPECT_DOUBLE_EQ(metrics.at("loss"), (2 * 1.0 + 6 * 3.0) / 8);
}

TEST(TaskRegistry, BuiltInsByNameAndUnknownNamesListTheRegistered) {
  EXPECT_EQ(task_registry().names(), (std::vector<std::string>{"classification", "language_modeling",
                                                               "regression", "reconstruction"}));
  EXPECT_EQ(make_task("regression", DataShape())->name(), "regression");
  EXPECT_TRUE(contains_all(error_message([&] { make_task("ranking", DataShape()); }),
                           {"task.name 'ranking'", "classification, language_modeling"}));
  EXPECT_THROW(task_registry().add("regression", "again", task_registry().at("regression")), Error);
}

}  // namespace
}  // namespace fasttrain
