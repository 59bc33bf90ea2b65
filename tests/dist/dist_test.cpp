// Distributed training: the environment, the sampler, and multi-process runs through the CLI (fasttrain
// launch, torchrun, ranks started by hand; on 127.0.0.1, or on two hosts made of network namespaces), each
// bounded in time.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "fasttrain/data/loader.h"
#include "fasttrain/detail/file_io.h"
#include "fasttrain/dist/launcher.h"
#include "fasttrain/dist/process_group.h"
#include "fasttrain/state/checkpoint_dir.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/util/hardware.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::kCli;
using testing::max_difference;

namespace fs = std::filesystem;
using testing::run_command;

// 20 optimizer steps over windows of 2 micro-batches, with clipping, AdamW and one-cycle. An MLP: a
// BatchNorm model would differ by design (DDP normalises each rank's half of the batch on its own).
const std::string kRun =
    " --set model.name=mlp --set model.hidden=[64] --set optim.name=adamw --set optim.lr=2e-3"
    " --set schedule.name=one-cycle --set train.max_steps=20 --set train.accumulation=2"
    " --set train.clip_norm=1.0 --set data.train_limit=4096 --set train.threads=1 --set data.workers=0"
    " --set log.every_steps=5 --set log.progress=none --set train.eval_every_steps=0"
    " --set train.device=cpu";  // Gloo on the CPU: what these tests are about, on a GPU machine too

std::string launch(int nproc) {
  return kCli + " launch --nproc " + std::to_string(nproc) + " --grace-s 5 -- " + kCli + " train";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Whether the run writing `run_dir` logged step `step` within `timeout_s` (its metrics every 5 steps).
bool reached_step(const std::string& run_dir, int step, double timeout_s) {
  const std::string record = "\"step\":" + std::to_string(step) + "}";
  return testing::wait_until(
      [&] { return testing::read_text(run_dir + "/metrics.jsonl").find(record) != std::string::npos; },
      timeout_s);
}

nlohmann::json summary_of(const std::string& run_dir) {
  return nlohmann::json::parse(read_text_file(run_dir + "/summary.json"));
}

// The rendezvous variables of torchrun and Slurm: only `values` set, for one test.
class RendezvousEnv : public testing::ScopedEnv {
 public:
  explicit RendezvousEnv(const std::map<std::string, std::string>& values)
      : ScopedEnv(values,
                  {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}) {}
};

// ---------------------------------------------------------------------------------------------
// The environment
// ---------------------------------------------------------------------------------------------

TEST(DistEnv, NoVariablesMeanOneProcess) {
  RendezvousEnv env({});
  EXPECT_FALSE(DistEnv::from_environment().has_value());
}

TEST(DistEnv, ReadsTorchrunsVariables) {
  RendezvousEnv env({{"RANK", "3"},
                     {"WORLD_SIZE", "4"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "node0"},
                     {"MASTER_PORT", "29400"}});
  auto read = DistEnv::from_environment();
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->rank, 3);
  EXPECT_EQ(read->world_size, 4);
  EXPECT_EQ(read->local_rank, 1);
  EXPECT_EQ(read->local_world_size, 2);
  EXPECT_EQ(read->master_addr, "node0");
  EXPECT_EQ(read->master_port, 29400);
  EXPECT_EQ(read->source, "torchrun");
}

TEST(DistEnv, ReadsSlurmsVariablesWithTheDefaultPort) {
  RendezvousEnv env({{"SLURM_PROCID", "5"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                     {"MASTER_ADDR", "n1"}});
  auto read = DistEnv::from_environment();
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->rank, 5);
  EXPECT_EQ(read->world_size, 8);
  EXPECT_EQ(read->local_rank, 1);
  EXPECT_EQ(read->local_world_size, 4);
  EXPECT_EQ(read->master_port, 29500);
  EXPECT_EQ(read->source, "slurm");
}

TEST(DistEnv, ABadVariableIsAnErrorNamingIt) {
  {
    RendezvousEnv env({{"RANK", "one"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    EXPECT_TRUE(testing::contains_all(testing::error_message([] { DistEnv::from_environment(); }),
                                      {"RANK='one'", "not an integer"}));
  }
  {
    RendezvousEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}});
    EXPECT_TRUE(testing::contains_all(testing::error_message([] { DistEnv::from_environment(); }),
                                      {"rank 2", "world size 2"}));
  }
  {
    RendezvousEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
    EXPECT_TRUE(testing::contains_all(testing::error_message([] { DistEnv::from_environment(); }),
                                      {"MASTER_ADDR is not set"}));
  }
  {
    RendezvousEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
    EXPECT_TRUE(testing::contains_all(testing::error_message([] { DistEnv::from_environment(); }),
                                      {"MASTER_PORT=70000"}));
  }
}

// The process's group is made once; asking for it again with other options is an error, not a
// silently different group (ctest runs each test in its own process, so the group ends with it).
TEST(DistEnv, TheDefaultGroupKeepsItsOptionsAndRefusesOthers) {
  RendezvousEnv env({{"RANK", "0"},
                     {"WORLD_SIZE", "1"},
                     {"MASTER_ADDR", "127.0.0.1"},
                     {"MASTER_PORT", std::to_string(free_tcp_port())}});
  const DistOptions options = DistOptions().timeout_s(20);
  const std::shared_ptr<ProcessGroup> group = default_process_group(options);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(default_process_group(options), group);
  EXPECT_EQ(default_process_group(DistOptions(options).zero(2)), group)
      << "zero is the trainer's, not the group's";
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { default_process_group(DistOptions(options).timeout_s(30)); }),
      {"dist.timeout_s = 20", "dist.timeout_s = 30"}));
}

// ---------------------------------------------------------------------------------------------
// The sampler: DistributedSampler's sharding
// ---------------------------------------------------------------------------------------------

// dist.backend: "auto" takes NCCL for a CUDA run where the machine's ranks spread over as many GPUs, else
// Gloo (saying why, on CUDA); "nccl" where it certainly cannot work is an error naming why.
BackendFacts facts(torch::DeviceType device, int local_ranks, int gpus, bool visible_devices_set = false) {
  BackendFacts facts;
  facts.device = device;
  facts.local_ranks = local_ranks;
  facts.gpus = gpus;
  facts.visible_devices_set = visible_devices_set;
  return facts;
}

