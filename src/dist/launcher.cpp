#include "fasttrain/dist/launcher.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

volatile std::sig_atomic_t forwarded_signal = 0;

void remember_signal(int signal) {
  forwarded_signal = signal;
}

// SIGINT/SIGTERM handlers for the launcher's lifetime; the previous ones come back afterwards.
class SignalCapture {
 public:
  SignalCapture() {
    struct sigaction action {};
    action.sa_handler = remember_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_int_);
    sigaction(SIGTERM, &action, &previous_term_);
    forwarded_signal = 0;
  }
  ~SignalCapture() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
  }

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

}  // namespace

int free_tcp_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  FT_CHECK(fd >= 0, "cannot open a socket to find a free port: {}", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  close(fd);
  FT_CHECK(ok, "cannot bind a socket on 127.0.0.1 to find a free port: {}", std::strerror(error));
  return ntohs(address.sin_port);
}

int launch(const LaunchOptions& options, const std::vector<std::string>& command) {
  FT_CONFIG_CHECK(options.nproc() >= 1, "--nproc must be >= 1, got {}", options.nproc());
  FT_CONFIG_CHECK(
      !command.empty(),
      "launch needs a command after --, e.g. fasttrain launch --nproc 2 -- fasttrain train cfg.toml");
  FT_CONFIG_CHECK(options.grace_s() >= 0, "--grace-s must be >= 0, got {}", options.grace_s());
  const int port = options.master_port() > 0 ? options.master_port() : free_tcp_port();
  const pid_t launcher = getpid();
  SignalCapture capture;

  // ---- start the ranks ----
  std::vector<pid_t> children;
  for (int rank = 0; rank < options.nproc(); ++rank) {
    const pid_t pid = fork();
    FT_CHECK(pid >= 0, "fork failed for rank {}: {}", rank, std::strerror(errno));
    if (pid == 0) {
      // Own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it once.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(125);  // the launcher died before prctl
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(options.nproc()).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc()).c_str(), 1);
      setenv("MASTER_ADDR", options.master_addr().c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      fmt::print(stderr, "fasttrain launch: cannot run '{}': {}\n", command[0], std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);  // also here: a signal sent before the child ran setpgid must not be lost
    children.push_back(pid);
  }
  if (options.verbose()) {
    fmt::print(stderr, "fasttrain launch: {} ranks of '{}' (MASTER_ADDR={} MASTER_PORT={})\n",
               options.nproc(), command[0], options.master_addr(), port);
  }

  // ---- wait; on the first failure or a signal, stop the others ----
  std::vector<bool> running(children.size(), true);
  size_t alive = children.size();
  int first_failure = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  int stop_signal = 0;  // the last signal forwarded
  // Each rank leads its own process group: its own children (a shell's, say) get the signal too.
  auto signal_all = [&](int signal) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (running[i]) kill(-children[i], signal);
    }
  };
  auto start_stopping = [&](int signal) {
    signal_all(signal);
    if (!kill_at) {
      kill_at = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(options.grace_s() * 1000));
    }
  };
  while (alive > 0) {
    if (forwarded_signal != 0) {
      stop_signal = forwarded_signal;
      forwarded_signal = 0;
      if (options.verbose())
        fmt::print(stderr, "fasttrain launch: forwarding signal {} to the ranks\n", stop_signal);
      signal_all(stop_signal);  // they checkpoint and stop at their next step
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t rank = 0; rank < children.size(); ++rank) {
        if (children[rank] != pid || !running[rank]) continue;
        running[rank] = false;
        --alive;
        const int code = exit_code_of(status);
        // After a forwarded signal, ranks that stop with 128 + it did as asked: no reason to hurry the rest.
        const bool asked_to_stop = stop_signal != 0 && code == 128 + stop_signal;
        if (code != 0 && first_failure == 0 && asked_to_stop) {
          first_failure = code;
        } else if (code != 0 && first_failure == 0) {
          first_failure = code;
          if (options.verbose() && alive > 0) {
            fmt::print(stderr, "fasttrain launch: rank {} {}; stopping the other {} rank(s)\n", rank,
                       describe_status(status), alive);
          }
          start_stopping(SIGTERM);
        } else if (options.verbose() && code != 0) {
          fmt::print(stderr, "fasttrain launch: rank {} {}\n", rank, describe_status(status));
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;  // no children left to wait for
    if (kill_at && std::chrono::steady_clock::now() >= *kill_at) {
      signal_all(SIGKILL);
      kill_at = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Whatever a rank left behind in its process group (a shell's background job) goes with it.
  for (const pid_t child : children) kill(-child, SIGKILL);
  return first_failure;
}

}  // namespace fasttrain
