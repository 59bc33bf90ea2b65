#include "fasttrain/train/run.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>

#include "fasttrain/config/auto.h"
#include "fasttrain/data/text.h"
#include "fasttrain/log/metrics.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/file_io.h"
#include "fasttrain/state/optimizer_state.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/train/batch_finder.h"
#include "fasttrain/train/run_logger.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/compat.h"
#include "fasttrain/util/device.h"

namespace fasttrain {

namespace fs = std::filesystem;

namespace {

// Normalisation statistics come from the training set (identity when data.normalize is off); both
// loaders share them, so they are computed once.
std::pair<std::vector<float>, std::vector<float>> normalisation(const DataConfig& data,
                                                                const ImageDataset& train) {
  if (data.normalize()) return channel_statistics(train.images);
  return {std::vector<float>(train.channels(), 0.0f), std::vector<float>(train.channels(), 1.0f)};
}

TransformPipeline make_pipeline(const DataConfig& data,
                                const std::pair<std::vector<float>, std::vector<float>>& stats,
                                bool augment) {
  TransformPipeline pipeline(stats.first, stats.second);
  if (augment && data.crop_padding() > 0) pipeline.add(std::make_shared<RandomCrop>(data.crop_padding()));
  if (augment && data.hflip() > 0) pipeline.add(std::make_shared<HorizontalFlip>(data.hflip()));
  return pipeline;
}

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

// What a new run would overwrite in `run_dir`.
void clear_run_outputs(const std::string& run_dir, bool fresh) {
  const auto checkpoints = list_checkpoints(run_dir + "/checkpoints");
  FT_CHECK(fresh || checkpoints.empty(),
           "'{}' holds an earlier run (checkpoints up to step {}): continue it with --resume, start over "
           "with --fresh (removes its checkpoints, metrics and weights), or choose another --run-dir",
           run_dir, checkpoints.empty() ? 0 : checkpoints.back().step);
  if (!fs::is_directory(run_dir)) return;
  fs::remove_all(run_dir + "/checkpoints");
  fs::remove_all(run_dir + "/final");
  fs::remove(run_dir + "/metrics.jsonl");
  fs::remove(run_dir + "/summary.json");
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) fs::remove(entry.path());
  }
}

// train.threads (a share of the cores each when `processes_sharing` ranks share this machine) and
// train.blas_threads, as resolve_auto left them, set before anything computes. Returns the intra-op
// thread count.
int set_threads(const TrainOptions& train, int processes_sharing = 1) {
  const int threads = set_intra_op_threads(train.threads(), processes_sharing);
  set_blas_threads(train.blas_threads());
  return threads;
}

// The schedule of a run of `total_steps` steps, from its [optim] and [schedule].
std::unique_ptr<Schedule> run_schedule(const Config& config, int64_t total_steps) {
  const double momentum = config.optim.name() == "sgd" ? config.optim.momentum() : config.optim.beta1();
  return make_schedule(config.schedule, config.optim.lr(), momentum, total_steps);
}

// A resumed run made longer: its schedule is recomputed over the new total, and the LR moves.
void announce_extension(const Trainer& trainer, const Config& saved, const Config& now,
                        const std::vector<std::string>& changes, const Experiment& experiment,
                        Reporter& reporter) {
  const int64_t batches = experiment.train_loader->batches_per_epoch();
  const int64_t before = planned_steps(saved.train, batches), after = planned_steps(now.train, batches);
  const auto old_schedule = run_schedule(saved, before), new_schedule = run_schedule(now, after);
  const int64_t step = trainer.step();
  reporter.note(fmt::format(
      "extending the run ({}): {} steps instead of {}; the {} schedule is recomputed over the new total (at "
      "step {} the LR is {:.3g}; the old schedule had {:.3g})",
      fmt::join(changes, ", "), after, before, now.schedule.name(), step, new_schedule->lr(step),
      old_schedule->lr(std::min(step, std::max<int64_t>(before - 1, 0)))));
}

