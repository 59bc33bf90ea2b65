#pragma once
// StopSignals: while a guard exists, SIGINT and SIGTERM ask every running Trainer::fit() to stop
// after the micro-batch in flight, write a checkpoint and return (summary.interrupted); the caller
// then exits with 128 + the signal (130, 143), like a process the signal had ended. A second signal
// ends the process at once with that code: the user who presses Ctrl-C twice does not wait.
// The previous handlers are restored when the guard is destroyed. One guard at a time.
//
//   fasttrain::StopSignals signals;
//   auto summary = trainer.fit(train, &test);
//   if (summary.interrupted) return 128 + fasttrain::StopSignals::received();
#include <csignal>

namespace fasttrain {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since the guard was made (0 = none). Async-signal-safe.
  static int received();

  // The handlers stay for the rest of the process when the guard is destroyed (another guard may be
  // made): an error unwinding past the guard is still reported by main(), where a stop signal in
  // between (a launcher stopping the other ranks of a failed job) would have ended the process
  // first. A signal then only sets received(), silently (no run is left to stop); a second one still
  // ends the process.
  void keep_installed() { keep_installed_ = true; }

 private:
  bool keep_installed_ = false;
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

}  // namespace fasttrain
