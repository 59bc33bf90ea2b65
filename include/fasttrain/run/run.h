#pragma once
// Runs built from a Config: the layer between the CLI (or a program) and the library. A Run is what
// one training run is made of, with every "auto" of the config resolved for this machine (run/auto.h)
// and announced: the device and threads set, the data loaded into loaders (sharded over the ranks of a
// distributed job), the model built and placed, the task chosen; make_trainer() adds the optimizer,
// the schedule, EMA and data parallelism.
//
// A RunBuilder makes the three parts a config cannot say how to make by itself, for a config: the data,
// the model and the task. The base class makes them from the registries by name (data.dataset,
// model.name, task.name): what the CLI runs. A program brings its own model or data by overriding what
// it brings, and every tool of the playbook then works on its run:
//
//   struct MyRun : fasttrain::RunBuilder {
//     fasttrain::Model model(const fasttrain::Config&, const fasttrain::DataShape& shape) override {
//       return fasttrain::Model(MyAutoencoder(shape.input));
//     }
//   };
//   MyRun builder;
//   fasttrain::Run run = fasttrain::build_run(builder, config);      // what train_run trains
//   fasttrain::DoctorReport report = fasttrain::diagnose(builder, config, "runs/mine");
//
// The measuring tools (find-lr, find-batch, profile, doctor, tune) build several runs of one config,
// each with a change (another precision, thread count or batch size): a builder is asked for the model
// and the task once per run, and for the data once per dataset (the keys of data.dataset and the
// model's sequence length): every later run of the same builder reuses the splits it gave.
#include <map>
#include <memory>
#include <string>

#include "fasttrain/config/config.h"
#include "fasttrain/data/datasets.h"
#include "fasttrain/data/device_resident.h"
#include "fasttrain/data/loader.h"
#include "fasttrain/log/reporter.h"
#include "fasttrain/models/model.h"
#include "fasttrain/run/auto.h"
#include "fasttrain/task/task.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/hardware.h"

namespace fasttrain {

class RunBuilder {
 public:
  virtual ~RunBuilder() = default;
  // The splits to train and evaluate on. Default: the registered dataset data.dataset names, loaded with
  // its keys.
  virtual DataSplits data(const Config& config);
  // The model, on the CPU, initialised from the seed the run has set. Default: the registered model
  // model.name names, built with its keys for data of `shape`.
  virtual Model model(const Config& config, const DataShape& shape);
  // The loss and metrics. Default: the registered task task.name names ("auto": the data's own,
  // DataShape::task).
  virtual std::shared_ptr<Task> task(const Config& config, const DataShape& shape);

  // What build_run asks for: data(), or the splits it gave this builder for the same dataset keys and
  // model sequence length (one dataset kept at a time).
  DataSplits reused_data(const Config& config);

 private:
  std::string loaded_key_;
  DataSplits loaded_;
};

// Everything a run is made of, built from a config.
struct Run {
  Config config;  // as it runs: every "auto" resolved
  torch::Device device = torch::kCPU;
  Hardware hardware;
  int threads = 1;
  BlasLibrary blas;                 // its threads as train.blas_threads set them
  std::vector<AutoChoice> choices;  // what each "auto" became, and why
  std::vector<std::string> warnings;
  DataSplits data;
  double data_seconds = 0;  // how long loading it took (about 0 where the builder reused it)
  DataShape shape;          // of the training samples
  std::unique_ptr<DataLoader> train_loader;
  std::unique_ptr<DataLoader> test_loader;  // null when the data has no evaluation split
  // data.device_resident resolved: whether both loaders build their batches on the device, and why.
  ResidencyChoice residency;
  Model model;
  std::shared_ptr<Task> task;
  // The distributed job this process is a rank of (default_process_group), or null: one process.
  std::shared_ptr<ProcessGroup> group;

  // Optimizer, schedule (planned over the run), EMA, the step engine (train.cuda_graphs resolved; on a
  // GPU where "auto" runs eager, `reporter` hears why) and data parallelism over `group`: a Trainer ready
  // to fit().
  std::unique_ptr<Trainer> make_trainer(Reporter* reporter = nullptr);
  // A training batch of the largest shape the run sees, on the run's device (what memory.warmup runs).
  Batch largest_batch() const;
};

// Builds the run `config` describes, with `builder`'s parts. data.batch_size must be resolved (not
// "auto": resolve_batch_size, as train_run does). `reporter` (on rank 0; null: nothing said) hears what
// was built and chosen: the machine, threads, each "auto" and its reason, the data, the model. Bad input
// (a model output that does not fit the task, a switch the model cannot take) is an error here, before
// any training.
Run build_run(RunBuilder& builder, const Config& config, Reporter* reporter = nullptr);

}  // namespace fasttrain
