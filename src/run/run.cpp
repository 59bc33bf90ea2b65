#include "fasttrain/run/run.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "fasttrain/detail/compat.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/train/guards.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/huge_pages.h"

namespace fasttrain {

// ---------------------------------------------------------------------------------------------
// The parts from the registries
// ---------------------------------------------------------------------------------------------

namespace {

// The registered model's longest sequence (a sequence model's), which the data cuts; 0 for none.
int64_t model_sequence_length(const Config& config) {
  if (!model_registry().contains(config.model.name())) return 0;
  const ModelRecipe& recipe = model_registry().at(config.model.name());
  return recipe.sequence_length ? recipe.sequence_length(config.model.options()) : 0;
}

std::string options_text(const AnyOptions& options) {
  std::string text;
  for (const KeyInfo& key : options.keys()) text += key.name + "=" + key.write(options.data()) + "\n";
  return text;
}

}  // namespace

DataSplits RunBuilder::data(const Config& config) {
  DataRequest request;
  request.sequence_length = model_sequence_length(config);
  const std::string& name = config.data.dataset.name();
  return config.data.dataset.registry().at(name).load(config.data.dataset.options(), request);
}

DataSplits RunBuilder::reused_data(const Config& config) {
  const std::string key =
      fmt::format("{}\n{}{}", config.data.dataset.name(), options_text(config.data.dataset.options()),
                  model_sequence_length(config));
  if (loaded_.train == nullptr || key != loaded_key_) {
    loaded_ = {};  // the earlier dataset is let go before the next one loads
    DataSplits splits = data(config);
    FT_CHECK(splits.train != nullptr, "the run builder's data gave no training split (data.dataset = '{}')",
             config.data.dataset.name());
    loaded_ = std::move(splits);
    loaded_key_ = key;
  }
  return loaded_;
}

Model RunBuilder::model(const Config& config, const DataShape& shape) {
  return make_model(config.model.name(), shape, &config.model.options());
}

std::shared_ptr<Task> RunBuilder::task(const Config& config, const DataShape& shape) {
  if (!config.task.is_auto()) return make_task(config.task.name(), shape, &config.task.options());
  FT_CONFIG_CHECK(!shape.task.empty(),
                  "task.name = \"auto\" takes the data's task, but the data does not say it "
                  "({}): set task.name",
                  shape.describe());
  return make_task(shape.task, shape);
}

// ---------------------------------------------------------------------------------------------
// build_run
// ---------------------------------------------------------------------------------------------

namespace {

// The data, its shape, the task and the model, in that order (the model's initialisation draws from the
// seed set just before, as it always has).
void build_parts(Run& run, RunBuilder& builder, AutoResolution& resolved) {
  const auto loading = std::chrono::steady_clock::now();
  run.data = builder.reused_data(resolved.config);
  run.data_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - loading).count();
  run.shape = run.data.train->shape();
  run.task = builder.task(resolved.config, run.shape);
  FT_CHECK(run.task, "the run builder gave no task");
  if (resolved.config.task.is_auto()) {
    resolved.choices.push_back(
        {"task.name", run.task->name(), "the data's task (" + run.shape.describe() + ")"});
    if (task_registry().contains(run.task->name())) resolved.config.task.select(run.task->name());
  }
  run.model = builder.model(resolved.config, run.shape);
  FT_CHECK(run.model, "the run builder gave no model");
}

// The model on the run's device, with the switches that change it: memory.checkpoint (its Stages'
// blocks) and train.channels_last (its 4-d weights); each is an error naming it where the model lacks it.
void place_model(Run& run) {
  const Config& config = run.config;
  run.model.set_checkpointing(config.memory.checkpoint_policy());
  run.model.module().to(run.device);
  if (config.train.channels_last()) run.model.to_channels_last();
}

void make_loaders(Run& run, int local_ranks) {
  const Config& config = run.config;
  const DataConfig& data = config.data;
  // Both splits on the device, or neither.
  const auto& train = *run.data.train;
  ResidentData resident{train.resident_bytes(), train.resident_batches_are_gathers()};
  if (run.data.test) {
    const int64_t test_bytes = run.data.test->resident_bytes();
    resident.bytes = resident.bytes > 0 && test_bytes > 0 ? resident.bytes + test_bytes : 0;
    resident.gathers = resident.gathers && run.data.test->resident_batches_are_gathers();
  }
  // The ranks on a host share its memory, each with a copy; a memory.budget is the memory the run has.
  DeviceMemory memory{
      run.hardware.device_memory_bytes() / (run.device.is_cuda() ? 1 : std::max(1, local_ranks)),
      run.device.is_cuda() ? run.device.str() + "'s memory" : "the host's memory"};
  if (config.memory.budget_bytes() > 0 && (memory.bytes <= 0 || config.memory.budget_bytes() < memory.bytes))
    memory = {config.memory.budget_bytes(), "memory.budget"};
  run.residency = choose_residency(data.device_resident(), run.device, resident, memory);
  const LoaderOptions common =
      LoaderOptions(data.loader)
          .workers(data.workers() >= 0 ? data.workers() : auto_worker_count(local_ranks))
          .seed(static_cast<uint64_t>(config.train.seed()))
          .device(run.device)
          .channels_last(config.train.channels_last())
          .rank(run.group ? run.group->rank() : 0)
          .world_size(run.group ? run.group->size() : 1)
          .device_resident(run.residency.resident);
  run.train_loader =
      std::make_unique<DataLoader>(run.data.train, LoaderOptions(common).batch_size(data.batch_size()));
  if (!run.data.test) return;
  // Evaluation sees every sample once, in order, whatever the world size.
  const int64_t eval_batch = std::min(data.eval_batch_size(), run.data.test->size());
  run.test_loader = std::make_unique<DataLoader>(
      run.data.test,
      LoaderOptions(common).batch_size(eval_batch).shuffle(false).drop_last(false).even_shards(false));
}

// torchrun sets OMP_NUM_THREADS=1 for its workers where it starts several on a machine; train.threads =
// "auto" gives each rank its share of the cores instead (the same 1 where the ranks fill the cores, more
// where cores are to spare), and says so.
void note_omp_num_threads(Run& run, const Config& requested) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (omp == nullptr || requested.train.threads() != 0) return;
  for (AutoChoice& choice : run.choices) {
    if (choice.key == "train.threads")
      choice.reason += fmt::format(" (not OMP_NUM_THREADS={}: torchrun sets it to 1 for its workers)", omp);
  }
}

