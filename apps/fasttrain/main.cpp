// fasttrain: the command-line tool. A thin layer over the library: parse a subcommand, build the
// Config, call the runs of run/train_run.h and the tools with the registries' RunBuilder. Only main()
// catches errors: it prints `error: ...` with a hint and exits 2 for bad configuration or usage, 1 for
// anything else.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "fasttrain/dist/error_file.h"
#include "fasttrain/fasttrain.h"

namespace {

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
};

void add_config_args(CLI::App& command, ConfigArgs& args, bool required) {
  auto* option = command.add_option("config", args.path, "TOML config (see docs/CONFIG.md)");
  if (required) option->required();
  command.add_option("--set", args.overrides, "Override a key: --set section.key=value (repeatable)");
}

// The config as asked for; its values are checked as they are read, and by each component as the run is
// built from it.
fasttrain::Config build_config(const ConfigArgs& args) {
  fasttrain::Config config = args.path.empty() ? fasttrain::Config() : fasttrain::load_config(args.path);
  for (const auto& assignment : args.overrides) fasttrain::apply_override(config, assignment);
  return config;
}

// What the library reports, on stderr: "fasttrain: " lines and the progress bar of log.progress.
std::shared_ptr<fasttrain::Reporter> console(const fasttrain::Config& config) {
  return std::make_shared<fasttrain::ConsoleReporter>(fasttrain::Progress::parse_mode(config.log.progress()));
}

// A subcommand: its options are registered on construction, run() does its work.
class Subcommand {
 public:
  virtual ~Subcommand() = default;
  bool chosen() const { return static_cast<bool>(*command_); }
  virtual int run() = 0;

 protected:
  Subcommand(CLI::App& app, const std::string& name, const std::string& description)
      : command_(app.add_subcommand(name, description)) {}
  // The run directory: `dir` when given, else <run.root>/<run.name> of `config`.
  static std::string run_dir_or_default(const std::string& dir, const fasttrain::Config& config) {
    return dir.empty() ? config.run.root() + "/" + config.run.name() : dir;
  }
  CLI::App* command_;
};

class Train : public Subcommand {
 public:
  explicit Train(CLI::App& app)
      : Subcommand(app, "train", "Train a model; writes the run directory (runs/<run.name>)") {
    add_config_args(*command_, args_, false);
    command_->add_option("--run-dir", run_dir_, "Run directory (default: <run.root>/<run.name>)");
    command_
        ->add_option(
            "--resume", options_.resume(),
            "Continue from the newest checkpoint of the run directory (bare --resume), or from PATH: "
            "a checkpoints/step-N directory or a run directory")
        ->expected(0, 1)
        ->default_str("latest");
    command_->add_flag("--fresh", options_.fresh(),
                       "Start over in a run directory that holds an earlier run (removes its checkpoints, "
                       "metrics and weights)");
  }
  int run() override {
    fasttrain::Config cfg = build_config(args_);
    const std::string run_dir = run_dir_or_default(run_dir_, cfg);
    // A distributed job prints once, from rank 0 (the other ranks run the same config). The full
    // effective config goes to RUN_DIR/config.toml (`fasttrain config` prints it), not the terminal.
    const std::optional<fasttrain::DistEnv> job = fasttrain::DistEnv::from_environment();
    const bool rank0 = !job || job->rank == 0;
    // SIGINT/SIGTERM and checkpoint.preempt_signal: the run stops after the micro-batch in flight and
    // saves a checkpoint.
    fasttrain::StopSignals stop_signals;
    stop_signals.also_stop_on(cfg.checkpoint.preempt_signal());
    fasttrain::FitSummary summary;
    try {
      summary = fasttrain::train_run(cfg, run_dir, fasttrain::RunOptions(options_).reporter(console(cfg)));
    } catch (...) {
      // main() reports the error once this guard is gone: a stop signal in between (the launcher
      // stopping the other ranks when one failed) must not end the process before it does.
      stop_signals.keep_installed();
      throw;
    }
    const int signal = fasttrain::StopSignals::received();
    const int stopped_code = 128 + (signal != 0 ? signal : SIGINT);  // a stop agreed with the other ranks
    if (!rank0) return summary.interrupted ? stopped_code : 0;
    if (summary.interrupted) {
      std::cerr << "fasttrain: interrupted at step " << summary.steps << "; state saved in "
                << summary.checkpoint << "\nfasttrain: continue with: fasttrain train ... --run-dir "
                << run_dir << " --resume\n";
      return stopped_code;
    }
    // A closing statement; the whole summary is in the run directory.
    std::cout << "fasttrain: " << summary.describe() << "\nfasttrain: run directory " << run_dir
              << " (summary.json, metrics.jsonl, final/model.safetensors)\n";
    return 0;
  }

