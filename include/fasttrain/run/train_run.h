#pragma once
// The runs the CLI's subcommands call, each a short composition of build_run and the Trainer:
//
//   fasttrain::Config config = fasttrain::load_config("configs/default.toml");
//   fasttrain::FitSummary summary = fasttrain::train_run(config, "runs/default");
//   MyRun builder;                                                   // a program's own model or data
//   fasttrain::train_run(builder, config, "runs/mine", fasttrain::RunOptions().resume("latest"));
//
// The run directory gets config.toml (effective), model.txt, metrics.jsonl, events.out.tfevents.*
// (TensorBoard), checkpoints/step-N/, summary.json and final/model.safetensors
// (final/model_ema.safetensors with EMA). A run stopped by SIGINT/SIGTERM (under a StopSignals guard)
// returns summary.interrupted after its checkpoint; `RunOptions().resume("latest")` continues it
// bit-exactly.
#include <memory>
#include <string>

#include "fasttrain/config/config.h"
#include "fasttrain/log/reporter.h"
#include "fasttrain/models/generate.h"
#include "fasttrain/optim/lr_finder.h"
#include "fasttrain/run/run.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct RunOptions {
  // Continue from a checkpoint: "" = start a new run; "latest" = the newest checkpoint of the run
  // directory that verifies (none: start fresh and say so); else a step-N checkpoint directory or a
  // run directory (its newest). A missing or damaged PATH is an error naming it, as is a checkpoint
  // of a run whose training config differs (the keys are listed).
  FT_ARG(std::string, resume) = "";
  // A new run in a directory that holds an earlier one's checkpoints is an error unless `fresh`:
  // then its checkpoints, metrics, events, final weights and summary are removed first (clear_run_dir).
  FT_ARG(bool, fresh) = false;
  // Hears what the run builds, chooses and does, and its progress (the CLI's ConsoleReporter); null:
  // nothing is said. metrics.jsonl and the TensorBoard events are written either way.
  FT_ARG(std::shared_ptr<Reporter>, reporter) = nullptr;
};

// Trains and writes the run directory (data.batch_size = "auto" is resolved first, or taken from
// the checkpoint when resuming); returns the summary also written to summary.json (not
// written, nor the final weights, when the run was interrupted). Started as one rank of a
// distributed job (torchrun, srun, fasttrain launch), every rank trains on its shard and rank 0
// alone writes the run directory; data.batch_size is then per rank. The run is built (and every bad
// input found) before anything in the directory changes.
FitSummary train_run(RunBuilder& builder, const Config& config, const std::string& run_dir,
                     const RunOptions& options = RunOptions());
// The same from the registries (the CLI's).
FitSummary train_run(const Config& config, const std::string& run_dir,
                     const RunOptions& options = RunOptions());

// Removes what a run wrote into `run_dir` (checkpoints, metrics, TensorBoard events, final weights,
// summary): what `fasttrain train --fresh` does before a new run there. Nothing else is touched.
void clear_run_dir(const std::string& run_dir);

// Evaluates the weights in `weights_path` (a safetensors file with the model's names, such as
// final/model.safetensors) on the evaluation split of `config`'s data.
EvalResult eval_run(RunBuilder& builder, const Config& config, const std::string& weights_path);
EvalResult eval_run(const Config& config, const std::string& weights_path);

// Text sampled from the weights in `weights_path` (final/model.safetensors of a run) of a model built
// as `config` says (the run's config.toml) for byte-level text: the continuation of `prompt`.
// options.context() is the model's longest sequence (its recipe's).
std::string generate_run(const Config& config, const std::string& weights_path, const std::string& prompt,
                         GenerateOptions options);

// LR range test on the config's run (Trainer::find_lr). Writes the curve to `csv_path` when it is not
// empty.
LrFinderResult find_lr_run(RunBuilder& builder, const Config& config, const LrFinderOptions& options,
                           const std::string& csv_path, const std::shared_ptr<Reporter>& reporter = nullptr);

}  // namespace fasttrain
