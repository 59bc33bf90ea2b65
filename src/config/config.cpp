#include "fasttrain/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "fasttrain/data/dataset.h"
#include "fasttrain/data/text.h"
#include "fasttrain/state/sha256.h"
#include "fasttrain/util/bytes.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

std::string DataConfig::resolved_path() const {
  return path_.empty() ? "/usr/share/datasets/" + dataset_ : path_;
}

int64_t MemoryConfig::budget_bytes() const {
  return budget_.empty() ? 0 : parse_bytes(budget_, "memory.budget");
}

namespace {

// ---------------------------------------------------------------------------------------------
// Values: TOML node -> C++ value, C++ value -> TOML literal. Errors name the key and the value.
// ---------------------------------------------------------------------------------------------

std::string describe(const toml::node& node) {
  std::ostringstream out;
  node.visit([&out](auto&& value) { out << value; });
  out << " (" << node.type() << ")";
  return out.str();
}

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string literal(int64_t value) {
  return std::to_string(value);
}
std::string literal(int value) {
  return std::to_string(value);
}
std::string literal(bool value) {
  return value ? "true" : "false";
}
std::string literal(const std::string& value) {
  return quote(value);
}
std::string literal(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // keep it a TOML float
  return text;
}
std::string literal(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

void parse(const toml::node& node, const std::string& key, int64_t& out) {
  FT_CONFIG_CHECK(node.is_integer(), "{} must be an integer, got {}", key, describe(node));
  out = node.as_integer()->get();
}
void parse(const toml::node& node, const std::string& key, int& out) {
  int64_t value = 0;
  parse(node, key, value);
  FT_CONFIG_CHECK(value >= INT32_MIN && value <= INT32_MAX, "{} is out of range, got {}", key, value);
  out = static_cast<int>(value);
}
void parse(const toml::node& node, const std::string& key, double& out) {
  FT_CONFIG_CHECK(node.is_number(), "{} must be a number, got {}", key, describe(node));
  out = node.is_integer() ? static_cast<double>(node.as_integer()->get()) : node.as_floating_point()->get();
  FT_CONFIG_CHECK(std::isfinite(out), "{} must be finite, got {}", key, out);
}
void parse(const toml::node& node, const std::string& key, bool& out) {
  FT_CONFIG_CHECK(node.is_boolean(), "{} must be true or false, got {}", key, describe(node));
  out = node.as_boolean()->get();
}
void parse(const toml::node& node, const std::string& key, std::string& out) {
  FT_CONFIG_CHECK(node.is_string(), "{} must be a string, got {}", key, describe(node));
  out = node.as_string()->get();
}
void parse(const toml::node& node, const std::string& key, std::vector<int64_t>& out) {
  FT_CONFIG_CHECK(node.is_array(), "{} must be an array of integers, got {}", key, describe(node));
  std::vector<int64_t> values;
  for (const auto& element : *node.as_array()) {
    FT_CONFIG_CHECK(element.is_integer(), "{} must be an array of integers, got {}", key, describe(node));
    values.push_back(element.as_integer()->get());
  }
  out = std::move(values);
}

// ---------------------------------------------------------------------------------------------
// The schema: one Field per key, in the order they are printed and documented.
// ---------------------------------------------------------------------------------------------

struct Field {
  std::string section;
  std::string key;
  std::string help;
  std::function<void(Config&, const toml::node&)> read;
  std::function<std::string(const Config&)> write;

  std::string name() const { return section + "." + key; }
};

template <typename T>
using Check = std::function<void(const std::string& key, const T& value)>;

template <typename T>
Check<T> at_least(T minimum) {
  return [minimum](const std::string& key, const T& value) {
    FT_CONFIG_CHECK(value >= minimum, "{} must be >= {}, got {}", key, minimum, value);
  };
}

template <typename T>
Check<T> above(T minimum) {
  return [minimum](const std::string& key, const T& value) {
    FT_CONFIG_CHECK(value > minimum, "{} must be > {}, got {}", key, minimum, value);
  };
}

Check<double> in_unit_interval() {
  return [](const std::string& key, const double& value) {
    FT_CONFIG_CHECK(value >= 0 && value <= 1, "{} must be in [0, 1], got {}", key, value);
  };
}

Check<double> in_open_unit_interval() {
  return [](const std::string& key, const double& value) {
    FT_CONFIG_CHECK(value > 0 && value < 1, "{} must be in (0, 1), got {}", key, value);
  };
}

std::vector<std::string> dataset_names() {
  std::vector<std::string> names = image_dataset_names();
  names.push_back("text");
  return names;
}

Check<std::string> one_of(std::vector<std::string> choices) {
  return [choices](const std::string& key, const std::string& value) {
    FT_CONFIG_CHECK(std::find(choices.begin(), choices.end(), value) != choices.end(),
                    "{} '{}' is not allowed; valid: {}", key, value, fmt::join(choices, ", "));
  };
}

// `access` returns a reference to the value inside a Config: the FT_ARG getters.
template <typename T, typename Access>
Field field(std::string section, std::string key, Access access, std::string help, Check<T> check = nullptr) {
  Field result{section, key, std::move(help), nullptr, nullptr};
  std::string name = section + "." + key;
  result.read = [access, check, name](Config& config, const toml::node& node) {
    T value{};
    parse(node, name, value);
    if (check) check(name, value);
    access(config) = value;
  };
  result.write = [access](const Config& config) { return literal(access(const_cast<Config&>(config))); };
  return result;
}

// An integer >= `minimum`, or "auto" (stored as `auto_value`): data.workers, data.batch_size.
template <typename T, typename Access>
Field int_or_auto_field(std::string section, std::string key, Access access, T auto_value, T minimum,
                        std::string help) {
  Field result{section, key, std::move(help), nullptr, nullptr};
  const std::string name = section + "." + key;
  result.read = [=](Config& config, const toml::node& node) {
    const std::string expected = fmt::format("{} must be an integer >= {} or \"auto\", got ", name, minimum);
    if (node.is_string()) {
      FT_CONFIG_CHECK(node.as_string()->get() == "auto", "{}{}", expected, describe(node));
      access(config) = auto_value;
      return;
    }
    FT_CONFIG_CHECK(node.is_integer(), "{}{}", expected, describe(node));
    T value{};
    parse(node, name, value);
    FT_CONFIG_CHECK(value >= minimum, "{}{}", expected, value);
    access(config) = value;
  };
  result.write = [=](const Config& config) {
    const T value = access(const_cast<Config&>(config));
    return value == auto_value ? quote("auto") : literal(value);
  };
  return result;
}

// A switch with an "auto" setting: TOML true / false, or "auto"; the option holds "true", "false" or
// "auto" (the string forms are accepted too).
template <typename Access>
Field bool_or_auto_field(std::string section, std::string key, Access access, std::string help) {
  Field result{section, key, std::move(help), nullptr, nullptr};
  const std::string name = section + "." + key;
  result.read = [=](Config& config, const toml::node& node) {
    if (node.is_boolean()) {
      access(config) = node.as_boolean()->get() ? "true" : "false";
      return;
    }
    const bool allowed = node.is_string() && (node.as_string()->get() == "auto" || node.as_string()->get() == "true" ||
                                              node.as_string()->get() == "false");
    FT_CONFIG_CHECK(allowed, "{} must be true, false or \"auto\", got {}", name, describe(node));
    access(config) = node.as_string()->get();
  };
  result.write = [=](const Config& config) {
    const std::string value = access(const_cast<Config&>(config));
    return value == "auto" ? quote("auto") : value;
  };
  return result;
}

const std::vector<Field>& schema() {
  using S = std::string;
  static const std::vector<Field> fields = {
      // [data]
      field<S>(
          "data", "dataset", [](Config& c) -> S& { return c.data.dataset(); },
          "Dataset: fashion-mnist, mnist, idx (any MNIST-format IDX files), or text (byte-level documents "
          "for model gpt)",
          one_of(dataset_names())),
      field<S>(
          "data", "path", [](Config& c) -> S& { return c.data.path(); },
          "Images: directory with train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
          "t10k-labels-idx1-ubyte (each optionally .gz), \"\" = /usr/share/datasets/<dataset>; text: a "
          "directory of documents (recursive) or one file"),
      field<S>(
          "data", "include", [](Config& c) -> S& { return c.data.include(); },
          "text: shell pattern of the file names that are documents, such as \"*.py\""),
      field<double>(
          "data", "val_fraction", [](Config& c) -> double& { return c.data.val_fraction(); },
          "text: fraction of the documents held out for validation (chosen by a hash of their path)",
          in_open_unit_interval()),
      field<S>(
          "data", "batching", [](Config& c) -> S& { return c.data.batching(); },
          "text: windows (batch_size random windows of model.context tokens) or tokens (whole documents "
          "cut at model.context, batched by token count with length bucketing and padding)",
          one_of({"windows", "tokens"})),
      field<int64_t>(
          "data", "max_tokens", [](Config& c) -> int64_t& { return c.data.max_tokens(); },
          "text, batching = tokens: tokens per batch, padding included (>= model.context); 0 = no "
          "bucketing: batch_size documents per batch in random order",
          at_least<int64_t>(0)),
      int_or_auto_field<int64_t>(
          "data", "batch_size", [](Config& c) -> int64_t& { return c.data.batch_size(); }, 0, 1,
          "Samples per micro-batch, or \"auto\": the largest that fits memory.budget (CPU) or the GPU, "
          "found before the run as `fasttrain find-batch` does"),
      field<int64_t>(
          "data", "eval_batch_size", [](Config& c) -> int64_t& { return c.data.eval_batch_size(); },
          "Samples per evaluation batch", at_least<int64_t>(1)),
      int_or_auto_field<int>(
          "data", "workers", [](Config& c) -> int& { return c.data.workers(); }, -1, 0,
          "Loader threads, or \"auto\": enough to keep the step fed without taking its cores"),
      field<int>(
          "data", "prefetch", [](Config& c) -> int& { return c.data.prefetch(); },
          "Batches kept ready ahead of the step (bounded queue)", at_least(1)),
      field<bool>(
          "data", "shuffle", [](Config& c) -> bool& { return c.data.shuffle(); },
          "Shuffle the training set each epoch (order keyed on seed and epoch)"),
      field<bool>(
          "data", "drop_last", [](Config& c) -> bool& { return c.data.drop_last(); },
          "Drop the last incomplete training batch of each epoch"),
      field<bool>(
          "data", "pin_memory", [](Config& c) -> bool& { return c.data.pin_memory(); },
          "On CUDA, build batches in pinned memory and copy them non_blocking"),
      bool_or_auto_field(
          "data", "device_resident", [](Config& c) -> S& { return c.data.device_resident(); },
          "Keep the data set on the training device and gather, augment and normalise each batch there: "
          "\"auto\" (images on a CUDA device, when they take at most a tenth of its memory), true or false"),
      field<bool>(
          "data", "normalize", [](Config& c) -> bool& { return c.data.normalize(); },
          "Normalize with the training set's per-channel mean and std (else scale to [0, 1])"),
      field<int>(
          "data", "crop_padding", [](Config& c) -> int& { return c.data.crop_padding(); },
          "Random crop after zero padding by this many pixels (0 = off)", at_least(0)),
      field<double>(
          "data", "hflip", [](Config& c) -> double& { return c.data.hflip(); },
          "Probability of a horizontal flip (0 = off)", in_unit_interval()),
      field<int64_t>(
          "data", "train_limit", [](Config& c) -> int64_t& { return c.data.train_limit(); },
          "Train on the first N samples only (0 = all)", at_least<int64_t>(0)),
      // [model]
      field<S>(
          "model", "name", [](Config& c) -> S& { return c.model.name(); },
          "Model: mlp, cnn, resnet (images), or gpt (byte-level text: data.dataset = \"text\")",
          one_of(model_names())),
      field<std::vector<int64_t>>(
          "model", "widths", [](Config& c) -> std::vector<int64_t>& { return c.model.widths(); },
          "cnn: channels of each conv+pool stage; resnet: channels of each stage"),
      field<std::vector<int64_t>>(
          "model", "hidden", [](Config& c) -> std::vector<int64_t>& { return c.model.hidden(); },
          "Hidden fully connected layers before the classifier"),
      field<bool>(
          "model", "batchnorm", [](Config& c) -> bool& { return c.model.batchnorm(); },
          "cnn: BatchNorm after each conv (the conv then has no bias)"),
      field<bool>(
          "model", "bias_before_norm", [](Config& c) -> bool& { return c.model.bias_before_norm(); },
          "cnn: keep the conv bias before BatchNorm (as PyTorch's Conv2d(bias=True) has it); wasted work"),
      field<bool>(
          "model", "pool_first", [](Config& c) -> bool& { return c.model.pool_first(); },
          "cnn: max-pool right after each conv, before BatchNorm and ReLU (4x less normalisation work)"),
      field<int64_t>(
          "model", "blocks", [](Config& c) -> int64_t& { return c.model.blocks(); },
          "resnet: residual blocks per stage", at_least<int64_t>(1)),
      field<double>(
          "model", "dropout", [](Config& c) -> double& { return c.model.dropout(); },
          "Dropout before each fully connected layer (gpt: on the embeddings and each residual branch)",
          in_unit_interval()),
      field<int64_t>(
          "model", "layers", [](Config& c) -> int64_t& { return c.model.layers(); },
          "gpt: transformer blocks", at_least<int64_t>(1)),
      field<int64_t>(
          "model", "heads", [](Config& c) -> int64_t& { return c.model.heads(); }, "gpt: attention heads",
          at_least<int64_t>(1)),
      field<int64_t>(
          "model", "embed", [](Config& c) -> int64_t& { return c.model.embed(); },
          "gpt: embedding width (a multiple of heads)", at_least<int64_t>(1)),
      field<int64_t>(
          "model", "context", [](Config& c) -> int64_t& { return c.model.context(); },
          "gpt: longest sequence (positions embedded)", at_least<int64_t>(1)),
      // [optim]
      field<S>(
          "optim", "name", [](Config& c) -> S& { return c.optim.name(); }, "Optimizer: sgd, adam or adamw",
          one_of(optimizer_names())),
      field<double>(
          "optim", "lr", [](Config& c) -> double& { return c.optim.lr(); },
          "Learning rate (the peak of one-cycle and cyclic schedules)", above(0.0)),
      field<double>(
          "optim", "momentum", [](Config& c) -> double& { return c.optim.momentum(); }, "sgd momentum",
          in_unit_interval()),
      field<bool>(
          "optim", "nesterov", [](Config& c) -> bool& { return c.optim.nesterov(); },
          "sgd Nesterov momentum"),
      field<double>(
          "optim", "weight_decay", [](Config& c) -> double& { return c.optim.weight_decay(); },
          "Weight decay (decoupled for adamw); never applied to biases and norm weights", at_least(0.0)),
      field<double>(
          "optim", "beta1", [](Config& c) -> double& { return c.optim.beta1(); }, "adam/adamw beta1",
          in_unit_interval()),
      field<double>(
          "optim", "beta2", [](Config& c) -> double& { return c.optim.beta2(); }, "adam/adamw beta2",
          in_unit_interval()),
      field<double>(
          "optim", "eps", [](Config& c) -> double& { return c.optim.eps(); }, "adam/adamw epsilon",
          above(0.0)),
      field<S>(
          "optim", "kernel", [](Config& c) -> S& { return c.optim.kernel(); },
          "How the optimizer steps on the device: fused (ATen's fused multi-tensor kernel, one launch per "
          "group; CUDA, and CPU from LibTorch 2.4), foreach (multi-tensor ops; every LibTorch) or auto "
          "(fused where the device has it)",
          one_of(optimizer_kernel_names())),
      // [schedule]
      field<S>(
          "schedule", "name", [](Config& c) -> S& { return c.schedule.name(); },
          "Schedule: constant, step, cosine, one-cycle or cyclic", one_of(schedule_names())),
      field<int64_t>(
          "schedule", "step_size", [](Config& c) -> int64_t& { return c.schedule.step_size(); },
          "step: optimizer steps between decays", at_least<int64_t>(1)),
      field<double>(
          "schedule", "gamma", [](Config& c) -> double& { return c.schedule.gamma(); }, "step: decay factor",
          above(0.0)),
      field<int64_t>(
          "schedule", "warmup_steps", [](Config& c) -> int64_t& { return c.schedule.warmup_steps(); },
          "cosine: linear warmup steps", at_least<int64_t>(0)),
      field<double>(
          "schedule", "min_lr", [](Config& c) -> double& { return c.schedule.min_lr(); },
          "cosine: final learning rate", at_least(0.0)),
      field<double>(
          "schedule", "pct_start", [](Config& c) -> double& { return c.schedule.pct_start(); },
          "one-cycle: fraction of the steps spent rising to optim.lr", in_unit_interval()),
      field<double>(
          "schedule", "div_factor", [](Config& c) -> double& { return c.schedule.div_factor(); },
          "one-cycle: initial lr = optim.lr / div_factor", above(0.0)),
      field<double>(
          "schedule", "final_div_factor", [](Config& c) -> double& { return c.schedule.final_div_factor(); },
          "one-cycle: final lr = initial lr / final_div_factor", above(0.0)),
      field<S>(
          "schedule", "anneal", [](Config& c) -> S& { return c.schedule.anneal(); },
          "one-cycle: annealing shape, cos or linear", one_of({"cos", "linear"})),
      field<bool>(
          "schedule", "cycle_momentum", [](Config& c) -> bool& { return c.schedule.cycle_momentum(); },
          "one-cycle and cyclic: cycle momentum (sgd) or beta1 (adam) inversely to the lr"),
      field<double>(
          "schedule", "base_momentum", [](Config& c) -> double& { return c.schedule.base_momentum(); },
          "Lowest momentum of the cycle", in_unit_interval()),
      field<double>(
          "schedule", "max_momentum", [](Config& c) -> double& { return c.schedule.max_momentum(); },
          "Highest momentum of the cycle", in_unit_interval()),
      field<bool>(
          "schedule", "three_phase", [](Config& c) -> bool& { return c.schedule.three_phase(); },
          "one-cycle: fastai-style third phase that annihilates the lr"),
      field<double>(
          "schedule", "base_lr", [](Config& c) -> double& { return c.schedule.base_lr(); },
          "cyclic: lowest lr (the highest is optim.lr)", above(0.0)),
      field<int64_t>(
          "schedule", "step_size_up", [](Config& c) -> int64_t& { return c.schedule.step_size_up(); },
          "cyclic: steps rising", at_least<int64_t>(1)),
      field<int64_t>(
          "schedule", "step_size_down", [](Config& c) -> int64_t& { return c.schedule.step_size_down(); },
          "cyclic: steps falling (0 = step_size_up)", at_least<int64_t>(0)),
      // [train]
      field<int64_t>(
          "train", "epochs", [](Config& c) -> int64_t& { return c.train.epochs(); },
          "Passes over the training set", at_least<int64_t>(1)),
      field<int64_t>(
          "train", "max_steps", [](Config& c) -> int64_t& { return c.train.max_steps(); },
          "Stop after this many optimizer steps (0 = epochs decide)", at_least<int64_t>(0)),
      field<int64_t>(
          "train", "accumulation", [](Config& c) -> int64_t& { return c.train.accumulation(); },
          "Micro-batches per optimizer step", at_least<int64_t>(1)),
      field<double>(
          "train", "clip_norm", [](Config& c) -> double& { return c.train.clip_norm(); },
          "Clip gradients to this global L2 norm (0 = off)", at_least(0.0)),
      field<double>(
          "train", "label_smoothing", [](Config& c) -> double& { return c.train.label_smoothing(); },
          "Cross-entropy label smoothing", in_unit_interval()),
      field<int64_t>(
          "train", "seed", [](Config& c) -> int64_t& { return c.train.seed(); },
          "Seed of initialisation, shuffling and augmentation", at_least<int64_t>(0)),
      int_or_auto_field<int>(
          "train", "threads", [](Config& c) -> int& { return c.train.threads(); }, 0, 0,
          "Intra-op (OpenMP) threads, or \"auto\" (also 0): the physical cores (this rank's share), "
          "except an fp32 matmul model (mlp, gpt) on OpenBLAS, which gets 1 and leaves the cores to "
          "OpenBLAS's pool; the run says what it chose"),
      int_or_auto_field<int>(
          "train", "blas_threads", [](Config& c) -> int& { return c.train.blas_threads(); }, -1, 0,
          "Threads of OpenBLAS's own pool, which runs the fp32 matmuls when LibTorch's BLAS is OpenBLAS "
          "(0 = the library's count: OPENBLAS_NUM_THREADS or every core), or \"auto\": 1 for a conv "
          "net in fp32 (its convs run on the OpenMP threads), the cores for an fp32 matmul model"),
      field<S>(
          "train", "precision", [](Config& c) -> S& { return c.train.precision(); },
          "fp32, bf16 (autocast to bfloat16), fp16 (autocast to float16 with a GradScaler; CUDA only) or "
          "auto: bf16 where the hardware runs it natively (CPU with AVX512-BF16 or AMX, CUDA compute "
          "capability >= 8.0), fp32 elsewhere",
          one_of({"auto", "fp32", "bf16", "fp16"})),
      field<bool>(
          "train", "channels_last", [](Config& c) -> bool& { return c.train.channels_last(); },
          "Conv kernels and input batches in channels_last (NHWC) layout: faster conv kernels"),
      field<bool>(
          "train", "cudnn_benchmark", [](Config& c) -> bool& { return c.train.cudnn_benchmark(); },
          "CUDA: let cuDNN benchmark the conv algorithms per shape and keep the fastest"),
      field<bool>(
          "train", "tf32", [](Config& c) -> bool& { return c.train.tf32(); },
          "CUDA: TF32 tensor cores for fp32 matmuls and convolutions (Ampere and later)"),
      field<bool>(
          "train", "deterministic", [](Config& c) -> bool& { return c.train.deterministic(); },
          "Deterministic algorithms only (an error for ops without one); disables cudnn_benchmark"),
      field<bool>(
          "train", "detect_anomaly", [](Config& c) -> bool& { return c.train.detect_anomaly(); },
          "Autograd anomaly detection: NaN checks and forward stack traces in backward (debugging; slow)"),
      field<S>(
          "train", "device", [](Config& c) -> S& { return c.train.device(); }, "auto, cpu, cuda or cuda:N"),
      bool_or_auto_field(
          "train", "cuda_graphs", [](Config& c) -> S& { return c.train.cuda_graphs(); },
          "Capture the whole optimizer step in a CUDA graph and replay it: \"auto\" (where it applies; "
          "otherwise eager, and the run says why), true (an error where it cannot) or false"),
      field<int64_t>(
          "train", "eval_every_steps", [](Config& c) -> int64_t& { return c.train.eval_every_steps(); },
          "Evaluate every N optimizer steps (0 = at the end of each epoch only)", at_least<int64_t>(0)),
      field<int64_t>(
          "train", "eval_from_step", [](Config& c) -> int64_t& { return c.train.eval_from_step(); },
          "No evaluation before this optimizer step, but at the end of the run", at_least<int64_t>(0)),
      field<double>(
          "train", "target_accuracy", [](Config& c) -> double& { return c.train.target_accuracy(); },
          "Test accuracy whose first crossing is time_to_target_s (0 = none)", in_unit_interval()),
      field<bool>(
          "train", "stop_at_target", [](Config& c) -> bool& { return c.train.stop_at_target(); },
          "End the run when target_accuracy is reached"),
      field<S>(
          "train", "init_from", [](Config& c) -> S& { return c.train.init_from(); },
          "Initial weights from a safetensors file with the model's names (\"\" = random init from seed)"),
      // [ema]
      field<bool>(
          "ema", "enabled", [](Config& c) -> bool& { return c.ema.enabled(); },
          "Keep an exponential moving average of the weights and evaluate with it"),
      field<double>(
          "ema", "decay", [](Config& c) -> double& { return c.ema.decay(); }, "EMA decay per update",
          in_unit_interval()),
      field<bool>(
          "ema", "warmup", [](Config& c) -> bool& { return c.ema.warmup(); },
          "Use decay min(decay, (1 + t) / (10 + t)) so early averages are not stuck at init"),
      field<int64_t>(
          "ema", "every", [](Config& c) -> int64_t& { return c.ema.every(); },
          "Update the average every N optimizer steps", at_least<int64_t>(1)),
      // [memory]
      field<S>(
          "memory", "checkpoint", [](Config& c) -> S& { return c.memory.checkpoint(); },
          "Activation checkpointing: none, blocks (every conv/linear block recomputed in backward) or "
          "every_k (every checkpoint_every-th block)",
          one_of({"none", "blocks", "every_k"})),
      field<int64_t>(
          "memory", "checkpoint_every", [](Config& c) -> int64_t& { return c.memory.checkpoint_every(); },
          "every_k: checkpoint blocks 0, k, 2k, ... of each stage", at_least<int64_t>(1)),
      field<S>(
          "memory", "budget", [](Config& c) -> S& { return c.memory.budget(); },
          "Most tensor bytes the run may hold at once, e.g. \"2GiB\" (\"\" = none); what "
          "data.batch_size = \"auto\" fits on CPU",
          Check<S>([](const std::string& key, const std::string& value) {
            if (!value.empty()) parse_bytes(value, key);
          })),
      field<bool>(
          "memory", "warmup", [](Config& c) -> bool& { return c.memory.warmup(); },
          "One forward and backward at the largest batch before training (nothing kept): the allocator "
          "reserves its peak once"),
      field<bool>(
          "memory", "expandable_segments", [](Config& c) -> bool& { return c.memory.expandable_segments(); },
          "CUDA: the caching allocator grows segments in place instead of caching many sizes (LibTorch "
          ">= 2.1)"),
      // [dist]
      field<S>(
          "dist", "backend", [](Config& c) -> S& { return c.dist.backend(); },
          "Collectives of a distributed run (torchrun, srun or fasttrain launch): auto (gloo on CPU), gloo "
          "or "
          "nccl",
          one_of({"auto", "gloo", "nccl"})),
      field<double>(
          "dist", "timeout_s", [](Config& c) -> double& { return c.dist.timeout_s(); },
          "Longest wait of the rendezvous or any collective: a rank that died or hangs fails the others "
          "after it",
          above(0.0)),
      field<double>(
          "dist", "bucket_cap_mb", [](Config& c) -> double& { return c.dist.bucket_cap_mb(); },
          "DDP gradient buckets, MiB: each is all-reduced as soon as backward has filled it", above(0.0)),
      field<int>(
          "dist", "zero", [](Config& c) -> int& { return c.dist.zero(); },
          "0 = DDP; 1 = ZeRO-1 (optimizer state sharded across ranks); 2 = ZeRO-2 (and gradients, "
          "reduce-scattered); 3 = fully sharded (and each block's parameters, gathered for its forward "
          "and backward)",
          Check<int>([](const std::string& key, const int& value) {
            FT_CONFIG_CHECK(value >= 0 && value <= 3, "{} must be 0, 1, 2 or 3, got {}", key, value);
          })),
      field<bool>(
          "dist", "broadcast_buffers", [](Config& c) -> bool& { return c.dist.broadcast_buffers(); },
          "Before each forward, rank 0's buffers (BatchNorm statistics) replace the other ranks' (as DDP)"),
      // [log]
      field<S>(
          "log", "progress", [](Config& c) -> S& { return c.log.progress(); },
          "auto (a bar on a terminal, lines otherwise), bar, lines or none",
          one_of({"auto", "bar", "lines", "none"})),
      field<int64_t>(
          "log", "every_steps", [](Config& c) -> int64_t& { return c.log.every_steps(); },
          "Optimizer steps between metrics records and progress lines", at_least<int64_t>(1)),
      // [checkpoint]
      field<int64_t>(
          "checkpoint", "every_steps", [](Config& c) -> int64_t& { return c.checkpoint.every_steps(); },
          "Save the run state every N optimizer steps (0 = only at the end and on SIGINT/SIGTERM)",
          at_least<int64_t>(0)),
      field<int>(
          "checkpoint", "keep", [](Config& c) -> int& { return c.checkpoint.keep(); },
          "Newest checkpoints kept (>= 2: if the newest is damaged, the one before it resumes)", at_least(2)),
      // [run]
      field<S>(
          "run", "name", [](Config& c) -> S& { return c.run.name(); },
          "Run name: the directory <root>/<name>"),
      field<S>(
          "run", "root", [](Config& c) -> S& { return c.run.root(); }, "Directory that holds runs"),
  };
  return fields;
}

std::vector<std::string> sections() {
  std::vector<std::string> result;
  for (const auto& f : schema()) {
    if (result.empty() || result.back() != f.section) result.push_back(f.section);
  }
  return result;
}

const Field& find_field(const std::string& section, const std::string& key) {
  auto all_sections = sections();
  FT_CONFIG_CHECK(std::find(all_sections.begin(), all_sections.end(), section) != all_sections.end(),
                  "unknown config section [{}]; valid: {}", section, fmt::join(all_sections, ", "));
  std::vector<std::string> keys;
  for (const auto& f : schema()) {
    if (f.section != section) continue;
    if (f.key == key) return f;
    keys.push_back(f.key);
  }
  throw ConfigError(fmt::format("unknown config key {}.{}; valid keys of [{}]: {}", section, key, section,
                                fmt::join(keys, ", ")));
}

void apply_table(Config& config, const toml::table& table, const std::string& source) {
  for (const auto& [section_key, section_node] : table) {
    std::string section(section_key.str());
    FT_CONFIG_CHECK(section_node.is_table(), "{}: '{}' must be a [section] table; valid sections: {}", source,
                    section, fmt::join(sections(), ", "));
    for (const auto& [key, node] : *section_node.as_table()) {
      try {
        find_field(section, std::string(key.str())).read(config, node);
      } catch (const ConfigError& error) {
        throw ConfigError(fmt::format("{}: {}", source, error.what()));
      }
    }
  }
}

}  // namespace

void apply_toml(Config& config, const std::string& text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& error) {
    throw ConfigError(fmt::format("{}:{}:{}: TOML syntax error: {}", source, error.source().begin.line,
                                  error.source().begin.column, error.description()));
  }
  apply_table(config, table, source);
}

