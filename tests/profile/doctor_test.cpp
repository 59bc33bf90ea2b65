#include "fasttrain/profile/doctor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#ifdef FASTTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "fasttrain/memory/stats.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/hardware.h"
#include "support.h"

namespace fasttrain {
namespace {

std::set<std::string> rules(const DoctorReport& report) {
  std::set<std::string> names;
  for (const auto& finding : report.findings) names.insert(finding.rule());
  return names;
}

// A small conv net on part of Fashion-MNIST, one thread, a one-cycle schedule, the precision this
// CPU runs best ("auto": bf16 where native, fp32 elsewhere): nothing planted, on any CPU. On the CPU
// on a GPU machine too: the rules under test are the CPU's (a GPU wants larger batches, rightly).
Config clean_config() {
  Config config;
  config.train.device("cpu");
  config.data.batch_size(128);
  config.data.dataset.as<ImageDataOptions>().train_limit(8192);
  config.model.select("cnn").as<CnnOptions>().widths({8, 16}).hidden({32}).batchnorm(true);
  config.schedule.name("one-cycle");
  config.train.threads(1).precision("auto").channels_last(true);
  return config;
}

DoctorOptions quick(int64_t steps, int64_t warmup, double min_seconds = 2.0) {
  return DoctorOptions().measure(MeasureOptions().steps(steps).warmup_steps(warmup).min_seconds(min_seconds));
}

// Reads a weight on the host after every micro-batch: a synchronisation a careless callback (or a
// print of the loss) puts in the hot loop.
class SyncEveryStep : public Callback {
 public:
  void on_micro_batch(Trainer& trainer) override {
    total += trainer.model().module().parameters()[0].sum().item<double>();
  }
  double total = 0;
};

TEST(Doctor, NamesEachPlantedProblem) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  const auto options = quick(10, 3);
  RunBuilder builder;

  // No loader workers with heavy augmentation, on a model small enough for the data to matter.
  Config starved = clean_config();
  starved.model.select("mlp").as<MlpOptions>().hidden({16});
  starved.train.channels_last(false);
  starved.data.workers(0).batch_size(512);
  starved.data.dataset.as<ImageDataOptions>().crop_padding(4).hflip(0.5);
  // The matmuls on this thread: OpenBLAS's own pool on every core crawls when anything else runs
  // on the machine (a build beside the tests), which made the compute outweigh the data. (Other
  // BLAS libraries, MKL in PyTorch 2.x's wheel, run on the OpenMP threads and have no pool to size.)
  if (detect_hardware(torch::kCPU).openblas_pool) starved.train.blas_threads(1);
  DoctorReport data = diagnose(builder, starved, dir.path(), options);
  EXPECT_TRUE(rules(data).count("data_bound")) << data.text();

  // Conv bias before BatchNorm, anomaly detection left on, a tiny batch, a constant LR.
  Config careless = clean_config();
  careless.model.as<CnnOptions>().bias_before_norm(true);
  careless.train.options.detect_anomaly(true);
  careless.data.batch_size(8);
  careless.schedule.name("constant");
  DoctorReport debug = diagnose(builder, careless, dir.path(), options);
  for (const char* rule : {"conv_bias_before_batchnorm", "anomaly_detection", "small_batch", "constant_lr"}) {
    EXPECT_TRUE(rules(debug).count(rule)) << rule << "\n" << debug.text();
  }
  EXPECT_EQ(debug.findings.front().severity(), Severity::kHigh) << "ranked: the costly findings first\n"
                                                                << debug.text();

  // A host read per step from a callback, on an otherwise clean run.
  DoctorReport synced =
      diagnose(builder, clean_config(), dir.path(), options, {std::make_shared<SyncEveryStep>()});
  EXPECT_TRUE(rules(synced).count("host_sync")) << synced.text();

  // What the report draws: doctor.json's shape.
  const nlohmann::json json = debug.to_json();
  for (const auto& finding : json.at("findings")) {
    for (const char* key : {"rule", "title", "evidence", "estimated_gain", "severity"})
      EXPECT_TRUE(finding.contains(key)) << key;
  }
  EXPECT_TRUE(json.at("measurements").contains("as_configured"));
}

TEST(Doctor, FlagsBf16ThatThisCpuWouldEmulate) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  // Whatever this CPU has, the doctor is told it has no native bf16: the finding must appear.
  testing::ScopedEnv no_native_bf16("FASTTRAIN_NATIVE_BF16", "0");
  Config emulated = clean_config();
  emulated.train.precision("bf16");
  RunBuilder builder;
  DoctorReport report = diagnose(builder, emulated, dir.path(), quick(6, 2, 0.3));
  ASSERT_TRUE(rules(report).count("emulated_bf16")) << report.text();
  for (const auto& finding : report.findings) {
    if (finding.rule() != "emulated_bf16") continue;
    EXPECT_EQ(finding.severity(), Severity::kHigh);
    EXPECT_TRUE(testing::contains_all(finding.title(), {"fp32", "emulated"})) << finding.title();
    EXPECT_NE(finding.evidence().find("samples/s in fp32"), std::string::npos) << finding.evidence();
  }
  // And an fp32 run there is never told to switch to bf16.
  Config fp32 = clean_config();
  fp32.train.precision("fp32");
  DoctorReport quiet = diagnose(builder, fp32, dir.path(), quick(6, 2, 0.3));
  EXPECT_FALSE(rules(quiet).count("mixed_precision")) << quiet.text();
}

