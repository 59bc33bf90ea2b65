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
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <thread>

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

volatile std::sig_atomic_t forwarded_signal = 0;

void remember_signal(int signal) {
  forwarded_signal = signal;
}

// The signals the launcher passes on to its ranks: the stop signals, and the pre-emption warnings a
// scheduler may send (checkpoint.preempt_signal). HUP is left alone: a closed terminal ends the launcher.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

// Handlers for the launcher's lifetime; the previous ones come back afterwards.
class SignalCapture {
 public:
  SignalCapture() {
    struct sigaction action {};
    action.sa_handler = remember_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kForwarded); ++i) sigaction(kForwarded[i], &action, &previous_[i]);
    forwarded_signal = 0;
  }
  ~SignalCapture() {
    for (size_t i = 0; i < std::size(kForwarded); ++i) sigaction(kForwarded[i], &previous_[i], nullptr);
  }

 private:
  struct sigaction previous_[std::size(kForwarded)]{};
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

namespace {

// Whether `port` on 127.0.0.1 can be bound now; with port 0, the port the kernel chose (else 0).
int bindable_port(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  FT_CHECK(fd >= 0, "cannot open a socket to find a free port: {}", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;  // bind's, for the caller's message: close may set its own
  close(fd);
  errno = error;
  return ok ? ntohs(address.sin_port) : 0;
}

// The lowest port the kernel hands out to outgoing connections (net.ipv4.ip_local_port_range; Linux's
// default 32768).
int first_ephemeral_port() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  return range >> low >> high && low > 1024 ? low : 32768;
}

}  // namespace

// A port the kernel chose (bind to port 0) lies in the ephemeral range, where any process's next outgoing
// connection (another run's store clients) may take it before rank 0 listens on it: seen as EADDRINUSE.
// So a random port below that range that binds now, and the kernel's choice only where none does.
int free_tcp_port() {
  const int below = first_ephemeral_port();
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(std::max(1025, below - 16384), below - 1);
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = pick(random);
    if (bindable_port(port) == port) return port;
  }
  const int chosen = bindable_port(0);
  FT_CHECK(chosen > 0, "cannot bind a socket on 127.0.0.1 to find a free port: {}", std::strerror(errno));
  return chosen;
}

namespace {

// Starts rank `rank` of `command` as a child in its own process group, with the rendezvous variables.
pid_t start_rank(const LaunchOptions& options, const std::vector<std::string>& command, int rank, int port) {
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  FT_CHECK(pid >= 0, "fork failed for rank {}: {}", rank, std::strerror(errno));
  if (pid != 0) {
    setpgid(pid, pid);  // also here: a signal sent before the child ran setpgid must not be lost
    return pid;
  }
  // Own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it once.
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(125);  // the launcher died before prctl
  for (int forwarded : kForwarded) signal(forwarded, SIG_DFL);
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
  // The child has only its stderr left to say why (no reporter crosses exec); the launcher sees 127.
  fmt::print(stderr, "fasttrain launch: cannot run '{}': {}\n", command[0], std::strerror(errno));
  _exit(127);
}

// Waits for the ranks; on the first failure stops the others (SIGTERM, SIGKILL after the grace time),
// forwards a signal the launcher got, and remembers the first failure's exit code.
class RankSupervisor {
 public:
  RankSupervisor(std::vector<pid_t> children, double grace_s, Reporter& reporter)
      : children_(std::move(children)),
        running_(children_.size(), true),
        alive_(children_.size()),
        grace_(std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000))),
        reporter_(reporter) {}

  int wait_all() {
    while (alive_ > 0) {
      forward_signal();
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        ended(pid, status);
        continue;
      }
      if (pid < 0 && errno != EINTR) break;  // no children left to wait for
      if (kill_at_ && std::chrono::steady_clock::now() >= *kill_at_) {
        signal_all(SIGKILL);
        kill_at_ = std::chrono::steady_clock::now() + std::chrono::hours(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Whatever a rank left behind in its process group (a shell's background job) goes with it.
    for (const pid_t child : children_) kill(-child, SIGKILL);
    return first_failure_;
  }

 private:
  // Each rank leads its own process group: its own children (a shell's, say) get the signal too.
  void signal_all(int signal) {
    for (size_t i = 0; i < children_.size(); ++i) {
      if (running_[i]) kill(-children_[i], signal);
    }
  }
  void forward_signal() {
    if (forwarded_signal == 0) return;
    stop_signal_ = forwarded_signal;
    forwarded_signal = 0;
    reporter_.note(fmt::format("forwarding signal {} to the ranks", stop_signal_));
    signal_all(stop_signal_);  // they checkpoint and stop at their next step
  }
  void ended(pid_t pid, int status) {
    for (size_t rank = 0; rank < children_.size(); ++rank) {
      if (children_[rank] != pid || !running_[rank]) continue;
      running_[rank] = false;
      --alive_;
      const int code = exit_code_of(status);
      if (code == 0) return;
      // After a forwarded signal, ranks that stop with 128 + it did as asked: no reason to hurry the rest.
      const bool asked_to_stop = stop_signal_ != 0 && code == 128 + stop_signal_;
      if (first_failure_ != 0) {
        reporter_.note(fmt::format("rank {} {}", rank, describe_status(status)));
        return;
      }
      first_failure_ = code;
      if (asked_to_stop) return;
      if (alive_ > 0)
        reporter_.note(
            fmt::format("rank {} {}; stopping the other {} rank(s)", rank, describe_status(status), alive_));
      signal_all(SIGTERM);
      if (!kill_at_) kill_at_ = std::chrono::steady_clock::now() + grace_;
    }
  }

  std::vector<pid_t> children_;
  std::vector<bool> running_;
  size_t alive_;
  std::chrono::milliseconds grace_;
  Reporter& reporter_;
  int first_failure_ = 0;
  int stop_signal_ = 0;  // the last signal forwarded
  std::optional<std::chrono::steady_clock::time_point> kill_at_;
};

}  // namespace

int launch(const LaunchOptions& options, const std::vector<std::string>& command) {
  FT_CONFIG_CHECK(options.nproc() >= 1, "--nproc must be >= 1, got {}", options.nproc());
  FT_CONFIG_CHECK(
      !command.empty(),
      "launch needs a command after --, e.g. fasttrain launch --nproc 2 -- fasttrain train cfg.toml");
  FT_CONFIG_CHECK(options.grace_s() >= 0, "--grace-s must be >= 0, got {}", options.grace_s());
  const int port = options.master_port() > 0 ? options.master_port() : free_tcp_port();
  Reporter& reporter = reporter_or_quiet(options.reporter());
  SignalCapture capture;
  std::vector<pid_t> children;
  for (int rank = 0; rank < options.nproc(); ++rank)
    children.push_back(start_rank(options, command, rank, port));
  reporter.note(fmt::format("{} ranks of '{}' (MASTER_ADDR={} MASTER_PORT={})", options.nproc(), command[0],
                            options.master_addr(), port));
  return RankSupervisor(std::move(children), options.grace_s(), reporter).wait_all();
}

}  // namespace fasttrain
