#pragma once
// The process group of a distributed run: PyTorch's c10d (Gloo for CPU tensors; NCCL or Gloo for CUDA
// tensors, dist.backend) set up from the environment that torchrun, Slurm's srun or `fasttrain launch`
// give each process.
//
//   // torchrun --nproc-per-node 2 --no-python fasttrain train cfg.toml   (or: fasttrain launch --nproc 2 --
//   ...) if (std::optional<fasttrain::DistEnv> env = fasttrain::DistEnv::from_environment()) {
//     auto group = fasttrain::ProcessGroup::create(*env, fasttrain::DistOptions().timeout_s(60));
//     torch::Tensor loss_sum = ...;
//     group->all_reduce(loss_sum);   // summed over ranks, in place
//   }
//
// Every collective waits at most dist.timeout_s: a rank that died or hangs makes the others fail
// with an Error naming the collective, the rank and the timeout instead of waiting forever.
#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"

namespace c10d {
class ProcessGroup;
}

namespace fasttrain {

// [dist]: how ranks talk and what they shard.
struct DistOptions {
  FT_KEYS(DistOptions);
  FT_KEY(
      std::string, backend,
      "Collectives of a distributed run (torchrun, srun or fasttrain launch): auto (nccl on CUDA when each "
      "rank on a machine has a GPU of its own, else gloo), gloo (ranks may share a GPU; CUDA tensors go "
      "through the host) or nccl (CUDA, a GPU per rank, a LibTorch with NCCL; CPU tensors still take "
      "gloo). The NCCL group has run on one rank of an H200, not yet across GPUs",
      one_of({"auto", "gloo", "nccl"}), KeyTrait::kNeutral) = "auto";
  FT_KEY(
      double, timeout_s,
      "Longest wait of the rendezvous or any collective: a rank that died or hangs fails the others after it",
      above(0), KeyTrait::kNeutral) = 300;
  FT_KEY(double, bucket_cap_mb,
         "DDP gradient buckets, MiB: each is all-reduced as soon as backward has filled it", above(0),
         KeyTrait::kNeutral) = 25;
  FT_KEY(int, zero,
         "0 = DDP; 1 = ZeRO-1 (optimizer state sharded across ranks); 2 = ZeRO-2 (and gradients, "
         "reduce-scattered); 3 = fully sharded (and each block's parameters, gathered for its forward and "
         "backward)",
         KeyRule<int>([](const std::string& key, const int& value) {
           FT_CONFIG_CHECK(value >= 0 && value <= 3, "{} must be 0, 1, 2 or 3, got {}", key, value);
         }),
         KeyTrait::kNeutral) = 0;
  FT_KEY(bool, broadcast_buffers,
         "Before each forward, rank 0's buffers (BatchNorm statistics) replace the other ranks' (as DDP)",
         KeyTrait::kNeutral) = true;
};

// Where this process sits in the job, read from the environment.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // ranks on this machine
  std::string master_addr;
  int master_port = 0;
  std::string source;  // "torchrun" (RANK/WORLD_SIZE, also fasttrain launch) or "slurm"

  // torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
  // when RANK is set; else Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
  // SLURM_NTASKS_PER_NODE, with MASTER_ADDR and MASTER_PORT, default 29500, from the job script)
  // when SLURM_PROCID and SLURM_NTASKS are; else nullopt: one process.
  // A missing or malformed variable is an Error naming it and its value.
  static std::optional<DistEnv> from_environment();
};

// Reduction of all_reduce.
enum class ReduceOp { kSum, kMax };

// What decides dist.backend "auto", and whether "nccl" can work (see choose_backend).
struct BackendFacts {
  torch::DeviceType device = torch::kCPU;  // the run's
  int local_ranks = 1;                     // ranks on this machine
  int gpus = 0;                            // GPUs they spread over: those visible, 1 under "cuda:N"
  bool visible_devices_set = false;        // CUDA_VISIBLE_DEVICES is set: each rank may see a GPU of its own
};
// The facts of this process for train.device = `device_spec` with `local_ranks` ranks on this machine.
BackendFacts backend_facts(const std::string& device_spec, int local_ranks);