 private:
  ConfigArgs args_;
  std::string run_dir_;
  fasttrain::RunOptions options_;
};

class Eval : public Subcommand {
 public:
  explicit Eval(CLI::App& app)
      : Subcommand(app, "eval", "Evaluate saved weights on the test set of the config's data") {
    add_config_args(*command_, args_, false);
    command_
        ->add_option("--weights", weights_,
                     "safetensors weights with the model's names (RUN_DIR/final/model.safetensors)")
        ->required();
  }
  int run() override {
    fasttrain::EvalResult result = fasttrain::eval_run(build_config(args_), weights_);
    nlohmann::json out;
    for (const auto& [name, value] : result.metrics.items()) out["test_" + name] = value;
    out["samples"] = result.samples;
    std::cout << out.dump(2) << "\n";
    return 0;
  }

 private:
  ConfigArgs args_;
  std::string weights_;
};

class Generate : public Subcommand {
 public:
  explicit Generate(CLI::App& app)
      : Subcommand(app, "generate", "Sample text from the weights of a trained gpt model"), options_(0) {
    add_config_args(*command_, args_, false);
    command_
        ->add_option(
            "--weights", weights_,
            "safetensors weights of the model (RUN_DIR/final/model.safetensors); the config defaults "
            "to the run's RUN_DIR/config.toml")
        ->required();
    command_->add_option("--prompt", prompt_, "Text to continue (\"\": start a new document)");
    command_->add_option("--tokens", options_.max_new_tokens(), "Bytes to generate")->capture_default_str();
    command_->add_option("--temperature", options_.temperature(), "Sampling temperature; 0 = greedy")
        ->capture_default_str();
    command_->add_option("--top-k", options_.top_k(), "Sample among the k most likely bytes; 0 = all")
        ->capture_default_str();
    command_->add_option("--seed", options_.seed(), "Seed of the draws")->capture_default_str();
  }
  int run() override {
    if (args_.path.empty()) {
      // RUN_DIR/final/model.safetensors -> RUN_DIR/config.toml
      const auto run_config = std::filesystem::path(weights_).parent_path().parent_path() / "config.toml";
      if (!std::filesystem::is_regular_file(run_config)) {
        throw fasttrain::ConfigError(fmt::format(
            "no config given and none at {} (the run directory of --weights): pass the run's config.toml",
            run_config.string()));
      }
      args_.path = run_config.string();
    }
    std::cout << prompt_ << fasttrain::generate_run(build_config(args_), weights_, prompt_, options_) << "\n";
    return 0;
  }

 private:
  ConfigArgs args_;
  std::string weights_, prompt_;
  fasttrain::GenerateOptions options_;
};

class FindLr : public Subcommand {
 public:
  explicit FindLr(CLI::App& app)
      : Subcommand(app, "find-lr", "LR range test: sweep the LR exponentially, suggest a max LR") {
    add_config_args(*command_, args_, true);
    command_->add_option("--start-lr", options_.start_lr(), "First LR")->capture_default_str();
    command_->add_option("--end-lr", options_.end_lr(), "Last LR")->capture_default_str();
    command_->add_option("--steps", options_.steps(), "Optimizer steps of the sweep")->capture_default_str();
    command_->add_option("--csv", csv_, "Where to write the curve")->capture_default_str();
  }
  int run() override {
    const fasttrain::Config cfg = build_config(args_);
    fasttrain::RunBuilder builder;
    fasttrain::LrFinderResult result = fasttrain::find_lr_run(builder, cfg, options_, csv_, console(cfg));
    std::cout << result.table();
    std::cout << fmt::format("suggested max lr: {:.3g}{}\ncurve written to {}\n", result.suggested_lr,
                             result.diverged ? " (the sweep stopped at divergence)" : "", csv_);
    return 0;
  }

 private:
  ConfigArgs args_;
  fasttrain::LrFinderOptions options_;
  std::string csv_ = "lr_find.csv";
};

class FindBatch : public Subcommand {
 public:
  explicit FindBatch(CLI::App& app)
      : Subcommand(
            app, "find-batch",
            "The largest batch that fits memory.budget (CPU) or the GPU, with samples/s at each size") {
    add_config_args(*command_, args_, true);
    command_->add_option("--steps", options_.measure().steps(), "Optimizer steps per trial")
        ->capture_default_str();
    command_->add_option("--start", options_.start(), "First batch size tried")->capture_default_str();
    command_->add_option("--max", options_.max_batch(), "Largest batch size tried (0 = the training set)")
        ->capture_default_str();
    command_
        ->add_option("--tolerance", options_.tolerance(),
                     "Stop when the largest fit is within this fraction of the smallest failure")
        ->capture_default_str();
  }
  int run() override {
    const fasttrain::Config cfg = build_config(args_);
    fasttrain::RunBuilder builder;
    fasttrain::BatchFinderOptions options = options_;
    options.measure().reporter(console(cfg));
    std::cout << fasttrain::find_batch_size(builder, cfg, options).table();
    return 0;
  }