Config load_config(const std::string& path) {
  FT_CONFIG_CHECK(std::filesystem::is_regular_file(path), "config file '{}' does not exist or is not a file",
                  path);
  std::ifstream in(path);
  FT_CONFIG_CHECK(in.good(), "config file '{}' cannot be read", path);
  std::stringstream text;
  text << in.rdbuf();
  Config config;
  apply_toml(config, text.str(), path);
  return config;
}

void apply_override(Config& config, const std::string& assignment) {
  auto equals = assignment.find('=');
  auto dot = assignment.find('.');
  FT_CONFIG_CHECK(equals != std::string::npos && dot != std::string::npos && dot < equals,
                  "--set expects section.key=value, got '{}'", assignment);
  std::string section = assignment.substr(0, dot);
  std::string key = assignment.substr(dot + 1, equals - dot - 1);
  std::string value = assignment.substr(equals + 1);
  const Field& target = find_field(section, key);
  toml::table parsed;
  try {
    parsed = toml::parse("value = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"value", value}};  // a bare word: model.name=resnet
  }
  target.read(config, *parsed.get("value"));
}

void validate(const Config& config) {
  validate(config.optim);
  // Building the schedule checks its options against a nominal length.
  make_schedule(config.schedule, config.optim.lr(), config.optim.momentum(), 1000);
  FT_CONFIG_CHECK(config.schedule.max_momentum() >= config.schedule.base_momentum(),
                  "schedule.max_momentum ({}) must be >= schedule.base_momentum ({})",
                  config.schedule.max_momentum(), config.schedule.base_momentum());
  const std::string& device = config.train.device();
  FT_CONFIG_CHECK(device == "auto" || device == "cpu" || device.rfind("cuda", 0) == 0,
                  "train.device must be auto, cpu, cuda or cuda:N, got '{}'", device);
  if (config.data.dataset() == "idx") {
    FT_CONFIG_CHECK(!config.data.path().empty(),
                    "data.path must name the IDX directory when data.dataset = \"idx\"");
  }
  FT_CONFIG_CHECK(
      config.train.init_from().empty() || std::filesystem::is_regular_file(config.train.init_from()),
      "train.init_from '{}' is not a file (a safetensors file of the model's weights)",
      config.train.init_from());
  // A text model on text data, an image model on images.
  const bool text = config.data.dataset() == "text";
  FT_CONFIG_CHECK(text == (config.model.name() == "gpt"),
                  "model.name = \"{}\" cannot train on data.dataset = \"{}\": gpt takes byte sequences "
                  "(data.dataset = \"text\"), the other models images",
                  config.model.name(), config.data.dataset());
  if (text) {
    FT_CONFIG_CHECK(
        !config.data.path().empty(),
        "data.path must name a directory of documents (or one file) when data.dataset = \"text\"");
    FT_CONFIG_CHECK(std::filesystem::exists(config.data.path()), "data.path '{}' does not exist",
                    config.data.path());
    FT_CONFIG_CHECK(config.data.batch_size() > 0,
                    "data.batch_size = \"auto\" searches image batches only: set the sequences per batch "
                    "(data.batching = \"windows\") or data.max_tokens (\"tokens\") for text");
    FT_CONFIG_CHECK(config.data.train_limit() == 0,
                    "data.train_limit = {} applies to images; for text narrow data.include or data.path",
                    config.data.train_limit());
    if (config.data.batching() == "tokens")
      check_token_budget(config.data.max_tokens(), config.model.context());
    return;
  }
  std::string path = config.data.resolved_path();
  FT_CONFIG_CHECK(std::filesystem::is_directory(path), "data.path '{}' is not a directory{}", path,
                  config.data.path().empty()
                      ? " (install Debian's dataset-" + config.data.dataset() + " package or set data.path)"
                      : "");
}

std::string to_toml(const Config& config) {
  std::string out;
  std::string section;
  for (const auto& f : schema()) {
    if (f.section != section) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", f.section);
      section = f.section;
    }
    out += fmt::format("{} = {}\n", f.key, f.write(config));
  }
  return out;
}

