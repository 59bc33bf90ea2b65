#pragma once
// Runs built from a Config: what the CLI's subcommands call. Each is a short composition of the
// public pieces (load_image_dataset, DataLoader, make_model, make_optimizer, make_schedule, Trainer).
//
//   fasttrain::Config config = fasttrain::load_config("configs/default.toml");
//   fasttrain::FitSummary summary = fasttrain::train_run(config, "runs/default");
//
// The run directory gets config.toml (effective), metrics.jsonl, events.out.tfevents.* (TensorBoard),
// checkpoints/step-N/, summary.json and final/model.safetensors (final/model_ema.safetensors with
// EMA). A run stopped by SIGINT/SIGTERM (under a StopSignals guard) returns summary.interrupted
// after its checkpoint; `RunOptions().resume("latest")` continues it bit-exactly.
#include <memory>
#include <string>

#include "fasttrain/config/config.h"
#include "fasttrain/data/device_resident.h"
#include "fasttrain/data/loader.h"
#include "fasttrain/data/text.h"
#include "fasttrain/log/reporter.h"
#include "fasttrain/models/generate.h"
#include "fasttrain/optim/lr_finder.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/arg.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/hardware.h"

namespace fasttrain {

// Everything a run is made of, built from a config: device and threads set, data loaded, model
// initialised from train.seed. `reporter` (on rank 0; null: nothing said) hears what was built and
// chosen: the machine, threads, "auto" choices and their reasons, the data, the model.
struct Experiment {
  Config config;  // as it runs: "auto" precision and threads resolved for `hardware`
  torch::Device device = torch::kCPU;
  Hardware hardware;
  int threads = 1;
  BlasLibrary blas;  // its threads as train.blas_threads set them
  ImageSplits data;  // image datasets
  TextSplits text;   // data.dataset = "text"
  std::unique_ptr<DataLoader> train_loader;
  std::unique_ptr<DataLoader> test_loader;
  // data.device_resident resolved: whether both loaders build their batches on the device, and why.
  ResidencyChoice residency;
  std::shared_ptr<Model> model;
  // The distributed job this process is a rank of (default_process_group), or null: one process.
  std::shared_ptr<ProcessGroup> group;

  // `data`: the loaded dataset to use instead of reading it again (find_batch_size's trials).
  // data.batch_size must be resolved (not "auto": resolve_batch_size).
  static Experiment build(const Config& config, Reporter* reporter = nullptr, const ImageSplits* data = nullptr);
  // Optimizer, schedule (planned over the run) and options: a Trainer ready to fit() (data parallel
  // over `group` when there is one).
  std::unique_ptr<Trainer> make_trainer() const;
  // A training batch of the largest shape the run sees (zeros; the loader's layout and device): what
  // Trainer::warm_up runs on.
  Batch largest_batch() const;
  bool is_text() const { return config.data.dataset() == "text"; }
  // Tokens per batch when text documents are length-bucketed (data.batching = "tokens" with
  // data.max_tokens > 0), else 0: batches hold data.batch_size samples.
  int64_t token_budget() const {
    return is_text() && config.data.batching() == "tokens" ? config.data.max_tokens() : 0;
  }
};

struct RunOptions {
  // Continue from a checkpoint: "" = start a new run; "latest" = the newest checkpoint of the run
  // directory that verifies (none: start fresh and say so); else a step-N checkpoint directory or a
  // run directory (its newest). A missing or damaged PATH is an error naming it, as is a checkpoint
  // of a run whose training config differs (the keys are listed).
  FT_ARG(std::string, resume) = "";
  // A new run in a directory that holds an earlier one's checkpoints is an error unless `fresh`:
  // then its checkpoints, metrics, events, final weights and summary are removed first.
  FT_ARG(bool, fresh) = false;
  // Hears what the run builds, chooses and does, and its progress (the CLI's ConsoleReporter); null:
  // nothing is said. metrics.jsonl and the TensorBoard events are written either way.
  FT_ARG(std::shared_ptr<Reporter>, reporter) = nullptr;
};

// Trains and writes the run directory (data.batch_size = "auto" is resolved first, or taken from
// the checkpoint when resuming); returns the summary also written to summary.json (not
// written, nor the final weights, when the run was interrupted). Started as one rank of a
// distributed job (torchrun, srun, fasttrain launch), every rank trains on its shard and rank 0
// alone writes the run directory; data.batch_size is then per rank.
FitSummary train_run(const Config& config, const std::string& run_dir,
                     const RunOptions& options = RunOptions());

// Evaluates the weights in `weights_path` (a safetensors file with the model's names, such as
// final/model.safetensors) on the test set of `config`'s data.
EvalResult eval_run(const Config& config, const std::string& weights_path);

// Text sampled from the gpt weights in `weights_path` (final/model.safetensors of a run) built as
// `config` says (the run's config.toml): the continuation of `prompt`. options.context() is taken
// from config.model.context.
std::string generate_run(const Config& config, const std::string& weights_path, const std::string& prompt,
                         GenerateOptions options);

// LR range test of `trainer` on `loader` (fasttrain::find_lr driven by Trainer::train_step): the
// model's weights and buffers and the optimizer's state are restored afterwards.
LrFinderResult find_lr(Trainer& trainer, DataLoader& loader, const LrFinderOptions& options);

// LR range test on the config's model and data. Writes the curve to `csv_path` when it is not empty.
LrFinderResult find_lr_run(const Config& config, const LrFinderOptions& options, const std::string& csv_path,
                           const std::shared_ptr<Reporter>& reporter = nullptr);

}  // namespace fasttrain