// The model's output on two training samples, through the task's loss and evaluation, before anything
// trains: a model and a task that do not fit each other fail here, with the task's message.
void check_model_fits_task(const Run& run) {
  std::vector<int64_t> samples = {0, std::min<int64_t>(1, run.data.train->size() - 1)};
  BatchRequest request;
  request.samples = samples.data();
  request.count = static_cast<int64_t>(samples.size());
  request.shuffle = false;
  request.channels_last = run.config.train.channels_last();
  const Batch batch =
      run.data.train->build(request).map([&](const torch::Tensor& t) { return t.to(run.device); });
  if (run.config.train.options.eval_flip()) Trainer::check_mirrorable(batch);
  EvalGuard eval(run.model.module());
  torch::NoGradGuard no_grad;
  AutocastGuard autocast(run.device, parse_precision(run.config.train.precision(), run.device));
  std::optional<ModelOutput> output;
  try {
    output.emplace(run.model.forward(batch));
  } catch (const std::exception& error) {
    if (is_out_of_memory(error)) throw;
    FT_FAIL("model '{}' fails on two training samples ({}): {}", run.model.name(), run.shape.describe(),
            message_of(error));
  }
  try {
    run.task->loss(*output, batch);
    run.task->evaluation_sums(*output, batch);
  } catch (const std::exception& error) {
    if (is_out_of_memory(error)) throw;
    FT_FAIL("model '{}' and task '{}' do not fit each other on the data's samples ({}): {}", run.model.name(),
            run.task->name(), run.shape.describe(), message_of(error));
  }
}