namespace {

// train.epochs and train.max_steps say how long the run is, not what each step computes.
bool is_run_length(const Field& field) {
  return field.section == "train" && (field.key == "epochs" || field.key == "max_steps");
}

// Keys that change how fast or how visibly a run trains, never what it computes beyond rounding: a
// resume may change them (more workers on a bigger machine, another log cadence, the fused or
// foreach optimizer kernels, eager or captured steps). [memory] too: checkpointed
// blocks recompute the same values, and the warm-up puts back everything it touches. [dist] too: a
// checkpoint records its world size and dist.zero, and load_checkpoint checks them itself.
bool shapes_training(const Field& field) {
  static const std::vector<std::string> neutral = {
      "data.eval_batch_size", "data.workers",          "data.prefetch",        "data.pin_memory",
      "data.device_resident",
      "train.threads",        "train.blas_threads",    "train.device",         "train.eval_every_steps",
      "train.eval_from_step", "train.target_accuracy", "train.stop_at_target", "train.init_from",
      "train.detect_anomaly", "train.cuda_graphs",    "optim.kernel"};
  if (is_run_length(field)) return false;  // a resume may extend the run: run_length_change
  if (field.section == "log" || field.section == "run" || field.section == "checkpoint" ||
      field.section == "memory" || field.section == "dist")
    return false;
  return std::find(neutral.begin(), neutral.end(), field.section + "." + field.key) == neutral.end();
}

}  // namespace