// The splits, their batch sources and loaders (on the device when they fit, data.device_resident);
// returns the model options with the input shape and class count the data gives.
ModelOptions load_data(Experiment& experiment, const ImageSplits* data_in, int local_ranks) {
  const Config& config = experiment.config;
  const int64_t rank = experiment.group ? experiment.group->rank() : 0;
  const int64_t world_size = experiment.group ? experiment.group->size() : 1;
  const DataConfig& data = config.data;
  auto loader_options = [&](int64_t batch_size) {
    return LoaderOptions(batch_size)
        .workers(data.workers() >= 0 ? data.workers() : auto_worker_count(local_ranks))
        .prefetch(data.prefetch())
        .seed(static_cast<uint64_t>(config.train.seed()))
        .device(experiment.device)
        .pin_memory(data.pin_memory())
        .channels_last(config.train.channels_last())
        .rank(rank)
        .world_size(world_size);
  };
  // Evaluation sees every sample once, in order, whatever the world size.
  auto eval_options = [&](int64_t batch_size) {
    return loader_options(batch_size).shuffle(false).drop_last(false).even_shards(false);
  };
  ModelOptions model_options = config.model;
  std::shared_ptr<const BatchSource> train_source, eval_source;
  if (experiment.is_text()) {
    experiment.text = load_text_corpus(
        TextCorpusOptions(data.path()).include(data.include()).val_fraction(data.val_fraction()));
    const int64_t context = config.model.context();
    if (data.batching() == "windows") {
      train_source = std::make_shared<TextWindowSource>(experiment.text.train, context);
      eval_source = std::make_shared<TextWindowSource>(experiment.text.validation, context);
    } else {
      const auto documents = TextDocumentOptions(context).max_tokens(data.max_tokens());
      train_source = std::make_shared<TextDocumentSource>(experiment.text.train, documents);
      eval_source = std::make_shared<TextDocumentSource>(experiment.text.validation, documents);
    }
    model_options.num_classes(kByteVocabulary);
  } else {
    experiment.data = data_in ? *data_in : load_image_dataset(data.dataset(), data.resolved_path());
    ImageDataset train = experiment.data.train;
    if (data.train_limit() > 0) {
      FT_CONFIG_CHECK(data.train_limit() <= train.size(),
                      "data.train_limit {} exceeds the {} training samples", data.train_limit(),
                      train.size());
      train = train.head(data.train_limit());
    }
    FT_CONFIG_CHECK(data.batch_size() <= train.size(),
                    "data.batch_size {} is larger than the {} training samples", data.batch_size(),
                    train.size());
    const auto stats = normalisation(data, train);
    train_source = std::make_shared<ImageBatchSource>(train, make_pipeline(data, stats, /*augment=*/true));
    eval_source = std::make_shared<ImageBatchSource>(experiment.data.test,
                                                     make_pipeline(data, stats, /*augment=*/false));
    model_options.in_channels(train.channels())
        .height(train.height())
        .width(train.width())
        .num_classes(experiment.data.train.num_classes);
  }
  // Both splits on the device, or neither.
  const int64_t resident_bytes = train_source->resident_bytes() > 0 && eval_source->resident_bytes() > 0
                                     ? train_source->resident_bytes() + eval_source->resident_bytes()
                                     : 0;
  experiment.residency = choose_residency(data.device_resident(), experiment.device, resident_bytes,
                                          experiment.hardware.gpu_memory_bytes);
  const int64_t eval_batch = experiment.is_text()
                                 ? data.eval_batch_size()
                                 : std::min(data.eval_batch_size(), experiment.data.test.size());
  experiment.train_loader =
      std::make_unique<DataLoader>(train_source, loader_options(data.batch_size())
                                                     .shuffle(data.shuffle())
                                                     .drop_last(data.drop_last())
                                                     .device_resident(experiment.residency.resident));
  experiment.test_loader = std::make_unique<DataLoader>(
      eval_source, eval_options(eval_batch).device_resident(experiment.residency.resident));

  return model_options;
}