// dist.backend resolved: "nccl" or "gloo", and why "auto" took gloo for a CUDA run ("" otherwise).
// "auto" takes NCCL where the machine's ranks spread over as many GPUs; "nccl" where it cannot work (a
// CPU run, a build without NCCL, ranks that certainly share a GPU: NCCL refuses two ranks on one
// device) is a ConfigError naming the reason.
struct BackendChoice {
  std::string backend;
  std::string reason;
};
BackendChoice choose_backend(const std::string& requested, const BackendFacts& facts);
// Whether this fasttrain was built with NCCL (against a CUDA LibTorch 2.x, with nccl.h).
bool built_with_nccl();

class ProcessGroup {
 public:
  // Rendezvous at master_addr:master_port (rank 0 serves the TCP store) and connect every rank, with
  // the backend choose_backend picks for a run on train.device = `device_spec` (every rank must pick
  // rank 0's: one that differs is a ConfigError). Fails after options.timeout_s with the ranks that did
  // not arrive.
  static std::shared_ptr<ProcessGroup> create(const DistEnv& env, const DistOptions& options,
                                              const std::string& device_spec = "cpu");
  ~ProcessGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ranks on this machine (they share its cores), and this one's index among them (its GPU).
  int local_size() const { return local_size_; }
  int local_rank() const { return local_rank_; }
  // "gloo" or "nccl" (for CUDA tensors; CPU tensors always take gloo), and why auto took gloo on CUDA.
  const std::string& backend() const { return backend_; }
  const std::string& backend_reason() const { return backend_reason_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // In place, on every rank.
  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // `tensors` of rank `root` copied into everyone's, in few messages (c10d::broadcast_coalesced).
  void broadcast(std::vector<torch::Tensor>& tensors, int root = 0);
  // `outputs[r]` = rank r's `input` (all the same shape); outputs may be views into one buffer.
  void all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input);
  // Reduce-scatter by sum: `input` is [size() x chunk]; returns this rank's chunk summed over ranks.
  // (Gloo in LibTorch 1.13 has no reduce_scatter: an all-to-all and a local sum, the same bytes.)
  torch::Tensor reduce_scatter(const torch::Tensor& input);
  void barrier();
  // Rank `root`'s `text` on every rank (through the TCP store).
  std::string broadcast_string(const std::string& text, int root = 0);
  // True on every rank when `flag` is true on any (stop requests, errors).
  bool any(bool flag);

  // Ends the NCCL communicators (c10d's shutdown, as torch.distributed.destroy_process_group), or with
  // `abort` without waiting for collectives in flight (after a failure: a dead peer never joins them);
  // nothing for Gloo. No collective may follow.
  void shutdown(bool abort = false);

  // Runs `work` (collectives launched elsewhere, such as the Reducer's inside backward); a failure
  // becomes an Error that says which rank failed in which collective and what to look at.
  void guard(const char* what, const std::function<void()>& work);

  // Rank `rank`'s machine, as it said at the start: "node3 (10.0.0.3)" (its name, and the address its
  // collectives use). Errors name it.
  std::string host(int rank) const;

  // The c10d group, for c10d::Reducer.
  const c10::intrusive_ptr<c10d::ProcessGroup>& c10d_group() const;

  // Bytes this rank sent into collectives so far (algorithmic: what a ring or pairwise exchange
  // moves per rank), for the benchmarks.
  int64_t bytes_sent() const { return bytes_sent_; }
  void add_bytes_sent(int64_t bytes) { bytes_sent_ += bytes; }

 private:
  struct Impl;
  ProcessGroup() = default;

  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
  int local_size_ = 1;
  int local_rank_ = 0;
  std::string backend_;
  std::string backend_reason_;
  std::chrono::milliseconds timeout_{0};
  int64_t strings_ = 0;
  int64_t bytes_sent_ = 0;
};

// The process group of this process, created from the environment on the first call (nullptr when
// the environment names no distributed job) and kept for the life of the process, like
// torch.distributed's default group. `device_spec` is the run's train.device: a CUDA run first makes
// its rank's GPU current (parse_device), and dist.backend "auto" takes NCCL where it can. A later call
// with another dist.backend or dist.timeout_s is a ConfigError (the group has them already).
std::shared_ptr<ProcessGroup> default_process_group(const DistOptions& options,
                                                    const std::string& device_spec = "cpu");
// Shuts the default group down and drops it, as torch.distributed.destroy_process_group() (`abort`: after
// a failure, see ProcessGroup::shutdown): call it before the process exits (the CLI does), while CUDA
// still runs; a later default_process_group is an Error.
void shutdown_default_process_group(bool abort = false);

}  // namespace fasttrain