std::string training_fingerprint(const Config& config) {
  std::string text;
  for (const auto& f : schema()) {
    if (shapes_training(f)) text += fmt::format("{}.{} = {}\n", f.section, f.key, f.write(config));
  }
  return sha256_hex(text);
}

std::vector<std::string> training_differences(const Config& a, const Config& b) {
  std::vector<std::string> keys;
  for (const auto& f : schema()) {
    if (shapes_training(f) && f.write(a) != f.write(b)) {
      keys.push_back(fmt::format("{}.{} ({} vs {})", f.section, f.key, f.write(a), f.write(b)));
    }
  }
  return keys;
}

RunLengthChange run_length_change(const Config& saved, const Config& now) {
  RunLengthChange change;
  // `before` and `after` as written; compared as `from` and `to` (max_steps = 0 is no step limit).
  auto note = [&](const std::string& key, int64_t before, int64_t after, int64_t from, int64_t to) {
    if (from == to) return;
    (to > from ? change.longer : change.shorter).push_back(fmt::format("train.{} {} -> {}", key, before, after));
  };
  auto step_limit = [](const Config& c) {
    return c.train.max_steps() > 0 ? c.train.max_steps() : std::numeric_limits<int64_t>::max();
  };
  note("epochs", saved.train.epochs(), now.train.epochs(), saved.train.epochs(), now.train.epochs());
  note("max_steps", saved.train.max_steps(), now.train.max_steps(), step_limit(saved), step_limit(now));
  return change;
}

std::string config_reference() {
  Config defaults;
  std::string out =
      "# Configuration reference\n\n"
      "Every key of a fasttrain TOML config, its default and its meaning. Override any key on the command\n"
      "line with `--set section.key=value`. This file is generated by `fasttrain config --reference`;\n"
      "a test keeps it in step with the code.\n";
  std::string section;
  for (const auto& f : schema()) {
    if (f.section != section) {
      out += fmt::format("\n## [{}]\n\n| key | default | meaning |\n| --- | --- | --- |\n", f.section);
      section = f.section;
    }
    out += fmt::format("| `{}` | `{}` | {} |\n", f.key, f.write(defaults), f.help);
  }
  return out;
}

}  // namespace fasttrain
