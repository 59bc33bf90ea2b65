#include "fasttrain/train/signals.h"

#include <unistd.h>

#include <atomic>

#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

std::atomic<int> g_received{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

void on_signal(int signal) {
  int expected = 0;
  if (!g_received.compare_exchange_strong(expected, signal)) _exit(128 + signal);  // the second one
  const char message[] =
      "\nfasttrain: stopping after this micro-batch and saving a checkpoint (signal again to quit now)\n";
  ssize_t ignored = write(STDERR_FILENO, message, sizeof(message) - 1);
  (void)ignored;
}

}  // namespace

StopSignals::StopSignals() {
  FT_CHECK(!g_installed.exchange(true), "only one StopSignals guard may exist at a time");
  g_received.store(0);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight continue instead of failing with EINTR
  sigaction(SIGINT, &action, &previous_int_);
  sigaction(SIGTERM, &action, &previous_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGTERM, &previous_term_, nullptr);
  g_installed.store(false);
}

int StopSignals::received() {
  return g_received.load();
}

}  // namespace fasttrain