// The ranks, their kind of data parallelism and batch; a warning when the ranks on this machine ask for
// more threads of a pool than it has (they take turns).
void announce_ranks(const Run& run, int local_ranks, Reporter& reporter) {
  const Config& config = run.config;
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  auto warn_oversubscribed = [&](int per_rank, const std::string& pool, const std::string& remedy) {
    if (per_rank * local_ranks <= hardware) return;
    reporter.warning(
        fmt::format("{} ranks x {} {} threads on {} hardware threads: they will take turns; set {}",
                    local_ranks, per_rank, pool, hardware, remedy));
  };
  warn_oversubscribed(run.threads, "intra-op", "train.threads = 0 (a share of the cores each) or 1");
  warn_oversubscribed(run.blas.threads, run.blas.name + " (matmul)",
                      fmt::format("train.blas_threads = {}", std::max(1, hardware / local_ranks)));
  const int64_t world_size = run.group->size();
  if (!run.group->backend_reason().empty())
    reporter.note(fmt::format("  auto: dist.backend = gloo: {}", run.group->backend_reason()));
  const std::string kind =
      config.dist.zero() == 0 ? std::string("DDP") : fmt::format("ZeRO-{}", config.dist.zero());
  if (run.train_loader->source_batched()) {
    reporter.note(fmt::format("{} ranks ({}), {}, the source's own batches ({}) dealt to the ranks",
                              world_size, run.group->backend(), kind, run.train_loader->source().describe()));
    return;
  }
  const int64_t per_rank = config.data.batch_size();
  reporter.note(fmt::format("{} ranks ({}), {}, batch {} per rank = {} global", world_size,
                            run.group->backend(), kind, per_rank, per_rank * world_size));
}

// A short start: the machine, what runs where (and what "auto" chose), the data and the model.
void announce_run(const Run& run, int local_ranks, Reporter& reporter) {
  const Config& config = run.config;
  reporter.note(fmt::format("{}; LibTorch {}", run.hardware.describe(), compat::torch_version()));
  const std::string blas = run.blas.name.empty() ? ""
                                                 : fmt::format(" + {} of {}'s own pool for fp32 matmuls",
                                                               run.blas.threads, run.blas.name);
  const int workers = run.train_loader->workers();
  reporter.note(fmt::format("{}, {}, {} intra-op thread{}{}, {} loader worker{}", run.device.str(),
                            config.train.precision(), run.threads, run.threads == 1 ? "" : "s", blas, workers,
                            workers == 1 ? "" : "s"));
  if (run.residency.resident || (run.device.is_cuda() && config.data.device_resident() == "auto"))
    reporter.note(
        fmt::format("  data.device_resident = {}: {}", run.residency.resident, run.residency.reason));
  for (const AutoChoice& choice : run.choices)
    reporter.note(fmt::format("  auto: {} = {}: {}", choice.key, choice.value, choice.reason));
  for (const std::string& warning : run.warnings) reporter.warning(warning);
  if (run.group) announce_ranks(run, local_ranks, reporter);
  const std::string test =
      run.test_loader ? fmt::format("; {} {}", run.data.test_name, run.test_loader->source().describe()) : "";
  reporter.note(fmt::format("data (loaded in {:.2f} s): train {}, {} batches per epoch{}", run.data_seconds,
                            run.train_loader->source().describe(), run.train_loader->batches_per_epoch(),
                            test));
  reporter.note(fmt::format("model {}, {} parameters; task {}", run.model.name(), run.model.parameter_count(),
                            run.task->name()));
}

}  // namespace

