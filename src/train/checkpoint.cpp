// Trainer's run state: what a step-N checkpoint holds and how it is restored.
//
//   step-N/
//     state.json             format, version, step, progress (epoch, place in the permutation,
//                            accumulation window, counters, clocks), scaler, EMA counters,
//                            config fingerprint, LibTorch version
//     model.safetensors      parameters and buffers, by the model's names
//     optimizer.safetensors  per-parameter moments and steps, group options (state/optimizer_state.h)
//     ema.safetensors        the EMA averages, by the model's names (with EMA)
//     rng.safetensors        the default generators' states (cpu, cuda:i)
//     window.safetensors     inside an accumulation window: the gradients and loss so far
//     config.toml            the effective config (when the caller gave it)
//     manifest.json          sha256 of each of the above, written last (state/checkpoint_dir.h)
#include <ATen/Context.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>

#include "fasttrain/detail/compat.h"
#include "fasttrain/detail/file_io.h"
#include "fasttrain/detail/json.h"
#include "fasttrain/detail/loss_tracker.h"
#include "fasttrain/log/metrics.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/optimizer_state.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/train/trainer.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/rng.h"

namespace fasttrain {

namespace {

constexpr const char* kStateFormat = "fasttrain-run-state";
constexpr int kStateVersion = 1;

// ---- the default random generators (dropout masks, anything drawn from torch's global RNG) ----

NamedTensors generator_states() {
  NamedTensors states;
  for (const auto& device : generator_devices()) {
    states.emplace_back(device.str(), generator_state(device));  // U8 [state bytes]
  }
  return states;
}

void restore_generator_states(const SafetensorsFile& file) {
  for (const auto& device : generator_devices()) {
    FT_CHECK(file.contains(device.str()),
             "rng.safetensors has no state for {} (the checkpoint was written on a machine without it)",
             device.str());
    set_generator_state(device, file.at(device.str()));
  }
}

NamedTensors named(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors) {
  NamedTensors result;
  for (size_t i = 0; i < names.size(); ++i) result.emplace_back(names[i], tensors[i]);
  return result;
}

// The model's parameter names then buffer names: the order of Ema::shadow().
std::vector<std::string> state_names(const torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  for (const auto& item : model.named_buffers()) names.push_back(item.key());
  return names;
}

// A checkpoint's state.json, read after every file matched the manifest, with the checks that need
// only the file: format, version, step, a position inside the loader's epoch.
struct SavedRunState {
  int64_t step = 0;
  std::string fingerprint;
  TrainProgress progress;
  nlohmann::json ema;  // null: written without EMA
  GradScalerState scaler;
  int world_size = 1;  // written before data parallel runs existed: one process
  int zero = 0;
};

SavedRunState read_run_state(const std::string& dir, const CheckpointManifest& manifest,
                             int64_t train_batches) {
  const std::string what = "checkpoint " + dir + "/state.json";
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_text_file(dir + "/state.json", 1 << 20));
  } catch (const nlohmann::json::exception& error) {
    FT_FAIL("{} is not valid JSON: {}", what, error.what());
  }
  FT_CHECK(json_field<std::string>(state, "format", what) == kStateFormat, "{}: format is not {}", what,
           kStateFormat);
  const int version = json_field<int>(state, "version", what);
  FT_CHECK(version == kStateVersion, "{}: format version {} is not the {} this fasttrain reads", what,
           version, kStateVersion);
  SavedRunState saved;
  saved.step = json_field<int64_t>(state, "step", what);
  FT_CHECK(saved.step == manifest.step, "{}: step {} differs from the manifest's {}", what, saved.step,
           manifest.step);
  saved.fingerprint = json_field<std::string>(state, "config_fingerprint", what);
  saved.progress = TrainProgress::from_json(json_field<nlohmann::json>(state, "progress", what));
  FT_CHECK(saved.progress.batch_in_epoch <= train_batches,
           "{}: the checkpoint is at batch {} of an epoch, but the loader has {} batches per epoch", what,
           saved.progress.batch_in_epoch, train_batches);
  saved.ema = json_field<nlohmann::json>(state, "ema", what);
  saved.scaler = GradScalerState::from_json(json_field<nlohmann::json>(state, "scaler", what));
  if (state.contains("world_size")) saved.world_size = json_field<int>(state, "world_size", what);
  if (state.contains("zero")) saved.zero = json_field<int>(state, "zero", what);
  return saved;
}

// Metrics as a JSON array of [name, value] pairs: the task's order is kept.
nlohmann::json metrics_json(const Metrics& metrics) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [name, value] : metrics.items()) list.push_back({name, value});
  return list;
}