 private:
  ConfigArgs args_;
  fasttrain::BatchFinderOptions options_;
};

class Profile : public Subcommand {
 public:
  explicit Profile(CLI::App& app)
      : Subcommand(app, "profile",
                   "Profile training steps: Chrome trace, memory timeline, time per phase and operator") {
    add_config_args(*command_, args_, true);
    command_->add_option("--steps", options_.measure().steps(), "Optimizer steps recorded")
        ->capture_default_str();
    command_->add_option("--warmup-steps", options_.measure().warmup_steps(), "Steps run before recording")
        ->capture_default_str();
    command_->add_option("--run-dir", dir_,
                         "Where trace.json, memory_timeline.csv and profile.json go (default: "
                         "<run.root>/<run.name>)");
  }
  int run() override {
    fasttrain::Config cfg = build_config(args_);
    fasttrain::RunBuilder builder;
    fasttrain::ProfileOptions options = options_;
    options.measure().reporter(console(cfg));
    std::cout << fasttrain::profile_run(builder, cfg, run_dir_or_default(dir_, cfg), options).table();
    return 0;
  }

 private:
  ConfigArgs args_;
  fasttrain::ProfileOptions options_;
  std::string dir_;
};

class Doctor : public Subcommand {
 public:
  explicit Doctor(CLI::App& app)
      : Subcommand(app, "doctor",
                   "Measure a short run and say which playbook techniques it needs, with evidence, ranked") {
    add_config_args(*command_, args_, true);
    command_->add_option("--steps", options_.measure().steps(), "Steps recorded per measurement")
        ->capture_default_str();
    command_
        ->add_option("--min-seconds", options_.measure().min_seconds(),
                     "Each timed comparison lasts at least this long (short runs are noise)")
        ->capture_default_str();
    command_->add_flag("--json", json_, "Print doctor.json instead of the text");
    command_->add_option(
        "--run-dir", dir_,
        "Where doctor.json and the measurements' profiles go (default: <run.root>/<run.name>)");
  }
  int run() override {
    fasttrain::Config cfg = build_config(args_);
    const std::string dir = run_dir_or_default(dir_, cfg);
    fasttrain::RunBuilder builder;
    fasttrain::DoctorOptions options = options_;
    options.measure().reporter(console(cfg));
    fasttrain::DoctorReport found = fasttrain::diagnose(builder, cfg, dir, options);
    fasttrain::write_json_file(dir + "/doctor.json", found.to_json());
    std::cout << (json_ ? found.to_json().dump(2) + "\n" : found.text());
    return 0;
  }

 private:
  ConfigArgs args_;
  fasttrain::DoctorOptions options_;
  std::string dir_;
  bool json_ = false;
};

class Tune : public Subcommand {
 public:
  explicit Tune(CLI::App& app)
      : Subcommand(
            app, "tune",
            "Try the switches that apply here, keep what is faster, write the tuned config and the table") {
    add_config_args(*command_, args_, true);
    command_->add_option("--steps", options_.measure().steps(), "Steps timed per trial")
        ->capture_default_str();
    command_
        ->add_option("--min-seconds", options_.measure().min_seconds(),
                     "Each trial lasts at least this long, past --steps if need be (short runs are noise)")
        ->capture_default_str();
    command_->add_option("--min-gain", options_.min_gain(), "Speedup needed to keep a change")
        ->capture_default_str();
    command_->add_flag("--batch", options_.batch(), "Also try 2x and 4x the batch (the LR scaled with it)");
    command_->add_option("--run-dir", dir_,
                         "Where tuned.toml and tune.md go (default: <run.root>/<run.name>)");
  }
  int run() override {
    fasttrain::Config cfg = build_config(args_);
    const std::string dir = run_dir_or_default(dir_, cfg);
    fasttrain::RunBuilder builder;
    fasttrain::TuneOptions options = options_;
    options.measure().reporter(console(cfg));
    fasttrain::TuneResult result = fasttrain::tune(builder, cfg, dir, options);
    std::cout << result.table() << "written: " << dir << "/tuned.toml, " << dir << "/tune.md\n";
    return 0;
  }

 private:
  ConfigArgs args_;
  fasttrain::TuneOptions options_;
  std::string dir_;
};

