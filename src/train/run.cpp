#include "fasttrain/train/run.h"

#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "fasttrain/log/metrics.h"
#include "fasttrain/log/progress.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/util/check.h"
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

// Writes metrics.jsonl records and drives the console progress.
class RunLogger : public Callback {
 public:
  RunLogger(const std::string& run_dir, Progress::Mode mode)
      : metrics_(run_dir.empty() ? nullptr : std::make_unique<MetricsWriter>(run_dir + "/metrics.jsonl")),
        mode_(mode) {}

  void on_fit_start(Trainer&, int64_t total_steps) override {
    progress_ = std::make_unique<Progress>(mode_, total_steps);
  }
  void on_log(Trainer&, const StepRecord& r) override {
    if (metrics_) {
      metrics_->write({{"kind", "train"},
                       {"step", r.step},
                       {"epoch", r.epoch},
                       {"loss", r.loss},
                       {"lr", r.lr},
                       {"grad_norm", r.grad_norm},
                       {"samples_per_s", r.samples_per_s},
                       {"data_wait_fraction", r.data_wait_fraction},
                       {"elapsed_s", r.elapsed_s}});
    }
    progress_->update({r.step, r.epoch, r.loss, r.lr, r.samples_per_s, r.data_wait_fraction, r.elapsed_s});
  }
  void on_evaluate(Trainer&, const EvalRecord& r) override {
    if (metrics_) {
      metrics_->write({{"kind", "eval"},
                       {"step", r.step},
                       {"epoch", r.epoch},
                       {"test_loss", r.result.loss},
                       {"test_accuracy", r.result.accuracy},
                       {"ema", r.ema},
                       {"elapsed_s", r.elapsed_s}});
    }
    progress_->message(fmt::format("step {} epoch {}: test accuracy {:.4f}{} loss {:.4f} at {:.1f}s", r.step,
                                   r.epoch, r.result.accuracy, r.ema ? " (EMA)" : "", r.result.loss,
                                   r.elapsed_s));
  }
  void on_fit_end(Trainer&, const FitSummary&) override { progress_->finish(); }

 private:
  std::unique_ptr<MetricsWriter> metrics_;
  Progress::Mode mode_;
  std::unique_ptr<Progress> progress_;
};

}  // namespace

Experiment Experiment::build(const Config& config, bool announce) {
  validate(config);
  Experiment experiment;
  experiment.config = config;
  experiment.device = parse_device(config.train.device());
  experiment.threads = set_intra_op_threads(config.train.threads());
  parse_precision(config.train.precision(), experiment.device);  // fp16 on CPU fails here, before any work
  torch::manual_seed(static_cast<uint64_t>(config.train.seed()));

  // ---- data ----
  const DataConfig& data = config.data;
  experiment.data = load_image_dataset(data.dataset(), data.resolved_path());
  ImageDataset train = experiment.data.train;
  if (data.train_limit() > 0) {
    FT_CONFIG_CHECK(data.train_limit() <= train.size(), "data.train_limit {} exceeds the {} training samples",
                    data.train_limit(), train.size());
    train = train.head(data.train_limit());
  }
  FT_CONFIG_CHECK(data.batch_size() <= train.size(),
                  "data.batch_size {} is larger than the {} training samples", data.batch_size(),
                  train.size());
  auto loader_options = [&](int64_t batch_size) {
    return LoaderOptions(batch_size)
        .workers(data.workers())
        .prefetch(data.prefetch())
        .seed(static_cast<uint64_t>(config.train.seed()))
        .device(experiment.device)
        .pin_memory(data.pin_memory())
        .channels_last(config.train.channels_last());
  };
  const auto stats = normalisation(data, train);
  experiment.train_loader = std::make_unique<DataLoader>(
      train, make_pipeline(data, stats, /*augment=*/true),
      loader_options(data.batch_size()).shuffle(data.shuffle()).drop_last(data.drop_last()));
  experiment.test_loader = std::make_unique<DataLoader>(
      experiment.data.test, make_pipeline(data, stats, /*augment=*/false),
      loader_options(std::min(data.eval_batch_size(), experiment.data.test.size()))
          .shuffle(false)
          .drop_last(false));

  // ---- model ----
  ModelOptions model_options = config.model;
  model_options.in_channels(train.channels())
      .height(train.height())
      .width(train.width())
      .num_classes(experiment.data.train.num_classes);
  experiment.model = make_model(model_options);
  experiment.model->to(experiment.device);
  if (config.train.channels_last()) to_channels_last(*experiment.model);

  if (announce) {
    fmt::print(stderr, "fasttrain: device {}, {} intra-op threads, {} loader workers\n",
               experiment.device.str(), experiment.threads, experiment.train_loader->workers());
    fmt::print(stderr, "fasttrain: {} train / {} test samples of {}x{}x{}, {} batches of {} per epoch\n",
               train.size(), experiment.data.test.size(), train.channels(), train.height(), train.width(),
               experiment.train_loader->batches_per_epoch(), data.batch_size());
    fmt::print(stderr, "fasttrain: model {}", experiment.model->describe());
  }
  return experiment;
}

