#pragma once
// Runs built from a Config: what the CLI's subcommands call. Each is a short composition of the
// public pieces (load_image_dataset, DataLoader, make_model, make_optimizer, make_schedule, Trainer).
//
//   fasttrain::Config config = fasttrain::load_config("configs/default.toml");
//   fasttrain::FitSummary summary = fasttrain::train_run(config, "runs/default");
//
// The run directory gets config.toml (effective), metrics.jsonl, summary.json and final/model.pt
// (final/model_ema.pt with EMA).
#include <memory>
#include <string>

#include "fasttrain/config/config.h"
#include "fasttrain/data/loader.h"
#include "fasttrain/optim/lr_finder.h"
#include "fasttrain/train/trainer.h"

namespace fasttrain {

// Everything a run is made of, built from a config: device and threads set, data loaded, model
// initialised from train.seed. `announce` prints what was built (threads, data, model) to stderr.
struct Experiment {
  Config config;
  torch::Device device = torch::kCPU;
  int threads = 1;
  ImageSplits data;
  std::unique_ptr<DataLoader> train_loader;
  std::unique_ptr<DataLoader> test_loader;
  std::shared_ptr<Model> model;

  static Experiment build(const Config& config, bool announce);
  // Optimizer, schedule (planned over the run) and options: a Trainer ready to fit().
  std::unique_ptr<Trainer> make_trainer() const;
};

// Trains and writes the run directory; returns the summary also written to summary.json.
FitSummary train_run(const Config& config, const std::string& run_dir);

// Evaluates the weights in `weights_path` (a final/model.pt) on the test set of `config`'s data.
EvalResult eval_run(const Config& config, const std::string& weights_path);

// LR range test of `trainer` on `loader` (fasttrain::find_lr driven by Trainer::train_step): the
// model's weights and buffers and the optimizer's state are restored afterwards.
LrFinderResult find_lr(Trainer& trainer, DataLoader& loader, const LrFinderOptions& options);

// LR range test on the config's model and data. Writes the curve to `csv_path` when it is not empty.
LrFinderResult find_lr_run(const Config& config, const LrFinderOptions& options, const std::string& csv_path);

void save_weights(Model& model, const std::string& path);
void load_weights(Model& model, const std::string& path);

}  // namespace fasttrain
