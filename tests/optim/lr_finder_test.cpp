// LR range test: on a real regression problem with a known divergence LR, and on synthetic curves
// where the right suggestion is known.
#include "fasttrain/optim/lr_finder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fasttrain/optim/optimizer.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

// Full-batch linear regression y = X w* + noise with plain SGD. The loss is the mean squared error,
// whose Hessian is H = 2/N [X 1]^T [X 1]; gradient descent diverges for lr > 2 / lambda_max(H).
struct Regression {
  Regression() {
    torch::manual_seed(0);
    const int64_t n = 256;
    const torch::Tensor scales = torch::linspace(0.2, 2.0, 8, torch::kDouble);
    x = torch::randn({n, 8}, torch::kDouble) * scales;
    y = x.matmul(torch::randn({8, 1}, torch::kDouble)) + 0.1 * torch::randn({n, 1}, torch::kDouble) + 0.5;
    model = torch::nn::Linear(8, 1);
    model->to(torch::kDouble);
    const torch::Tensor design = torch::cat({x, torch::ones({n, 1}, torch::kDouble)}, 1);
    const torch::Tensor hessian = 2.0 / n * design.t().matmul(design);
    // ATen's op: the torch::linalg C++ namespace (torch/linalg.h) is not in the 2.x LibTorch.
    critical_lr = 2.0 / torch::linalg_eigvalsh(hessian, "L").max().item<double>();
    optimizer = make_optimizer(model->named_parameters(), OptimizerOptions("sgd").momentum(0));
  }

  double step(double lr) {
    optimizer->zero_grad();
    const torch::Tensor loss = torch::mse_loss(model(x), y);
    loss.backward();
    optimizer->step(torch::full({}, lr, torch::kDouble));
    return loss.item<double>();
  }

  torch::Tensor x, y;
  torch::nn::Linear model{nullptr};
  std::unique_ptr<Optimizer> optimizer;
  double critical_lr = 0;
};

TEST(LrFinder, RegressionDivergesEarlyAndSuggestsAStableLr) {
  Regression problem;
  const auto options = LrFinderOptions().start_lr(1e-5).end_lr(100).steps(120);
  const LrFinderResult result = find_lr(options, [&](double lr) { return problem.step(lr); });

  ASSERT_TRUE(result.diverged);
  ASSERT_GT(result.points.size(), 20u);
  EXPECT_LT(result.points.size(), 120u);  // stopped early, well before end_lr
  EXPECT_LT(result.points.back().lr, 100.0);
  // It stops once the loss blows up, which takes LRs beyond the stability limit...
  EXPECT_GT(result.points.back().lr, problem.critical_lr);
  // ...but not far beyond it: GD's error grows geometrically there.
  EXPECT_LT(result.points.back().lr, 10 * problem.critical_lr);
  // The suggestion trains stably and is not absurdly small.
  EXPECT_LT(result.suggested_lr, problem.critical_lr);
  EXPECT_GT(result.suggested_lr, problem.critical_lr / 1000);

  // The sweep is geometric: lr strictly increasing with a constant ratio.
  const double ratio = std::pow(100 / 1e-5, 1.0 / 119);
  for (size_t i = 1; i < result.points.size(); ++i) {
    EXPECT_GT(result.points[i].lr, result.points[i - 1].lr);
    EXPECT_NEAR(result.points[i].lr / result.points[i - 1].lr, ratio, 1e-9);
  }
  EXPECT_DOUBLE_EQ(result.points.front().lr, 1e-5);
}

TEST(LrFinder, SmoothingIsBiasCorrected) {
  const std::vector<double> losses = {4.0, 2.0, 3.0, 1.0};
  size_t call = 0;
  const auto result = find_lr(LrFinderOptions().steps(4).smoothing(0.5).divergence(100),
                              [&](double) { return losses[call++]; });
  ASSERT_EQ(result.points.size(), 4u);
  double average = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    average = 0.5 * average + 0.5 * losses[i];
    EXPECT_DOUBLE_EQ(result.points[i].loss, losses[i]);
    EXPECT_DOUBLE_EQ(result.points[i].smoothed_loss, average / (1 - std::pow(0.5, i + 1)));
  }
  EXPECT_DOUBLE_EQ(result.points[0].smoothed_loss, 4.0);  // no drag toward 0 at the start
  EXPECT_FALSE(result.diverged);
}

// A synthetic curve: flat, a sigmoid drop centred at lr = 1e-3, flat until 1, then a blow-up.
// The steepest descent against log(lr) is at 1e-3; the minimum lies in [1e-2, 1].
double synthetic_loss(double lr) {
  const double drop = 1 / (1 + std::pow(lr / 1e-3, -3));  // a logistic in log(lr)
  return 2.0 - 1.5 * drop + (lr > 1 ? 10 * (lr - 1) : 0);
}

