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
#include "fasttrain/log/progress.h"
#include "fasttrain/log/tensorboard.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/file_io.h"
#include "fasttrain/state/optimizer_state.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/train/batch_finder.h"
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

// Writes metrics.jsonl and the TensorBoard events of a run and drives the console progress.
class RunLogger : public Callback {
 public:
  RunLogger(const std::string& run_dir, Progress::Mode mode)
      : metrics_(std::make_unique<MetricsWriter>(run_dir + "/metrics.jsonl")),
        events_(std::make_unique<TensorBoardWriter>(run_dir)),
        mode_(mode) {}

  void on_fit_start(Trainer& trainer, int64_t total_steps) override {
    // How the steps run, said once on a GPU: captured, or why train.cuda_graphs = "auto" could not.
    if (trainer.device().is_cuda()) {
      const std::string& reason = trainer.engine_reason();
      fmt::print(stderr, "fasttrain: steps: {}{}; optimizer {}, {}\n", trainer.engine_name(),
                 reason.empty() ? "" : " (train.cuda_graphs: " + reason + ")", trainer.optimizer().name(),
                 trainer.optimizer().describe_kernel());
    }
    progress_ = std::make_unique<Progress>(mode_, total_steps);
    if (trainer.step() > 0) events_->purge_from(trainer.step() + 1);  // resumed: hide the repeated steps
  }
  void on_log(Trainer&, const StepRecord& r) override {
    metrics_->write({{"kind", "train"},
                     {"step", r.step},
                     {"epoch", r.epoch},
                     {"loss", r.loss},
                     {"lr", r.lr},
                     {"grad_norm", r.grad_norm},
                     {"samples_per_s", r.samples_per_s},
                     {"data_wait_fraction", r.data_wait_fraction},
                     {"phases_s", r.phases.to_json()},
                     {"elapsed_s", r.elapsed_s}});
    events_->add_scalar("train/loss", r.loss, r.step);
    events_->add_scalar("train/lr", r.lr, r.step);
    events_->add_scalar("train/grad_norm", r.grad_norm, r.step);
    events_->add_scalar("train/samples_per_s", r.samples_per_s, r.step);
    events_->add_scalar("train/data_wait_fraction", r.data_wait_fraction, r.step);
    progress_->update({r.step, r.epoch, r.loss, r.lr, r.samples_per_s, r.data_wait_fraction, r.elapsed_s});
  }
  void on_evaluate(Trainer&, const EvalRecord& r) override {
    nlohmann::json record{{"kind", "eval"},
                          {"step", r.step},
                          {"epoch", r.epoch},
                          {"test_loss", r.result.loss},
                          {"test_accuracy", r.result.accuracy},
                          {"ema", r.ema},
                          {"elapsed_s", r.elapsed_s}};
    if (r.result.bits_per_byte) {
      record["test_bits_per_byte"] = *r.result.bits_per_byte;
      events_->add_scalar("test/bits_per_byte", *r.result.bits_per_byte, r.step);
    }
    metrics_->write(record);
    events_->add_scalar("test/accuracy", r.result.accuracy, r.step);
    events_->add_scalar("test/loss", r.result.loss, r.step);
    events_->flush();
    progress_->message(fmt::format("step {} epoch {}: test accuracy {:.4f}{} loss {:.4f}{} at {:.1f}s",
                                   r.step, r.epoch, r.result.accuracy, r.ema ? " (EMA)" : "", r.result.loss,
                                   r.result.bits_per_byte
                                       ? fmt::format(" ({:.3f} bits per byte)", *r.result.bits_per_byte)
                                       : std::string(),
                                   r.elapsed_s));
  }
  // The marker a resume truncates metrics.jsonl to: what follows it will be recomputed.
  void on_checkpoint(Trainer& trainer, const std::string& dir) override {
    metrics_->write({{"kind", "checkpoint"},
                     {"step", trainer.step()},
                     {"dir", dir},
                     {"save_s", trainer.last_checkpoint_seconds()}});
    events_->flush();
  }
  void on_fit_end(Trainer&, const FitSummary&) override {
    events_->flush();
    progress_->finish();
  }

 private:
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardWriter> events_;
  Progress::Mode mode_;
  std::unique_ptr<Progress> progress_;
};

