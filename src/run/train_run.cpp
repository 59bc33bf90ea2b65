#include "fasttrain/run/train_run.h"

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "fasttrain/data/text.h"
#include "fasttrain/detail/file_io.h"
#include "fasttrain/detail/json.h"
#include "fasttrain/log/metrics.h"
#include "fasttrain/memory/snapshot.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/run/batch_finder.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/train/run_logger.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"

namespace fasttrain {

namespace fs = std::filesystem;

namespace {

// The step-N directory `--resume` names: "latest" (may be none), a step-N directory, or a run
// directory (its newest verified checkpoint).
std::optional<std::string> resume_target(const std::string& resume, const std::string& run_dir,
                                         Reporter& reporter) {
  auto newest = [&](const std::string& root, const std::string& what) -> std::optional<std::string> {
    std::vector<std::string> skipped;
    auto latest = latest_checkpoint(root, &skipped);
    for (const auto& reason : skipped) reporter.warning("skipping a damaged checkpoint: " + reason);
    if (!latest) {
      FT_CHECK(what.empty(), "--resume {}: no checkpoint that verifies in '{}'", what, root);
      return std::nullopt;
    }
    return latest->dir;
  };
  if (resume == "latest") return newest(run_dir + "/checkpoints", "");
  FT_CHECK(fs::is_directory(resume), "--resume {}: no such checkpoint or run directory", resume);
  if (fs::exists(resume + "/" + kCheckpointManifestName)) return resume;
  if (fs::is_directory(resume + "/checkpoints")) return newest(resume + "/checkpoints", resume);
  FT_FAIL("--resume {}: neither a step-N checkpoint (no {}) nor a run directory (no checkpoints/)", resume,
          kCheckpointManifestName);
}

// The effective config a checkpoint recorded (none in checkpoints written without one: the
// fingerprint check in load_checkpoint still applies).
std::optional<Config> saved_config(const std::string& checkpoint) {
  const std::string saved_path = checkpoint + "/config.toml";
  if (!fs::exists(saved_path)) return std::nullopt;
  return load_config(saved_path);
}

// The checkpoint's config against this run's: the keys that would change the trajectory. The run
// may be made longer (returned: "train.epochs 2 -> 3"), not shorter.
std::vector<std::string> check_same_training(const std::string& checkpoint, const Config& saved,
                                             const Config& config) {
  std::vector<std::string> differences = training_differences(saved, config);
  FT_CONFIG_CHECK(
      differences.empty(),
      "cannot resume from '{}': it was trained with another config; differing keys (checkpoint vs "
      "now): {}",
      checkpoint, fmt::join(differences, ", "));
  const RunLengthChange length = run_length_change(saved, config);
  FT_CONFIG_CHECK(length.shorter.empty(),
                  "cannot resume from '{}' with a shorter run ({}): a resume may extend train.epochs or "
                  "train.max_steps, not cut them",
                  checkpoint, fmt::join(length.shorter, ", "));
  return length.longer;
}

// Resuming step `step` from `checkpoint` into `root`: checkpoints of `root` after it belong to the
// abandoned continuation and are rewritten by this run. Those of another run are not touched: an error.
void remove_later_checkpoints(const std::string& root, const std::string& checkpoint, int64_t step,
                              Reporter& reporter) {
  const auto existing = list_checkpoints(root);
  if (existing.empty()) return;
  const bool same_root = fs::equivalent(fs::path(checkpoint).parent_path(), root);
  FT_CHECK(same_root,
           "cannot resume from '{}' into '{}': it holds another run's checkpoints; choose an empty --run-dir",
           checkpoint, root);
  for (const auto& later : existing) {
    if (later.step <= step) continue;
    reporter.note(fmt::format("removing {}, written after the resumed step {}", later.dir, step));
    fs::remove_all(later.dir);
  }
}

// A scheduler's restart of this job ("" if none): torchrun --max-restarts and a Slurm requeue say so.
std::string restart_by_scheduler() {
  for (const char* variable : {"TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"}) {
    const char* count = std::getenv(variable);
    if (count != nullptr && std::string(count) != "0" && *count != '\0')
      return fmt::format("{}={}", variable, count);
  }
  return "";
}

// What a new run would overwrite in `run_dir`: refused where an earlier run left checkpoints, unless `fresh`.
void clear_for_new_run(const std::string& run_dir, bool fresh) {
  const auto checkpoints = list_checkpoints(run_dir + "/checkpoints");
  const std::string restart = restart_by_scheduler();
  FT_CHECK(fresh || checkpoints.empty(),
           "'{}' holds an earlier run (checkpoints up to step {}): continue it with --resume, start over "
           "with --fresh (removes its checkpoints, metrics and weights), or choose another --run-dir{}",
           run_dir, checkpoints.empty() ? 0 : checkpoints.back().step,
           restart.empty() ? ""
                           : fmt::format(". This is a restart of the job ({}): put --resume in the job's "
                                         "command, and every restart continues from the newest checkpoint",
                                         restart));
  clear_run_dir(run_dir);
}

// The schedule of a run of `total_steps` steps, from its [optim] and [schedule].
std::unique_ptr<Schedule> run_schedule(const Config& config, int64_t total_steps) {
  const double momentum = optimizer_registry().at(config.optim.name()).momentum(config.optim);
  return make_schedule(config.schedule, config.optim.lr(), momentum, total_steps);
}

// A resumed run made longer: its schedule is recomputed over the new total, and the LR moves.
void announce_extension(const Trainer& trainer, const Config& saved, const Config& now,
                        const std::vector<std::string>& changes, int64_t batches, Reporter& reporter) {
  const int64_t before = planned_steps(saved.train.options, batches),
                after = planned_steps(now.train.options, batches);
  const auto old_schedule = run_schedule(saved, before), new_schedule = run_schedule(now, after);
  const int64_t step = trainer.step();
  reporter.note(fmt::format(
      "extending the run ({}): {} steps instead of {}; the {} schedule is recomputed over the new total (at "
      "step {} the LR is {:.3g}; the old schedule had {:.3g})",
      fmt::join(changes, ", "), after, before, now.schedule.name(), step, new_schedule->lr(step),
      old_schedule->lr(std::min(step, std::max<int64_t>(before - 1, 0)))));
}

// Where a run starts: a verified checkpoint and the config it recorded, or new.
struct RunStart {
  Config config;  // data.batch_size resolved
  std::optional<std::string> checkpoint;
  std::optional<Config> saved;
  std::string resharded;    // "2 rank(s) -> 3: data.batch_size 48 -> 32 per rank ..." ("" = the same world)
  std::string fingerprint;  // the checkpoint's training, as its config.toml says
};

// The number of ranks that wrote `checkpoint` (state.json's world_size; 1 before it was recorded).
int checkpoint_world_size(const std::string& checkpoint) {
  const std::string path = checkpoint + "/state.json";
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_text_file(path, 1 << 20));
  } catch (const nlohmann::json::exception& error) {
    FT_FAIL("checkpoint {} is not valid JSON: {}", path, error.what());
  }
  return state.contains("world_size") ? json_field<int>(state, "world_size", "checkpoint " + path) : 1;
}