std::unique_ptr<Trainer> Experiment::make_trainer() const {
  auto optimizer = make_optimizer(model->named_parameters(), config.optim);
  int64_t total_steps = planned_steps(config.train, train_loader->batches_per_epoch());
  double momentum = config.optim.name() == "sgd" ? config.optim.momentum() : config.optim.beta1();
  auto schedule = make_schedule(config.schedule, config.optim.lr(), momentum, total_steps);
  auto trainer =
      std::make_unique<Trainer>(model, std::move(optimizer), std::move(schedule), config.train, device);
  if (config.ema.enabled()) {
    trainer->enable_ema(EmaOptions(config.ema.decay()).warmup(config.ema.warmup()).every(config.ema.every()));
  }
  trainer->set_log_every(config.log.every_steps());
  return trainer;
}

void save_weights(Model& model, const std::string& path) {
  torch::serialize::OutputArchive archive;
  model.save(archive);
  archive.save_to(path);
}

void load_weights(Model& model, const std::string& path) {
  FT_CHECK(fs::is_regular_file(path), "weights file '{}' does not exist", path);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
    model.load(archive);
  } catch (const c10::Error& error) {
    FT_FAIL("weights file '{}' does not match the configured model ({}): {}", path, model.name(),
            error.what_without_backtrace());
  }
}

FitSummary train_run(const Config& config, const std::string& run_dir) {
  Experiment experiment = Experiment::build(config, /*announce=*/true);
  fs::create_directories(run_dir + "/final");
  write_text_file(run_dir + "/config.toml", to_toml(experiment.config));
  fs::remove(run_dir + "/metrics.jsonl");

  auto trainer = experiment.make_trainer();
  trainer->add_callback(std::make_shared<RunLogger>(run_dir, Progress::parse_mode(config.log.progress())));
  FitSummary summary = trainer->fit(*experiment.train_loader, experiment.test_loader.get());

  save_weights(*experiment.model, run_dir + "/final/model.pt");
  write_json_file(run_dir + "/summary.json", summary.to_json());
  return summary;
}

EvalResult eval_run(const Config& config, const std::string& weights_path) {
  Experiment experiment = Experiment::build(config, /*announce=*/false);
  load_weights(*experiment.model, weights_path);
  experiment.model->to(experiment.device);
  TrainOptions options = config.train;
  Trainer trainer(experiment.model, make_optimizer(experiment.model->named_parameters(), config.optim),
                  nullptr, options, experiment.device);
  return trainer.evaluate(*experiment.test_loader);
}

LrFinderResult find_lr(Trainer& trainer, DataLoader& loader, const LrFinderOptions& options) {
  // Snapshot what the sweep changes; the caller gets it back untouched.
  std::stringstream model_state, optimizer_state;
  {
    torch::serialize::OutputArchive model_archive, optimizer_archive;
    trainer.model().save(model_archive);
    model_archive.save_to(model_state);
    trainer.optimizer().save(optimizer_archive);
    optimizer_archive.save_to(optimizer_state);
  }
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
    return trainer.train_step(window, lr).item<double>();
  });
  torch::serialize::InputArchive model_archive, optimizer_archive;
  model_archive.load_from(model_state);
  trainer.model().load(model_archive);
  optimizer_archive.load_from(optimizer_state);
  trainer.optimizer().state().clear();  // load() only adds the saved entries
  trainer.optimizer().load(optimizer_archive);
  return result;
}

LrFinderResult find_lr_run(const Config& config, const LrFinderOptions& options,
                           const std::string& csv_path) {
  Experiment experiment = Experiment::build(config, /*announce=*/true);
  auto trainer = experiment.make_trainer();
  LrFinderResult result = find_lr(*trainer, *experiment.train_loader, options);
  if (!csv_path.empty()) result.write_csv(csv_path);
  return result;
}

}  // namespace fasttrain
