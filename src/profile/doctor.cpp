#include "fasttrain/profile/doctor.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

#include "fasttrain/detail/compat.h"
#include "fasttrain/memory/stats.h"
#include "fasttrain/profile/profiler.h"
#include "fasttrain/run/auto.h"
#include "fasttrain/run/batch_finder.h"
#include "fasttrain/run/run.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"
#include "fasttrain/util/hardware.h"
#include "kernel_switches.h"

namespace fasttrain {

namespace {

// ---------------------------------------------------------------------------------------------
// Thresholds: a finding needs a measured gain past the run-to-run noise of this kind of machine
// (single runs vary by 10-15% in throughput).
// ---------------------------------------------------------------------------------------------
constexpr double kDataBound = 0.10;        // share of step time waiting for data
constexpr double kBatchSpeedup = 1.5;      // samples/s at 4x the batch over the current batch
constexpr double kSwitchSpeedup = 1.15;    // samples/s with a switch flipped (bf16, channels_last)
constexpr double kHostReadsPerStep = 0.5;  // device-to-host reads per optimizer step
constexpr double kPointwiseBound = 0.20;   // share of a CPU step's recorded time in elementwise operators

std::string percent(double fraction) {
  return fmt::format("{:.1f}%", 100 * fraction);
}

// Convolutions with a bias directly followed (a max-pool, or the Identity holding a fused one's place,
// in between commutes) by a BatchNorm.
int64_t conv_biases_before_batchnorm(torch::nn::Module& model) {
  int64_t count = 0;
  for (const auto& module : model.modules(/*include_self=*/true)) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(module.get());
    if (!sequential) continue;
    bool biased_conv = false;
    for (const auto& child : *sequential) {
      const auto* conv = child.ptr()->as<torch::nn::Conv2d>();
      if (conv) {
        biased_conv = conv->options.bias();
      } else if (child.ptr()->as<torch::nn::BatchNorm2d>()) {
        count += biased_conv ? 1 : 0;
        biased_conv = false;
      } else if (!child.ptr()->as<torch::nn::MaxPool2d>() && !child.ptr()->as<torch::nn::Identity>()) {
        biased_conv = false;
      }
    }
  }
  return count;
}

// Matrix and conv sizes that are not multiples of 8, the data's own input and output counts left out
// (they are the data's, not the model's to choose).
std::vector<std::string> odd_layer_sizes(const Model& model, const DataShape& shape) {
  int64_t inputs = 1;
  for (int64_t size : shape.input) inputs *= size;
  const int64_t input_channels = shape.input.empty() ? 0 : shape.input[0];
  int64_t outputs = shape.classes;
  if (outputs == 0) {
    outputs = 1;
    for (int64_t size : shape.target) outputs *= size;
  }
  std::vector<std::string> odd;
  for (const auto& item : model.module().named_parameters()) {
    const torch::Tensor& weight = item.value();
    if (weight.dim() < 2) continue;
    const int64_t out = weight.size(0), in = weight.size(1);
    const bool odd_out = out % 8 != 0 && out != outputs && out != shape.vocabulary;
    const bool odd_in = in % 8 != 0 && in != inputs && in != input_channels && in != shape.vocabulary;
    if (odd_out || odd_in) odd.push_back(fmt::format("{} [{}]", item.key(), fmt::join(weight.sizes(), ", ")));
  }
  return odd;
}

// A speed comparison that cleared `threshold`: the change is worth it, by this much.
std::vector<Finding> if_faster(const std::string& rule, const std::string& title, const Comparison& result,
                               const std::string& what, Severity severity = Severity::kMedium,
                               double threshold = kSwitchSpeedup) {
  if (result.speedup < threshold) return {};
  return {Finding(rule, severity)
              .title(title)
              .evidence(fmt::format("{:.0f} samples/s {} vs {:.0f} as configured ({:.2f}x)", result.changed,
                                    what, result.configured, result.speedup))
              .estimated_gain(fmt::format("{:.2f}x samples/s", result.speedup))
              .gain(1 - 1 / result.speedup)};
}

double data_wait_share(const DoctorContext& c) {
  return c.base.phases.seconds(Phase::kDataWait) / std::max(c.base.phases.total(), 1e-12);
}

// ---- data ----

std::vector<Finding> data_bound(const DoctorContext& c) {
  const double wait = data_wait_share(c);
  if (wait < kDataBound) return {};
  const double steps = static_cast<double>(std::max<int64_t>(c.base.steps, 1));
  return {
      Finding("data_bound", wait >= 0.3 ? Severity::kHigh : Severity::kMedium)
          .title(
              c.workers == 0
                  ? "Build batches in loader workers: set data.workers (now 0: the step builds them itself)"
                  : fmt::format("Add loader workers: data.workers = {} cannot keep up", c.workers))
          .evidence(
              fmt::format("{} of step time is spent waiting for the next batch ({:.2f} of {:.2f} ms per "
                          "step; {} workers, {} compute threads, {} cores)",
                          percent(wait), 1000 * c.base.phases.seconds(Phase::kDataWait) / steps,
                          1000 * c.base.phases.total() / steps, c.workers, c.threads, c.cores))
          .estimated_gain(fmt::format("up to {} of step time", percent(wait)))
          .gain(wait)};
}

std::vector<Finding> too_many_workers(const DoctorContext& c) {
  const double wait = data_wait_share(c);
  if (c.workers <= 1 || c.workers + c.threads <= c.cores || wait >= 0.01) return {};
  return {
      Finding("too_many_workers", Severity::kLow)
          .title(fmt::format("Use fewer loader workers: {} workers share {} cores with {} compute threads",
                             c.workers, c.cores, c.threads))
          .evidence(fmt::format("the step waits for data only {} of the time", percent(wait)))
          .estimated_gain("fewer context switches")};
}

// ---- throughput vs batch ----

std::vector<Finding> small_batch(const DoctorContext& c) {
  const int64_t batch = c.config.data.batch_size();
  if (batch * 4 > c.train_size) return {};
  Config larger = c.config;
  larger.data.batch_size(batch * 4);
  const Comparison result = c.compare("batch_x4", larger, kBatchSpeedup);
  if (result.speedup < kBatchSpeedup) return {};
  return {Finding("small_batch", result.speedup >= 2 ? Severity::kHigh : Severity::kMedium)
              .title(fmt::format(
                  "Raise data.batch_size: {} leaves the hardware idle (scale the LR with it, or run "
                  "fasttrain find-batch)",
                  batch))
              .evidence(fmt::format("{:.0f} samples/s at batch {} vs {:.0f} at batch {} ({:.2f}x)",
                                    result.configured, batch, result.changed, batch * 4, result.speedup))
              .estimated_gain(fmt::format("{:.2f}x samples/s", result.speedup))
              .gain(1 - 1 / result.speedup)};
}

// ---- switches that may pay here, measured flipped ----

std::vector<Finding> emulated_bf16(const DoctorContext& c) {
  if (c.cuda || c.config.train.precision() != "bf16" || c.hardware.native_bf16()) return {};
  // Flagged whatever the measurement says: emulated bf16 is never the right setting.
  Config fp32 = c.config;
  fp32.train.precision("fp32");
  const Comparison result = c.compare("emulated_bf16", fp32, 1.0);
  return {
      Finding("emulated_bf16", Severity::kHigh)
          .title("Train in fp32 (train.precision = \"fp32\" or \"auto\"): this CPU has no native bfloat16 "
                 "(AVX512-BF16 or AMX), so every bf16 op is emulated")
          .evidence(fmt::format("{:.0f} samples/s in fp32 vs {:.0f} in emulated bf16 ({:.2f}x) on {}",
                                result.changed, result.configured, result.speedup, c.hardware.describe()))
          .estimated_gain(fmt::format("{:.2f}x samples/s", result.speedup))
          .gain(1 - 1 / std::max(result.speedup, 1.0))};
}

std::vector<Finding> mixed_precision(const DoctorContext& c) {
  if (c.config.train.precision() != "fp32" || !c.hardware.native_bf16()) return {};
  Config bf16 = c.config;
  bf16.train.precision("bf16");
  return if_faster("mixed_precision",
                   c.cuda ? "Use mixed precision: train.precision = \"bf16\" (or \"fp16\")"
                          : "Use bf16 autocast: train.precision = \"bf16\" (this CPU has native bfloat16)",
                   c.compare("mixed_precision", bf16, kSwitchSpeedup), "with bf16 autocast");
}

std::vector<Finding> bf16_slower(const DoctorContext& c) {
  if (c.cuda || c.config.train.precision() != "bf16" || !c.hardware.native_bf16()) return {};
  // Native bf16 can still lose on a CPU: where the time goes to pointwise work, autocast's casts cost
  // more than the bf16 matmuls save (the GPT with ATen's kernels on an AMX Xeon, issue P4).
  Config fp32 = c.config;
  fp32.train.precision("fp32");
  return if_faster("bf16_slower",
                   "Train in fp32 (train.precision = \"fp32\"): bf16 autocast is slower than fp32 here, "
                   "although this CPU runs bfloat16 natively",
                   c.compare("bf16_slower", fp32, kSwitchSpeedup), "in fp32");
}

// fp32 training where oneDNN can compute the fp32 matmuls and convolutions in bf16 (AMX-BF16, LibTorch
// 2.9+): weights, activations and the optimizer stay fp32, the products' inputs are rounded to bf16. It
// changes the arithmetic, so the finding asks for the accuracy to be checked; the tuner, which times and
// does not train to the target, never proposes it.
std::vector<Finding> implicit_bf16(const DoctorContext& c) {
  if (c.cuda || c.config.train.precision() != "fp32" || c.config.train.fp32_precision() != "ieee" ||
      !c.hardware.cpu_amx_bf16 || !compat::has_cpu_fp32_precision())
    return {};
  Config bf16_math = c.config;
  bf16_math.train.fp32_precision("bf16");
  return if_faster("implicit_bf16",
                   "Let oneDNN compute the fp32 matmuls and convolutions in bf16 on this AMX CPU: "
                   "train.fp32_precision = \"bf16\" (their inputs rounded to bf16; weights, activations and "
                   "the optimizer stay fp32): check the accuracy it costs before keeping it",
                   c.compare("implicit_bf16", bf16_math, kSwitchSpeedup), "with bf16 matmul arithmetic",
                   Severity::kLow);
}

std::vector<Finding> thread_contention(const DoctorContext& c) {
  if (c.cuda || c.threads <= 1 || c.blas.threads <= 0 || c.threads + c.blas.threads <= c.cores) return {};
  // Either pool can give way: one OpenMP thread, or one BLAS thread; the better one is reported.
  Config one_thread = c.config, one_blas_thread = c.config;
  one_thread.train.threads(1);
  one_blas_thread.train.blas_threads(1);
  const Comparison fewer_threads = c.compare("thread_contention", one_thread, kSwitchSpeedup);
  const Comparison fewer_blas = c.compare("thread_contention_blas", one_blas_thread, kSwitchSpeedup);
  const bool blas_better = fewer_blas.speedup > fewer_threads.speedup;
  return if_faster(
      "thread_contention",
      fmt::format("{}: {}'s own pool of {} threads runs the matmuls, and {} OpenMP threads on {} cores "
                  "spin against it",
                  blas_better ? "Shrink the BLAS pool (train.blas_threads = 1)"
                              : "Use one intra-op thread (train.threads = 1)",
                  c.blas.name, c.blas.threads, c.threads, c.cores),
      blas_better ? fewer_blas : fewer_threads,
      blas_better ? "at train.blas_threads = 1" : "at train.threads = 1");
}

std::vector<Finding> channels_last(const DoctorContext& c) {
  if (!c.conv_net || c.config.train.channels_last()) return {};
  Config nhwc = c.config;
  nhwc.train.channels_last(true);
  return if_faster("channels_last", "Use channels_last for this conv net: train.channels_last = true",
                   c.compare("channels_last", nhwc, kSwitchSpeedup), "in channels_last");
}

// Work that fasttrain's own kernels cover (on the CPU the model's `kernels` key: the gpt's attention and
// pointwise chain, the cnn's max-pool; the task's: the cross-entropy; muon's Newton-Schulz; on a GPU the
// gpt's `gpu_kernels`: LayerNorm and the MLP) left to ATen, where turning every such switch to fasttrain
// is faster by the switch threshold.
std::vector<Finding> own_kernels(const DoctorContext& c) {
  Config own = c.config;
  std::vector<std::string> settings;
  for (const detail::KernelSwitch& s : detail::kernel_switches(c.config, c.cuda)) {
    if (s.value == "fasttrain") continue;
    apply_override(own, s.key + "=fasttrain");
    settings.push_back(fmt::format("{} = \"fasttrain\"", s.key));
  }
  if (settings.empty()) return {};
  return if_faster(
      "own_kernels",
      fmt::format("Use fasttrain's {} kernels: {}", c.cuda ? "GPU" : "CPU", fmt::join(settings, ", ")),
      c.compare("own_kernels", own, kSwitchSpeedup), "with fasttrain's kernels");
}

// ATen's elementwise operators, with the norms, softmaxes and casts: a pass or two over memory each and
// little arithmetic, so a step of small matrices can spend more in them than in its matmuls.
bool elementwise(const std::string& op) {
  static const std::set<std::string> names = {"aten::add",
                                              "aten::add_",
                                              "aten::sub",
                                              "aten::sub_",
                                              "aten::mul",
                                              "aten::mul_",
                                              "aten::div",
                                              "aten::div_",
                                              "aten::neg",
                                              "aten::exp",
                                              "aten::pow",
                                              "aten::where",
                                              "aten::clamp",
                                              "aten::clamp_min",
                                              "aten::masked_fill",
                                              "aten::masked_fill_",
                                              "aten::fill_",
                                              "aten::zero_",
                                              "aten::copy_",
                                              "aten::_to_copy",
                                              "aten::gelu",
                                              "aten::gelu_backward",
                                              "aten::tanh",
                                              "aten::tanh_backward",
                                              "aten::sigmoid",
                                              "aten::sigmoid_backward",
                                              "aten::silu",
                                              "aten::silu_backward",
                                              "aten::relu",
                                              "aten::relu_",
                                              "aten::threshold_backward",
                                              "aten::native_dropout",
                                              "aten::native_dropout_backward",
                                              "aten::native_layer_norm",
                                              "aten::native_layer_norm_backward",
                                              "aten::_softmax",
                                              "aten::_softmax_backward_data",
                                              "aten::_log_softmax",
                                              "aten::_log_softmax_backward_data"};
  return names.count(op) > 0;
}

// The recorded profile's elementwise operators (among its top operators) take a large share of a CPU
// step: work that fused kernels do in one pass at memory speed. On CUDA the operators' host times say
// nothing of their kernels, so the rule is the CPU's.
std::vector<Finding> pointwise_bound(const DoctorContext& c) {
  if (c.cuda) return {};
  const double steps = static_cast<double>(std::max<int64_t>(c.base.steps, 1));
  const double step_ms = 1000 * c.base.phases.total() / steps;
  double elementwise_ms = 0;
  std::vector<std::string> largest;
  for (const OperatorStat& op : c.base.operators) {  // by self time
    if (!elementwise(op.name)) continue;
    elementwise_ms += op.self_ms / steps;
    if (largest.size() < 4) largest.push_back(fmt::format("{} {:.2f} ms", op.name, op.self_ms / steps));
  }
  const double share = elementwise_ms / std::max(step_ms, 1e-9);
  if (share < kPointwiseBound) return {};
  const auto kernels = detail::model_kernels(c.config);
  return {
      Finding("pointwise_bound", share >= 0.4 ? Severity::kMedium : Severity::kLow)
          .title(kernels && *kernels == "aten"
                     ? "The step is pointwise-bound: fuse its elementwise work with fasttrain's CPU kernels "
                       "(model.kernels = \"fasttrain\")"
                     : "The step is pointwise-bound: fuse its elementwise work (in a model of your own, "
                       "fasttrain::kernels::bias_gelu, add_layer_norm and packed_causal_attention; "
                       "fasttrain/kernels/cpu.h)")
          .evidence(
              fmt::format("{} of the recorded step is in elementwise operators, {:.2f} of {:.2f} ms per "
                          "step: {}",
                          percent(share), elementwise_ms, step_ms, fmt::join(largest, ", ")))
          .estimated_gain(fmt::format("up to {} of step time (fused, such work runs in one pass at memory "
                                      "speed)",
                                      percent(share)))
          .gain(share)};
}

// ---- debugging aids left on ----

std::vector<Finding> anomaly_detection(const DoctorContext& c) {
  if (!c.config.train.options.detect_anomaly() && !c.anomaly_mode) return {};
  Config off = c.config;
  off.train.options.detect_anomaly(false);
  // Reported whatever it measures: no threshold to confirm.
  const Comparison result = c.compare("anomaly_off", off, std::numeric_limits<double>::infinity());
  return {
      Finding("anomaly_detection", Severity::kHigh)
          .title("Turn autograd anomaly detection off (train.detect_anomaly = false): it is a debugging aid")
          .evidence(fmt::format("{:.0f} samples/s with it vs {:.0f} without ({:.2f}x)", result.configured,
                                result.changed, result.speedup))
          .estimated_gain(fmt::format("{:.2f}x samples/s", result.speedup))
          .gain(std::max(0.0, 1 - 1 / result.speedup))};
}

std::vector<Finding> profiler_on(const DoctorContext& c) {
  if (!c.profiler_was_on) return {};
  return {Finding("profiler_on", Severity::kMedium)
              .title("Stop the profiler or RecordFunction callbacks that were active before the doctor ran")
              .evidence("at::hasCallbacks() was true outside fasttrain's own measurement")
              .estimated_gain("the profiler's per-operator overhead")};
}

// ---- the step loop: host reads, allocator ----

std::vector<Finding> host_sync(const DoctorContext& c) {
  const double reads_per_step = static_cast<double>(c.base.host_reads) / std::max<int64_t>(c.base.steps, 1);
  if (reads_per_step < kHostReadsPerStep) return {};
  return {
      Finding("host_sync", c.cuda ? Severity::kHigh : Severity::kMedium)
          .title(
              "Stop reading tensors on the host every step (.item(), nonzero, printing a loss): keep values "
              "on the device and read them at log steps")
          .evidence(
              fmt::format("{} device-to-host reads in {} steps ({:.1f} per step; aten::_local_scalar_dense "
                          "and aten::nonzero in the profile)",
                          c.base.host_reads, c.base.steps, reads_per_step))
          .estimated_gain(c.cuda ? "each read stalls the GPU queue"
                                 : "small on CPU; on a GPU each read stalls the queue")};
}

std::vector<Finding> allocator_churn(const DoctorContext& c) {
  if (!c.cuda || c.alloc_retries == 0) return {};
  return {
      Finding("allocator_churn", Severity::kMedium)
          .title(
              "The caching allocator had to free its cache to allocate: lower the batch, set memory.warmup, "
              "or memory.expandable_segments")
          .evidence(fmt::format("{} allocation retries in {} steps", c.alloc_retries, c.base.steps))
          .estimated_gain("fewer cudaMalloc/free stalls")};
}

// ---- the model and the config ----

std::vector<Finding> conv_bias_before_batchnorm(const DoctorContext& c) {
  if (c.conv_biases_before_bn == 0) return {};
  return {
      Finding("conv_bias_before_batchnorm", Severity::kLow)
          .title(
              "Drop the conv biases before BatchNorm (bias(false) on those convolutions; the cnn's "
              "model.bias_before_norm = false): BatchNorm subtracts the mean, so the bias does nothing but "
              "cost an add and its gradient")
          .evidence(fmt::format("{} convolution(s) with a bias feed a BatchNorm", c.conv_biases_before_bn))
          .estimated_gain("a bias add and its gradient per conv")};
}

std::vector<Finding> constant_lr(const DoctorContext& c) {
  if (c.config.schedule.name() != "constant") return {};
  return {
      Finding("constant_lr", Severity::kLow)
          .title("Schedule the learning rate: run fasttrain find-lr, then schedule.name = \"one-cycle\" with "
                 "its suggestion")
          .evidence("schedule.name = \"constant\"")
          .estimated_gain("in the default config one-cycle reached 91% where a constant LR did not "
                          "(BENCHMARKS ablation)")};
}

std::vector<Finding> cudnn_benchmark(const DoctorContext& c) {
  if (!c.cuda || !c.conv_net || c.config.train.cudnn_benchmark() || c.config.train.deterministic()) return {};
  return {Finding("cudnn_benchmark", Severity::kMedium)
              .title("Let cuDNN pick the fastest convolution algorithms: train.cudnn_benchmark = true")
              .evidence("the shapes are fixed and cudnn_benchmark is off")
              .estimated_gain("often 10-30% on conv nets")};
}

std::vector<Finding> tensor_core_sizes(const DoctorContext& c) {
  if (!c.cuda) return {};
  std::vector<std::string> odd;
  const int64_t batch = c.config.data.batch_size();
  if (batch % 8 != 0) odd.push_back(fmt::format("data.batch_size {}", batch));
  odd.insert(odd.end(), c.odd_layer_sizes.begin(), c.odd_layer_sizes.end());
  if (odd.empty()) return {};
  return {Finding("tensor_core_sizes", Severity::kLow)
              .title("Use multiples of 8 for sizes that become matrix dimensions (tensor cores)")
              .evidence(fmt::format("not multiples of 8: {}", fmt::join(odd, ", ")))
              .estimated_gain("tensor-core kernels instead of fallbacks")};
}

std::vector<Finding> variable_shapes(const DoctorContext& c) {
  const int64_t batch = c.config.data.batch_size();
  if (!c.cuda || c.config.data.loader.drop_last() || c.train_size % batch == 0 || c.config.memory.warmup())
    return {};
  return {
      Finding("variable_shapes", Severity::kLow)
          .title(
              "Set memory.warmup = true (or data.drop_last = true): the last batch of each epoch has another "
              "shape")
          .evidence(fmt::format("{} samples in batches of {} leave a last batch of {}", c.train_size, batch,
                                c.train_size % batch))
          .estimated_gain("no allocator growth at epoch ends")};
}

// The run as configured, measured: its recorded profile, the facts the rules read, and the timed
// comparisons (written into `report`'s measurements).
DoctorContext measure(RunBuilder& builder, const Config& requested, const std::string& out_dir,
                      const DoctorOptions& options, const std::vector<std::shared_ptr<Callback>>& callbacks,
                      DoctorReport& report) {
  DoctorContext c;
  c.profiler_was_on = at::hasGlobalCallbacks() || at::hasThreadLocalCallbacks();
  c.anomaly_mode = torch::autograd::AnomalyMode::is_enabled();
  const ProfileOptions profile_options = ProfileOptions().measure(
      MeasureOptions().steps(options.measure().steps()).warmup_steps(options.measure().warmup_steps()));
  // "auto" resolved as the run on this machine resolves it: what the run would do here.
  Run run = build_run(
      builder, with_room_to_profile(resolve_batch_size(builder, requested, options.measure().reporter())));
  c.config = run.config;
  c.hardware = run.hardware;
  c.cuda = run.device.is_cuda();
  c.conv_biases_before_bn = conv_biases_before_batchnorm(run.model.module());
  c.conv_net = run.model.has_convolutions();
  c.odd_layer_sizes = odd_layer_sizes(run.model, run.shape);
  c.train_size = run.train_loader->samples_per_epoch();
  c.workers = run.train_loader->workers();
  c.threads = run.threads;
  c.cores = physical_cores();
  c.blas = run.blas;
  // The allocator counts retries over the process: the run's own are those its profile added.
  const int64_t retries_before = memory_stats(run.device).alloc_retries;
  c.base = profile_built_run(run, out_dir + "/doctor/as-configured", profile_options, callbacks);
  c.alloc_retries = memory_stats(run.device).alloc_retries - retries_before;
  report.measurements["as_configured"] = c.base.to_json();

  // Speeds are compared between unrecorded runs (the profiler's per-operator cost is no part of a
  // real run and weighs differently on each). Short runs are noisy here, bimodally so where threads
  // contend, so the run as configured is timed twice before the first comparison, and a change that
  // clears its threshold is timed again with the configured run once more: it counts only if the
  // means still clear it. One lucky run on a busy machine is no finding.
  const ProfileOptions timed_options =
      ProfileOptions(profile_options)
          .record(false)
          .measure(MeasureOptions(profile_options.measure()).min_seconds(options.measure().min_seconds()));
  auto timed = [&builder, &report, out_dir, timed_options](const std::string& name, const Config& config) {
    const ProfileResult result = profile_run(builder, config, out_dir + "/doctor/" + name, timed_options);
    report.measurements[name] = result.to_json();
    return result.samples_per_s;
  };
  auto configured_speeds = std::make_shared<std::vector<double>>();
  const Config configured = c.config;
  c.compare = [timed, configured_speeds, configured](const std::string& name, const Config& changed,
                                                     double threshold) {
    auto mean = [](const std::vector<double>& values) {
      return std::accumulate(values.begin(), values.end(), 0.0) / std::max<size_t>(values.size(), 1);
    };
    std::vector<double>& speeds = *configured_speeds;
    while (speeds.size() < 2)
      speeds.push_back(timed(fmt::format("as_configured_{}", speeds.size()), configured));
    std::vector<double> changed_speeds = {timed(name, changed)};
    if (changed_speeds[0] / std::max(mean(speeds), 1e-9) >= threshold) {
      speeds.push_back(timed(fmt::format("as_configured_{}", speeds.size()), configured));
      changed_speeds.push_back(timed(name + "_again", changed));
    }
    Comparison result{mean(speeds), mean(changed_speeds)};
    result.speedup = result.changed / std::max(result.configured, 1e-9);
    return result;
  };
  return c;
}

}  // namespace

