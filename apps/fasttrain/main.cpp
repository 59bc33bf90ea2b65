// fasttrain: the command-line tool. A thin layer over the library: parse a subcommand, build the
// Config, call the run functions of train/run.h. Only main() catches errors: it prints
// `error: ...` with a hint and exits 2 for bad configuration or usage, 1 for anything else.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

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

fasttrain::Config build_config(const ConfigArgs& args) {
  fasttrain::Config config = args.path.empty() ? fasttrain::Config() : fasttrain::load_config(args.path);
  for (const auto& assignment : args.overrides) fasttrain::apply_override(config, assignment);
  fasttrain::validate(config);
  return config;
}

int run(int argc, char** argv) {
  CLI::App app{
      "fasttrain: train neural networks fast on LibTorch, with the PyTorch performance playbook as "
      "switches"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("fasttrain 0.1.0 (LibTorch ") + TORCH_VERSION + ")");

  // ---- train ----
  ConfigArgs train_args;
  std::string run_dir;
  auto* train = app.add_subcommand("train", "Train a model; writes the run directory (runs/<run.name>)");
  add_config_args(*train, train_args, false);
  train->add_option("--run-dir", run_dir, "Run directory (default: <run.root>/<run.name>)");
  fasttrain::RunOptions run_options;
  train
      ->add_option("--resume", run_options.resume(),
                   "Continue from the newest checkpoint of the run directory (bare --resume), or from PATH: "
                   "a checkpoints/step-N directory or a run directory")
      ->expected(0, 1)
      ->default_str("latest");
  train->add_flag("--fresh", run_options.fresh(),
                  "Start over in a run directory that holds an earlier run (removes its checkpoints, metrics "
                  "and weights)");

  // ---- eval ----
  ConfigArgs eval_args;
  std::string weights;
  auto* eval = app.add_subcommand("eval", "Evaluate saved weights on the test set of the config's data");
  add_config_args(*eval, eval_args, false);
  eval->add_option("--weights", weights,
                   "safetensors weights with the model's names (RUN_DIR/final/model.safetensors)")
      ->required();

  // ---- generate ----
  ConfigArgs generate_args;
  std::string generate_weights, prompt;
  fasttrain::GenerateOptions generate_options(0);
  auto* generate = app.add_subcommand("generate", "Sample text from the weights of a trained gpt model");
  add_config_args(*generate, generate_args, false);
  generate
      ->add_option("--weights", generate_weights,
                   "safetensors weights of the model (RUN_DIR/final/model.safetensors); the config defaults "
                   "to the run's RUN_DIR/config.toml")
      ->required();
  generate->add_option("--prompt", prompt, "Text to continue (\"\": start a new document)");
  generate->add_option("--tokens", generate_options.max_new_tokens(), "Bytes to generate")
      ->capture_default_str();
  generate->add_option("--temperature", generate_options.temperature(), "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  generate->add_option("--top-k", generate_options.top_k(), "Sample among the k most likely bytes; 0 = all")
      ->capture_default_str();
  generate->add_option("--seed", generate_options.seed(), "Seed of the draws")->capture_default_str();

  // ---- find-lr ----
  ConfigArgs lr_args;
  fasttrain::LrFinderOptions lr_options;
  std::string lr_csv = "lr_find.csv";
  auto* find_lr =
      app.add_subcommand("find-lr", "LR range test: sweep the LR exponentially, suggest a max LR");
  add_config_args(*find_lr, lr_args, true);
  find_lr->add_option("--start-lr", lr_options.start_lr(), "First LR")->capture_default_str();
  find_lr->add_option("--end-lr", lr_options.end_lr(), "Last LR")->capture_default_str();
  find_lr->add_option("--steps", lr_options.steps(), "Optimizer steps of the sweep")->capture_default_str();
  find_lr->add_option("--csv", lr_csv, "Where to write the curve")->capture_default_str();

  // ---- find-batch ----
  ConfigArgs batch_args;
  fasttrain::BatchFinderOptions batch_options;
  auto* find_batch = app.add_subcommand(
      "find-batch",
      "The largest batch that fits memory.budget (CPU) or the GPU, with samples/s at each size");
  add_config_args(*find_batch, batch_args, true);
  find_batch->add_option("--steps", batch_options.steps(), "Optimizer steps per trial")
      ->capture_default_str();
  find_batch->add_option("--start", batch_options.start(), "First batch size tried")->capture_default_str();
  find_batch
      ->add_option("--max", batch_options.max_batch(), "Largest batch size tried (0 = the training set)")
      ->capture_default_str();
  find_batch
      ->add_option("--tolerance", batch_options.tolerance(),
                   "Stop when the largest fit is within this fraction of the smallest failure")
      ->capture_default_str();

  // ---- profile ----
  ConfigArgs profile_args;
  fasttrain::ProfileOptions profile_options;
  std::string profile_dir;
  auto* profile = app.add_subcommand(
      "profile", "Profile training steps: Chrome trace, memory timeline, time per phase and operator");
  add_config_args(*profile, profile_args, true);
  profile->add_option("--steps", profile_options.steps(), "Optimizer steps recorded")->capture_default_str();
  profile->add_option("--warmup-steps", profile_options.warmup_steps(), "Steps run before recording")
      ->capture_default_str();
  profile->add_option(
      "--run-dir", profile_dir,
      "Where trace.json, memory_timeline.csv and profile.json go (default: <run.root>/<run.name>)");

  // ---- doctor ----
  ConfigArgs doctor_args;
  fasttrain::DoctorOptions doctor_options;
  std::string doctor_dir;
  bool doctor_json = false;
  auto* doctor = app.add_subcommand(
      "doctor", "Measure a short run and say which playbook techniques it needs, with evidence, ranked");
  add_config_args(*doctor, doctor_args, true);
  doctor->add_option("--steps", doctor_options.steps(), "Steps recorded per measurement")
      ->capture_default_str();
  doctor
      ->add_option("--min-seconds", doctor_options.min_seconds(),
                   "Each timed comparison lasts at least this long (short runs are noise)")
      ->capture_default_str();
  doctor->add_flag("--json", doctor_json, "Print doctor.json instead of the text");
  doctor->add_option("--run-dir", doctor_dir,
                     "Where doctor.json and the measurements' profiles go (default: <run.root>/<run.name>)");

  // ---- tune ----
  ConfigArgs tune_args;
  fasttrain::TuneOptions tune_options;
  std::string tune_dir;
  auto* tune = app.add_subcommand(
      "tune", "Try the switches that apply here, keep what is faster, write the tuned config and the table");
  add_config_args(*tune, tune_args, true);
  tune->add_option("--steps", tune_options.steps(), "Steps timed per trial")->capture_default_str();
  tune->add_option("--min-seconds", tune_options.min_seconds(),
                   "Each trial lasts at least this long, past --steps if need be (short runs are noise)")
      ->capture_default_str();
  tune->add_option("--min-gain", tune_options.min_gain(), "Speedup needed to keep a change")
      ->capture_default_str();
  tune->add_flag("--batch", tune_options.batch(), "Also try 2x and 4x the batch (the LR scaled with it)");
  tune->add_option("--run-dir", tune_dir, "Where tuned.toml and tune.md go (default: <run.root>/<run.name>)");

  // ---- config ----
  ConfigArgs show_args;
  bool reference = false;
  auto* config = app.add_subcommand("config", "Print the effective config (defaults, file, --set) as TOML");
  add_config_args(*config, show_args, false);
  config->add_flag("--reference", reference, "Print the Markdown reference of every key (docs/CONFIG.md)");

  // ---- report ----
  std::string report_dir, report_out;
  auto* report = app.add_subcommand(
      "report", "Write one self-contained HTML page for a run: curves, step time, memory, doctor, config");
  report->add_option("run_dir", report_dir, "Run directory (holds metrics.jsonl)")->required();
  report->add_option("--out", report_out, "Where to write the page (default: RUN_DIR/report.html)");

  // ---- launch ----
  fasttrain::LaunchOptions launch_options(1);
  std::vector<std::string> launch_command;
  auto* launch = app.add_subcommand(
      "launch",
      "Run a command as N ranks of one distributed job on this machine (like torchrun --nproc-per-node N "
      "--no-python): fasttrain launch --nproc 2 -- fasttrain train cfg.toml");
  launch->add_option("--nproc", launch_options.nproc(), "Ranks to start")->required();
  launch->add_option("--master-addr", launch_options.master_addr(), "Rendezvous host (MASTER_ADDR)");
  launch->add_option("--master-port", launch_options.master_port(), "Rendezvous port (default: a free one)");
  launch->add_option("--grace-s", launch_options.grace_s(),
                     "After a rank fails, seconds the others get to exit before SIGKILL");
  launch->add_option("command", launch_command, "The command each rank runs, after --")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }

  if (*train) {
    fasttrain::Config cfg = build_config(train_args);
    if (run_dir.empty()) run_dir = cfg.run.root() + "/" + cfg.run.name();
    // A distributed job prints once, from rank 0 (the other ranks run the same config). The full
    // effective config goes to RUN_DIR/config.toml (`fasttrain config` prints it), not the terminal.
    const std::shared_ptr<fasttrain::ProcessGroup> group = fasttrain::default_process_group(cfg.dist);
    const bool rank0 = !group || group->rank() == 0;
    // SIGINT/SIGTERM: the run stops after the micro-batch in flight and saves a checkpoint.
    fasttrain::StopSignals stop_signals;
    fasttrain::FitSummary summary = fasttrain::train_run(cfg, run_dir, run_options);
    const int signal = fasttrain::StopSignals::received();
    const int stopped_code = 128 + (signal != 0 ? signal : SIGINT);  // a stop agreed with the other ranks
    if (!rank0) return summary.interrupted ? stopped_code : 0;
    std::cout << summary.to_json().dump(2) << "\n";
    if (summary.interrupted) {
      std::cerr << "fasttrain: interrupted at step " << summary.steps << "; state saved in "
                << summary.checkpoint << "\nfasttrain: continue with: fasttrain train ... --run-dir "
                << run_dir << " --resume\n";
      return stopped_code;
    }
    std::cerr << "fasttrain: run written to " << run_dir << "\n";
  } else if (*launch) {
    return fasttrain::launch(launch_options, launch_command);
  } else if (*eval) {
    fasttrain::EvalResult result = fasttrain::eval_run(build_config(eval_args), weights);
    nlohmann::json out{
        {"test_accuracy", result.accuracy}, {"test_loss", result.loss}, {"samples", result.samples}};
    if (result.bits_per_byte) out["test_bits_per_byte"] = *result.bits_per_byte;
    std::cout << out.dump(2) << "\n";
  } else if (*generate) {
    if (generate_args.path.empty()) {
      // RUN_DIR/final/model.safetensors -> RUN_DIR/config.toml
      const auto run_config =
          std::filesystem::path(generate_weights).parent_path().parent_path() / "config.toml";
      if (!std::filesystem::is_regular_file(run_config)) {
        throw fasttrain::ConfigError(fmt::format(
            "no config given and none at {} (the run directory of --weights): pass the run's config.toml",
            run_config.string()));
      }
      generate_args.path = run_config.string();
    }
    std::cout << prompt
              << fasttrain::generate_run(build_config(generate_args), generate_weights, prompt,
                                         generate_options)
              << "\n";
  } else if (*find_lr) {
    fasttrain::LrFinderResult result = fasttrain::find_lr_run(build_config(lr_args), lr_options, lr_csv);
    std::cout << result.table();
    std::cout << fmt::format("suggested max lr: {:.3g}{}\ncurve written to {}\n", result.suggested_lr,
                             result.diverged ? " (the sweep stopped at divergence)" : "", lr_csv);
  } else if (*profile) {
    fasttrain::Config cfg = build_config(profile_args);
    if (profile_dir.empty()) profile_dir = cfg.run.root() + "/" + cfg.run.name();
    std::cout << fasttrain::profile_run(cfg, profile_dir, profile_options).table();
  } else if (*tune) {
    fasttrain::Config cfg = build_config(tune_args);
    if (tune_dir.empty()) tune_dir = cfg.run.root() + "/" + cfg.run.name();
    fasttrain::TuneResult result = fasttrain::tune(cfg, tune_dir, tune_options);
    std::cout << result.table() << "written: " << tune_dir << "/tuned.toml, " << tune_dir << "/tune.md\n";
  } else if (*doctor) {
    fasttrain::Config cfg = build_config(doctor_args);
    if (doctor_dir.empty()) doctor_dir = cfg.run.root() + "/" + cfg.run.name();
    fasttrain::DoctorReport found = fasttrain::diagnose(cfg, doctor_dir, doctor_options);
    fasttrain::write_json_file(doctor_dir + "/doctor.json", found.to_json());
    std::cout << (doctor_json ? found.to_json().dump(2) + "\n" : found.text());
  } else if (*find_batch) {
    fasttrain::BatchFinderResult result = fasttrain::find_batch_size(build_config(batch_args), batch_options);
    std::cout << result.table();
  } else if (*config) {
    if (reference) {
      std::cout << fasttrain::config_reference();
    } else {
      std::cout << fasttrain::to_toml(build_config(show_args));
    }
  } else if (*report) {
    if (report_out.empty()) report_out = report_dir + "/report.html";
    fasttrain::write_report(report_dir, report_out);
    std::cout << "report written to " << report_out << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const fasttrain::ConfigError& error) {
    std::fprintf(stderr, "error: %s\nhint: see docs/CONFIG.md or `fasttrain config --reference`\n",
                 error.what());
    return 2;
  } catch (const fasttrain::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  } catch (const c10::Error& error) {
    std::fprintf(stderr, "error: LibTorch: %s\n", error.what_without_backtrace());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