// A checkpoint of N ranks resumed on M keeps its global batch: data.batch_size B becomes B * N / M per
// rank (the command may say either), the accumulation stays. Each global micro-batch then holds the
// same samples (the ranks deal each epoch's order in turn), and the run continues its trajectory.
void keep_global_batch(RunStart& start, int ranks) {
  const int saved_ranks = checkpoint_world_size(*start.checkpoint);
  if (saved_ranks == ranks) return;
  const int64_t saved_batch = start.saved->data.batch_size();
  const int64_t global = saved_batch * saved_ranks;
  const int64_t requested = start.config.data.batch_size();
  FT_CONFIG_CHECK(global % ranks == 0,
                  "cannot resume '{}' on {} rank(s): it was trained by {} rank(s) x data.batch_size {} = a "
                  "global batch of {}, which {} ranks cannot split evenly; resume on a number of ranks that "
                  "divides {}",
                  *start.checkpoint, ranks, saved_ranks, saved_batch, global, ranks, global);
  const int64_t per_rank = global / ranks;
  FT_CONFIG_CHECK(requested == saved_batch || requested == per_rank,
                  "cannot resume '{}' on {} rank(s) with data.batch_size = {}: the checkpoint's global batch "
                  "is {} ({} rank(s) x {}), so {} per rank here (or the checkpoint's {}, which is adjusted)",
                  *start.checkpoint, ranks, requested, global, saved_ranks, saved_batch, per_rank,
                  saved_batch);
  start.config.data.batch_size(per_rank);
  start.saved->data.batch_size(per_rank);  // compared key by key with this run's config next
  start.resharded = fmt::format(
      "{} rank(s) -> {}: data.batch_size {} -> {} per rank keeps the global batch of {} (x "
      "train.accumulation "
      "{})",
      saved_ranks, ranks, saved_batch, per_rank, global, start.config.train.options.accumulation());
}

