#pragma once
// The Trainer's options: its keys of [train] (the run's own keys of [train], such as the seed, the
// device and the threads, are the run layer's: config/config.h TrainConfig) and of [log].
//
//   auto options = fasttrain::TrainOptions().epochs(3).accumulation(2).clip_norm(1.0).target("rmse <= 0.5");
//   options.precision(torch::kBFloat16);   // a plain dtype: "auto" is resolved before the trainer
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"

namespace fasttrain {

// A metric reaching a value: "accuracy >= 0.91", "rmse <= 0.5".
struct Target {
  std::string metric;
  bool at_least = true;  // ">=": the metric must rise to `value`; "<=": fall to it
  double value = 0;

  bool reached(double metric_value) const { return at_least ? metric_value >= value : metric_value <= value; }
  std::string describe() const;  // "accuracy >= 0.91"
  // "METRIC >= VALUE" or "METRIC <= VALUE"; anything else is a ConfigError naming `key`.
  static Target parse(const std::string& text, const std::string& key);
};

struct TrainOptions {
  FT_KEYS(TrainOptions);
  FT_KEY(int64_t, epochs, "Passes over the training set (the run ends earlier when max_steps > 0 is reached)",
         at_least(1), KeyTrait::kRunLength) = 1;
  FT_KEY(int64_t, max_steps, "Stop after this many optimizer steps (0 = epochs decide)", at_least(0),
         KeyTrait::kRunLength) = 0;
  FT_KEY(int64_t, accumulation,
         "Micro-batches per optimizer step (the effective batch is accumulation x data.batch_size)",
         at_least(1)) = 1;
  FT_KEY(double, clip_norm, "Clip gradients to this global L2 norm (0 = off)", at_least(0)) = 0.0;
  FT_KEY(bool, detect_anomaly,
         "Autograd anomaly detection: NaN checks and forward stack traces in backward (debugging; slow)",
         KeyTrait::kNeutral) = false;
  FT_KEY(int64_t, eval_every_steps, "Evaluate every N optimizer steps (0 = at the end of each epoch only)",
         at_least(0), KeyTrait::kNeutral) = 0;
  FT_KEY(int64_t, eval_from_step,
         "No evaluation before this optimizer step, but at the end of the run (in a race to a target, early "
         "evaluations only cost time)",
         at_least(0), KeyTrait::kNeutral) = 0;
  FT_KEY(
      bool, eval_flip,
      "Test-time augmentation: evaluate each image and its mirror image (flipped left-right) and score the "
      "mean of the two outputs (images [N, C, H, W] only; for data whose labels survive a mirror)",
      KeyTrait::kNeutral) = false;
  FT_KEY(
      std::string, target,
      "A metric of the task reaching a value, \"METRIC >= VALUE\" or \"METRIC <= VALUE\" (\"rmse <= 0.5\"): "
      "its first crossing is time_to_target_s (\"\" = none)",
      KeyRule<std::string>([](const std::string& key, const std::string& value) {
        if (!value.empty()) Target::parse(value, key);
      }),
      KeyTrait::kNeutral) = "";
  FT_KEY(double, target_accuracy, "Shorthand for target = \"accuracy >= VALUE\" (0 = none)",
         in_unit_interval(), KeyTrait::kNeutral) = 0.0;
  FT_KEY(bool, stop_at_target, "End the run when the target is reached", KeyTrait::kNeutral) = false;
  // ---- resolved by the run layer from [train]'s precision and cuda_graphs ----
  // The autocast dtype of forward and loss: kFloat (off), kBFloat16 or kHalf (with a GradScaler).
  FT_ARG(torch::ScalarType, precision) = torch::kFloat;
  // Capture each optimizer step in a CUDA graph (an Error where it cannot: train/step_engine.h).
  FT_ARG(bool, cuda_graphs) = false;

 public:
  // `target`, or target_accuracy's; none when neither is set. Both set is a ConfigError.
  std::optional<Target> resolved_target() const;
};

// [log]
struct LogOptions {
  FT_KEYS(LogOptions);
  FT_KEY(std::string, progress, "auto (a bar on a terminal, lines otherwise), bar, lines or none",
         one_of({"auto", "bar", "lines", "none"}), KeyTrait::kNeutral) = "auto";
  FT_KEY(int64_t, every_steps, "Optimizer steps between metrics records and progress lines", at_least(1),
         KeyTrait::kNeutral) = 50;
};

}  // namespace fasttrain