// The ranks, their kind of data parallelism and batch; a warning when the ranks on this machine ask for
// more threads of a pool than it has (they take turns).
void announce_ranks(const Experiment& experiment, int local_ranks, Reporter& reporter) {
  const Config& config = experiment.config;
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  auto warn_oversubscribed = [&](int per_rank, const std::string& pool, const std::string& remedy) {
    if (per_rank * local_ranks <= hardware) return;
    reporter.warning(
        fmt::format("{} ranks x {} {} threads on {} hardware threads: they will take turns; set {}",
                    local_ranks, per_rank, pool, hardware, remedy));
  };
  warn_oversubscribed(experiment.threads, "intra-op", "train.threads = 0 (a share of the cores each) or 1");
  warn_oversubscribed(experiment.blas.threads, experiment.blas.name + " (matmul)",
                      fmt::format("train.blas_threads = {}", std::max(1, hardware / local_ranks)));
  const int64_t token_budget = experiment.token_budget();
  const int64_t per_rank = token_budget > 0 ? token_budget : config.data.batch_size();
  const int64_t world_size = experiment.group->size();
  reporter.note(
      fmt::format("{} ranks ({}), {}, {} {} per rank = {} global", world_size, experiment.group->backend(),
                  config.dist.zero() == 0 ? std::string("DDP") : fmt::format("ZeRO-{}", config.dist.zero()),
                  token_budget > 0 ? "tokens per batch at most" : "batch", per_rank, per_rank * world_size));
}

// A short start: the machine, what runs where (and what "auto" chose), the data and the model.
void announce_experiment(const Experiment& experiment, const AutoResolution& resolved, int local_ranks,
                         Reporter& reporter) {
  const Config& config = experiment.config;
  const DataConfig& data = config.data;
  reporter.note(fmt::format("{}; LibTorch {}", experiment.hardware.describe(), compat::torch_version()));
  const std::string blas = experiment.blas.name.empty()
                               ? ""
                               : fmt::format(" + {} of {}'s own pool for fp32 matmuls",
                                             experiment.blas.threads, experiment.blas.name);
  const int workers = experiment.train_loader->workers();
  reporter.note(fmt::format("{}, {}, {} intra-op thread{}{}, {} loader worker{}", experiment.device.str(),
                            config.train.precision(), experiment.threads, experiment.threads == 1 ? "" : "s",
                            blas, workers, workers == 1 ? "" : "s"));
  if (experiment.residency.resident || (experiment.device.is_cuda() && data.device_resident() == "auto"))
    reporter.note(fmt::format("  data.device_resident = {}: {}", experiment.residency.resident,
                              experiment.residency.reason));
  for (const AutoChoice& choice : resolved.choices)
    reporter.note(fmt::format("  auto: {} = {}: {}", choice.key, choice.value, choice.reason));
  for (const std::string& warning : resolved.warnings) reporter.warning(warning);
  if (experiment.group) announce_ranks(experiment, local_ranks, reporter);
  reporter.note(
      fmt::format("data: train {}, {} batches per epoch; {} {}", experiment.train_loader->source().describe(),
                  experiment.train_loader->batches_per_epoch(), experiment.is_text() ? "validation" : "test",
                  experiment.test_loader->source().describe()));
  reporter.note(
      fmt::format("model {}, {} parameters", config.model.name(), experiment.model->parameter_count()));
}

}  // namespace

Experiment Experiment::build(const Config& requested, Reporter* reporter_in, const ImageSplits* data_in) {
  validate(requested);
  FT_CHECK(requested.data.batch_size() > 0,
           "data.batch_size is \"auto\": resolve it first (resolve_batch_size, as train_run does)");
  // Before CUDA allocates anything (a process group may): the allocator reads its settings once.
  const bool segments_ignored =
      requested.memory.expandable_segments() && !compat::enable_expandable_segments();
  Experiment experiment;
  experiment.device = parse_device(requested.train.device());
  experiment.group = default_process_group(requested.dist);
  const bool rank0 = !experiment.group || experiment.group->rank() == 0;
  Reporter& reporter = reporter_in && rank0 ? *reporter_in : quiet_reporter();
  if (segments_ignored) {
    reporter.warning(fmt::format("memory.expandable_segments needs LibTorch >= 2.1 (this is {}): ignored",
                                 compat::torch_version()));
  }
  // The ranks on this machine share its cores: "auto" threads and workers take a share each.
  const int local_ranks = experiment.group ? experiment.group->local_size() : 1;
  // "auto" precision and threads become what this hardware runs best.
  experiment.hardware = detect_hardware(experiment.device);
  const AutoResolution resolved = resolve_auto(requested, experiment.hardware, local_ranks);
  experiment.config = resolved.config;
  const Config& config = experiment.config;
  // From the start, so that peak_memory_bytes counts the dataset and the model too.
  if (experiment.device.is_cpu()) track_cpu_allocations();
  experiment.threads = set_threads(config.train, local_ranks);
  experiment.blas = blas_library();
  compat::set_backend_switches(config.train.cudnn_benchmark(), config.train.tf32(),
                               config.train.deterministic());
  parse_precision(config.train.precision(), experiment.device);  // fp16 on CPU fails here, before any work
  torch::manual_seed(static_cast<uint64_t>(config.train.seed()));

  ModelOptions model_options = load_data(experiment, data_in, local_ranks);

  // ---- model ----
  experiment.model = make_model(model_options);
  experiment.model->set_checkpointing(CheckpointPolicy::parse(config.memory.checkpoint_options()));
  experiment.model->to(experiment.device);
  if (config.train.channels_last()) to_channels_last(*experiment.model);

  announce_experiment(experiment, resolved, local_ranks, reporter);
  return experiment;
}