TEST(DistBackend, AutoTakesNcclWhereEachRankHasAGpuAndNcclIsRefusedWhereItCannotWork) {
  EXPECT_EQ(choose_backend("auto", facts(torch::kCPU, 2, 0)).backend, "gloo");
  EXPECT_EQ(choose_backend("auto", facts(torch::kCPU, 2, 0)).reason, "");
  EXPECT_EQ(choose_backend("gloo", facts(torch::kCUDA, 1, 8)).backend, "gloo");
  EXPECT_EQ(choose_backend("gloo", facts(torch::kCUDA, 1, 8)).reason, "");
  const BackendChoice shared = choose_backend("auto", facts(torch::kCUDA, 2, 1));
  EXPECT_EQ(shared.backend, "gloo");
  EXPECT_TRUE(testing::contains_all(
      shared.reason, {built_with_nccl() ? "2 ranks on this machine share its 1 GPU" : "without NCCL"}))
      << shared.reason;
  EXPECT_EQ(choose_backend("auto", facts(torch::kCUDA, 2, 2)).backend, built_with_nccl() ? "nccl" : "gloo");
  // train.device = "cuda:N": every rank of the machine on one GPU.
  EXPECT_EQ(backend_facts("cpu", 4).gpus, 0);
  auto refused = [](const BackendFacts& facts) {
    return testing::error_message([&] { choose_backend("nccl", facts); });
  };
  EXPECT_TRUE(
      testing::contains_all(testing::error_message([] { choose_backend("mpi", facts(torch::kCPU, 1, 0)); }),
                            {"dist.backend", "\"mpi\""}));
  if (!built_with_nccl()) {
    EXPECT_TRUE(testing::contains_all(refused(facts(torch::kCUDA, 1, 1)),
                                      {"dist.backend = \"nccl\"", "without NCCL"}));
    return;
  }
  EXPECT_EQ(choose_backend("nccl", facts(torch::kCUDA, 2, 2)).backend, "nccl");
  EXPECT_TRUE(testing::contains_all(refused(facts(torch::kCPU, 1, 0)),
                                    {"dist.backend = \"nccl\"", "trains on the CPU"}));
  EXPECT_TRUE(testing::contains_all(
      refused(facts(torch::kCUDA, 2, 1)),
      {"needs a GPU per rank", "2 ranks on this machine share its 1 GPU", "at most 1 rank a machine"}));
  // Each rank may see its own GPU as its only one (srun --gpus-per-task): trusted, and auto says how.
  EXPECT_EQ(choose_backend("nccl", facts(torch::kCUDA, 4, 1, true)).backend, "nccl");
  EXPECT_TRUE(testing::contains_all(choose_backend("auto", facts(torch::kCUDA, 4, 1, true)).reason,
                                    {"CUDA_VISIBLE_DEVICES", "dist.backend = \"nccl\""}));
}