const char* severity_name(Severity severity) {
  switch (severity) {
    case Severity::kHigh:
      return "high";
    case Severity::kMedium:
      return "medium";
    case Severity::kLow:
      return "low";
  }
  return "unknown";
}

Registry<DoctorRule>& doctor_rules() {
  static Registry<DoctorRule> rules = [] {
    Registry<DoctorRule> r("doctor rule");
    r.add("data_bound", "the step waits for batches >= 10% of its time", data_bound);
    r.add("too_many_workers", "loader workers + compute threads > cores while the step never waits",
          too_many_workers);
    r.add("small_batch", "4x the batch gives >= 1.5x samples/s", small_batch);
    r.add("emulated_bf16", "bf16 on a CPU without native bfloat16 (always flagged; fp32 measured beside it)",
          emulated_bf16);
    r.add("mixed_precision", "bf16 autocast gives >= 1.15x where the hardware runs bf16 natively",
          mixed_precision);
    r.add("bf16_slower", "CPU: bf16 autocast on a CPU with native bfloat16, and fp32 gives >= 1.15x",
          bf16_slower);
    r.add("implicit_bf16",
          "CPU: fp32 training on AMX-BF16 with train.fp32_precision = \"ieee\", and \"bf16\" gives >= 1.15x",
          implicit_bf16);
    r.add("thread_contention", "OpenMP + OpenBLAS threads > cores, and one pool at 1 thread gives >= 1.15x",
          thread_contention);
    r.add("channels_last", "a conv net in NCHW, and channels_last gives >= 1.15x", channels_last);
    r.add(
        "own_kernels",
        "model.kernels, task.kernels or optim.muon_newton_schulz = \"aten\" on the CPU, model.gpu_kernels = "
        "\"aten\" on a GPU, and fasttrain's kernels give >= 1.15x",
        own_kernels);
    r.add("pointwise_bound",
          "CPU: elementwise operators (activations, norms, softmax, adds, casts) take >= 20% of the recorded "
          "step",
          pointwise_bound);
    r.add("anomaly_detection", "autograd anomaly detection is on (always flagged, its cost measured)",
          anomaly_detection);
    r.add("profiler_on", "RecordFunction callbacks were active before the doctor ran", profiler_on);
    r.add("host_sync", ">= 0.5 device-to-host reads per step in the profile", host_sync);
    r.add("allocator_churn", "CUDA: the caching allocator retried allocations", allocator_churn);
    r.add("conv_bias_before_batchnorm", "convolutions with a bias feed a BatchNorm",
          conv_bias_before_batchnorm);
    r.add("constant_lr", "schedule.name = \"constant\"", constant_lr);
    r.add("cudnn_benchmark", "CUDA: a conv net with cudnn_benchmark off", cudnn_benchmark);
    r.add("tensor_core_sizes", "CUDA: a batch or layer sizes that are not multiples of 8", tensor_core_sizes);
    r.add("variable_shapes", "CUDA: a short last batch without memory.warmup", variable_shapes);
    return r;
  }();
  return rules;
}

