#pragma once
// A local launcher: N copies of a command as the ranks of one job on this machine, like
// `torchrun --standalone --nproc-per-node N --no-python`.
//
//   int code = fasttrain::launch(fasttrain::LaunchOptions(2),
//                                {"fasttrain", "train", "configs/default.toml"});
//
// Each child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
// SIGINT and SIGTERM sent to the launcher are forwarded to every child (which checkpoint and stop).
// When a child fails (non-zero exit or killed by a signal) the others get SIGTERM, and SIGKILL after
// grace_s; launch() returns the first failure's exit code (128 + N for signal N), 0 when all
// succeed. A child never outlives the launcher (PR_SET_PDEATHSIG).
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/log/reporter.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct LaunchOptions {
  explicit LaunchOptions(int nproc) : nproc_(nproc) {}
  FT_ARG(int, nproc);
  FT_ARG(std::string, master_addr) = "127.0.0.1";
  // 0 = a free port chosen by the launcher.
  FT_ARG(int, master_port) = 0;
  // Seconds the other ranks get to exit after a failure (or a forwarded signal) before SIGKILL.
  FT_ARG(double, grace_s) = 10;
  // Hears the start, a forwarded signal and each rank that fails (the CLI's ConsoleReporter named
  // "fasttrain launch"); null: nothing said.
  FT_ARG(std::shared_ptr<Reporter>, reporter) = nullptr;
};

int launch(const LaunchOptions& options, const std::vector<std::string>& command);

// A TCP port on 127.0.0.1 that nothing listens on now, below the ephemeral range where one binds.
int free_tcp_port();

}  // namespace fasttrain