Run build_run(RunBuilder& builder, const Config& requested, Reporter* reporter_in) {
  FT_CHECK(requested.data.batch_size() > 0,
           "data.batch_size is \"auto\": resolve it first (resolve_batch_size, as train_run does)");
  // Before CUDA allocates anything (a process group may): the allocator reads its settings once.
  const bool segments_ignored =
      requested.memory.expandable_segments() && !compat::enable_expandable_segments();
  Run run;
  run.group = default_process_group(requested.dist, requested.train.device());
  run.device = parse_device(requested.train.device(), run.group ? run.group->local_rank() : 0);
  use_device(run.device);
  const bool rank0 = !run.group || run.group->rank() == 0;
  Reporter& reporter = reporter_in && rank0 ? *reporter_in : quiet_reporter();
  if (segments_ignored) {
    reporter.warning(fmt::format("memory.expandable_segments needs LibTorch >= 2.1 (this is {}): ignored",
                                 compat::torch_version()));
  }
  // The ranks on this machine share its cores: "auto" threads and workers take a share each.
  const int local_ranks = run.group ? run.group->local_size() : 1;
  run.hardware = detect_hardware(run.device);
  AutoResolution resolved{requested, {}, {}};
  resolve_precision(resolved, run.hardware);
  parse_precision(resolved.config.train.precision(), run.device);  // fp16 on CPU fails here, before any work
  if (run.device.is_cpu()) {
    track_cpu_allocations();  // from the start: peak_memory_bytes counts the dataset and the model too
    if (requested.memory.cpu_heap() == "retain") retain_cpu_heap();
    set_cpu_huge_pages(requested.memory.cpu_huge_pages());
  }
  // The cores (this rank's share) until the model says whether its bulk runs in OpenBLAS's own pool.
  set_intra_op_threads(requested.train.threads(), local_ranks);
  compat::set_backend_switches(requested.train.cudnn_benchmark(), requested.train.tf32(),
                               requested.train.deterministic());
  compat::set_cpu_fp32_precision(resolved.config.train.fp32_precision() == "bf16");
  torch::manual_seed(static_cast<uint64_t>(requested.train.seed()));

  build_parts(run, builder, resolved);
  resolve_threads(resolved, run.hardware, local_ranks, run.model.has_convolutions());
  run.config = resolved.config;
  run.choices = resolved.choices;
  note_omp_num_threads(run, requested);
  run.warnings = resolved.warnings;
  run.threads = set_intra_op_threads(run.config.train.threads(), local_ranks);
  set_blas_threads(run.config.train.blas_threads());
  run.blas = blas_library();
  place_model(run);
  make_loaders(run, local_ranks);
  check_model_fits_task(run);
  announce_run(run, local_ranks, reporter);
  return run;
}

std::unique_ptr<Trainer> Run::make_trainer(Reporter* reporter) {
  auto optimizer = make_optimizer(model.module().named_parameters(), config.optim);
  const double momentum = optimizer_registry().at(config.optim.name()).momentum(config.optim);
  auto schedule = make_schedule(config.schedule, config.optim.lr(), momentum,
                                planned_steps(config.train.options, train_loader->batches_per_epoch()));
  TrainOptions options = config.train.options;
  options.precision(parse_precision(config.train.precision(), device));
  const EngineChoice engine = choose_engine(
      config.train.cuda_graphs(),
      capture_facts(device, group != nullptr, *train_loader, options.accumulation(), schedule.get(),
                    *optimizer, config.ema.enabled() ? &config.ema.options : nullptr,
                    options.detect_anomaly()));
  options.cuda_graphs(engine.capture);
  if (reporter && !engine.reason.empty() && device.is_cuda() && config.train.cuda_graphs() == "auto")
    reporter->note("  auto: train.cuda_graphs = false: " + engine.reason);
  auto trainer = std::make_unique<Trainer>(model, task, std::move(optimizer), std::move(schedule), options);
  if (config.ema.enabled()) trainer->enable_ema(config.ema.options);
  trainer->set_logging(config.log);
  if (group) trainer->enable_data_parallel(group, config.dist);
  return trainer;
}

Batch Run::largest_batch() const {
  Batch batch = data.train->largest_batch(config.data.batch_size());
  const auto layout =
      config.train.channels_last() ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  return batch.map([&](const torch::Tensor& t) {
    torch::Tensor on_device = t.to(device);
    return on_device.dim() == 4 ? on_device.contiguous(layout) : on_device;
  });
}

}  // namespace fasttrain
