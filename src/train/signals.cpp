#include "fasttrain/train/signals.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

std::atomic<int> g_received{0};
std::atomic<bool> g_announced{false};
std::atomic<bool> g_guard_installed{false};
std::atomic<bool> g_quiet{false};  // kept past the guard: no run is left to stop
std::atomic<bool> g_armed{false};  // a fit() can stop gracefully
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");

void on_signal(int signal) {
  if (!g_armed.load() && !g_quiet.load()) {  // nothing to save yet: end as the signal would
    const char message[] = "\nfasttrain: stopped by a signal before training started\n";
    ssize_t ignored = write(STDERR_FILENO, message, sizeof(message) - 1);
    (void)ignored;
    _exit(128 + signal);
  }
  int expected = 0;
  if (!g_received.compare_exchange_strong(expected, signal)) {
    // The second signal. Another thread may be handling the first one right now: let its notice
    // reach the terminal before the process ends, or the user never learns why it quit. (Both
    // signals are in sa_mask, so the first handler is never interrupted on its own thread, and
    // this wait cannot be waiting on itself.) The bound keeps a stuck write from holding the exit.
    for (long spins = 0; !g_announced.load() && spins < 200'000'000L; ++spins) {
    }
    _exit(128 + signal);
  }
  if (!g_quiet.load()) {
    const char message[] =
        "\nfasttrain: stopping after this micro-batch and saving a checkpoint (signal again to quit now)\n";
    ssize_t ignored = write(STDERR_FILENO, message, sizeof(message) - 1);
    (void)ignored;
  }
  g_announced.store(true);
}

}  // namespace

StopSignals::StopSignals() {
  FT_CHECK(!g_guard_installed.exchange(true), "only one StopSignals guard may exist at a time");
  g_received.store(0);
  g_announced.store(false);
  g_quiet.store(false);
  g_armed.store(false);
  install(SIGINT, &previous_int_);
  install(SIGTERM, &previous_term_);
}

void StopSignals::install(int signal, struct sigaction* previous) {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int stop : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP}) sigaddset(&action.sa_mask, stop);
  action.sa_flags = SA_RESTART;  // reads and writes in flight continue instead of failing with EINTR
  sigaction(signal, &action, previous);
}

int StopSignals::signal_number(const std::string& name) {
  const std::string bare = name.rfind("SIG", 0) == 0 ? name.substr(3) : name;
  if (bare == "USR1") return SIGUSR1;
  if (bare == "USR2") return SIGUSR2;
  if (bare == "HUP") return SIGHUP;
  if (bare == "none") return 0;
  FT_FAIL("stop signal '{}' is not one of USR1, USR2, HUP or none", name);
}

void StopSignals::also_stop_on(const std::string& name) {
  const int signal = signal_number(name);
  if (signal == 0) return;
  FT_CHECK(extra_ == 0, "StopSignals: one extra stop signal per guard (signal {} is one already; {} asked)",
           extra_, name);
  extra_ = signal;
  install(signal, &previous_extra_);
}

StopSignals::~StopSignals() {
  g_quiet.store(keep_installed_);
  if (!keep_installed_) {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
    if (extra_ != 0) sigaction(extra_, &previous_extra_, nullptr);
  }
  g_guard_installed.store(false);
}

int StopSignals::received() {
  return g_received.load();
}

void StopSignals::arm() {
  g_armed.store(true);
}

void StopSignals::keep_installed() {
  keep_installed_ = true;
  g_quiet.store(true);  // an error is unwinding: main() must live to report it
}

}  // namespace fasttrain