// Keeps the lines of metrics.jsonl up to the marker of checkpoint `step`: the records after it
// belong to steps the resumed run repeats. Without the marker (killed between the commit and the
// marker) the records of steps before `step` and the train record of `step` are kept.
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::vector<std::pair<std::string, nlohmann::json>> records;
  std::istringstream lines(read_text_file(path));
  for (std::string line; std::getline(lines, line);) {
    records.emplace_back(line, nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
  }
  auto is_marker = [&](const nlohmann::json& r) {
    return r.is_object() && r.value("kind", "") == "checkpoint" && r.value("step", int64_t{-1}) == step;
  };
  const bool has_marker =
      std::any_of(records.begin(), records.end(), [&](const auto& r) { return is_marker(r.second); });
  std::string kept;
  for (const auto& [line, record] : records) {
    if (!record.is_object()) continue;  // a line cut short by a kill
    const int64_t record_step = record.value("step", int64_t{-1});
    if (!has_marker && !(record_step < step || (record_step == step && record.value("kind", "") == "train")))
      break;
    kept += line + "\n";
    if (has_marker && is_marker(record)) break;
  }
  write_text_file(path, kept);
}

// The step-N directory `--resume` names: "latest" (may be none), a step-N directory, or a run
// directory (its newest verified checkpoint).
std::optional<std::string> resume_target(const std::string& resume, const std::string& run_dir) {
  auto newest = [](const std::string& root, const std::string& what) -> std::optional<std::string> {
    std::vector<std::string> skipped;
    auto latest = latest_checkpoint(root, &skipped);
    for (const auto& reason : skipped)
      fmt::print(stderr, "fasttrain: skipping a damaged checkpoint: {}\n", reason);
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
void remove_later_checkpoints(const std::string& root, const std::string& checkpoint, int64_t step) {
  const auto existing = list_checkpoints(root);
  if (existing.empty()) return;
  const bool same_root = fs::equivalent(fs::path(checkpoint).parent_path(), root);
  FT_CHECK(same_root,
           "cannot resume from '{}' into '{}': it holds another run's checkpoints; choose an empty --run-dir",
           checkpoint, root);
  for (const auto& later : existing) {
    if (later.step <= step) continue;
    fmt::print(stderr, "fasttrain: removing {}, written after the resumed step {}\n", later.dir, step);
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
                        const std::vector<std::string>& changes, const Experiment& experiment) {
  const int64_t batches = experiment.train_loader->batches_per_epoch();
  const int64_t before = planned_steps(saved.train, batches), after = planned_steps(now.train, batches);
  const auto old_schedule = run_schedule(saved, before), new_schedule = run_schedule(now, after);
  const int64_t step = trainer.step();
  fmt::print(stderr,
             "fasttrain: extending the run ({}): {} steps instead of {}; the {} schedule is recomputed over "
             "the new total (at step {} the LR is {:.3g}; the old schedule had {:.3g})\n",
             fmt::join(changes, ", "), after, before, now.schedule.name(), step, new_schedule->lr(step),
             old_schedule->lr(std::min(step, std::max<int64_t>(before - 1, 0))));
}

}  // namespace

Experiment Experiment::build(const Config& requested, bool announce, const ImageSplits* data_in) {
  validate(requested);
  FT_CHECK(requested.data.batch_size() > 0,
           "data.batch_size is \"auto\": resolve it first (resolve_batch_size, as train_run does)");
  // Before CUDA allocates anything: the allocator reads its settings once.
  if (requested.memory.expandable_segments() && !compat::enable_expandable_segments()) {
    fmt::print(stderr, "fasttrain: memory.expandable_segments needs LibTorch >= 2.1 (this is {}): ignored\n",
               compat::torch_version());
  }
  Experiment experiment;
  experiment.device = parse_device(requested.train.device());
  experiment.group = default_process_group(requested.dist);
  const int64_t rank = experiment.group ? experiment.group->rank() : 0;
  const int64_t world_size = experiment.group ? experiment.group->size() : 1;
  announce = announce && rank == 0;
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

  // ---- data ----
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
    eval_source =
        std::make_shared<ImageBatchSource>(experiment.data.test, make_pipeline(data, stats, /*augment=*/false));
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
  const int64_t eval_batch =
      experiment.is_text() ? data.eval_batch_size() : std::min(data.eval_batch_size(), experiment.data.test.size());
  experiment.train_loader = std::make_unique<DataLoader>(train_source, loader_options(data.batch_size())
                                                                           .shuffle(data.shuffle())
                                                                           .drop_last(data.drop_last())
                                                                           .device_resident(experiment.residency.resident));
  experiment.test_loader = std::make_unique<DataLoader>(
      eval_source, eval_options(eval_batch).device_resident(experiment.residency.resident));

  // ---- model ----
  experiment.model = make_model(model_options);
  experiment.model->set_checkpointing(CheckpointPolicy::parse(config.memory.checkpoint_options()));
  experiment.model->to(experiment.device);
  if (config.train.channels_last()) to_channels_last(*experiment.model);

  if (announce) {
    // A short start: the machine, what runs where (and what "auto" chose), the data and the model.
    fmt::print(stderr, "fasttrain: {}; LibTorch {}\n", experiment.hardware.describe(), compat::torch_version());
    fmt::print(stderr, "fasttrain: {}, {}, {} intra-op thread{}{}, {} loader worker{}\n", experiment.device.str(),
               config.train.precision(), experiment.threads, experiment.threads == 1 ? "" : "s",
               experiment.blas.name.empty() ? ""
                                            : fmt::format(" + {} of {}'s own pool for fp32 matmuls",
                                                          experiment.blas.threads, experiment.blas.name),
               experiment.train_loader->workers(), experiment.train_loader->workers() == 1 ? "" : "s");
    if (experiment.residency.resident || (experiment.device.is_cuda() && data.device_resident() == "auto"))
      fmt::print(stderr, "fasttrain:   data.device_resident = {}: {}\n", experiment.residency.resident,
                 experiment.residency.reason);
    for (const AutoChoice& choice : resolved.choices)
      fmt::print(stderr, "fasttrain:   auto: {} = {}: {}\n", choice.key, choice.value, choice.reason);
    for (const std::string& warning : resolved.warnings) fmt::print(stderr, "fasttrain: warning: {}\n", warning);
    if (experiment.group) {
      // The ranks on this machine asking for more threads of a pool than it has take turns.
      const int hardware = static_cast<int>(std::thread::hardware_concurrency());
      auto warn_oversubscribed = [&](int per_rank, const std::string& pool, const std::string& remedy) {
        if (per_rank * local_ranks <= hardware) return;
        fmt::print(stderr,
                   "fasttrain: warning: {} ranks x {} {} threads on {} hardware threads: they will take "
                   "turns; set {}\n",
                   local_ranks, per_rank, pool, hardware, remedy);
      };
      warn_oversubscribed(experiment.threads, "intra-op",
                          "train.threads = 0 (a share of the cores each) or 1");
      warn_oversubscribed(experiment.blas.threads, experiment.blas.name + " (matmul)",
                          fmt::format("train.blas_threads = {}", std::max(1, hardware / local_ranks)));
      const int64_t token_budget = experiment.token_budget();
      const int64_t per_rank = token_budget > 0 ? token_budget : data.batch_size();
      fmt::print(stderr, "fasttrain: {} ranks ({}), {}, {} {} per rank = {} global\n", world_size,
                 experiment.group->backend(),
                 config.dist.zero() == 0 ? std::string("DDP") : fmt::format("ZeRO-{}", config.dist.zero()),
                 token_budget > 0 ? "tokens per batch at most" : "batch", per_rank, per_rank * world_size);
    }
    fmt::print(stderr, "fasttrain: data: train {}, {} batches per epoch; {} {}\n",
               experiment.train_loader->source().describe(), experiment.train_loader->batches_per_epoch(),
               experiment.is_text() ? "validation" : "test", experiment.test_loader->source().describe());
    fmt::print(stderr, "fasttrain: model {}, {} parameters\n", config.model.name(),
               experiment.model->parameter_count());
  }
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

FitSummary train_run(const Config& requested, const std::string& run_dir, const RunOptions& options) {
  // ---- distributed: rank 0 alone decides about and writes the run directory ----
  std::shared_ptr<ProcessGroup> group = default_process_group(requested.dist);
  const bool rank0 = !group || group->rank() == 0;
  FT_CONFIG_CHECK(!group || requested.data.batch_size() > 0,
                  "data.batch_size = \"auto\" is not supported in a distributed run: find it in one process "
                  "(fasttrain find-batch) and set the per-rank size");
  auto on_rank0 = [&](const std::function<std::string()>& decide) {
    std::string result = rank0 ? decide() : "";
    return group ? group->broadcast_string(result) : result;
  };

  // ---- where the run starts: a checkpoint, or new ----
  Config config = requested;
  std::optional<std::string> checkpoint;
  std::optional<Config> saved;
  std::vector<std::string> extended;  // "train.epochs 2 -> 3": the resumed run is made longer
  if (!options.resume().empty()) {
    const std::string target =
        on_rank0([&] { return resume_target(options.resume(), run_dir).value_or(""); });
    if (!target.empty()) checkpoint = target;
    if (!checkpoint) {
      fmt::print(stderr, "fasttrain: no checkpoint in {}/checkpoints: starting fresh\n", run_dir);
    } else if ((saved = saved_config(*checkpoint))) {
      // "auto" resumes with the size the run was searched to, not a new search.
      if (config.data.batch_size() == 0) config.data.batch_size(saved->data.batch_size());
      // The checkpoint recorded what "auto" chose then; this machine's choice is compared with it.
      const Config resolved =
          resolve_auto(config, detect_hardware(parse_device(config.train.device())),
                       group ? group->local_size() : 1)
              .config;
      extended = check_same_training(*checkpoint, *saved, resolved);
    }
  }
  if (!checkpoint) {
    // Every rank learns of a refusal (an earlier run without --fresh) and stops with the same error.
    const std::string refusal = on_rank0([&] {
      try {
        clear_run_outputs(run_dir, options.fresh());
      } catch (const Error& error) {
        return std::string(error.what());
      }
      return std::string();
    });
    FT_CHECK(refusal.empty(), "{}", refusal);
  }
  config = resolve_batch_size(config);

  Experiment experiment = Experiment::build(config, /*announce=*/true);
  // What ran: "auto" resolved; checkpoints record it, so a resume elsewhere compares what ran.
  const Config& effective = experiment.config;
  if (rank0) {
    fs::create_directories(run_dir + "/final");
    write_text_file(run_dir + "/config.toml", to_toml(effective));
    write_text_file(run_dir + "/model.txt", experiment.model->describe());
    fmt::print(stderr, "fasttrain: run directory {} (effective config: {}/config.toml)\n", run_dir, run_dir);
  }
  auto trainer = experiment.make_trainer();
  trainer->enable_checkpoints(RunCheckpointOptions(run_dir + "/checkpoints")
                                  .every_steps(effective.checkpoint.every_steps())
                                  .keep(effective.checkpoint.keep())
                                  .config_toml(to_toml(effective))
                                  .fingerprint(training_fingerprint(effective)));
  if (checkpoint) {
    trainer->load_checkpoint(*checkpoint, experiment.train_loader->batches_per_epoch());
    const int64_t step = trainer->step();
    if (rank0) {
      remove_later_checkpoints(run_dir + "/checkpoints", *checkpoint, step);
      truncate_metrics(run_dir + "/metrics.jsonl", step);
      fmt::print(stderr, "fasttrain: resuming from {} (step {}, epoch {}, batch {} of the epoch)\n",
                 *checkpoint, step, trainer->progress().epoch, trainer->progress().batch_in_epoch);
      if (!extended.empty()) announce_extension(*trainer, *saved, effective, extended, experiment);
    }
  } else if (!config.train.init_from().empty()) {
    std::optional<DataParallel::WholeParameters> whole;  // ZeRO-3: the loaded weights become the shards
    if (trainer->data_parallel()) whole.emplace(*trainer->data_parallel(), /*write_back=*/true);
    load_module_safetensors(*experiment.model, config.train.init_from());
    fmt::print(stderr, "fasttrain: initial weights from {}\n", config.train.init_from());
  }

  // ---- train ----
  if (config.memory.warmup()) trainer->warm_up(experiment.largest_batch());
  if (rank0) {
    trainer->add_callback(std::make_shared<RunLogger>(run_dir, Progress::parse_mode(config.log.progress())));
  }
  FitSummary summary = trainer->fit(*experiment.train_loader, experiment.test_loader.get());
  if (summary.interrupted) return summary;

  // ---- outputs: final weights (and their EMA) in safetensors, the summary ----
  std::optional<DataParallel::WholeParameters> whole;  // ZeRO-3: gathered on every rank
  if (trainer->data_parallel()) whole.emplace(*trainer->data_parallel(), /*write_back=*/false);
  if (!rank0) return summary;
  save_module_safetensors(*experiment.model, run_dir + "/final/model.safetensors");
  if (trainer->ema()) {
    Ema::SwapGuard ema_weights(*trainer->ema());
    save_module_safetensors(*experiment.model, run_dir + "/final/model_ema.safetensors");
  }
  write_json_file(run_dir + "/summary.json", summary.to_json());
  return summary;
}

EvalResult eval_run(const Config& config, const std::string& weights_path) {
  Config plain = config;
  plain.ema.enabled(false);                                    // evaluate the weights in the file as they are
  if (plain.data.batch_size() == 0) plain.data.batch_size(1);  // "auto": no training batches here
  Experiment experiment = Experiment::build(plain, /*announce=*/false);
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
    const torch::Tensor lr_tensor = torch::full({}, lr, torch::TensorOptions().device(trainer.device()).dtype(torch::kDouble));
    return trainer.train_step(window, lr_tensor).item<double>();
  });
  torch::serialize::InputArchive model_archive;
  model_archive.load_from(model_state);
  trainer.model().load(model_archive);
  load_optimizer_state(trainer.optimizer(),
                       SafetensorsFile(optimizer_before.tensors, optimizer_before.metadata, "the optimizer before find-lr"));
  return result;
}

LrFinderResult find_lr_run(const Config& config, const LrFinderOptions& options,
                           const std::string& csv_path) {
  Experiment experiment = Experiment::build(resolve_batch_size(config), /*announce=*/true);
  auto trainer = experiment.make_trainer();
  LrFinderResult result = find_lr(*trainer, *experiment.train_loader, options);
  if (!csv_path.empty()) result.write_csv(csv_path);
  return result;
}

}  // namespace fasttrain