std::unique_ptr<Trainer> Experiment::make_trainer() const {
  auto optimizer = make_optimizer(model->named_parameters(), config.optim);
  auto schedule = run_schedule(config, planned_steps(config.train, train_loader->batches_per_epoch()));
  auto trainer =
      std::make_unique<Trainer>(model, std::move(optimizer), std::move(schedule), config.train, device);
  if (config.ema.enabled()) {
    trainer->enable_ema(EmaOptions(config.ema.decay()).warmup(config.ema.warmup()).every(config.ema.every()));
  }
  trainer->set_log_every(config.log.every_steps());
  if (group) trainer->enable_data_parallel(group, config.dist);
  return trainer;
}

Batch Experiment::largest_batch() const {
  Batch batch;
  const auto on_device = torch::TensorOptions().device(device);
  if (is_text()) {
    // The most tokens at the longest sequences: attention's [B, H, T, T] scores are largest there.
    const int64_t context = config.model.context();
    const int64_t sequences = token_budget() > 0 ? token_budget() / context : config.data.batch_size();
    batch.inputs = torch::zeros({sequences, context}, on_device.dtype(torch::kLong));  // [B, T]
    batch.targets = torch::zeros({sequences * context}, on_device.dtype(torch::kLong));
    batch.count = sequences * context;
    return batch;
  }
  const ImageDataset& train = data.train;
  auto layout =
      config.train.channels_last() ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  batch.inputs = torch::zeros({config.data.batch_size(), train.channels(), train.height(), train.width()},
                              on_device.dtype(torch::kFloat32))
                     .contiguous(layout);  // [B, C, H, W]
  batch.targets = torch::zeros({config.data.batch_size()}, on_device.dtype(torch::kLong));
  batch.count = config.data.batch_size();
  return batch;
}

