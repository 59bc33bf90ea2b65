#pragma once
// StopSignals: while a guard exists, SIGINT and SIGTERM (and one more: also_stop_on) ask every
// running Trainer::fit() to stop after the micro-batch in flight, write a checkpoint and return
// (summary.interrupted); the caller then exits with 128 + the signal (130, 143, 138 for USR1), like a
// process the signal had ended. A second signal
// ends the process at once with that code: the user who presses Ctrl-C twice does not wait.
// The previous handlers are restored when the guard is destroyed. One guard at a time.
//
// A graceful stop starts once a run can stop with a checkpoint: Trainer::fit arms it (arm()). A signal
// before that (while the run is built, its data loaded, or a rank waits in the rendezvous) ends the
// process at once with 128 + the signal, as if no guard were there: there is nothing to save, and a
// rank waiting for the others would never look at the request (torchrun stops a group so when one of
// its ranks failed, and SIGKILLs what is still running 30 s later).
//
//   fasttrain::StopSignals signals;
//   auto summary = trainer.fit(train, &test);
//   if (summary.interrupted) return 128 + fasttrain::StopSignals::received();
#include <csignal>
#include <string>

namespace fasttrain {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since the guard was made (0 = none). Async-signal-safe.
  static int received();
  // From now on a signal asks the running fit() to stop (Trainer::fit calls it).
  static void arm();
  // Also `name` (USR1, USR2 or HUP, with or without "SIG"; "none" adds nothing) stops the run, until
  // the guard ends: a scheduler's pre-emption warning (Slurm's sbatch --signal=USR1@90; the
  // checkpoint.preempt_signal key). One per guard.
  void also_stop_on(const std::string& name);
  // The signal `name` stands for (0 for "none"); an Error for another name.
  static int signal_number(const std::string& name);

  // The handlers stay for the rest of the process when the guard is destroyed (another guard may be
  // made): an error unwinding past the guard is still reported by main(), where a stop signal in
  // between (a launcher stopping the other ranks of a failed job) would have ended the process
  // first. A signal then only sets received(), silently (no run is left to stop); a second one still
  // ends the process.
  void keep_installed();

 private:
  static void install(int signal, struct sigaction* previous);

  bool keep_installed_ = false;
  int extra_ = 0;  // the signal also_stop_on() added
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
  struct sigaction previous_extra_ {};
};

}  // namespace fasttrain
