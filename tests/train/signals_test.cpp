// StopSignals (train/signals.h): the guard's handlers, and what stays when it ends.
#include "fasttrain/train/signals.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>

namespace fasttrain {
namespace {

void (*current_handler(int signal))(int) {
  struct sigaction action {};
  sigaction(signal, nullptr, &action);
  return action.sa_handler;
}

TEST(StopSignals, AGuardRestoresThePreviousHandlersWhenItEnds) {
  ASSERT_EQ(current_handler(SIGTERM), SIG_DFL);
  {
    StopSignals guard;
    EXPECT_NE(current_handler(SIGTERM), SIG_DFL);
    EXPECT_NE(current_handler(SIGINT), SIG_DFL);
  }
  EXPECT_EQ(current_handler(SIGTERM), SIG_DFL);
  EXPECT_EQ(current_handler(SIGINT), SIG_DFL);
}

// Before a fit() arms the guard (building the run, loading its data, waiting in a rendezvous) a signal
// ends the process at once, as it would without the guard; once armed it only asks the run to stop.
TEST(StopSignals, ASignalBeforeTrainingEndsTheProcessAndAfterArmingAsksForAStop) {
  EXPECT_EXIT(
      {
        StopSignals guard;
        std::raise(SIGTERM);
      },
      ::testing::ExitedWithCode(128 + SIGTERM), "stopped by a signal before training started");
  {
    StopSignals guard;
    StopSignals::arm();
    ASSERT_EQ(std::raise(SIGINT), 0);
    EXPECT_EQ(StopSignals::received(), SIGINT);
  }
  EXPECT_EQ(current_handler(SIGINT), SIG_DFL);
}

// An error unwinding past the guard is reported by main() afterwards: a stop signal in between only
// sets the flag instead of ending the process (the CLI's train does this on an exception).
TEST(StopSignals, KeptHandlersOutliveTheGuardAndASignalOnlySetsTheFlag) {
  {
    StopSignals guard;
    guard.keep_installed();
  }
  EXPECT_NE(current_handler(SIGTERM), SIG_DFL);
  ASSERT_EQ(std::raise(SIGTERM), 0);  // with the default handler this would end the test binary
  EXPECT_EQ(StopSignals::received(), SIGTERM);
  { StopSignals another; }  // a new guard may still be made
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
}

// A scheduler's pre-emption signal (checkpoint.preempt_signal) stops the run as SIGTERM does, for the
// guard's lifetime; a name that is not a signal fasttrain can stop on is an error naming it.
TEST(StopSignals, AnExtraSignalStopsTheRunUntilTheGuardEnds) {
  ASSERT_EQ(current_handler(SIGUSR1), SIG_DFL);
  {
    StopSignals guard;
    guard.also_stop_on("USR1");
    EXPECT_NE(current_handler(SIGUSR1), SIG_DFL);
    EXPECT_EQ(current_handler(SIGUSR2), SIG_DFL);
    StopSignals::arm();
    ASSERT_EQ(std::raise(SIGUSR1), 0);  // with the default handler this would end the test binary
    EXPECT_EQ(StopSignals::received(), SIGUSR1);
  }
  EXPECT_EQ(current_handler(SIGUSR1), SIG_DFL);
  {
    StopSignals guard;
    guard.also_stop_on("none");
    EXPECT_EQ(current_handler(SIGUSR1), SIG_DFL);
  }
  EXPECT_EQ(StopSignals::signal_number("SIGUSR2"), SIGUSR2);
  EXPECT_EQ(StopSignals::signal_number("HUP"), SIGHUP);
  try {
    StopSignals::signal_number("KILL");
    ADD_FAILURE() << "KILL accepted";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("'KILL'"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace fasttrain