namespace {

// Where a run starts: a verified checkpoint and the config it recorded, or new.
struct RunStart {
  Config config;  // data.batch_size resolved
  std::optional<std::string> checkpoint;
  std::optional<Config> saved;
  std::vector<std::string> extended;  // "train.epochs 2 -> 3": the resumed run is made longer
};

// Rank 0 decides, every rank learns the answer.
std::string decided_on_rank0(const std::shared_ptr<ProcessGroup>& group,
                             const std::function<std::string()>& decide) {
  const bool rank0 = !group || group->rank() == 0;
  std::string result = rank0 ? decide() : "";
  return group ? group->broadcast_string(result) : result;
}

RunStart find_start(const Config& requested, const std::string& run_dir, const RunOptions& options,
                    const std::shared_ptr<ProcessGroup>& group,
                    const std::shared_ptr<Reporter>& reporter_ptr) {
  Reporter& reporter = reporter_or_quiet(reporter_ptr);
  RunStart start{requested, std::nullopt, std::nullopt, {}};
  Config& config = start.config;
  if (!options.resume().empty()) {
    const std::string target = decided_on_rank0(
        group, [&] { return resume_target(options.resume(), run_dir, reporter).value_or(""); });
    if (!target.empty()) start.checkpoint = target;
    if (!start.checkpoint) {
      reporter.note(fmt::format("no checkpoint in {}/checkpoints: starting fresh", run_dir));
    } else if ((start.saved = saved_config(*start.checkpoint))) {
      // "auto" resumes with the size the run was searched to, not a new search.
      if (config.data.batch_size() == 0) config.data.batch_size(start.saved->data.batch_size());
      // The checkpoint recorded what "auto" chose then; this machine's choice is compared with it.
      const Config resolved = resolve_auto(config, detect_hardware(parse_device(config.train.device())),
                                           group ? group->local_size() : 1)
                                  .config;
      start.extended = check_same_training(*start.checkpoint, *start.saved, resolved);
    }
  }
  if (!start.checkpoint) {
    // Every rank learns of a refusal (an earlier run without --fresh) and stops with the same error.
    const std::string refusal = decided_on_rank0(group, [&] {
      try {
        clear_run_outputs(run_dir, options.fresh());
      } catch (const Error& error) {
        return std::string(error.what());
      }
      return std::string();
    });
    FT_CHECK(refusal.empty(), "{}", refusal);
  }
  config = resolve_batch_size(config, reporter_ptr);
  return start;
}

// The trainer continues the checkpoint; rank 0 drops what the abandoned continuation wrote.
void resume(Trainer& trainer, const RunStart& start, const Experiment& experiment, const std::string& run_dir,
            Reporter& reporter) {
  trainer.load_checkpoint(*start.checkpoint, experiment.train_loader->batches_per_epoch());
  const int64_t step = trainer.step();
  if (trainer.rank() != 0) return;
  remove_later_checkpoints(run_dir + "/checkpoints", *start.checkpoint, step, reporter);
  truncate_metrics(run_dir + "/metrics.jsonl", step);
  reporter.note(fmt::format("resuming from {} (step {}, epoch {}, batch {} of the epoch)", *start.checkpoint,
                            step, trainer.progress().epoch, trainer.progress().batch_in_epoch));
  if (!start.extended.empty())
    announce_extension(trainer, *start.saved, experiment.config, start.extended, experiment, reporter);
}

// The final weights (and their EMA) in safetensors, and the summary; ZeRO-3's are gathered on every rank.
void write_outputs(Trainer& trainer, Model& model, const FitSummary& summary, const std::string& run_dir) {
  std::optional<DataParallel::WholeParameters> whole;
  if (trainer.data_parallel()) whole.emplace(*trainer.data_parallel(), /*write_back=*/false);
  if (trainer.rank() != 0) return;
  save_module_safetensors(model, run_dir + "/final/model.safetensors");
  if (trainer.ema()) {
    Ema::SwapGuard ema_weights(*trainer.ema());
    save_module_safetensors(model, run_dir + "/final/model_ema.safetensors");
  }
  write_json_file(run_dir + "/summary.json", summary.to_json());
}

}  // namespace

FitSummary train_run(const Config& requested, const std::string& run_dir, const RunOptions& options) {
  // ---- distributed: rank 0 alone decides about, writes and reports the run directory ----
  std::shared_ptr<ProcessGroup> group = default_process_group(requested.dist);
  const bool rank0 = !group || group->rank() == 0;
  const std::shared_ptr<Reporter> reporter_ptr = rank0 ? options.reporter() : nullptr;
  Reporter& reporter = reporter_or_quiet(reporter_ptr);
  FT_CONFIG_CHECK(!group || requested.data.batch_size() > 0,
                  "data.batch_size = \"auto\" is not supported in a distributed run: find it in one process "
                  "(fasttrain find-batch) and set the per-rank size");

  // ---- where the run starts: a checkpoint, or new; then what is built ----
  const RunStart start = find_start(requested, run_dir, options, group, reporter_ptr);
  Experiment experiment = Experiment::build(start.config, &reporter);
  // What ran: "auto" resolved; checkpoints record it, so a resume elsewhere compares what ran.
  const Config& effective = experiment.config;
  if (rank0) {
    fs::create_directories(run_dir + "/final");
    write_text_file(run_dir + "/config.toml", to_toml(effective));
    write_text_file(run_dir + "/model.txt", experiment.model->describe());
    reporter.note(fmt::format("run directory {} (effective config: {}/config.toml)", run_dir, run_dir));
  }
  auto trainer = experiment.make_trainer();
  trainer->enable_checkpoints(RunCheckpointOptions(run_dir + "/checkpoints")
                                  .every_steps(effective.checkpoint.every_steps())
                                  .keep(effective.checkpoint.keep())
                                  .config_toml(to_toml(effective))
                                  .fingerprint(training_fingerprint(effective)));
  if (start.checkpoint) {
    resume(*trainer, start, experiment, run_dir, reporter);
  } else if (!effective.train.init_from().empty()) {
    std::optional<DataParallel::WholeParameters> whole;  // ZeRO-3: the loaded weights become the shards
    if (trainer->data_parallel()) whole.emplace(*trainer->data_parallel(), /*write_back=*/true);
    load_module_safetensors(*experiment.model, effective.train.init_from());
    reporter.note("initial weights from " + effective.train.init_from());
  }

  // ---- train ----
  if (effective.memory.warmup()) trainer->warm_up(experiment.largest_batch());
  if (rank0) trainer->add_callback(std::make_shared<RunLogger>(run_dir, reporter_ptr));
  FitSummary summary = trainer->fit(*experiment.train_loader, experiment.test_loader.get());
  if (!summary.interrupted) write_outputs(*trainer, *experiment.model, summary, run_dir);
  return summary;
}

