// What "auto" chooses on hardware the tests do not run on: each Hardware is built by hand.
#include "fasttrain/run/auto.h"

#include <gtest/gtest.h>

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"
#include "support.h"

namespace fasttrain {
namespace {

Hardware cpu(bool native_bf16, int cores = 2, bool openblas = true) {
  Hardware hardware;
  hardware.device = torch::kCPU;
  hardware.cpu_model = "test CPU";
  hardware.cpu_avx2 = true;
  hardware.cpu_avx512 = native_bf16;
  hardware.cpu_native_bf16 = native_bf16;
  hardware.physical_cores = cores;
  hardware.openblas_pool = openblas;
  return hardware;
}

Hardware gpu(int capability) {
  Hardware hardware = cpu(false);
  hardware.device = torch::Device(torch::kCUDA, 0);
  hardware.gpu_name = "test GPU";
  hardware.cuda_capability = capability;
  return hardware;
}

Config auto_config() {
  Config config;
  config.train.precision("auto");
  return config;
}

// How a run resolves: the model's convolutions decide which pool gets the cores.
AutoResolution resolve(const Config& config, const Hardware& hardware, int processes = 1,
                       bool convolutions = true) {
  return resolve_auto(config, hardware, processes, convolutions);
}

const AutoChoice* choice(const AutoResolution& resolved, const std::string& key) {
  for (const auto& c : resolved.choices)
    if (c.key == key) return &c;
  return nullptr;
}

TEST(Auto, PrecisionIsBf16OnlyWhereTheHardwareRunsItNatively) {
  const AutoResolution avx2 = resolve(auto_config(), cpu(/*native_bf16=*/false));
  EXPECT_EQ(avx2.config.train.precision(), "fp32");
  ASSERT_NE(choice(avx2, "train.precision"), nullptr);
  EXPECT_NE(choice(avx2, "train.precision")->reason.find("no native bfloat16"), std::string::npos);
  EXPECT_TRUE(avx2.warnings.empty());

  const AutoResolution amx = resolve(auto_config(), cpu(/*native_bf16=*/true));
  EXPECT_EQ(amx.config.train.precision(), "bf16");

  EXPECT_EQ(resolve(auto_config(), gpu(90)).config.train.precision(), "bf16");  // H100
  EXPECT_EQ(resolve(auto_config(), gpu(80)).config.train.precision(), "bf16");  // A100
  EXPECT_EQ(resolve(auto_config(), gpu(75)).config.train.precision(), "fp32");  // T4: no bf16 cores
}

TEST(Auto, ThreadsGiveTheCoresToThePoolThatRunsTheModelsBulk) {
  // fp32 conv net on OpenBLAS: convs on the OpenMP threads, OpenBLAS one thread.
  const AutoResolution conv = resolve(auto_config(), cpu(false, 8));
  EXPECT_EQ(conv.config.train.threads(), 8);
  EXPECT_EQ(conv.config.train.blas_threads(), 1);
  // fp32 model without convolutions (an mlp, a gpt): OpenBLAS's pool gets the cores, one OpenMP thread.
  const AutoResolution matmuls = resolve(auto_config(), cpu(false, 8), 1, /*convolutions=*/false);
  EXPECT_EQ(matmuls.config.train.threads(), 1);
  EXPECT_EQ(matmuls.config.train.blas_threads(), 8);
  ASSERT_NE(choice(matmuls, "train.threads"), nullptr);
  EXPECT_NE(choice(matmuls, "train.threads")->reason.find("OpenBLAS"), std::string::npos);
  // bf16 runs its matmuls in oneDNN on the OpenMP threads: every core there, OpenBLAS left alone.
  const AutoResolution bf16 = resolve(auto_config(), cpu(true, 8), 1, false);
  EXPECT_EQ(bf16.config.train.threads(), 8);
  EXPECT_EQ(bf16.config.train.blas_threads(), 0);
  // Without OpenBLAS (MKL follows the intra-op threads) there is one pool.
  const AutoResolution mkl = resolve(auto_config(), cpu(false, 8, /*openblas=*/false), 1, false);
  EXPECT_EQ(mkl.config.train.threads(), 8);
  EXPECT_EQ(mkl.config.train.blas_threads(), 0);
  // Ranks on one machine split its cores.
  const AutoResolution rank = resolve(auto_config(), cpu(false, 8), /*processes=*/4);
  EXPECT_EQ(rank.config.train.threads(), 2);
  // On a GPU the host's threads are this process's share of the cores; the BLAS pool as it comes.
  const AutoResolution cuda = resolve(auto_config(), gpu(90), /*processes=*/2);
  EXPECT_EQ(cuda.config.train.threads(), 1);
  EXPECT_EQ(cuda.config.train.blas_threads(), 0);
}

TEST(Auto, ExplicitValuesAreKeptAndEmulatedBf16Warns) {
  Config config = auto_config();
  config.train.precision("bf16").threads(3).blas_threads(2);
  const AutoResolution emulated = resolve(config, cpu(/*native_bf16=*/false));
  EXPECT_EQ(emulated.config.train.precision(), "bf16");
  EXPECT_EQ(emulated.config.train.threads(), 3);
  EXPECT_EQ(emulated.config.train.blas_threads(), 2);
  EXPECT_TRUE(emulated.choices.empty());
  ASSERT_EQ(emulated.warnings.size(), 1u);
  EXPECT_TRUE(
      testing::contains_all(emulated.warnings[0], {"train.precision", "emulated", "\"fp32\"", "auto"}));
  EXPECT_TRUE(resolve(config, cpu(/*native_bf16=*/true)).warnings.empty());
  EXPECT_TRUE(resolve(config, gpu(75)).warnings.empty());  // CUDA autocast runs bf16 on any GPU
}

TEST(Auto, Fp32PrecisionBf16IsForTheCpuFromLibTorch29AndWarnsWithoutNativeBf16) {
  Config config = auto_config();
  config.train.fp32_precision("bf16");
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] { resolve(config, gpu(90)); }),
                                    {"train.fp32_precision", "cuda", "train.tf32"}));
  if (!compat::has_cpu_fp32_precision()) {
    EXPECT_TRUE(testing::contains_all(testing::error_message([&] { resolve(config, cpu(true)); }),
                                      {"train.fp32_precision", "LibTorch >= 2.9", compat::torch_version()}));
    return;
  }
  Hardware amx = cpu(/*native_bf16=*/true);
  amx.cpu_amx_bf16 = true;
  EXPECT_TRUE(resolve(config, amx).warnings.empty());
  for (bool native_bf16 : {false, true}) {  // AVX2, AVX512-BF16: oneDNN's fp32 kernels either way
    const AutoResolution resolved = resolve(config, cpu(native_bf16));
    ASSERT_EQ(resolved.warnings.size(), 1u);
    EXPECT_TRUE(testing::contains_all(resolved.warnings[0],
                                      {"train.fp32_precision", "AMX", "keeps fp32 arithmetic"}));
  }
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { apply_override(config, "train.fp32_precision=\"tf32\""); }),
      {"train.fp32_precision", "tf32", "ieee, bf16"}));
}

