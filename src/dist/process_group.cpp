// c10d's Gloo (and, for CUDA tensors, NCCL) process group behind fasttrain's small collective interface.
#ifndef USE_C10D_GLOO  // ProcessGroupGloo.hpp declares the class only under it (Torch's CMake sets it)
#define USE_C10D_GLOO
#endif
#include "fasttrain/dist/process_group.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
// Against PyTorch 2.x's wheel, which ships no Gloo headers, ProcessGroupGloo.hpp is compiled with
// Debian's libgloo-dev (a 2022 snapshot); the Gloo built into the wheel's libtorch_cpu.so is a
// late-2025 one whose classes differ. That is safe because this file compiles no code that depends
// on Gloo's layouts: Gloo objects are only held through shared_ptr, and only ProcessGroupGloo's
// out-of-line members (in libtorch_cpu.so) are called. Keep it so: construct no GlooStore, call no
// inline ProcessGroupGloo member that touches Gloo (setTimeout), link no libgloo. The test
// Dist.NoGlooCodeCompiledAgainstForeignHeaders checks the object files.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#ifdef FASTTRAIN_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "fasttrain/detail/compat.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/device.h"

namespace fasttrain {

namespace {

std::optional<std::string> env_text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int env_int(const char* name, int min_value, std::optional<int> fallback = std::nullopt) {
  std::optional<std::string> text = env_text(name);
  if (!text) {
    FT_CHECK(fallback.has_value(), "environment variable {} is not set (a distributed launcher sets it)",
             name);
    return *fallback;
  }
  size_t used = 0;
  long value = 0;
  try {
    value = std::stol(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FT_CHECK(used == text->size() && value >= min_value && value <= 1 << 30,
           "environment variable {}='{}' is not an integer >= {}", name, *text, min_value);
  return static_cast<int>(value);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The local network device Gloo connects through: GLOO_SOCKET_IFNAME names it (as in PyTorch); a
// loopback master means every rank is on this machine; else the interface the hostname resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (auto interface = env_text("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(*interface);
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// The IPv4 address this rank's Gloo traffic leaves from: GLOO_SOCKET_IFNAME's, else the one the route
// to the master takes (a UDP "connect" sends nothing). "" where neither can be read.
std::string local_address(const std::string& master_addr) {
  if (auto interface = env_text("GLOO_SOCKET_IFNAME")) {
    ifaddrs* all = nullptr;
    if (getifaddrs(&all) != 0) return "";
    std::string found;
    for (ifaddrs* at = all; at != nullptr && found.empty(); at = at->ifa_next) {
      if (at->ifa_addr == nullptr || at->ifa_addr->sa_family != AF_INET || *interface != at->ifa_name)
        continue;
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(at->ifa_addr)->sin_addr, text, sizeof text);
      found = text;
    }
    freeifaddrs(all);
    return found;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* master = nullptr;
  if (getaddrinfo(master_addr.c_str(), "9", &hints, &master) != 0) return "";
  std::string found;
  const int probe = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t length = sizeof local;
  if (probe >= 0 && connect(probe, master->ai_addr, master->ai_addrlen) == 0 &&
      getsockname(probe, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
    found = text;
  }
  if (probe >= 0) close(probe);
  freeaddrinfo(master);
  return found;
}

// A rank's machine: its name, and the address its collectives use ("" where it could not be read).
struct RankHost {
  std::string name, address;
  std::string describe() const { return address.empty() ? name : fmt::format("{} ({})", name, address); }
};

RankHost this_host(const std::string& master_addr) {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return {name, local_address(master_addr)};
}

// Every rank's host, through the store ("ADDRESS\nNAME" under one key per rank): read at the start, when
// every rank is still there to answer.
std::vector<RankHost> exchange_hosts(c10d::Store& store, int rank, int world_size, const RankHost& mine) {
  const std::string text = mine.address + "\n" + mine.name;
  store.set("fasttrain/host/" + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<RankHost> hosts;
  for (int other = 0; other < world_size; ++other) {
    const std::vector<uint8_t> bytes = store.get("fasttrain/host/" + std::to_string(other));
    const std::string got(bytes.begin(), bytes.end());
    const size_t newline = got.find('\n');
    hosts.push_back({got.substr(newline + 1), got.substr(0, newline)});
  }
  return hosts;
}

int64_t bytes_of(const torch::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

// torchrun's elastic agent serves the TCP store on MASTER_PORT itself and tells its workers so: every
// rank, rank 0 too, then connects as a client, as torch.distributed's env:// rendezvous does
// (torch/distributed/rendezvous.py, _create_c10d_store); a rank 0 that served its own would find the
// port taken. The agent makes a new store for each restart of the group.
bool agent_serves_the_store() {
  const char* value = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return value != nullptr && std::string(value) == "True";
}

// A torchrun of PyTorch 2.x (its agent sets variables 1.x's does not) serves a store whose protocol a
// LibTorch 1.x client does not speak: the rendezvous would hang, so it is refused before.
void check_agent_store_speaks_our_protocol(const DistEnv& env) {
  const bool libtorch_1 = std::string(compat::torch_version()).rfind("1.", 0) == 0;
  const bool agent_2 =
      std::getenv("TORCHELASTIC_SIGNALS_TO_HANDLE") || std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  FT_CHECK(
      !(agent_serves_the_store() && libtorch_1 && agent_2),
      "rank {}: this fasttrain is built against LibTorch {}, and its store client cannot talk to the store "
      "of this torchrun, from PyTorch 2.x (TORCHELASTIC_SIGNALS_TO_HANDLE is set): launch it with "
      "`fasttrain launch`, with the torchrun of PyTorch 1.x, or build fasttrain against PyTorch 2.x's "
      "LibTorch (scripts/build)",
      env.rank, compat::torch_version());
}

// The keys of this attempt of the group, as env:// gives a Python worker of torchrun 1.x: that agent keeps
// one store across the group's restarts, where a restarted group would otherwise read the keys of the
// attempt before (2.x's agent makes a new store each time: the prefix only names the keys there).
c10::intrusive_ptr<c10d::Store> attempt_keys(c10::intrusive_ptr<c10d::Store> store) {
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return c10::make_intrusive<c10d::PrefixStore>(
      std::string("/worker/attempt_") + (attempt != nullptr ? attempt : "0"), std::move(store));
}

// Every rank must build the same backend (a machine with fewer GPUs would take Gloo where the others
// take NCCL, and their first collective would hang): rank 0's choice, through the store, is the rule.
void agree_on_backend(c10d::Store& store, int rank, const BackendChoice& mine) {
  const std::string key = "fasttrain/backend";
  if (rank == 0) store.set(key, std::vector<uint8_t>(mine.backend.begin(), mine.backend.end()));
  const std::vector<uint8_t> bytes = store.get(key);
  const std::string chosen(bytes.begin(), bytes.end());
  FT_CONFIG_CHECK(
      chosen == mine.backend,
      "rank {} chose dist.backend = \"{}\"{} and rank 0 \"{}\": the ranks' machines differ (GPUs, "
      "ranks per machine); set dist.backend explicitly",
      rank, mine.backend, mine.reason.empty() ? "" : " (" + mine.reason + ")", chosen);
}

// The c10d group of a NCCL run: NCCL for CUDA tensors, `gloo` for the CPU ones (the stop flags, the
// evaluation's sums), as torch.distributed's "cpu:gloo,cuda:nccl". NCCL's keys go under their own prefix
// of the store, as torch.distributed gives each device's backend one.
c10::intrusive_ptr<c10d::ProcessGroup> nccl_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo>& gloo, std::chrono::milliseconds timeout) {
#ifdef FASTTRAIN_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      c10::make_intrusive<c10d::PrefixStore>("cuda/", store), rank, size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  return group;
#else
  (void)store, (void)rank, (void)size, (void)gloo, (void)timeout;
  FT_FAIL("this fasttrain was built without NCCL");
#endif
}

}  // namespace

bool built_with_nccl() {
#ifdef FASTTRAIN_NCCL
  return true;
#else
  return false;
#endif
}

BackendFacts backend_facts(const std::string& device_spec, int local_ranks) {
  BackendFacts facts;
  facts.device = parse_device(device_spec).type();
  facts.local_ranks = local_ranks;
  if (facts.device == torch::kCUDA) {
    const bool pinned = device_spec.find(':') != std::string::npos;  // "cuda:N": every rank on GPU N
    facts.gpus = pinned ? 1 : static_cast<int>(torch::cuda::device_count());
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  facts.visible_devices_set = visible != nullptr && *visible != '\0';
  return facts;
}

BackendChoice choose_backend(const std::string& requested, const BackendFacts& facts) {
  const bool cuda = facts.device == torch::kCUDA;
  const int local_ranks = facts.local_ranks, gpus = facts.gpus;
  if (requested == "gloo") return {"gloo", ""};
  const std::string sharing =
      fmt::format("{} ranks on this machine share its {} GPU{}", local_ranks, gpus, gpus == 1 ? "" : "s");
  if (requested == "nccl") {
    FT_CONFIG_CHECK(
        built_with_nccl(),
        "dist.backend = \"nccl\": this fasttrain is built against LibTorch without NCCL (or without "
        "nccl.h); use \"gloo\" (or \"auto\")");
    FT_CONFIG_CHECK(cuda,
                    "dist.backend = \"nccl\" moves CUDA tensors, but the run trains on the CPU; use \"gloo\" "
                    "(or \"auto\")");
    // With CUDA_VISIBLE_DEVICES set, each rank may see a GPU of its own as its first (srun --gpus-per-task).
    FT_CONFIG_CHECK(
        local_ranks <= gpus || facts.visible_devices_set,
        "dist.backend = \"nccl\" needs a GPU per rank, and {} (NCCL refuses two ranks on one device): "
        "use \"gloo\" (or \"auto\"), or start at most {} rank{} a machine",
        sharing, gpus, gpus == 1 ? "" : "s");
    return {"nccl", ""};
  }
  FT_CONFIG_CHECK(requested == "auto", "dist.backend must be auto, gloo or nccl, got \"{}\"", requested);
  if (!cuda) return {"gloo", ""};
  if (!built_with_nccl()) return {"gloo", "this fasttrain is built without NCCL"};
  if (local_ranks > gpus) {
    const std::string bound =
        facts.visible_devices_set
            ? "; where CUDA_VISIBLE_DEVICES gives each rank its own, set dist.backend = \"nccl\""
            : "";
    return {"gloo", sharing + " (NCCL needs one each" + bound + ")"};
  }
  return {"nccl", ""};
}

std::optional<DistEnv> DistEnv::from_environment() {
  DistEnv env;
  if (env_text("RANK")) {
    env.source = "torchrun";
    env.rank = env_int("RANK", 0);
    env.world_size = env_int("WORLD_SIZE", 1);
    env.local_rank = env_int("LOCAL_RANK", 0, 0);
    env.local_world_size = env_int("LOCAL_WORLD_SIZE", 1, 1);
    env.master_port = env_int("MASTER_PORT", 1);
  } else if (env_text("SLURM_PROCID") && env_text("SLURM_NTASKS")) {
    env.source = "slurm";
    env.rank = env_int("SLURM_PROCID", 0);
    env.world_size = env_int("SLURM_NTASKS", 1);
    env.local_rank = env_int("SLURM_LOCALID", 0, 0);
    // "4", or "4(x2)" for 2 nodes of 4: the count of this job's first nodes.
    if (auto per_node = env_text("SLURM_NTASKS_PER_NODE"))
      env.local_world_size = std::max(1, std::atoi(per_node->c_str()));
    env.master_port = env_int("MASTER_PORT", 1, 29500);
  } else {
    return std::nullopt;
  }
  std::optional<std::string> addr = env_text("MASTER_ADDR");
  FT_CHECK(addr.has_value(),
           "MASTER_ADDR is not set: the host of rank 0 (under Slurm: export MASTER_ADDR=$(scontrol show "
           "hostnames \"$SLURM_JOB_NODELIST\" | head -n 1))");
  env.master_addr = *addr;
  FT_CHECK(env.master_port <= 65535, "MASTER_PORT={} is not a TCP port (1-65535)", env.master_port);
  FT_CHECK(env.rank < env.world_size, "rank {} ({}) is not below the world size {}", env.rank,
           env.source == "slurm" ? "SLURM_PROCID" : "RANK", env.world_size);
  return env;
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::vector<RankHost> hosts;  // rank r's

  // The other ranks whose address a Gloo error names ("Read error [10.0.0.2]:18070: ..."), as "rank 1
  // on node2 (10.0.0.2)" (ranks sharing a machine: "rank 1 ... or rank 2 ..."); "" for none.
  std::string peers_named_in(const std::string& message, int self) const {
    std::vector<std::string> named;
    for (size_t rank = 0; rank < hosts.size(); ++rank) {
      const RankHost& host = hosts[rank];
      if (static_cast<int>(rank) == self || host.address.empty()) continue;
      if (message.find("[" + host.address + "]") != std::string::npos)
        named.push_back(fmt::format("rank {} on {}", rank, host.describe()));
    }
    return fmt::format("{}", fmt::join(named, " or "));
  }
};

std::shared_ptr<ProcessGroup> ProcessGroup::create(const DistEnv& env, const DistOptions& options,
                                                   const std::string& device_spec) {
  check_keys(options, "dist");
  const BackendChoice backend =
      choose_backend(options.backend(), backend_facts(device_spec, env.local_world_size));
  std::shared_ptr<ProcessGroup> result(new ProcessGroup());
  result->impl_ = std::make_unique<Impl>();
  result->rank_ = env.rank;
  result->size_ = env.world_size;
  result->local_size_ = env.local_world_size;
  result->local_rank_ = env.local_rank;
  result->backend_ = backend.backend;
  result->backend_reason_ = backend.reason;
  result->timeout_ = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s() * 1000));

  check_agent_store_speaks_our_protocol(env);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0 && !agent_serves_the_store();
  store_options.numWorkers = static_cast<size_t>(env.world_size);
  store_options.waitWorkers = true;
  store_options.timeout = result->timeout_;
  try {
    result->impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    if (agent_serves_the_store()) result->impl_->store = attempt_keys(result->impl_->store);
    agree_on_backend(*result->impl_->store, env.rank, backend);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(result->timeout_);
    gloo_options->devices.push_back(gloo_device(env.master_addr));
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(result->impl_->store, env.rank, env.world_size,
                                                            gloo_options);
    result->impl_->group =
        backend.backend == "nccl"
            ? nccl_process_group(result->impl_->store, env.rank, env.world_size, gloo, result->timeout_)
            : compat::gloo_process_group<c10d::ProcessGroup>(result->impl_->store, env.rank, env.world_size,
                                                             gloo);
    result->impl_->hosts =
        exchange_hosts(*result->impl_->store, env.rank, env.world_size, this_host(env.master_addr));
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& error) {
    std::string message = error.what();
    message = message.substr(0, message.find("\nException raised from"));
    FT_FAIL(
        "rank {} of {}: the rendezvous at {}:{} ({}) failed within dist.timeout_s = {}: {}. Check that every "
        "rank started with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE and that {} can listen on the "
        "port",
        env.rank, env.world_size, env.master_addr, env.master_port,
        agent_serves_the_store() ? "torchrun's agent store" : env.source, options.timeout_s(), message,
        agent_serves_the_store() ? "torchrun's agent" : "rank 0");
  }
  return result;
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::host(int rank) const {
  return rank >= 0 && static_cast<size_t>(rank) < impl_->hosts.size()
             ? impl_->hosts[static_cast<size_t>(rank)].describe()
             : "an unknown host";
}

const c10::intrusive_ptr<c10d::ProcessGroup>& ProcessGroup::c10d_group() const {
  return impl_->group;
}

void ProcessGroup::guard(const char* what, const std::function<void()>& work) {
  try {
    work();
  } catch (const std::exception& error) {
    std::string message = error.what();
    message = message.substr(0, message.find("\nException raised from"));
    const std::string peers = impl_->peers_named_in(message, rank_);
    FT_FAIL(
        "rank {} of {} on {}: {} failed: {}{}. Another rank probably exited or hung (see its log; the "
        "launcher stops the others); collectives wait at most dist.timeout_s = {} s",
        rank_, size_, host(rank_), what, message, peers.empty() ? "" : " (that is " + peers + ")",
        timeout_.count() / 1000.0);
  }
}

void ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  options.timeout = timeout_;
  std::vector<at::Tensor> tensors{tensor};
  guard("all-reduce", [&] { impl_->group->allreduce(tensors, options)->wait(); });
  bytes_sent_ += 2 * bytes_of(tensor) * (size_ - 1) / size_;
}

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  if (tensors.empty()) return;
  int64_t bytes = 0;
  for (const auto& tensor : tensors) bytes += bytes_of(tensor);
  guard("broadcast", [&] { c10d::broadcast_coalesced(impl_->group, tensors, size_t{256} << 20, root); });
  if (rank_ == root) bytes_sent_ += bytes;
}

void ProcessGroup::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  FT_CHECK(static_cast<int>(outputs.size()) == size_, "all_gather needs {} outputs, got {}", size_,
           outputs.size());
  std::vector<std::vector<at::Tensor>> output_lists{outputs};
  std::vector<at::Tensor> inputs{input};
  c10d::AllgatherOptions options;
  options.timeout = timeout_;
  guard("all-gather", [&] { impl_->group->allgather(output_lists, inputs, options)->wait(); });
  bytes_sent_ += bytes_of(input) * (size_ - 1);
}

torch::Tensor ProcessGroup::reduce_scatter(const torch::Tensor& input) {
  FT_CHECK(input.dim() >= 1 && input.size(0) == size_, "reduce_scatter needs [{} x chunk], got {}", size_,
           input.sizes());
  torch::Tensor received = torch::empty_like(input);  // [size x chunk]: every rank's copy of my chunk
  std::vector<int64_t> even_split;
  c10d::AllToAllOptions options;
  options.timeout = timeout_;
  guard("reduce-scatter", [&] {
    impl_->group->alltoall_base(received, const_cast<torch::Tensor&>(input), even_split, even_split, options)
        ->wait();
  });
  bytes_sent_ += bytes_of(input) * (size_ - 1) / size_;
  return received.sum(0);  // in rank order: the same on every run
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions options;
  options.timeout = timeout_;
  guard("barrier", [&] { impl_->group->barrier(options)->wait(); });
}

std::string ProcessGroup::broadcast_string(const std::string& text, int root) {
  const std::string key = "fasttrain/string/" + std::to_string(strings_++);
  std::string result;
  guard("broadcast of a string", [&] {
    if (rank_ == root) impl_->store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
    std::vector<uint8_t> bytes = impl_->store->get(key);  // waits up to the store's timeout
    result.assign(bytes.begin(), bytes.end());
  });
  return result;
}

bool ProcessGroup::any(bool flag) {
  torch::Tensor value = torch::full({1}, flag ? 1 : 0, torch::kInt);
  all_reduce(value, ReduceOp::kMax);
  return value.item<int>() != 0;
}

namespace {

// The process's default group. Never destroyed at exit: NCCL's communicators need CUDA, which may be
// torn down before static destructors run (seen on an H200: ~ProcessGroupNCCL then aborted the
// process); shutdown_default_process_group ends them while CUDA lives.
struct DefaultGroup {
  std::mutex mutex;
  std::shared_ptr<ProcessGroup> group;
  std::optional<DistOptions> created_with;
  bool shut_down = false;
};

DefaultGroup& default_group() {
  static DefaultGroup* state = new DefaultGroup();
  return *state;
}

}  // namespace

void ProcessGroup::shutdown(bool abort) {
#if defined(FASTTRAIN_NCCL) && FASTTRAIN_TORCH_AT_LEAST(2, 4)
  if (backend_ != "nccl") return;
  abort ? impl_->group->abort() : impl_->group->shutdown();
#else
  (void)abort;
#endif
}

void shutdown_default_process_group(bool abort) {
  DefaultGroup& state = default_group();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.group) state.group->shutdown(abort);
  state.group.reset();
  state.shut_down = state.created_with.has_value();
}

std::shared_ptr<ProcessGroup> default_process_group(const DistOptions& options,
                                                    const std::string& device_spec) {
  DefaultGroup& state = default_group();
  std::lock_guard<std::mutex> lock(state.mutex);
  std::shared_ptr<ProcessGroup>& group = state.group;
  std::optional<DistOptions>& created_with = state.created_with;
  FT_CHECK(!state.shut_down, "this process's group was shut down (shutdown_default_process_group)");
  if (!created_with) {
    if (std::optional<DistEnv> env = DistEnv::from_environment()) {
      use_device(parse_device(device_spec, env->local_rank));  // where NCCL's communicators go
      group = ProcessGroup::create(*env, options, device_spec);
    }
    created_with = options;
    return group;
  }
  // What the group was made with cannot change: a later caller asking for another is told, not ignored.
  FT_CONFIG_CHECK(!group || (options.backend() == created_with->backend() &&
                             options.timeout_s() == created_with->timeout_s()),
                  "this process's group was created with dist.backend = \"{}\", dist.timeout_s = {}; it "
                  "cannot be asked for again with dist.backend = \"{}\", dist.timeout_s = {}",
                  created_with->backend(), created_with->timeout_s(), options.backend(), options.timeout_s());
  return group;
}

}  // namespace fasttrain