// Rank 0 decides, every rank learns the answer.
std::string decided_on_rank0(const std::shared_ptr<ProcessGroup>& group,
                             const std::function<std::string()>& decide) {
  const bool rank0 = !group || group->rank() == 0;
  std::string result = rank0 ? decide() : "";
  return group ? group->broadcast_string(result) : result;
}

// Reads only: which checkpoint (if any) the run continues, and its config. data.batch_size = "auto"
// resumes with the size the run was searched to, and a new run searches it.
RunStart find_start(RunBuilder& builder, const Config& requested, const std::string& run_dir,
                    const RunOptions& options, const std::shared_ptr<ProcessGroup>& group,
                    const std::shared_ptr<Reporter>& reporter_ptr) {
  Reporter& reporter = reporter_or_quiet(reporter_ptr);
  RunStart start{requested, std::nullopt, std::nullopt};
  if (!options.resume().empty()) {
    const std::string target = decided_on_rank0(
        group, [&] { return resume_target(options.resume(), run_dir, reporter).value_or(""); });
    if (!target.empty()) start.checkpoint = target;
    if (!start.checkpoint)
      reporter.note(fmt::format("no checkpoint in {}/checkpoints: starting fresh", run_dir));
    if (start.checkpoint) start.saved = saved_config(*start.checkpoint);
    if (start.saved && start.config.data.batch_size() == 0)
      start.config.data.batch_size(start.saved->data.batch_size());
    if (start.saved) {
      start.fingerprint = training_fingerprint(*start.saved);  // before keep_global_batch changes it
      keep_global_batch(start, group ? group->size() : 1);
    }
  }
  start.config = resolve_batch_size(builder, start.config, reporter_ptr);
  return start;
}

// The trainer continues the checkpoint; rank 0 drops what the abandoned continuation wrote.
void resume(Trainer& trainer, const RunStart& start, const Run& run, const std::vector<std::string>& extended,
            const std::string& run_dir, Reporter& reporter) {
  trainer.load_checkpoint(*start.checkpoint, run.train_loader->batches_per_epoch());
  const int64_t step = trainer.step();
  if (trainer.rank() != 0) return;
  remove_later_checkpoints(run_dir + "/checkpoints", *start.checkpoint, step, reporter);
  truncate_metrics(run_dir + "/metrics.jsonl", step);
  const std::string restart = restart_by_scheduler();
  if (!start.resharded.empty()) reporter.note("resharding the checkpoint: " + start.resharded);
  reporter.note(fmt::format("resuming from {} (step {}, epoch {}, batch {} of the epoch){}",
                            *start.checkpoint, step, trainer.progress().epoch,
                            trainer.progress().batch_in_epoch,
                            restart.empty() ? "" : " after a restart of the job (" + restart + ")"));
  if (!extended.empty())
    announce_extension(trainer, *start.saved, run.config, extended, run.train_loader->batches_per_epoch(),
                       reporter);
}

