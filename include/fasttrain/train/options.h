#pragma once
// TrainOptions: the [train] section of the config.
//
//   auto options = fasttrain::TrainOptions().epochs(3).accumulation(2).clip_norm(1.0);
#include <cstdint>
#include <string>

#include "fasttrain/util/arg.h"
#include "fasttrain/util/key.h"

namespace fasttrain {

struct TrainOptions {
  FT_KEYS(TrainOptions);
  FT_KEY(int64_t, epochs, "Passes over the training set (the run ends earlier when max_steps > 0 is reached)",
         at_least(1)) = 1;
  FT_KEY(int64_t, max_steps, "Stop after this many optimizer steps (0 = epochs decide)", at_least(0)) = 0;
  FT_KEY(int64_t, accumulation,
         "Micro-batches per optimizer step (the effective batch is accumulation x data.batch_size)",
         at_least(1)) = 1;
  FT_KEY(double, clip_norm, "Clip gradients to this global L2 norm (0 = off)", at_least(0)) = 0.0;
  FT_KEY(double, label_smoothing, "Cross-entropy label smoothing", in_unit_interval()) = 0.0;
  FT_KEY(int64_t, seed, "Seed of initialisation, shuffling and augmentation", at_least(0)) = 0;
  FT_KEY(int, threads,
         "Intra-op (OpenMP) threads, or \"auto\" (also 0): the physical cores (this rank's share), except an "
         "fp32 matmul model (mlp, gpt) on OpenBLAS, which gets 1 and leaves the cores to OpenBLAS's pool; "
         "the run says what it chose",
         integer_or_auto<int>(0, 0)) = 0;
  FT_KEY(int, blas_threads,
         "Threads of OpenBLAS's own pool, which runs the fp32 matmuls when LibTorch's BLAS is OpenBLAS (0 = "
         "the library's count: OPENBLAS_NUM_THREADS or every core), or \"auto\": 1 for a conv net in fp32 "
         "(its convs run on the OpenMP threads), the cores for an fp32 matmul model",
         integer_or_auto<int>(-1, 0)) = -1;
  FT_KEY(std::string, precision,
         "fp32, bf16 (autocast to bfloat16), fp16 (autocast to float16 with a GradScaler; CUDA only) or "
         "auto: bf16 where the hardware runs it natively (CPU with AVX512-BF16 or AMX, CUDA compute "
         "capability >= 8.0), fp32 elsewhere",
         one_of({"auto", "fp32", "bf16", "fp16"})) = "fp32";
  FT_KEY(bool, channels_last,
         "Conv kernels and input batches in channels_last (NHWC) layout: faster conv kernels") = false;
  FT_KEY(bool, cudnn_benchmark,
         "CUDA: let cuDNN benchmark the conv algorithms per shape and keep the fastest") = true;
  FT_KEY(bool, tf32, "CUDA: TF32 tensor cores for fp32 matmuls and convolutions (Ampere and later)") = true;
  FT_KEY(bool, deterministic,
         "Deterministic algorithms only (an error for ops without one); disables cudnn_benchmark") = false;
  FT_KEY(bool, detect_anomaly,
         "Autograd anomaly detection: NaN checks and forward stack traces in backward (debugging; slow)") =
      false;
  FT_KEY(std::string, device, "auto, cpu, cuda or cuda:N") = "auto";
  FT_KEY(std::string, cuda_graphs,
         "Capture the whole optimizer step in a CUDA graph and replay it: \"auto\" (where it applies; "
         "otherwise eager, and the run says why), true (an error where it cannot) or false",
         switch_or_auto()) = "auto";
  FT_KEY(int64_t, eval_every_steps, "Evaluate every N optimizer steps (0 = at the end of each epoch only)",
         at_least(0)) = 0;
  FT_KEY(int64_t, eval_from_step,
         "No evaluation before this optimizer step, but at the end of the run (in a race to a target "
         "accuracy, early evaluations only cost time)",
         at_least(0)) = 0;
  FT_KEY(double, target_accuracy, "Test accuracy whose first crossing is time_to_target_s (0 = none)",
         in_unit_interval()) = 0.0;
  FT_KEY(bool, stop_at_target, "End the run when target_accuracy is reached") = false;
  FT_KEY(std::string, init_from,
         "Initial weights from a safetensors file with the model's names (\"\" = random init from seed)") =
      "";
};

}  // namespace fasttrain