Metrics metrics_from_json(const nlohmann::json& json, const std::string& what) {
  FT_CHECK(json.is_array(), "{}: metrics must be a list of [name, value] pairs", what);
  Metrics metrics;
  for (const auto& pair : json) {
    FT_CHECK(pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_number(),
             "{}: a metric must be a [name, value] pair, got {}", what, pair.dump());
    metrics.set(pair[0].get<std::string>(), pair[1].get<double>());
  }
  return metrics;
}

}  // namespace

nlohmann::json TrainProgress::to_json() const {
  return {
      {"epoch", epoch},
      {"batch_in_epoch", batch_in_epoch},
      {"window_done", window_done},
      {"samples_seen", samples_seen},
      {"elapsed_s", elapsed_s},
      {"eval_s", eval_s},
      {"metrics", metrics_json(metrics)},
      {"best_metrics", metrics_json(best)},
      {"time_to_target_s", time_to_target_s ? nlohmann::json(*time_to_target_s) : nlohmann::json(nullptr)},
      {"step_at_target", step_at_target ? nlohmann::json(*step_at_target) : nlohmann::json(nullptr)},
      {"target_stop", target_stop}};
}

TrainProgress TrainProgress::from_json(const nlohmann::json& json) {
  const std::string what = "checkpoint progress";
  TrainProgress p;
  p.epoch = json_field<int64_t>(json, "epoch", what);
  p.batch_in_epoch = json_field<int64_t>(json, "batch_in_epoch", what);
  p.window_done = json_field<int64_t>(json, "window_done", what);
  p.samples_seen = json_field<int64_t>(json, "samples_seen", what);
  p.elapsed_s = json_field<double>(json, "elapsed_s", what);
  p.eval_s = json_field<double>(json, "eval_s", what);
  if (json.contains("metrics")) {
    p.metrics = metrics_from_json(json_field<nlohmann::json>(json, "metrics", what), what);
    p.best = metrics_from_json(json_field<nlohmann::json>(json, "best_metrics", what), what);
  } else {  // written before tasks: the accuracy of a classifier
    p.metrics.set("accuracy", json_field<double>(json, "test_accuracy", what));
    p.best.set("accuracy", json_field<double>(json, "best_test_accuracy", what));
  }
  if (json.contains("step_at_target") && !json.at("step_at_target").is_null())
    p.step_at_target = json_field<int64_t>(json, "step_at_target", what);
  if (!json_field<nlohmann::json>(json, "time_to_target_s", what).is_null()) {
    p.time_to_target_s = json_field<double>(json, "time_to_target_s", what);
  }
  p.target_stop = json_field<bool>(json, "target_stop", what);
  FT_CHECK(p.epoch >= 0 && p.batch_in_epoch >= 0 && p.window_done >= 0 && p.window_done <= p.batch_in_epoch,
           "{}: inconsistent position (epoch {}, batch {}, window {})", what, p.epoch, p.batch_in_epoch,
           p.window_done);
  return p;
}

void Trainer::enable_checkpoints(RunCheckpointOptions options) {
  check_keys(options, "checkpoint");
  checkpoints_ = std::move(options);
}

std::string Trainer::save_checkpoint() {
  FT_CHECK(checkpoints_, "save_checkpoint() needs enable_checkpoints() first");
  const auto start = std::chrono::steady_clock::now();
  // A diverged state is never saved: the losses since the last check, then the weights.
  check_losses_finite();
  // ZeRO-3: every rank takes part in gathering the weights; rank 0 writes them whole.
  std::optional<DataParallel::WholeParameters> whole;
  if (parallel_) whole.emplace(*parallel_, /*write_back=*/false);
  {
    torch::NoGradGuard no_grad;
    torch::Tensor bad = torch::zeros({}, torch::TensorOptions().device(device_).dtype(torch::kLong));
    for (const auto& parameter : parameters_) bad += (~torch::isfinite(parameter)).sum();
    FT_CHECK(
        bad.item<int64_t>() == 0,
        "{} weights are not finite after step {}: no checkpoint of this state was written; lower optim.lr or "
        "set train.clip_norm",
        bad.item<int64_t>(), step_);
  }

  // ---- rank 0 stages the directory; each rank adds the files only it holds ----
  const bool rank0 = rank() == 0;
  std::optional<CheckpointWriter> writer;
  if (rank0) writer.emplace(checkpoints_->root(), step_);
  const std::string staging = parallel_
                                  ? parallel_->group().broadcast_string(rank0 ? writer->staging_dir() : "")
                                  : writer->staging_dir();
  auto file = [&](const std::string& name) { return staging + "/" + name; };
  if (rank0 || sharded_optimizer()) {
    OptimizerStateTensors optimizer = optimizer_state(*optimizer_);
    save_safetensors(file(optimizer_file_name()), optimizer.tensors, optimizer.metadata);
  }
  save_safetensors(file(rng_file_name()), generator_states());
  if (parallel_) parallel_->group().barrier();  // every rank's files are written
  std::string dir = rank0 ? commit_replicated_state(*writer) : "";
  if (parallel_) dir = parallel_->group().broadcast_string(dir);  // the others learn it after the commit
  last_checkpoint_step_ = step_;
  last_checkpoint_ = dir;
  last_checkpoint_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& callback : callbacks_) callback->on_checkpoint(*this, dir);
  return dir;
}