// A new run: rank 0 clears what an earlier one left (or refuses), every rank learns the answer.
void start_new_run(const std::string& run_dir, bool fresh, const std::shared_ptr<ProcessGroup>& group) {
  const std::string refusal = decided_on_rank0(group, [&] {
    try {
      clear_for_new_run(run_dir, fresh);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string();
  });
  FT_CHECK(refusal.empty(), "{}", refusal);
}

void initialise_from(Trainer& trainer, const Run& run, Reporter& reporter) {
  const std::string& path = run.config.train.init_from();
  std::optional<DataParallel::WholeParameters> whole;  // ZeRO-3: the loaded weights become the shards
  if (trainer.data_parallel()) whole.emplace(*trainer.data_parallel(), /*write_back=*/true);
  load_module_safetensors(run.model.module(), path);
  reporter.note("initial weights from " + path);
}

// The final weights (and their EMA) in safetensors, and the summary; ZeRO-3's are gathered on every rank.
void write_outputs(Trainer& trainer, const Model& model, const FitSummary& summary,
                   const std::string& run_dir) {
  std::optional<DataParallel::WholeParameters> whole;
  if (trainer.data_parallel()) whole.emplace(*trainer.data_parallel(), /*write_back=*/false);
  if (trainer.rank() != 0) return;
  save_module_safetensors(model.module(), run_dir + "/final/model.safetensors");
  if (trainer.ema()) {
    Ema::SwapGuard ema_weights(*trainer.ema());
    save_module_safetensors(model.module(), run_dir + "/final/model_ema.safetensors");
  }
  write_json_file(run_dir + "/summary.json", summary.to_json());
}

}  // namespace

void clear_run_dir(const std::string& run_dir) {
  if (!fs::is_directory(run_dir)) return;
  fs::remove_all(run_dir + "/checkpoints");
  fs::remove_all(run_dir + "/final");
  fs::remove(run_dir + "/metrics.jsonl");
  fs::remove(run_dir + "/summary.json");
  fs::remove(run_dir + "/" + CudaMemoryHistory::kPickle);
  fs::remove(run_dir + "/" + CudaMemoryHistory::kSummary);
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) fs::remove(entry.path());
  }
}

FitSummary train_run(RunBuilder& builder, const Config& requested, const std::string& run_dir,
                     const RunOptions& options) {
  // ---- distributed: rank 0 alone decides about, writes and reports the run directory ----
  std::shared_ptr<ProcessGroup> group = default_process_group(requested.dist, requested.train.device());
  const bool rank0 = !group || group->rank() == 0;
  const std::shared_ptr<Reporter> reporter_ptr = rank0 ? options.reporter() : nullptr;
  Reporter& reporter = reporter_or_quiet(reporter_ptr);
  FT_CONFIG_CHECK(!group || requested.data.batch_size() > 0,
                  "data.batch_size = \"auto\" is not supported in a distributed run: find it in one process "
                  "(fasttrain find-batch) and set the per-rank size");
  FT_CONFIG_CHECK(requested.train.init_from().empty() || fs::is_regular_file(requested.train.init_from()),
                  "train.init_from '{}' is not a file (a safetensors file of the model's weights)",
                  requested.train.init_from());

  // ---- where the run starts, and what it is built from: every bad input found before anything is written
  // ----
  const RunStart start = find_start(builder, requested, run_dir, options, group, reporter_ptr);
  Run run = build_run(builder, start.config, &reporter);
  std::vector<std::string> extended;  // "train.epochs 2 -> 3": the resumed run is made longer
  if (start.saved) extended = check_same_training(*start.checkpoint, *start.saved, run.config);
  auto trainer = run.make_trainer(&reporter);
  // memory.snapshot: refused off CUDA before anything is cleared.
  std::optional<CudaMemoryHistory> memory_history;
  if (run.config.memory.snapshot()) memory_history.emplace(run.device);
  if (!start.checkpoint) start_new_run(run_dir, options.fresh(), group);

  // What ran: "auto" resolved; checkpoints record it, so a resume elsewhere compares what ran.
  const Config& effective = run.config;
  if (rank0) {
    fs::create_directories(run_dir + "/final");
    write_text_file(run_dir + "/config.toml", to_toml(effective));
    write_text_file(run_dir + "/model.txt", run.model.describe());
    reporter.note(fmt::format("run directory {} (effective config: {}/config.toml)", run_dir, run_dir));
  }
  trainer->enable_checkpoints(RunCheckpointOptions(effective.checkpoint)
                                  .root(run_dir + "/checkpoints")
                                  .config_toml(to_toml(effective))
                                  .fingerprint(training_fingerprint(effective))
                                  .resumed_fingerprint(start.resharded.empty() ? "" : start.fingerprint));
  if (start.checkpoint) {
    resume(*trainer, start, run, extended, run_dir, reporter);
  } else if (!effective.train.init_from().empty()) {
    initialise_from(*trainer, run, reporter);
  }

  // ---- train ----
  // memory.snapshot: written also when the warm-up or training fails (an out-of-memory error's history),
  // and never in the way of the run's own outputs or of the error that stopped it.
  auto write_memory_history = [&] {
    if (!memory_history || !rank0) return;
    try {
      memory_history->write(run_dir);
    } catch (const std::exception& error) {
      reporter.warning(
          fmt::format("memory.snapshot: the allocator's history was not written: {}", error.what()));
    }
  };
  FitSummary summary;
  try {
    if (effective.memory.warmup())
      trainer->warm_up(run.largest_batch(), run.test_loader.get(), run.train_loader.get());
    if (rank0) trainer->add_callback(std::make_shared<RunLogger>(run_dir, reporter_ptr));
    summary = trainer->fit(*run.train_loader, run.test_loader.get());
  } catch (const std::exception&) {
    write_memory_history();
    throw;
  }
  if (!summary.interrupted) write_outputs(*trainer, run.model, summary, run_dir);
  write_memory_history();
  return summary;
}