class ShowConfig : public Subcommand {
 public:
  explicit ShowConfig(CLI::App& app)
      : Subcommand(app, "config", "Print the effective config (defaults, file, --set) as TOML") {
    add_config_args(*command_, args_, false);
    command_->add_flag("--reference", reference_,
                       "Print the Markdown reference of every key (docs/CONFIG.md)");
  }
  int run() override {
    std::cout << (reference_ ? fasttrain::config_reference() : fasttrain::to_toml(build_config(args_)));
    return 0;
  }

 private:
  ConfigArgs args_;
  bool reference_ = false;
};

class Report : public Subcommand {
 public:
  explicit Report(CLI::App& app)
      : Subcommand(
            app, "report",
            "Write one self-contained HTML page for a run: curves, step time, memory, doctor, config") {
    command_->add_option("run_dir", dir_, "Run directory (holds metrics.jsonl)")->required();
    command_->add_option("--out", out_, "Where to write the page (default: RUN_DIR/report.html)");
  }
  int run() override {
    const std::string out = out_.empty() ? dir_ + "/report.html" : out_;
    fasttrain::write_report(dir_, out);
    std::cout << "report written to " << out << "\n";
    return 0;
  }

 private:
  std::string dir_, out_;
};

class Launch : public Subcommand {
 public:
  explicit Launch(CLI::App& app)
      : Subcommand(app, "launch",
                   "Run a command as N ranks of one distributed job on this machine (like torchrun "
                   "--nproc-per-node N --no-python): fasttrain launch --nproc 2 -- fasttrain train cfg.toml"),
        options_(1) {
    command_->add_option("--nproc", options_.nproc(), "Ranks to start")->required();
    command_->add_option("--master-addr", options_.master_addr(), "Rendezvous host (MASTER_ADDR)");
    command_->add_option("--master-port", options_.master_port(), "Rendezvous port (default: a free one)");
    command_->add_option("--grace-s", options_.grace_s(),
                         "After a rank fails, seconds the others get to exit before SIGKILL");
    command_->add_option("command", command_line_, "The command each rank runs, after --")->required();
  }
  int run() override {
    auto reporter =
        std::make_shared<fasttrain::ConsoleReporter>(fasttrain::Progress::Mode::kLines, "fasttrain launch");
    return fasttrain::launch(fasttrain::LaunchOptions(options_).reporter(reporter), command_line_);
  }

 private:
  fasttrain::LaunchOptions options_;
  std::vector<std::string> command_line_;
};

int run(int argc, char** argv) {
  CLI::App app{
      "fasttrain: train neural networks fast on LibTorch, with the PyTorch performance playbook as "
      "switches"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("fasttrain 0.1.0 (LibTorch ") + TORCH_VERSION + ")");
  std::vector<std::unique_ptr<Subcommand>> subcommands;  // in the order --help lists them
  subcommands.push_back(std::make_unique<Train>(app));
  subcommands.push_back(std::make_unique<Eval>(app));
  subcommands.push_back(std::make_unique<Generate>(app));
  subcommands.push_back(std::make_unique<FindLr>(app));
  subcommands.push_back(std::make_unique<FindBatch>(app));
  subcommands.push_back(std::make_unique<Profile>(app));
  subcommands.push_back(std::make_unique<Doctor>(app));
  subcommands.push_back(std::make_unique<Tune>(app));
  subcommands.push_back(std::make_unique<ShowConfig>(app));
  subcommands.push_back(std::make_unique<Report>(app));
  subcommands.push_back(std::make_unique<Launch>(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  for (const auto& subcommand : subcommands) {
    if (subcommand->chosen()) return subcommand->run();
  }
  return 0;
}

}  // namespace

namespace {

// The error on stderr and, under torchrun, in its error file (its failure summary quotes it).
int report(const char* kind, const std::string& message, const char* hint, int code) {
  std::fprintf(stderr, "error: %s\n%s", message.c_str(), hint);
  fasttrain::write_torchelastic_error_file(kind, message);
  return code;
}

int run_reporting_errors(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const fasttrain::ConfigError& error) {
    return report("fasttrain.ConfigError", error.what(),
                  "hint: see docs/CONFIG.md or `fasttrain config --reference`\n", 2);
  } catch (const fasttrain::Error& error) {
    return report("fasttrain.Error", error.what(), "", 1);
  } catch (const c10::Error& error) {
    return report("c10.Error", std::string("LibTorch: ") + error.what_without_backtrace(), "", 1);
  } catch (const std::exception& error) {
    return report("std.exception", error.what(), "", 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int code = run_reporting_errors(argc, argv);
  // A distributed run's NCCL communicators end here, before CUDA's own teardown at exit; after a failure
  // without waiting for collectives a dead peer never joins.
  try {
    fasttrain::shutdown_default_process_group(/*abort=*/code != 0);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "warning: shutting the process group down: %s\n", error.what());
  }
  return code;
}