std::string Trainer::commit_replicated_state(CheckpointWriter& writer) {
  save_safetensors(writer.file("model.safetensors"), module_state(model_.module()));
  if (ema_)
    save_safetensors(writer.file("ema.safetensors"), named(state_names(model_.module()), ema_->shadow()));
  if (progress_.window_done > 0) {
    NamedTensors window{{"loss", window_loss_}};
    for (const auto& item : model_.module().named_parameters()) {
      if (item.value().grad().defined()) window.emplace_back("grad." + item.key(), item.value().grad());
    }
    save_safetensors(writer.file("window.safetensors"), window);
  }
  if (!checkpoints_->config_toml().empty())
    write_text_file(writer.file("config.toml"), checkpoints_->config_toml());
  nlohmann::json state = {
      {"format", kStateFormat},
      {"version", kStateVersion},
      {"step", step_},
      {"progress", progress_.to_json()},
      {"scaler", scaler_.state().to_json()},
      {"ema",
       ema_ ? nlohmann::json{{"calls", ema_->calls()}, {"updates", ema_->updates()}} : nlohmann::json()},
      {"config_fingerprint", checkpoints_->fingerprint()},
      {"libtorch", compat::torch_version()},
      {"world_size", world_size()},
      {"zero", parallel_ ? parallel_->zero() : 0},
  };
  write_json_file(writer.file("state.json"), state);
  std::string dir = writer.commit();
  prune_checkpoints(checkpoints_->root(), checkpoints_->keep());
  return dir;
}

bool Trainer::sharded_optimizer() const {
  return parallel_ && parallel_->zero() > 0;
}

// One optimizer state (rank 0's) unless ZeRO shards it; one random state per rank when distributed.
std::string Trainer::optimizer_file_name() const {
  return sharded_optimizer() ? fmt::format("optimizer-rank{}.safetensors", rank()) : "optimizer.safetensors";
}

std::string Trainer::rng_file_name() const {
  return parallel_ ? fmt::format("rng-rank{}.safetensors", rank()) : "rng.safetensors";
}

void Trainer::load_checkpoint(const std::string& dir, int64_t train_batches) {
  check_not_captured_ahead("load_checkpoint");
  FT_CHECK(std::filesystem::is_directory(dir), "checkpoint '{}' does not exist or is not a directory", dir);
  // Nothing is parsed before every file matched the manifest's size and SHA-256.
  CheckpointManifest manifest = verify_checkpoint(dir);
  auto has = [&](const std::string& name) {
    for (const auto& entry : manifest.files) {
      if (entry.file == name) return true;
    }
    return false;
  };
  FT_CHECK(has("state.json"), "checkpoint '{}' has no state.json: it is not a fasttrain run checkpoint", dir);
  const SavedRunState saved = read_run_state(dir, manifest, train_batches);
  const std::string what = "checkpoint " + dir + "/state.json";
  if (checkpoints_ && !checkpoints_->fingerprint().empty()) {
    const std::string& expected = checkpoints_->resumed_fingerprint().empty()
                                      ? checkpoints_->fingerprint()
                                      : checkpoints_->resumed_fingerprint();
    FT_CONFIG_CHECK(
        saved.fingerprint == expected,
        "checkpoint '{}' was written by a run with another training config (fingerprint {} vs {})", dir,
        saved.fingerprint.substr(0, 12), expected.substr(0, 12));
  }
  FT_CHECK(saved.ema.is_null() == (ema_ == nullptr),
           "{}: the checkpoint was written {} EMA, the run has it {}", what,
           saved.ema.is_null() ? "without" : "with", ema_ ? "on" : "off");
  const int zero = parallel_ ? parallel_->zero() : 0;
  FT_CONFIG_CHECK(saved.zero == zero,
                  "checkpoint '{}' was written by {} rank(s) with dist.zero = {}, but this run has {} with "
                  "dist.zero = {}: resume with the same dist.zero (the optimizer state is laid out for it)",
                  dir, saved.world_size, saved.zero, world_size(), zero);
  const bool resharded = saved.world_size != world_size();
  FT_CONFIG_CHECK(
      !resharded || saved.progress.window_done == 0,
      "checkpoint '{}' stops inside an accumulation window ({} micro-batch(es) of it done) and was "
      "written by {} rank(s): resume it on {} rank(s), or resume another checkpoint on {}",
      dir, saved.progress.window_done, saved.world_size, saved.world_size, world_size());

  // ---- tensors: each file parsed and checked before anything is changed ----
  SafetensorsFile optimizer_file = resharded && sharded_optimizer()
                                       ? resharded_optimizer_state(dir, saved.world_size)
                                       : load_safetensors(dir + "/" + optimizer_file_name());
  // Rank r continues saved rank r mod N's random stream (one process wrote rng.safetensors).
  const std::string saved_rng = fmt::format("rng-rank{}.safetensors", rank() % saved.world_size);
  const std::string rng_name = !resharded ? rng_file_name() : has(saved_rng) ? saved_rng : "rng.safetensors";
  SafetensorsFile rng_file = load_safetensors(dir + "/" + rng_name);
  std::optional<SafetensorsFile> window_file;
  if (saved.progress.window_done > 0) {
    FT_CHECK(has("window.safetensors"),
             "checkpoint '{}' stops inside an accumulation window but has no window.safetensors", dir);
    window_file = load_safetensors(dir + "/window.safetensors");
  }
  std::vector<torch::Tensor> ema_shadow;
  if (ema_) {
    SafetensorsFile ema_file = load_safetensors(dir + "/ema.safetensors");
    for (const auto& name : state_names(model_.module())) ema_shadow.push_back(ema_file.at(name));
  }

  {
    std::optional<DataParallel::WholeParameters> whole;  // ZeRO-3: the loaded weights become the shards
    if (parallel_) whole.emplace(*parallel_, /*write_back=*/true);
    load_module_safetensors(model_.module(), dir + "/model.safetensors");
  }
  load_optimizer_state(*optimizer_, optimizer_file);
  if (ema_)
    ema_->load_state(ema_shadow, json_field<int64_t>(saved.ema, "calls", what),
                     json_field<int64_t>(saved.ema, "updates", what));
  scaler_.load_state(saved.scaler);
  restore_generator_states(rng_file);
  restore_window(window_file);
  step_ = saved.step;
  device_step_.fill_(saved.step);
  progress_ = saved.progress;
  progress_.samples_seen = saved.progress.samples_seen * saved.world_size / world_size();  // per rank
  losses_->reset();
  last_checkpoint_step_ = saved.step;
  last_checkpoint_ = dir;
}