TEST(Doctor, StaysQuietOnATunedConfig) {
  FT_REQUIRE_FASHION_MNIST();
  testing::TempDir dir;
  RunBuilder builder;
  DoctorReport report = diagnose(builder, clean_config(), dir.path(), quick(10, 3));
  EXPECT_TRUE(report.findings.empty()) << report.text();
  EXPECT_NE(report.text().find("nothing to fix"), std::string::npos);
}

// ---- the GPU's rules, on a GPU ----
#ifdef FASTTRAIN_CUDA

const std::set<std::string> kGpuRules = {"cudnn_benchmark", "tensor_core_sizes", "variable_shapes",
                                         "host_sync", "allocator_churn"};

// The clean config on the GPU: sizes in multiples of 8, whole batches, cuDNN's benchmark on.
Config clean_gpu_config() {
  Config config = clean_config();
  config.train.device("cuda");
  config.train.cudnn_benchmark(true);
  return config;
}

std::set<std::string> gpu_rules(const DoctorReport& report) {
  std::set<std::string> found;
  for (const auto& rule : rules(report))
    if (kGpuRules.count(rule)) found.insert(rule);
  return found;
}

// A run at its memory limit whose allocations grow: each micro-batch allocates a tensor 2 MiB larger
// than the last (as a loss over ever longer sequences might), under a memory fraction that holds one
// of them but not two. The cached smaller block cannot serve the larger one and the device has no room
// for both, so the allocator frees its cache and retries: what allocator_churn reads.
class GrowingAtTheMemoryLimit : public Callback {
 public:
  void on_fit_start(Trainer&, int64_t) override {
    c10::cuda::CUDACachingAllocator::emptyCache();
    const int64_t reserved = memory_stats(torch::Device(torch::kCUDA, device_)).reserved_bytes;
    const auto total = static_cast<double>(at::cuda::getDeviceProperties(device_)->totalGlobalMem);
    c10::cuda::CUDACachingAllocator::setMemoryFraction((reserved + kBase * 3 / 2) / total, device_);
  }
  void on_micro_batch(Trainer&) override {
    size_ += 2 << 20;
    torch::empty({size_}, torch::TensorOptions().dtype(torch::kByte).device(torch::kCUDA, device_)).fill_(1);
  }
  void on_fit_end(Trainer&, const FitSummary&) override { restore(); }
  ~GrowingAtTheMemoryLimit() override { restore(); }

 private:
  void restore() {
    c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, device_);
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  static constexpr int64_t kBase = int64_t{256} << 20;
  c10::DeviceIndex device_ = c10::cuda::current_device();
  int64_t size_ = kBase;
};

// Each of the GPU's rules fires on its planted problem on the GPU, and none on the clean config.
TEST(Doctor, TheGpuRulesNameEachPlantedProblemAndNoneOnTheCleanConfig_CUDA) {
  FT_REQUIRE_FASHION_MNIST();
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  const auto options = quick(8, 3, 0.3);
  RunBuilder builder;

  DoctorReport clean = diagnose(builder, clean_gpu_config(), dir.path(), options);
  EXPECT_TRUE(gpu_rules(clean).empty()) << clean.text();

  // cuDNN's benchmark off, a batch of 100 (not a multiple of 8; 8192 samples leave a last batch of
  // 92, kept, and no memory.warmup), and a host read per micro-batch.
  Config careless = clean_gpu_config();
  careless.train.cudnn_benchmark(false);
  careless.data.batch_size(100);
  careless.data.loader.drop_last(false);
  DoctorReport report = diagnose(builder, careless, dir.path(), options, {std::make_shared<SyncEveryStep>()});
  for (const char* rule : {"cudnn_benchmark", "tensor_core_sizes", "variable_shapes", "host_sync"})
    EXPECT_TRUE(rules(report).count(rule)) << rule << "\n" << report.text();
  EXPECT_FALSE(rules(report).count("allocator_churn")) << "no retries here\n" << report.text();
  EXPECT_NE(report.text().find("data.batch_size 100"), std::string::npos) << report.text();

  DoctorReport churned = diagnose(builder, clean_gpu_config(), dir.path(), options,
                                  {std::make_shared<GrowingAtTheMemoryLimit>()});
  EXPECT_TRUE(rules(churned).count("allocator_churn")) << churned.text();
}
#endif  // FASTTRAIN_CUDA

}  // namespace
}  // namespace fasttrain
