#pragma once
// TrainOptions: the [train] section of the config.
//
//   auto options = fasttrain::TrainOptions().epochs(3).accumulation(2).clip_norm(1.0);
#include <cstdint>
#include <string>

#include "fasttrain/util/arg.h"

namespace fasttrain {

struct TrainOptions {
  // Passes over the training set; the run ends earlier when max_steps > 0 is reached.
  FT_ARG(int64_t, epochs) = 1;
  // Optimizer steps to run in total (0 = as many as `epochs` gives).
  FT_ARG(int64_t, max_steps) = 0;
  // Micro-batches per optimizer step; the effective batch is accumulation x data.batch_size.
  FT_ARG(int64_t, accumulation) = 1;
  // Clip gradients to this global L2 norm before the step (0 = off).
  FT_ARG(double, clip_norm) = 0.0;
  FT_ARG(double, label_smoothing) = 0.0;
  FT_ARG(int64_t, seed) = 0;
  // Intra-op threads; 0 = "auto": chosen for the hardware, precision and model (config/auto.h).
  FT_ARG(int, threads) = 0;
  // Threads of the BLAS library's own pool, where the BLAS is OpenBLAS (Debian's LibTorch runs its
  // fp32 matmuls there, outside `threads`); 0 = the library's own count (OPENBLAS_NUM_THREADS, or
  // every core); -1 = "auto" (config/auto.h).
  FT_ARG(int, blas_threads) = -1;
  // "fp32" | "bf16" (autocast; CPU and CUDA) | "fp16" (autocast + GradScaler; CUDA only) | "auto"
  // (bf16 where the hardware runs it natively, else fp32: config/auto.h).
  FT_ARG(std::string, precision) = "fp32";
  // Conv kernels and input batches in channels_last (NHWC) layout.
  FT_ARG(bool, channels_last) = false;
  // cuDNN tries the convolution algorithms for each new shape and keeps the fastest (fixed shapes).
  FT_ARG(bool, cudnn_benchmark) = true;
  // TF32 tensor cores for fp32 matmuls and convolutions on Ampere and later (10-bit mantissa inputs).
  FT_ARG(bool, tf32) = true;
  // Deterministic algorithms only (an error for ops that have none); turns cudnn_benchmark off.
  FT_ARG(bool, deterministic) = false;
  // Autograd anomaly detection (a debugging aid: every backward op checks for NaN and keeps the
  // forward's stack trace; much slower).
  FT_ARG(bool, detect_anomaly) = false;
  // The whole optimizer step captured in a CUDA graph and replayed (train/step_engine.h): "auto"
  // (where it applies; otherwise eager, and the run says why) | "true" (an error where it cannot) |
  // "false".
  FT_ARG(std::string, cuda_graphs) = "auto";
  // "auto" | "cpu" | "cuda" | "cuda:N".
  FT_ARG(std::string, device) = "auto";
  // Evaluate on the test set every N optimizer steps (0 = only at the end of each epoch).
  FT_ARG(int64_t, eval_every_steps) = 0;
  // No evaluation (periodic or at epoch ends) before this optimizer step, except at the end of the
  // run: in a race to a target accuracy, early evaluations only cost time.
  FT_ARG(int64_t, eval_from_step) = 0;
  // Test accuracy whose first crossing is recorded as time_to_target_s (0 = none).
  FT_ARG(double, target_accuracy) = 0.0;
  // End the run as soon as target_accuracy is reached.
  FT_ARG(bool, stop_at_target) = false;
  // Initial weights: a safetensors file with the model's parameter and buffer names (for example a
  // final/model.safetensors); "" = random initialisation from `seed`.
  FT_ARG(std::string, init_from) = "";
};

}  // namespace fasttrain
