#pragma once
// `fasttrain profile`: a few training steps of a config under LibTorch's profiler.
//
//   fasttrain::RunBuilder builder;   // or a program's own: its model and data (run/run.h)
//   fasttrain::ProfileResult result = fasttrain::profile_run(
//       builder, config, "runs/default",
//       fasttrain::ProfileOptions().measure(fasttrain::MeasureOptions().steps(20)));
//   std::cout << result.table();   // phases per step, the operators that took the most time
//
// The run is built as `fasttrain train` builds it; `warmup_steps` run first (optimizer state,
// kernel selection, the allocator reaching its peak), then `steps` optimizer steps are recorded.
// Written into `out_dir`:
//   trace.json           Chrome trace (chrome://tracing, Perfetto): the ATen operators and
//                        fasttrain's phase scopes (fasttrain::forward, ::backward, ::optimizer,
//                        ::data_wait, ...), recorded by Kineto where the LibTorch has it (2.x: CPU
//                        operators, and on CUDA the kernels and memory copies) or by the legacy
//                        profiler (1.13: CPU operators); profile/trace_recorder.h.
//   memory_timeline.csv  time_s,allocated_bytes at every CPU allocation and free (CPU runs), or at
//                        every micro-batch and step (CUDA: the caching allocator's counters).
//   profile.json         the phases, the operator table and what was recorded.
// `fasttrain report RUN_DIR` draws the timeline and the phases.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/config/config.h"
#include "fasttrain/log/reporter.h"
#include "fasttrain/run/measure.h"
#include "fasttrain/run/run.h"
#include "fasttrain/train/phases.h"
#include "fasttrain/util/arg.h"

namespace fasttrain {

struct ProfileOptions {
  // Steps recorded, warm-up steps before them, the least time timed, who hears what was built.
  FT_ARG(MeasureOptions, measure);
  // Operators listed in the table (by total self time).
  FT_ARG(int64_t, top_operators) = 15;
  // Record the trace and the memory timeline. Off: only time the steps, what the tuner compares
  // (recording costs every operator and allocation something, which distorts models of many small
  // ops: the gpt measured 3.6k tokens/s recorded against 15k unrecorded).
  FT_ARG(bool, record) = true;
};

struct OperatorStat {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0;  // time in the operator minus its child operators'
};

struct ProfileResult {
  int64_t steps = 0;
  int64_t samples = 0;
  StepPhases phases;         // of the recorded steps
  double samples_per_s = 0;  // samples / the recorded steps' time
  // Operators that copy a value to the host (item(), nonzero's size): device synchronisations.
  int64_t host_reads = 0;
  int64_t allocations = 0;              // allocator calls during the recorded steps
  std::vector<OperatorStat> operators;  // by self time, the first top_operators
  int64_t trace_events = 0;
  int64_t memory_samples = 0;
  int64_t memory_samples_dropped = 0;
  int64_t peak_memory_bytes = 0;
  std::string trace_path, memory_timeline_path;
  std::string profiler;  // what recorded trace.json: "kineto (CPU + CUDA)", "kineto (CPU)" or "legacy (CPU)"
  // Batches gathered from a resident copy of the data (data.device_resident): the loader then runs no
  // workers.
  bool data_resident = false;
  // Phases in ms per step and share, then the operators.
  std::string table() const;
  nlohmann::json to_json() const;
};

// `callbacks` join the profiled fit (the doctor's tests plant problems through them).
ProfileResult profile_run(RunBuilder& builder, const Config& config, const std::string& out_dir,
                          const ProfileOptions& options = ProfileOptions(),
                          const std::vector<std::shared_ptr<Callback>>& callbacks = {});
// The same on a run already built (its config's batch size resolved).
ProfileResult profile_built_run(Run& run, const std::string& out_dir,
                                const ProfileOptions& options = ProfileOptions(),
                                const std::vector<std::shared_ptr<Callback>>& callbacks = {});

// `config` with room for any number of profiled steps (train.max_steps off, at least 1000 epochs):
// for measurements that must not be cut short by the run's own length (doctor, tune). The schedule
// is then planned over the longer run.
Config with_room_to_profile(Config config);

// Operator totals of a Chrome trace written by LibTorch's profiler: complete events ("ph": "X")
// by name, self time = duration minus the durations of the events nested directly inside (per
// thread, or per CUDA stream for Kineto's kernels); Kineto's span of the whole recording is left out.
std::vector<OperatorStat> operator_stats(const nlohmann::json& trace);

// Reads of a tensor's value on the host in such a trace: the operators that copy a value back
// (aten::_local_scalar_dense, what .item() runs; aten::nonzero, which sizes its output on the host),
// except those inside ATen's fused optimizer kernels (aten::_fused_adamw_ ...): their CPU versions read
// the step counts and the LR with .item() from host memory, which waits for nothing, and their CUDA
// versions read nothing.
int64_t count_host_reads(const nlohmann::json& trace);

}  // namespace fasttrain