EvalResult eval_run(const Config& config, const std::string& weights_path) {
  Config plain = config;
  plain.ema.enabled(false);                                    // evaluate the weights in the file as they are
  if (plain.data.batch_size() == 0) plain.data.batch_size(1);  // "auto": no training batches here
  Experiment experiment = Experiment::build(plain);
  FT_CHECK(fs::is_regular_file(weights_path), "weights file '{}' does not exist", weights_path);
  load_module_safetensors(*experiment.model, weights_path);
  auto trainer = experiment.make_trainer();
  return trainer->evaluate(*experiment.test_loader);
}

std::string generate_run(const Config& config, const std::string& weights_path, const std::string& prompt,
                         GenerateOptions options) {
  FT_CONFIG_CHECK(config.model.name() == "gpt",
                  "fasttrain generate needs a gpt model; the config has model.name = \"{}\"",
                  config.model.name());
  FT_CHECK(fs::is_regular_file(weights_path), "weights file '{}' does not exist", weights_path);
  const torch::Device device = parse_device(config.train.device());
  set_threads(resolve_auto(config, detect_hardware(device)).config.train);
  auto model = make_model(ModelOptions(config.model).num_classes(kByteVocabulary));
  load_module_safetensors(*model, weights_path);
  model->to(device);
  return generate_text(*model, prompt, options.context(config.model.context()));
}

LrFinderResult find_lr(Trainer& trainer, DataLoader& loader, const LrFinderOptions& options) {
  // Snapshot what the sweep changes; the caller gets it back untouched.
  std::stringstream model_state;
  {
    torch::serialize::OutputArchive model_archive;
    trainer.model().save(model_archive);
    model_archive.save_to(model_state);
  }
  OptimizerStateTensors optimizer_before = optimizer_state(trainer.optimizer());
  for (auto& [name, tensor] : optimizer_before.tensors) tensor = tensor.clone();
  int64_t epoch = 0;
  loader.start_epoch(epoch);
  LrFinderResult result = fasttrain::find_lr(options, [&](double lr) {
    std::vector<Batch> window;
    while (static_cast<int64_t>(window.size()) < trainer.options().accumulation()) {
      auto batch = loader.next();
      if (!batch) {
        loader.start_epoch(++epoch);
        continue;
      }
      window.push_back(std::move(*batch));
    }
    const torch::Tensor lr_tensor =
        torch::full({}, lr, torch::TensorOptions().device(trainer.device()).dtype(torch::kDouble));
    return trainer.train_step(window, lr_tensor).item<double>();
  });
  torch::serialize::InputArchive model_archive;
  model_archive.load_from(model_state);
  trainer.model().load(model_archive);
  load_optimizer_state(
      trainer.optimizer(),
      SafetensorsFile(optimizer_before.tensors, optimizer_before.metadata, "the optimizer before find-lr"));
  return result;
}

LrFinderResult find_lr_run(const Config& config, const LrFinderOptions& options, const std::string& csv_path,
                           const std::shared_ptr<Reporter>& reporter) {
  Experiment experiment = Experiment::build(resolve_batch_size(config, reporter), reporter.get());
  auto trainer = experiment.make_trainer();
  LrFinderResult result = find_lr(*trainer, *experiment.train_loader, options);
  if (!csv_path.empty()) result.write_csv(csv_path);
  return result;
}

}  // namespace fasttrain