TEST(DistSampler, DealsTheEpochOrderLikeDistributedSampler) {
  ImageDataset data = testing::synthetic_images(10);
  auto loader = [&](bool shuffle, int64_t rank, int64_t world, bool even) {
    return std::make_unique<DataLoader>(
        data, TransformPipeline({0.0f}, {1.0f}),
        LoaderOptions(1).workers(0).shuffle(shuffle).seed(5).rank(rank).world_size(world).even_shards(even));
  };
  // Without shuffling, as torch.utils.data.DistributedSampler(range(10), 3, r, shuffle=False):
  // padded to 12 by repeating the start, then every third.
  EXPECT_EQ(loader(false, 0, 3, true)->epoch_order(0), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(loader(false, 1, 3, true)->epoch_order(0), (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_EQ(loader(false, 2, 3, true)->epoch_order(0), (std::vector<int64_t>{2, 5, 8, 1}));
  EXPECT_EQ(loader(false, 2, 3, true)->batches_per_epoch(), 4);
  // Evaluation shards: every sample once.
  EXPECT_EQ(loader(false, 0, 3, false)->epoch_order(0), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(loader(false, 1, 3, false)->epoch_order(0), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(loader(false, 2, 3, false)->samples_per_epoch(), 3);

  // With shuffling every rank deals from the same permutation of (seed, epoch), each epoch anew.
  for (int64_t epoch : {0, 1}) {
    const std::vector<int64_t> whole = loader(true, 0, 1, true)->epoch_order(epoch);
    for (int64_t rank = 0; rank < 2; ++rank) {
      std::vector<int64_t> expected;
      for (size_t i = static_cast<size_t>(rank); i < whole.size(); i += 2) expected.push_back(whole[i]);
      EXPECT_EQ(loader(true, rank, 2, true)->epoch_order(epoch), expected) << "rank " << rank;
    }
  }
  EXPECT_NE(loader(true, 0, 2, true)->epoch_order(0), loader(true, 0, 2, true)->epoch_order(1));
}

// ---------------------------------------------------------------------------------------------
// Multi-process runs
// ---------------------------------------------------------------------------------------------

class DistRun : public ::testing::Test {
 protected:
  void SetUp() override { FT_REQUIRE_FASHION_MNIST(); }
};

TEST_F(DistRun, TwoRanksEqualOneProcessOnTheGlobalBatchAndZeroEqualsDdp) {
  testing::TempDir dir;
  auto single =
      run_command(kCli + " train" + kRun + " --set data.batch_size=64 --run-dir " + dir.file("single"));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  std::map<int, nlohmann::json> dist;
  for (int zero : {0, 1, 2, 3}) {
    const std::string run = dir.file("zero" + std::to_string(zero));
    // ZeRO-1 with the allocator warm-up too: it must leave no gradient behind on the model.
    auto result =
        run_command(launch(2) + kRun + " --set data.batch_size=32 --set dist.zero=" + std::to_string(zero) +
                    (zero == 1 ? " --set memory.warmup=true" : "") + " --run-dir " + run);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_LT(
        max_difference(dir.file("single") + "/final/model.safetensors", run + "/final/model.safetensors"),
        1e-6)
        << "dist.zero = " << zero << " against one process";
    dist[zero] = summary_of(run)["dist"];
    EXPECT_EQ(dist[zero]["world_size"], 2);
    EXPECT_EQ(summary_of(run)["steps"], 20);
  }
  for (int zero : {1, 2, 3}) {
    const std::string run = dir.file("zero" + std::to_string(zero));
    EXPECT_LT(
        max_difference(dir.file("zero0") + "/final/model.safetensors", run + "/final/model.safetensors"),
        1e-6)
        << "ZeRO-" << zero << " against DDP";
    // Adam's two moments of half the parameters each (plus step counters and padding).
    const double ratio =
        dist[zero]["optimizer_state_bytes"].get<double>() / dist[0]["optimizer_state_bytes"].get<double>();
    EXPECT_GT(ratio, 0.45) << "ZeRO-" << zero;
    EXPECT_LT(ratio, 0.55) << "ZeRO-" << zero;
  }
  // Per step: DDP's all-reduce and ZeRO-2's reduce-scatter + all-gather move the same bytes; ZeRO-1
  // all-reduces and all-gathers (1.5x). ZeRO-3 gathers every block for each micro-batch's forward and
  // again for its backward, and reduce-scatters once per window: (2 x 2 + 1) / 2 = 2.5x with windows
  // of 2 (1.5x without accumulation, as FSDP), plus the gathers of the final evaluation (each batch)
  // and of the final checkpoint, spread over the 20 steps.
  const double ddp_bytes = dist[0]["bytes_sent_per_step"].get<double>();
  EXPECT_NEAR(dist[2]["bytes_sent_per_step"].get<double>() / ddp_bytes, 1.0, 0.05);
  EXPECT_NEAR(dist[1]["bytes_sent_per_step"].get<double>() / ddp_bytes, 1.5, 0.05);
  EXPECT_GT(dist[3]["bytes_sent_per_step"].get<double>() / ddp_bytes, 2.5);
  EXPECT_LT(dist[3]["bytes_sent_per_step"].get<double>() / ddp_bytes, 2.7);
  // The MLP is all blocks (each Linear with its ReLU): ZeRO-3 keeps half the parameters per rank.
  EXPECT_EQ(dist[3]["units"], 3) << "the root and the two Linear blocks";
  EXPECT_NEAR(dist[3]["parameter_bytes"].get<double>() / dist[0]["parameter_bytes"].get<double>(), 0.5, 0.01);
  EXPECT_EQ(dist[2]["parameter_bytes"], dist[0]["parameter_bytes"]);
  EXPECT_TRUE(dist[0]["ddp_timings_ns"].contains("avg_backward_comm_time")) << dist[0].dump();
  // Only rank 0 wrote the run directory: one metrics file with one record per log interval.
  std::istringstream lines(testing::read_text(dir.file("zero0") + "/metrics.jsonl"));
  int train_records = 0;
  for (std::string line; std::getline(lines, line);)
    train_records += nlohmann::json::parse(line)["kind"] == "train";
  EXPECT_EQ(train_records, 4);
}

// On GPUs: each rank of a machine takes a GPU of its own (sharing them where there are fewer), and DDP and
// ZeRO-1/2/3 over CUDA tensors equal one process on the global batch, with the backend that "auto" picks
// (Gloo where the ranks share a GPU: NCCL refuses that; NCCL where each has one). fp32 without TF32; the
// half batches and the whole one still go through different cuBLAS kernels, hence the looser bound.
TEST_F(DistRun, TwoRanksOnTheGpusEqualOneProcessOnTheGlobalBatch_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  const std::string gpu = kRun + " --set train.device=cuda --set train.precision=fp32 --set train.tf32=false";
  auto single =
      run_command(kCli + " train" + gpu + " --set data.batch_size=64 --run-dir " + dir.file("single"));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const std::string backend = torch::cuda::device_count() >= 2 && built_with_nccl() ? "nccl" : "gloo";
  for (int zero : {0, 1, 2, 3}) {
    const std::string run = dir.file("zero" + std::to_string(zero));
    auto result =
        run_command(launch(2) + gpu + " --set data.batch_size=32 --set dist.zero=" + std::to_string(zero) +
                    " --run-dir " + run);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_LT(
        max_difference(dir.file("single") + "/final/model.safetensors", run + "/final/model.safetensors"),
        1e-4)
        << "dist.zero = " << zero << " on the GPU against one process";
    EXPECT_EQ(summary_of(run)["dist"]["backend"], backend) << "dist.zero = " << zero;
    EXPECT_EQ(summary_of(run)["steps"], 20);
    if (backend == "gloo") {
      EXPECT_TRUE(testing::contains_all(result.output, {"auto: dist.backend = gloo", "share"}))
          << result.output;
    }
  }
}

// dist.backend = "nccl", a rank per GPU (as many as there are, at most 2): DDP and ZeRO-1/2/3 equal one
// process on the global batch.
TEST_F(DistRun, NcclRanksEqualOneProcessOnTheGlobalBatch_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!built_with_nccl()) GTEST_SKIP() << "this fasttrain is built without NCCL";
  testing::TempDir dir;
  const int ranks = std::min(2, static_cast<int>(torch::cuda::device_count()));
  const std::string gpu = kRun + " --set train.device=cuda --set train.precision=fp32 --set train.tf32=false";
  auto single =
      run_command(kCli + " train" + gpu + " --set data.batch_size=64 --run-dir " + dir.file("single"));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  for (int zero : {0, 1, 2, 3}) {
    const std::string run = dir.file("zero" + std::to_string(zero));
    auto result = run_command(launch(ranks) + gpu +
                              " --set dist.backend=nccl --set data.batch_size=" + std::to_string(64 / ranks) +
                              " --set dist.zero=" + std::to_string(zero) + " --run-dir " + run);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_LT(
        max_difference(dir.file("single") + "/final/model.safetensors", run + "/final/model.safetensors"),
        1e-4)
        << "NCCL, dist.zero = " << zero << ", " << ranks << " rank(s), against one process";
    EXPECT_EQ(summary_of(run)["dist"]["backend"], "nccl");
    EXPECT_EQ(summary_of(run)["dist"]["world_size"], ranks);
  }
}

// Text on two ranks: windows are samples like images (rank r takes every other window of the epoch
// order), so two ranks of 4 equal one process of 8; token buckets deal whole planned batches, each
// rank its own, and every rank steps the same number of times.
TEST(DistText, WindowsOnTwoRanksEqualOneProcessAndTokenBucketsTrain) {
  testing::TempDir dir;
  const std::string text = " --set data.dataset=text --set data.path=" + testing::write_text_corpus(dir) +
                           " --set data.include=*.py --set data.val_fraction=0.2 --set model.name=gpt"
                           " --set model.layers=2 --set model.heads=2 --set model.embed=32"
                           " --set model.context=32 --set optim.name=adamw --set optim.lr=3e-3"
                           " --set schedule.name=constant --set train.max_steps=12 --set train.threads=1"
                           " --set data.workers=0 --set log.progress=none --set train.eval_every_steps=0"
                           " --set train.device=cpu";
  auto single =
      run_command(kCli + " train" + text + " --set data.batch_size=8 --run-dir " + dir.file("single"));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  auto windows = run_command(launch(2) + text + " --set data.batch_size=4 --run-dir " + dir.file("windows"));
  ASSERT_EQ(windows.exit_code, 0) << windows.output;
  // Only the order of the sums differs (one batch of 8 against two of 4 averaged): AdamW's normalised
  // steps carry that rounding into coordinates whose gradients are near zero, up to ~1e-5 after 12 steps
  // at lr 3e-3 (the attention kernel and ATen's SDPA, same run, differ by as much themselves).
  EXPECT_LT(max_difference(dir.file("single") + "/final/model.safetensors",
                           dir.file("windows") + "/final/model.safetensors"),
            5e-5);
  EXPECT_NEAR(summary_of(dir.file("windows"))["test_loss"].get<double>(),
              summary_of(dir.file("single"))["test_loss"].get<double>(), 1e-4);

  auto tokens = run_command(launch(2) + text +
                            " --set data.batching=tokens --set data.max_tokens=128 --set data.batch_size=4"
                            " --run-dir " +
                            dir.file("tokens"));
  ASSERT_EQ(tokens.exit_code, 0) << tokens.output;
  const nlohmann::json summary = summary_of(dir.file("tokens"));
  EXPECT_EQ(summary["steps"], 12);
  EXPECT_EQ(summary["dist"]["world_size"], 2);
  EXPECT_LT(summary["padding_fraction"].get<double>(), 0.15);
  EXPECT_TRUE(std::isfinite(summary["test_bits_per_byte"].get<double>()));
}

// ZeRO-3 on a GPT: the embeddings and final norm stay whole (the root), each transformer block is
// sharded and gathered for its forward and (recomputed, under activation checkpointing) backward,
// under bf16 autocast. The weights equal DDP's with the same settings; each rank keeps about half
// of the blocks' parameters. Evaluation forwards (test_loss) gather block by block too. (No clipping
// here: the global norm summed from shards differs from DDP's in the last bits, and over steps bf16
// rounding makes that 1e-3; the fp32 test above clips.)
TEST(DistText, FullyShardedGptWithCheckpointingAndBf16EqualsDdp) {
  testing::TempDir dir;
  const std::string text = " --set data.dataset=text --set data.path=" + testing::write_text_corpus(dir) +
                           " --set data.include=*.py --set data.val_fraction=0.2 --set model.name=gpt"
                           " --set model.layers=3 --set model.heads=2 --set model.embed=32"
                           " --set model.context=32 --set optim.name=adamw --set optim.lr=3e-3"
                           " --set schedule.name=constant --set train.max_steps=12 --set train.threads=1"
                           " --set train.accumulation=2"
                           " --set train.precision=bf16 --set memory.checkpoint=blocks"
                           " --set data.workers=0 --set log.progress=none --set train.eval_every_steps=6"
                           " --set data.batch_size=4 --set train.device=cpu";
  std::map<int, nlohmann::json> dist;
  for (int zero : {0, 3}) {
    const std::string run = dir.file("zero" + std::to_string(zero));
    auto result =
        run_command(launch(2) + text + " --set dist.zero=" + std::to_string(zero) + " --run-dir " + run);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    dist[zero] = summary_of(run);
  }
  EXPECT_LT(max_difference(dir.file("zero0") + "/final/model.safetensors",
                           dir.file("zero3") + "/final/model.safetensors"),
            1e-6);
  EXPECT_NEAR(dist[3]["test_loss"].get<double>(), dist[0]["test_loss"].get<double>(), 1e-5);
  EXPECT_EQ(dist[3]["dist"]["units"], 4) << "the root and 3 blocks";
  const double kept =
      dist[3]["dist"]["parameter_bytes"].get<double>() / dist[0]["dist"]["parameter_bytes"].get<double>();
  EXPECT_GT(kept, 0.5);  // the root (embeddings, final norm) is whole on every rank
  EXPECT_LT(kept, 0.65);
}

// A checkpoint resumes on another number of ranks with the same dist.zero, keeping the global batch:
// rank counts it cannot split it over, another dist.zero, and a per-rank batch that changes the global
// one are clear errors before anything is written.
TEST_F(DistRun, ResumingAtAWorldSizeThatCannotKeepTheRunIsAClearError) {
  testing::TempDir dir;
  const std::string run = dir.file("ddp");
  auto trained = run_command(launch(2) + kRun + " --set data.batch_size=32 --run-dir " + run);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string checkpoint = run + "/checkpoints/step-20";
  auto three = run_command(launch(3) + kRun + " --set data.batch_size=32 --resume " + checkpoint +
                           " --run-dir " + dir.file("three"));
  EXPECT_EQ(three.exit_code, 2) << three.output;
  EXPECT_TRUE(testing::contains_all(three.output, {"on 3 rank(s)", "global batch of 64", "divides 64"}))
      << three.output;
  auto other_batch = run_command(kCli + " train" + kRun + " --set data.batch_size=48 --resume " + checkpoint +
                                 " --run-dir " + dir.file("one"));
  EXPECT_EQ(other_batch.exit_code, 2) << other_batch.output;
  EXPECT_TRUE(testing::contains_all(other_batch.output, {"data.batch_size = 48", "64 per rank here"}))
      << other_batch.output;
  auto zero = run_command(launch(2) + kRun + " --set data.batch_size=32 --set dist.zero=1 --resume " +
                          checkpoint + " --run-dir " + dir.file("zero"));
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_TRUE(testing::contains_all(zero.output, {"dist.zero = 0, but this run has 2 with dist.zero = 1"}));
  EXPECT_FALSE(fs::exists(dir.file("three/config.toml")));
}

// Resuming at another world size: N ranks train 40 steps with a checkpoint at step 15 (inside an
// epoch); M ranks continue that checkpoint to step 40 with data.batch_size adjusted to keep the global batch.
// Every window holds the same samples, so the continuation ends at the uninterrupted run's weights up to the
// rounding of averaging the gradients over M ranks instead of N (sums in another order: 1.5e-8 after 25 steps
// of AdamW here; bound 1e-4, where 20 steps move the weights by 1e-2).
TEST_F(DistRun, ResumingAtAnotherWorldSizeContinuesTheUninterruptedRun) {
  struct Case {
    int saved_ranks, ranks, zero;
    int64_t saved_batch;
  };
  // 3840 samples: 40 global micro-batches of 96 (or 64 for 1 <-> 2 ranks) whatever the rank count.
  const std::string args = kRun +
                           " --set train.max_steps=40 --set checkpoint.every_steps=15 "
                           "--set data.train_limit=3840";
  auto start = [&](int ranks) { return ranks == 1 ? kCli + " train" : launch(ranks); };
  for (const Case& c :
       {Case{2, 1, 0, 32}, Case{1, 2, 0, 64}, Case{2, 3, 0, 48}, Case{2, 3, 2, 48}, Case{2, 3, 3, 48}}) {
    SCOPED_TRACE(fmt::format("{} -> {} rank(s), dist.zero = {}", c.saved_ranks, c.ranks, c.zero));
    testing::TempDir dir;
    const std::string zero = " --set dist.zero=" + std::to_string(c.zero);
    const std::string straight = dir.file("straight");
    auto trained = run_command(start(c.saved_ranks) + args + zero + " --set data.batch_size=" +
                               std::to_string(c.saved_batch) + " --run-dir " + straight);
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    // The same command line, on another number of ranks.
    auto resumed =
        run_command(start(c.ranks) + args + zero + " --set data.batch_size=" + std::to_string(c.saved_batch) +
                    " --resume " + straight + "/checkpoints/step-15 --run-dir " + dir.file("resumed"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const int64_t per_rank = c.saved_batch * c.saved_ranks / c.ranks;
    EXPECT_TRUE(testing::contains_all(
        resumed.output, {fmt::format("{} rank(s) -> {}: data.batch_size {} -> {} per rank", c.saved_ranks,
                                     c.ranks, c.saved_batch, per_rank)}))
        << resumed.output;
    const double difference = max_difference(straight + "/final/model.safetensors",
                                             dir.file("resumed") + "/final/model.safetensors");
    EXPECT_LT(difference, 1e-4);
    EXPECT_EQ(summary_of(dir.file("resumed"))["steps"], 40);
    EXPECT_NEAR(summary_of(dir.file("resumed"))["test_loss"].get<double>(),
                summary_of(straight)["test_loss"].get<double>(), 1e-4);
    std::printf("[          ] %d -> %d ranks, ZeRO-%d: weights within %.2g of the uninterrupted run\n",
                c.saved_ranks, c.ranks, c.zero, difference);
  }
}

TEST_F(DistRun, SigtermToTheLauncherCheckpointsEveryRankAndTheResumeEndsBitIdentical) {
  // 600 steps (about 30 epochs of 2 x 32 per rank): long enough to stop in the middle.
  const std::string long_run = kRun + " --set train.max_steps=600 --set data.batch_size=32";
  for (int zero : {0, 2, 3}) {
    SCOPED_TRACE("dist.zero = " + std::to_string(zero));
    const std::string run_args = long_run + " --set dist.zero=" + std::to_string(zero);
    testing::TempDir dir;
    auto straight = run_command(launch(2) + run_args + " --run-dir " + dir.file("straight"));
    ASSERT_EQ(straight.exit_code, 0) << straight.output;

    const std::string run = dir.file("stopped");
    const pid_t launcher =
        testing::spawn_command(launch(2) + run_args + " --run-dir " + run + " >" + dir.file("log") + " 2>&1");
    ASSERT_TRUE(reached_step(run, 50, 60)) << testing::read_text(dir.file("log"));
    ASSERT_EQ(::kill(launcher, SIGTERM), 0);
    EXPECT_EQ(testing::wait_exit_code(launcher), 143) << testing::read_text(dir.file("log"));
    auto checkpoints = list_checkpoints(run + "/checkpoints");
    ASSERT_EQ(checkpoints.size(), 1u) << testing::read_text(dir.file("log"));
    EXPECT_LT(checkpoints[0].step, 600);
    for (const char* file : {"rng-rank0.safetensors", "rng-rank1.safetensors"}) {
      EXPECT_TRUE(fs::exists(checkpoints[0].dir + "/" + file)) << file;
    }
    if (zero > 0) {
      EXPECT_TRUE(fs::exists(checkpoints[0].dir + "/optimizer-rank1.safetensors"));
    }
    std::printf("[          ] ZeRO-%d stopped at step %lld\n", zero,
                static_cast<long long>(checkpoints[0].step));

    auto resumed = run_command(launch(2) + run_args + " --run-dir " + run + " --resume");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(testing::read_text(dir.file("straight") + "/final/model.safetensors") ==
                testing::read_text(run + "/final/model.safetensors"))
        << "the resumed run's weights differ from the straight run's";
    EXPECT_EQ(summary_of(run)["steps"], 600);
  }
}

// A killed rank closes its connections, so the others notice at once; a stopped (hung) rank keeps
// them open, and only dist.timeout_s ends the wait. Either way the survivor fails with the rank and
// the collective named, within the timeout and 5 s.
TEST_F(DistRun, ADeadOrHungRankMakesTheOthersFailWithinTheTimeout) {
  for (int signal : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(strsignal(signal));
    testing::TempDir dir;
    const int port = free_tcp_port();
    const double timeout_s = 4;
    auto start_rank = [&](int rank) {
      return testing::spawn_command(
          "env RANK=" + std::to_string(rank) +
          " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " + kCli + " train" +
          kRun + " --set train.max_steps=1000000 --set data.batch_size=32 --set dist.timeout_s=" +
          std::to_string(timeout_s) + " --run-dir " + dir.file("run") + " >" +
          dir.file("log" + std::to_string(rank)) + " 2>&1");
    };
    const pid_t rank0 = start_rank(0), rank1 = start_rank(1);
    ASSERT_TRUE(reached_step(dir.file("run"), 20, 60)) << testing::read_text(dir.file("log0"));
    ASSERT_EQ(::kill(rank1, signal), 0);
    const auto signalled_at = std::chrono::steady_clock::now();
    const int code = testing::wait_exit_code(rank0);
    const double waited = seconds_since(signalled_at);
    ::kill(rank1, SIGKILL);
    testing::wait_exit_code(rank1);
    const std::string log = testing::read_text(dir.file("log0"));
    EXPECT_EQ(code, 1) << log;
    EXPECT_LT(waited, timeout_s + 5) << log;
    if (signal == SIGSTOP) {
      EXPECT_GT(waited, timeout_s - 1) << "failed before dist.timeout_s: " << log;
    }
    EXPECT_TRUE(testing::contains_all(log, {"error: rank 0 of 2 on ", "failed", "dist.timeout_s"})) << log;
    std::printf("[          ] rank 0 exited %.2f s after rank 1 got %s\n", waited, strsignal(signal));
  }
}

// ---------------------------------------------------------------------------------------------
// torchrun itself: torch.distributed.run of the PyTorch that FASTTRAIN_TORCH_PYTHON runs (the pinned
// 2.11 for build/, Debian's 1.13 for build-debian/), --no-python, with its elastic agent's store
// ---------------------------------------------------------------------------------------------

// On LibTorch 1.x there is no torchrun to test with: Debian's (python3-torch 1.13) fails under Python 3.11
// before it starts a worker ("'NoneType' object has no attribute 'get'" in to_map), and the store of a
// 2.x agent speaks a newer protocol than a 1.x client (the rendezvous waits until dist.timeout_s).
#define FT_REQUIRE_TORCHRUN()                                                                             \
  if (TORCH_VERSION_MAJOR < 2) {                                                                          \
    GTEST_SKIP() << "LibTorch 1.x: Debian's torchrun 1.13 does not run under Python 3.11, and a 2.x "     \
                    "torchrun's store does not talk to a 1.x client";                                     \
  }                                                                                                       \
  if (run_command(FASTTRAIN_TORCH_PYTHON " -c 'import torch.distributed.run'").exit_code != 0) {          \
    GTEST_SKIP() << "needs torchrun: " FASTTRAIN_TORCH_PYTHON " with PyTorch 2.x (scripts/install-deps)"; \
  }

std::string torchrun(int nproc, const std::string& options = "") {
  // The underscored options: PyTorch 1.13 knows only those, 2.x both spellings.
  return std::string(FASTTRAIN_TORCH_PYTHON) + " -m torch.distributed.run --nproc_per_node " +
         std::to_string(nproc) + " --master_port " + std::to_string(free_tcp_port()) + options +
         " --no_python " + kCli + " train";
}

// The process of `rank` among the workers whose command line names `run_dir` (-1 if none).
pid_t worker_of_rank(const std::string& run_dir, int rank) {
  const std::string rank_variable = "RANK=" + std::to_string(rank);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string command = testing::read_text(entry.path().string() + "/cmdline");
    if (command.rfind(kCli, 0) != 0 || command.find(run_dir) == std::string::npos) continue;
    std::string environment = testing::read_text(entry.path().string() + "/environ");
    std::replace(environment.begin(), environment.end(), '\0', '\n');
    if (("\n" + environment).find("\n" + rank_variable + "\n") != std::string::npos) return std::stoi(name);
  }
  return -1;
}

// A run to the end under torchrun trains what fasttrain's own launcher trains, byte for byte; the ranks
// take the cores' share, not torchrun's OMP_NUM_THREADS=1, and say so.
TEST_F(DistRun, TorchrunTrainsToTheEndAsFasttrainLaunchDoes) {
  FT_REQUIRE_TORCHRUN();
  testing::TempDir dir;
  const std::string run_args = kRun + " --set data.batch_size=32 --set train.threads=auto";
  auto ours = run_command(launch(2) + run_args + " --run-dir " + dir.file("launch"));
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  auto theirs = run_command(torchrun(2) + run_args + " --run-dir " + dir.file("torchrun"));
  ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
  EXPECT_TRUE(testing::read_text(dir.file("launch/final/model.safetensors")) ==
              testing::read_text(dir.file("torchrun/final/model.safetensors")));
  EXPECT_EQ(summary_of(dir.file("torchrun"))["dist"]["world_size"], 2);
  EXPECT_NE(theirs.output.find("not OMP_NUM_THREADS=1"), std::string::npos) << theirs.output;
}

// A LibTorch 1.x build under a 2.x torchrun would wait forever in the rendezvous: it is refused at once.
TEST(DistEnv, ALibTorch1BuildRefusesTheStoreOfATorchrun2) {
  if (TORCH_VERSION_MAJOR >= 2) GTEST_SKIP() << "a LibTorch 2.x build talks to torchrun 2.x's store";
  RendezvousEnv env({{"RANK", "0"},
                     {"WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "127.0.0.1"},
                     {"MASTER_PORT", std::to_string(free_tcp_port())},
                     {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                     {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT"}});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(testing::contains_all(testing::error_message([] {
                                      ProcessGroup::create(*DistEnv::from_environment(),
                                                           DistOptions().timeout_s(20));
                                    }),
                                    {"LibTorch 1.", "PyTorch 2.x", "fasttrain launch"}));
  EXPECT_LT(seconds_since(start), 5);
}

// A rank still waiting for the others has nothing to save: a stop signal ends it at once (torchrun
// SIGTERMs a group whose rank failed, and SIGKILLs what still runs 30 s later).
TEST_F(DistRun, ARankWaitingInTheRendezvousStopsAtOnceOnSigterm) {
  testing::TempDir dir;
  const pid_t lone = testing::spawn_command(
      "env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_tcp_port()) + " " +
      kCli + " train" + kRun + " --set dist.timeout_s=60 --run-dir " + dir.file("run") + " >" +
      dir.file("log") + " 2>&1");
  std::this_thread::sleep_for(std::chrono::seconds(3));  // built, and waiting for rank 1
  ASSERT_EQ(::kill(lone, SIGTERM), 0);
  const auto signalled_at = std::chrono::steady_clock::now();
  EXPECT_EQ(testing::wait_exit_code(lone), 128 + SIGTERM) << testing::read_text(dir.file("log"));
  EXPECT_LT(seconds_since(signalled_at), 2.0);
  EXPECT_NE(testing::read_text(dir.file("log")).find("stopped by a signal before training started"),
            std::string::npos)
      << testing::read_text(dir.file("log"));
}

// torchrun's summary quotes the failing rank's error from the file torchelastic's @record would write.
TEST_F(DistRun, TorchrunsSummaryNamesAFailingRanksError) {
  FT_REQUIRE_TORCHRUN();
  testing::TempDir dir;
  auto failed =
      run_command(torchrun(2) + kRun + " --set data.dataset=idx --set data.path=" + dir.file("absent") +
                  " --run-dir " + dir.file("run"));
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_TRUE(testing::contains_all(
      failed.output,
      {"error_file: /", "traceback : fasttrain.ConfigError: data.path", "absent", "is not a directory"}))
      << failed.output;
  EXPECT_EQ(failed.output.find("error_file: <N/A>"), std::string::npos) << failed.output;
}

// SIGTERM to torchrun: it passes the signal to its ranks, every one stops at the same step with a
// checkpoint, and the same command with --resume ends where a run that never stopped ends.
TEST_F(DistRun, SigtermToTorchrunCheckpointsEveryRankAndTheResumeEndsBitIdentical) {
  FT_REQUIRE_TORCHRUN();
  const std::string run_args = kRun + " --set train.max_steps=600 --set data.batch_size=32 --set dist.zero=2";
  testing::TempDir dir;
  auto straight = run_command(launch(2) + run_args + " --run-dir " + dir.file("straight"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string run = dir.file("stopped");
  const std::string command = torchrun(2) + run_args + " --run-dir " + run;
  const pid_t agent = testing::spawn_command(command + " >" + dir.file("log") + " 2>&1");
  ASSERT_TRUE(reached_step(run, 50, 60)) << testing::read_text(dir.file("log"));
  ASSERT_EQ(::kill(agent, SIGTERM), 0);
  EXPECT_NE(testing::wait_exit_code(agent), 0);
  auto checkpoints = list_checkpoints(run + "/checkpoints");
  ASSERT_EQ(checkpoints.size(), 1u) << testing::read_text(dir.file("log"));
  EXPECT_LT(checkpoints[0].step, 600);
  for (const char* file : {"rng-rank0.safetensors", "rng-rank1.safetensors", "optimizer-rank1.safetensors"})
    EXPECT_TRUE(fs::exists(checkpoints[0].dir + "/" + file)) << file;
  std::printf("[          ] torchrun's ranks stopped at step %lld\n",
              static_cast<long long>(checkpoints[0].step));

  auto resumed = run_command(command + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(testing::read_text(dir.file("straight") + "/final/model.safetensors") ==
              testing::read_text(run + "/final/model.safetensors"))
      << "the resumed run's weights differ from the straight run's";
  EXPECT_EQ(summary_of(run)["steps"], 600);
}

// torchrun --max-restarts: a rank killed mid-run makes torchrun restart the group with the same command,
// whose --resume continues from the newest checkpoint; the run ends where one that never failed ends.
TEST_F(DistRun, TorchrunRestartsAKilledRankAndTheGroupContinuesBitIdentical) {
  FT_REQUIRE_TORCHRUN();
  const std::string run_args = kRun +
                               " --set train.max_steps=600 --set data.batch_size=32 --set dist.zero=2"
                               " --set checkpoint.every_steps=100";
  testing::TempDir dir;
  auto straight = run_command(launch(2) + run_args + " --run-dir " + dir.file("straight"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string run = dir.file("restarted");
  const pid_t agent =
      testing::spawn_command(torchrun(2, " --max_restarts 1 --monitor_interval 0.2") + run_args +
                             " --run-dir " + run + " --resume >" + dir.file("log") + " 2>&1");
  ASSERT_TRUE(reached_step(run, 150, 90)) << testing::read_text(dir.file("log"));
  const pid_t rank1 = worker_of_rank(run, 1);
  ASSERT_GT(rank1, 0) << "rank 1 of torchrun's group not found";
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);
  const int code = testing::wait_exit_code(agent);
  const std::string log = testing::read_text(dir.file("log"));
  ASSERT_EQ(code, 0) << log;
  EXPECT_TRUE(testing::contains_all(
      log, {"resuming from", "step-", "after a restart of the job (TORCHELASTIC_RESTART_COUNT=1)"}))
      << log;
  EXPECT_TRUE(testing::read_text(dir.file("straight") + "/final/model.safetensors") ==
              testing::read_text(run + "/final/model.safetensors"))
      << "the restarted run's weights differ from the straight run's";
  EXPECT_EQ(summary_of(run)["steps"], 600);
}

// Slurm's pre-emption warning (sbatch --signal=USR1@90 signals every task): each rank checkpoints at the
// same step and exits with 138, the code the job script requeues on; the requeued job (SLURM_RESTART_COUNT
// set) resumes with the same command and ends bit-identical to a run that was never stopped. Without
// --resume the restart is refused with what to add.
TEST_F(DistRun, SlurmsPreemptionSignalCheckpointsAndTheRequeuedJobEndsBitIdentical) {
  const std::string run_args = kRun + " --set train.max_steps=600 --set data.batch_size=32";
  testing::TempDir dir;
  auto straight = run_command(launch(2) + run_args + " --run-dir " + dir.file("straight"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string run = dir.file("preempted");
  const int port = free_tcp_port();
  auto slurm_task = [&](int rank, const std::string& extra_env) {
    return "env SLURM_PROCID=" + std::to_string(rank) + " SLURM_LOCALID=" + std::to_string(rank) +
           " SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
           std::to_string(port) + extra_env + " " + kCli + " train" + run_args + " --run-dir " + run +
           " --resume";
  };
  const pid_t rank0 = testing::spawn_command(slurm_task(0, "") + " >" + dir.file("log0") + " 2>&1");
  const pid_t rank1 = testing::spawn_command(slurm_task(1, "") + " >" + dir.file("log1") + " 2>&1");
  ASSERT_TRUE(reached_step(run, 50, 60)) << testing::read_text(dir.file("log0"));
  ASSERT_EQ(::kill(rank0, SIGUSR1), 0);
  ASSERT_EQ(::kill(rank1, SIGUSR1), 0);
  EXPECT_EQ(testing::wait_exit_code(rank0), 128 + SIGUSR1) << testing::read_text(dir.file("log0"));
  EXPECT_EQ(testing::wait_exit_code(rank1), 128 + SIGUSR1) << testing::read_text(dir.file("log1"));
  auto checkpoints = list_checkpoints(run + "/checkpoints");
  ASSERT_EQ(checkpoints.size(), 1u) << testing::read_text(dir.file("log0"));
  EXPECT_LT(checkpoints[0].step, 600);
  std::printf("[          ] the ranks stopped at step %lld on SIGUSR1\n",
              static_cast<long long>(checkpoints[0].step));

  auto forgotten =
      run_command("env SLURM_RESTART_COUNT=1 " + kCli + " train" + run_args + " --run-dir " + run);
  EXPECT_NE(forgotten.exit_code, 0) << forgotten.output;
  EXPECT_TRUE(
      testing::contains_all(forgotten.output, {"restart of the job (SLURM_RESTART_COUNT=1)", "--resume"}))
      << forgotten.output;

  const pid_t again0 =
      testing::spawn_command(slurm_task(0, " SLURM_RESTART_COUNT=1") + " >" + dir.file("log0") + " 2>&1");
  const pid_t again1 =
      testing::spawn_command(slurm_task(1, " SLURM_RESTART_COUNT=1") + " >" + dir.file("log1") + " 2>&1");
  EXPECT_EQ(testing::wait_exit_code(again0), 0) << testing::read_text(dir.file("log0"));
  EXPECT_EQ(testing::wait_exit_code(again1), 0) << testing::read_text(dir.file("log1"));
  EXPECT_NE(testing::read_text(dir.file("log0")).find("after a restart of the job (SLURM_RESTART_COUNT=1)"),
            std::string::npos)
      << testing::read_text(dir.file("log0"));
  EXPECT_TRUE(testing::read_text(dir.file("straight") + "/final/model.safetensors") ==
              testing::read_text(run + "/final/model.safetensors"))
      << "the requeued run's weights differ from the straight run's";
  EXPECT_EQ(summary_of(run)["steps"], 600);
}

// ---------------------------------------------------------------------------------------------
// The launcher
// ---------------------------------------------------------------------------------------------

TEST(Launch, AFailingRankStopsTheOthersAndItsCodeIsReturned) {
  // Rank 1 fails; rank 2 ignores SIGTERM (and so does its child), so the grace period ends in SIGKILL
  // of its whole process group.
  const auto start = std::chrono::steady_clock::now();
  auto result =
      run_command(kCli +
                  " launch --nproc 3 --grace-s 1 -- sh -c 'if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 3; fi;"
                  " trap \"\" TERM; sleep 61.25; true'");
  const double took = seconds_since(start);
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_LT(took, 15) << result.output;
  EXPECT_TRUE(testing::contains_all(result.output, {"rank 1 exited with code 3", "stopping the other 2"}))
      << result.output;
  EXPECT_NE(run_command("pgrep -f 'sleep 61[.]25'").exit_code, 0) << "a rank's child outlived the launcher";
}

// The case end to end: a training rank killed under the launcher. The survivor fails at once
// (its connection is reset), the launcher returns non-zero, and no rank is left running.
TEST_F(DistRun, ATrainingRankKilledUnderTheLauncherEndsTheJob) {
  testing::TempDir dir;
  const pid_t launcher = testing::spawn_command(
      launch(2) + kRun + " --set train.max_steps=1000000 --set data.batch_size=32 --run-dir " +
      dir.file("run") + " >" + dir.file("log") + " 2>&1");
  ASSERT_TRUE(reached_step(dir.file("run"), 20, 60)) << testing::read_text(dir.file("log"));
  auto children = run_command("pgrep -P " + std::to_string(launcher));
  std::istringstream pids(children.output);
  std::vector<pid_t> ranks;
  for (pid_t pid; pids >> pid;) ranks.push_back(pid);
  ASSERT_EQ(ranks.size(), 2u) << children.output;
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(ranks[1], SIGKILL), 0);
  const int code = testing::wait_exit_code(launcher);
  const double waited = seconds_since(killed_at);
  const std::string log = testing::read_text(dir.file("log"));
  EXPECT_NE(code, 0) << log;
  EXPECT_LT(waited, 300 + 5) << log;  // dist.timeout_s's default; a reset connection ends it at once
  EXPECT_TRUE(testing::contains_all(log, {"was killed by signal 9", "error: rank 0 of 2 on "})) << log;
  for (pid_t rank : ranks) EXPECT_NE(::kill(rank, 0), 0) << "rank " << rank << " is still running";
  std::printf("[          ] the launcher returned %d, %.2f s after the kill\n", code, waited);
}

TEST(Launch, SetsTheRendezvousVariablesOfEachRank) {
  auto result = run_command(kCli +
                            " launch --nproc 2 -- sh -c 'echo rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK "
                            "addr=$MASTER_ADDR port=$MASTER_PORT'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(testing::contains_all(result.output, {"rank=0/2 local=0 addr=127.0.0.1", "rank=1/2 local=1"}))
      << result.output;
}

// channels_last conv kernels under DDP: the bucket views follow each kernel's layout, including the first
// conv's over one input channel, so the reducer neither warns nor copies.
TEST_F(DistRun, ChannelsLastConvNetTrainsWithoutTheReducersStrideWarning) {
  testing::TempDir dir;
  auto result =
      run_command(launch(2) + " --set model.name=cnn --set model.widths=[8,16] --set model.hidden=[32]" +
                  " --set train.channels_last=true --set train.max_steps=3 --set data.train_limit=512" +
                  " --set data.batch_size=32 --set train.threads=1 --set data.workers=0" +
                  " --set log.progress=none --set train.eval_every_steps=0 --set train.device=cpu" +
                  " --run-dir " + dir.file("run"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("Grad strides do not match"), std::string::npos) << result.output;
}

TEST(Launch, BadUsageIsAClearError) {
  auto no_command = run_command(kCli + " launch --nproc 2");
  EXPECT_EQ(no_command.exit_code, 2) << no_command.output;
  auto missing = run_command(kCli + " launch --nproc 2 -- /nonexistent/program");
  EXPECT_EQ(missing.exit_code, 127) << missing.output;
  EXPECT_TRUE(testing::contains_all(missing.output, {"cannot run '/nonexistent/program'"})) << missing.output;
  auto nccl =
      run_command(kCli + " launch --nproc 1 -- " + kCli + " train" + kRun + " --set dist.backend=nccl");
  EXPECT_EQ(nccl.exit_code, 2) << nccl.output;
  EXPECT_TRUE(testing::contains_all(
      nccl.output, {"dist.backend = \"nccl\"", built_with_nccl() ? "trains on the CPU" : "without NCCL"}))
      << nccl.output;
  auto zero = run_command(kCli + " train" + kRun + " --set dist.zero=4");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_TRUE(testing::contains_all(zero.output, {"dist.zero must be 0, 1, 2 or 3, got 4"})) << zero.output;
  auto ema = run_command(kCli + " launch --nproc 1 -- " + kCli + " train" + kRun +
                         " --set dist.zero=3 --set ema.enabled=true");
  EXPECT_EQ(ema.exit_code, 2) << ema.output;
  EXPECT_TRUE(testing::contains_all(ema.output, {"ema.enabled = true", "dist.zero = 3"})) << ema.output;
  auto muon = run_command(kCli + " launch --nproc 1 -- " + kCli + " train" + kRun +
                          " --set dist.zero=1 --set optim.name=muon");
  EXPECT_EQ(muon.exit_code, 2) << muon.output;
  EXPECT_TRUE(testing::contains_all(muon.output, {"dist.zero = 1", "'muon'", "dist.zero = 0"}))
      << muon.output;
}

// ---------------------------------------------------------------------------------------------
// Two hosts on this machine: network namespaces joined by a veth pair, one rank on each, talking over
// the link as two machines would (their own addresses, MASTER_ADDR on the other host, GLOO_SOCKET_IFNAME)
// ---------------------------------------------------------------------------------------------

// Two network namespaces ("hosts") joined by a veth pair: host h at 10.213.<k>.<h + 1>/24 on the
// interface ft<pid><a|b>. Made as root; `unavailable()` says why not elsewhere. Everything still
// running inside is killed, and both namespaces are removed, when the object ends.
class TwoHosts {
 public:
  TwoHosts() {
    if (::geteuid() != 0) {
      unavailable_ = "making network namespaces needs root (ip netns add)";
      return;
    }
    const std::string id = "ft" + std::to_string(::getpid());
    subnet_ = "10.213." + std::to_string(::getpid() % 250);
    for (int h : {0, 1}) names_[h] = id + (h == 0 ? "a" : "b");
    const std::string script =
        "set -e; ip netns add " + names_[0] + "; ip netns add " + names_[1] + "; ip link add " + names_[0] +
        " type veth peer name " + names_[1] + "; for h in " + names_[0] + " " + names_[1] +
        "; do ip link set $h netns $h; ip -n $h link set lo up; ip -n $h link set $h up; done; ip -n " +
        names_[0] + " addr add " + address(0) + "/24 dev " + names_[0] + "; ip -n " + names_[1] +
        " addr add " + address(1) + "/24 dev " + names_[1] + "; ip netns exec " + names_[1] + " true";
    const testing::CommandResult made = run_command(script);
    if (made.exit_code != 0) unavailable_ = "cannot make network namespaces here: " + made.output;
  }
  ~TwoHosts() {
    for (int h : {0, 1}) {
      run_command("for pid in $(ip netns pids " + names_[h] +
                  " 2>/dev/null); do kill -9 $pid; done; ip netns del " + names_[h] + " 2>/dev/null");
    }
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  const std::string& unavailable() const { return unavailable_; }
  std::string address(int host) const { return subnet_ + "." + std::to_string(host + 1); }
  // `command` run on `host`, talking through its end of the link.
  std::string on(int host, const std::string& command) const {
    return "ip netns exec " + names_[host] + " env GLOO_SOCKET_IFNAME=" + names_[host] + " " + command;
  }
  void cut_link(int host) const {
    run_command("ip -n " + names_[host] + " link set " + names_[host] + " down");
  }
  // Whether any process still runs on either host.
  bool anything_running() const {
    return !run_command("ip netns pids " + names_[0] + "; ip netns pids " + names_[1]).output.empty();
  }

 private:
  std::string names_[2];
  std::string subnet_;
  std::string unavailable_;
};

#define FT_REQUIRE_TWO_HOSTS(hosts) \
  if (!(hosts).unavailable().empty()) GTEST_SKIP() << (hosts).unavailable()

// Rank `rank` of 2 on its host, with torchrun's variables or Slurm's (one task per node).
std::string rank_on_host(const TwoHosts& hosts, int rank, bool slurm, int port, const std::string& args) {
  const std::string variables =
      slurm
          ? "SLURM_PROCID=" + std::to_string(rank) + " SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=1"
          : "RANK=" + std::to_string(rank) + " WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1";
  return hosts.on(rank, "env " + variables + " MASTER_ADDR=" + hosts.address(0) +
                            " MASTER_PORT=" + std::to_string(port) + " " + kCli + " train" + args);
}

// DDP and ZeRO-3 across two hosts train what two ranks on one host train, byte for byte, whether the
// ranks were started by torchrun's variables or by Slurm's.
TEST_F(DistRun, DdpAndZero3AcrossTwoHostsEqualTwoRanksOnOneHost) {
  TwoHosts hosts;
  FT_REQUIRE_TWO_HOSTS(hosts);
  testing::TempDir dir;
  for (int zero : {0, 3}) {
    // Where OpenBLAS runs the fp32 matmuls (Debian's LibTorch 1.13), one thread of it on both sides:
    // "auto" gives a host's only rank the whole machine, and OpenBLAS sums in another order on 2 threads.
    const std::string blas = detect_hardware(torch::kCPU).openblas_pool ? " --set train.blas_threads=1" : "";
    const std::string args =
        kRun + blas + " --set data.batch_size=32 --set dist.zero=" + std::to_string(zero);
    const std::string local = dir.file("local" + std::to_string(zero));
    auto one_host = run_command(launch(2) + args + " --run-dir " + local);
    ASSERT_EQ(one_host.exit_code, 0) << one_host.output;
    for (bool slurm : {false, true}) {
      SCOPED_TRACE(fmt::format("dist.zero = {}, {}'s variables", zero, slurm ? "Slurm" : "torchrun"));
      const std::string run = dir.file(fmt::format("hosts{}{}", zero, slurm ? "slurm" : "torchrun"));
      const int port = free_tcp_port();
      const pid_t rank0 =
          testing::spawn_command(rank_on_host(hosts, 0, slurm, port, args + " --run-dir " + run) + " >" +
                                 dir.file("log0") + " 2>&1");
      const pid_t rank1 =
          testing::spawn_command(rank_on_host(hosts, 1, slurm, port, args + " --run-dir " + run) + " >" +
                                 dir.file("log1") + " 2>&1");
      EXPECT_EQ(testing::wait_exit_code(rank0), 0) << testing::read_text(dir.file("log0"));
      EXPECT_EQ(testing::wait_exit_code(rank1), 0) << testing::read_text(dir.file("log1"));
      EXPECT_TRUE(testing::read_text(local + "/final/model.safetensors") ==
                  testing::read_text(run + "/final/model.safetensors"))
          << "two hosts trained other weights than one";
      EXPECT_EQ(summary_of(run)["dist"]["world_size"], 2);
    }
  }
  EXPECT_FALSE(hosts.anything_running());
}

// A host that loses its rank (SIGKILL) or its link (the veth taken down) ends the job: the other rank
// fails within dist.timeout_s (and 5 s) with an error that names itself, its host and, where Gloo says
// which peer broke, that rank and its host; nothing is left running on either host.
TEST_F(DistRun, AHostThatLosesItsRankOrItsLinkEndsTheJobWithinTheTimeout) {
  TwoHosts hosts;
  FT_REQUIRE_TWO_HOSTS(hosts);
  const double timeout_s = 4;
  for (bool cut_link : {false, true}) {
    SCOPED_TRACE(cut_link ? "link taken down" : "rank killed");
    testing::TempDir dir;
    const std::string args = kRun +
                             " --set train.max_steps=1000000 --set data.batch_size=32 --set dist.timeout_s=" +
                             std::to_string(timeout_s) + " --run-dir " + dir.file("run");
    const int port = free_tcp_port();
    const pid_t rank0 = testing::spawn_command(rank_on_host(hosts, 0, /*slurm=*/cut_link, port, args) + " >" +
                                               dir.file("log0") + " 2>&1");
    const pid_t rank1 = testing::spawn_command(rank_on_host(hosts, 1, /*slurm=*/cut_link, port, args) + " >" +
                                               dir.file("log1") + " 2>&1");
    ASSERT_TRUE(reached_step(dir.file("run"), 20, 60)) << testing::read_text(dir.file("log0"));
    if (cut_link) {
      hosts.cut_link(1);
    } else {
      ASSERT_EQ(::kill(rank1, SIGKILL), 0);
    }
    const auto failed_at = std::chrono::steady_clock::now();
    const int code0 = testing::wait_exit_code(rank0);
    const double waited = seconds_since(failed_at);
    const int code1 = testing::wait_exit_code(rank1);
    const double both = seconds_since(failed_at);
    const std::string log0 = testing::read_text(dir.file("log0"));
    EXPECT_EQ(code0, 1) << log0;
    EXPECT_LT(both, timeout_s + 5) << log0;
    EXPECT_TRUE(testing::contains_all(
        log0, {"error: rank 0 of 2 on ", "(" + hosts.address(0) + ")", "failed", "dist.timeout_s"}))
        << log0;
    if (cut_link) {
      EXPECT_EQ(code1, 1) << testing::read_text(dir.file("log1"));
      EXPECT_TRUE(testing::contains_all(testing::read_text(dir.file("log1")),
                                        {"error: rank 1 of 2 on ", "(" + hosts.address(1) + ")"}));
    } else {
      EXPECT_EQ(code1, 128 + SIGKILL);
      EXPECT_TRUE(testing::contains_all(log0, {"(that is rank 1 on ", "(" + hosts.address(1) + ")"})) << log0;
    }
    EXPECT_FALSE(hosts.anything_running());
    std::printf("[          ] %s: rank 0 exited %.2f s after, both %.2f s\n",
                cut_link ? "link down" : "rank 1 killed", waited, both);
  }
}

}  // namespace
}  // namespace fasttrain