TEST(LrFinder, SuggestsTheSteepestDescentOfAKnownCurve) {
  const auto result =
      find_lr(LrFinderOptions().start_lr(1e-6).end_lr(100).steps(200).smoothing(0), synthetic_loss);
  EXPECT_TRUE(result.diverged);
  EXPECT_GT(result.suggested_lr, 0.8e-3);
  EXPECT_LT(result.suggested_lr, 1.25e-3);
}

TEST(LrFinder, CapsTheSuggestionAtATenthOfTheMinimumsLr) {
  // The steepest descent is at the last step before the minimum at lr ~ 1e-2, so the cap wins.
  auto loss = [](double lr) { return lr < 1e-2 ? 1.0 - 50 * lr * lr : 10.0; };
  const auto result = find_lr(LrFinderOptions().start_lr(1e-5).end_lr(1).steps(100).smoothing(0), loss);
  ASSERT_TRUE(result.diverged);
  size_t best = 0;
  for (size_t i = 0; i < result.points.size(); ++i) {
    if (result.points[i].smoothed_loss < result.points[best].smoothed_loss) best = i;
  }
  EXPECT_DOUBLE_EQ(result.suggested_lr, result.points[best].lr / 10);
}

TEST(LrFinder, NonFiniteLossStopsAndIsNotRecorded) {
  int calls = 0;
  const auto result = find_lr(LrFinderOptions().steps(50), [&](double) {
    ++calls;
    return calls < 10 ? 1.0 / calls : NAN;
  });
  EXPECT_TRUE(result.diverged);
  EXPECT_EQ(calls, 10);
  EXPECT_EQ(result.points.size(), 9u);
  for (const auto& p : result.points) EXPECT_TRUE(std::isfinite(p.smoothed_loss));
  EXPECT_GT(result.suggested_lr, 0);
}

TEST(LrFinder, WritesCsvAndTable) {
  Regression problem;
  const auto result = find_lr(LrFinderOptions().start_lr(1e-5).end_lr(100).steps(120),
                              [&](double lr) { return problem.step(lr); });
  const auto path = std::filesystem::temp_directory_path() / "fasttrain_lr_finder_test.csv";
  result.write_csv(path.string());
  std::ifstream file(path);
  std::string line;
  ASSERT_TRUE(std::getline(file, line));
  EXPECT_EQ(line, "lr,loss,smoothed_loss");
  size_t rows = 0;
  while (std::getline(file, line)) {
    std::stringstream fields(line);
    std::string lr, loss, smoothed;
    ASSERT_TRUE(std::getline(fields, lr, ',') && std::getline(fields, loss, ',') &&
                std::getline(fields, smoothed));
    EXPECT_EQ(std::stod(lr), result.points[rows].lr);  // shortest round-trip formatting
    EXPECT_EQ(std::stod(smoothed), result.points[rows].smoothed_loss);
    ++rows;
  }
  EXPECT_EQ(rows, result.points.size());
  std::filesystem::remove(path);

  const std::string table = result.table();
  EXPECT_NE(table.find("smoothed"), std::string::npos) << table;
  EXPECT_NE(table.find("<- suggested"), std::string::npos) << table;
  EXPECT_NE(table.find("<- min loss"), std::string::npos) << table;
  EXPECT_NE(table.find("diverged"), std::string::npos) << table;
  const auto lines = std::count(table.begin(), table.end(), '\n');
  EXPECT_GE(lines, 15);
  EXPECT_LE(lines, 26);  // ~20 sampled rows + marked rows + header lines, not the whole curve

  try {
    result.write_csv("/nonexistent-dir/curve.csv");
    ADD_FAILURE() << "no error for an unwritable path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/curve.csv"), std::string::npos) << e.what();
  }
}

TEST(LrFinder, InvalidOptionsNameTheKey) {
  auto step = [](double) { return 1.0; };
  const std::vector<std::pair<LrFinderOptions, std::string>> cases = {
      {LrFinderOptions().start_lr(0), "lr_finder.start_lr"},
      {LrFinderOptions().end_lr(1e-8), "lr_finder.end_lr"},
      {LrFinderOptions().steps(1), "lr_finder.steps"},
      {LrFinderOptions().smoothing(1), "lr_finder.smoothing"},
      {LrFinderOptions().divergence(1), "lr_finder.divergence"},
  };
  for (const auto& [options, key] : cases) {
    try {
      find_lr(options, step);
      ADD_FAILURE() << "no error for " << key;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fasttrain