TEST(Auto, TheEffectiveConfigWritesAutoAndReadsItBack) {
  Config config;
  apply_override(config, "train.threads=\"auto\"");
  apply_override(config, "train.blas_threads=\"auto\"");
  apply_override(config, "train.precision=auto");
  EXPECT_EQ(config.train.threads(), 0);
  EXPECT_EQ(config.train.blas_threads(), -1);
  const std::string text = to_toml(config);
  EXPECT_NE(text.find("threads = \"auto\""), std::string::npos) << text;
  EXPECT_NE(text.find("blas_threads = \"auto\""), std::string::npos) << text;
  EXPECT_NE(text.find("precision = \"auto\""), std::string::npos) << text;
  // 0 is still accepted for train.threads (it meant the cores before "auto" existed).
  apply_override(config, "train.threads=0");
  EXPECT_EQ(config.train.threads(), 0);
  EXPECT_TRUE(
      testing::contains_all(testing::error_message([&] { apply_override(config, "train.blas_threads=-2"); }),
                            {"train.blas_threads", "auto", "-2"}));
}

TEST(Auto, TheEnvironmentCanHideOrGrantNativeBf16) {
  {
    testing::ScopedEnv env("FASTTRAIN_NATIVE_BF16", "0");
    const Hardware hardware = detect_hardware(torch::kCPU);
    EXPECT_FALSE(hardware.native_bf16());
    EXPECT_EQ(resolve(auto_config(), hardware).config.train.precision(), "fp32");
  }
  {
    testing::ScopedEnv env("FASTTRAIN_NATIVE_BF16", "1");
    const Hardware hardware = detect_hardware(torch::kCPU);
    EXPECT_TRUE(hardware.native_bf16());
    EXPECT_NE(hardware.describe().find("native bf16"), std::string::npos) << hardware.describe();
  }
  testing::ScopedEnv env("FASTTRAIN_NATIVE_BF16", "yes");
  EXPECT_TRUE(testing::contains_all(testing::error_message([] { detect_hardware(torch::kCPU); }),
                                    {"FASTTRAIN_NATIVE_BF16", "yes", "0"}));
}

TEST(Auto, AResumeMayMakeTheRunLongerNotShorter) {
  Config saved;
  saved.train.options.epochs(2);
  Config longer = saved;
  longer.train.options.epochs(3);
  EXPECT_EQ(training_fingerprint(saved), training_fingerprint(longer));
  RunLengthChange change = run_length_change(saved, longer);
  ASSERT_EQ(change.longer.size(), 1u);
  EXPECT_EQ(change.longer[0], "train.epochs 2 -> 3");
  EXPECT_TRUE(change.shorter.empty());
  // max_steps = 0 is no step limit: from 500 to 0 is longer, from 0 to 500 shorter.
  Config capped = saved;
  capped.train.options.max_steps(500);
  EXPECT_EQ(run_length_change(capped, saved).longer.size(), 1u);
  EXPECT_EQ(run_length_change(saved, capped).shorter.size(), 1u);
  EXPECT_TRUE(run_length_change(saved, saved).longer.empty());
  // Anything else that shapes training still differs.
  Config other = longer;
  other.optim.lr(1e-2);
  EXPECT_NE(training_fingerprint(saved), training_fingerprint(other));
}

}  // namespace
}  // namespace fasttrain