DoctorReport diagnose(RunBuilder& builder, const Config& requested, const std::string& out_dir,
                      const DoctorOptions& options, const std::vector<std::shared_ptr<Callback>>& callbacks) {
  check_measure_options(options.measure(), "doctor");
  DoctorReport report;
  const DoctorContext context = measure(builder, requested, out_dir, options, callbacks, report);
  for (const auto& name : doctor_rules().names()) {
    for (Finding& finding : doctor_rules().at(name)(context)) report.findings.push_back(std::move(finding));
  }
  // The costly first, then by the gain each estimated.
  std::stable_sort(report.findings.begin(), report.findings.end(), [](const Finding& a, const Finding& b) {
    if (a.severity() != b.severity()) return a.severity() < b.severity();
    return a.gain() > b.gain();
  });
  return report;
}

nlohmann::json DoctorReport::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : findings) {
    list.push_back({{"rule", f.rule()},
                    {"title", f.title()},
                    {"evidence", f.evidence()},
                    {"estimated_gain", f.estimated_gain()},
                    {"severity", severity_name(f.severity())}});
  }
  return {{"findings", list}, {"measurements", measurements}};
}

std::string DoctorReport::text() const {
  if (findings.empty())
    return "fasttrain doctor: nothing to fix: no rule found a measured gain for this config\n";
  std::string out = fmt::format("fasttrain doctor: {} finding(s), most valuable first\n", findings.size());
  int index = 1;
  for (const auto& f : findings) {
    out += fmt::format("{}. [{}] {}\n   evidence: {}\n   estimated gain: {}\n", index++,
                       severity_name(f.severity()), f.title(), f.evidence(), f.estimated_gain());
  }
  return out;
}

}  // namespace fasttrain