FitSummary train_run(const Config& config, const std::string& run_dir, const RunOptions& options) {
  RunBuilder builder;
  return train_run(builder, config, run_dir, options);
}

EvalResult eval_run(RunBuilder& builder, const Config& config, const std::string& weights_path) {
  FT_CHECK(fs::is_regular_file(weights_path), "weights file '{}' does not exist", weights_path);
  Config plain = config;
  plain.ema.enabled(false);                                    // evaluate the weights in the file as they are
  if (plain.data.batch_size() == 0) plain.data.batch_size(1);  // "auto": no training batches here
  Run run = build_run(builder, plain);
  FT_CHECK(run.test_loader, "the data ({}) has no evaluation split to evaluate on",
           config.data.dataset.name());
  load_module_safetensors(run.model.module(), weights_path);
  auto trainer = run.make_trainer();
  return trainer->evaluate(*run.test_loader);
}

EvalResult eval_run(const Config& config, const std::string& weights_path) {
  RunBuilder builder;
  return eval_run(builder, config, weights_path);
}

std::string generate_run(const Config& config, const std::string& weights_path, const std::string& prompt,
                         GenerateOptions options) {
  const ModelRecipe& recipe = model_registry().at(config.model.name());
  FT_CONFIG_CHECK(
      recipe.sequence_length,
      "fasttrain generate needs a sequence model over bytes (such as gpt); the config has model.name = "
      "\"{}\"",
      config.model.name());
  FT_CHECK(fs::is_regular_file(weights_path), "weights file '{}' does not exist", weights_path);
  const int64_t context = recipe.sequence_length(config.model.options());
  const torch::Device device = parse_device(config.train.device());
  Model model =
      make_model(config.model.name(), DataShape::tokens(context, kByteVocabulary), &config.model.options());
  const AutoResolution resolved = resolve_auto(config, detect_hardware(device), 1, model.has_convolutions());
  set_intra_op_threads(resolved.config.train.threads());
  set_blas_threads(resolved.config.train.blas_threads());
  load_module_safetensors(model.module(), weights_path);
  model.module().to(device);
  return generate_text(model, prompt, options.context(context));
}

LrFinderResult find_lr_run(RunBuilder& builder, const Config& config, const LrFinderOptions& options,
                           const std::string& csv_path, const std::shared_ptr<Reporter>& reporter) {
  Run run = build_run(builder, resolve_batch_size(builder, config, reporter), reporter.get());
  auto trainer = run.make_trainer(reporter.get());
  LrFinderResult result = trainer->find_lr(*run.train_loader, options);
  if (!csv_path.empty()) result.write_csv(csv_path);
  return result;
}

}  // namespace fasttrain