// Each of ZeRO's flat shards holds its part of one flat buffer (the parameters in a fixed order, then
// zeros to a multiple of the world size): the saved ranks' parts joined give the buffer, which is cut
// (only padding goes) or padded with zeros to this world's parts, and this rank takes its own. Step
// counts are the same on every rank: rank 0's.
SafetensorsFile Trainer::resharded_optimizer_state(const std::string& dir, int saved_world) const {
  std::vector<SafetensorsFile> saved;
  for (int r = 0; r < saved_world; ++r)
    saved.push_back(load_safetensors(fmt::format("{}/optimizer-rank{}.safetensors", dir, r)));
  const auto shards = optimizer_parameters();
  NamedTensors tensors;
  for (const auto& [name, first] : saved.front().tensors()) {
    if (first.dim() == 0) {
      tensors.emplace_back(name, first);
      continue;
    }
    const std::string shard = name.substr(0, name.rfind('.'));  // "zero.group0.exp_avg": "zero.group0"
    const torch::Tensor* mine = shards.find(shard);
    FT_CHECK(mine != nullptr, "checkpoint '{}': optimizer state '{}' belongs to no shard of this run", dir,
             name);
    std::vector<torch::Tensor> parts;
    for (const auto& file : saved) parts.push_back(file.at(name).reshape({-1}));
    torch::Tensor whole = torch::cat(parts);
    const int64_t part = mine->numel(), total = part * world_size();
    whole = total <= whole.numel()
                ? whole.narrow(0, 0, total)
                : torch::cat({whole, torch::zeros({total - whole.numel()}, whole.options())});
    tensors.emplace_back(name, whole.narrow(0, rank() * part, part).clone());
  }
  return SafetensorsFile(std::move(tensors), saved.front().metadata(),
                         fmt::format("{}/optimizer-rank*.safetensors (of {} ranks)", dir, saved_world));
}

void Trainer::restore_window(const std::optional<SafetensorsFile>& window_file) {
  torch::NoGradGuard no_grad;
  optimizer_->zero_grad();
  window_loss_.zero_();
  if (!window_file) return;
  window_loss_.copy_(window_file->at("loss"));
  for (const auto& item : model_.module().named_parameters()) {
    const std::string key = "grad." + item.key();
    if (!window_file->contains(key)) continue;
    const torch::Tensor& saved = window_file->at(key);
    FT_CHECK(saved.sizes() == item.value().sizes(), "window.safetensors '{}' has shape {}, the parameter {}",
             key, saved.sizes(), item.value().sizes());
    item.value().mutable_grad() =
        saved.to(item.value().options()).contiguous(item.value().suggest_memory_format());
  }
}

}  // namespace fasttrain
