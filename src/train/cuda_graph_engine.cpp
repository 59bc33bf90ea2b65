// The captured step (train/step_engine.h), compiled against a LibTorch with CUDA only.
//
// PyTorch's "whole network capture" recipe: a few eager steps on a side stream first (cuBLAS and
// cuDNN initialise, cudnn.benchmark picks its algorithms, the optimizer creates its state), the
// gradients to None, then one step captured with the gradients allocated inside the graph's memory
// pool, where they stay: each replay's first backward writes them and the rest of the window adds to
// them, so they are never set to None again. The captured step is Trainer::backward_micro_batch for
// each micro-batch of the window from static input buffers, then Trainer::optimizer_step at the LR
// that the schedule's device table holds for the device's step counter (StepFunctions).
#ifdef FASTTRAIN_CUDA

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <chrono>

#include "fasttrain/train/step_engine.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

class CudaGraphEngine : public StepEngine {
 public:
  CudaGraphEngine(StepFunctions& step, int warmup_steps) : step_(step), warmup_steps_(warmup_steps) {
    FT_CHECK(step.device().is_cuda(), "the CUDA-graph step needs a model on a CUDA device, not {}",
             step.device().str());
  }
  const char* name() const override { return "cuda_graph"; }
  bool stops_inside_windows() const override { return false; }
  double capture_seconds() const override { return capture_seconds_; }

  // memory.warmup: the warm-up steps and the capture on `window`, before the clock. (The capture step
  // records without running, so unlike step() nothing is replayed here.)
  void prepare(const std::vector<Batch>& window) override {
    FT_CHECK(!graph_ && warmed_up_ == 0, "the CUDA-graph step was already warmed up or captured");
    FT_CHECK(!window.empty(), "the CUDA-graph step's warm-up needs a window of at least one batch");
    window_size_ = static_cast<int64_t>(window.size());
    for (; warmed_up_ < warmup_steps_; ++warmed_up_) {
      window_ = window;
      on_side_stream([&] { eager_step(); });
    }
    window_ = window;
    capture();
  }

  void add_micro_batch(const Batch& batch, int64_t index, int64_t size) override {
    if (!graph_) {  // warm-up and the capture step take the batches as they come
      FT_CHECK(static_cast<int64_t>(window_.size()) == index,
               "micro-batch {} of the window came out of order", index);
      window_.push_back(batch);
      window_size_ = size;
      return;
    }
    FT_CHECK(size == window_size_ && index < size,
             "a captured step takes windows of {} micro-batches, got {} of {}", window_size_, index, size);
    Batch& staged = static_window_[static_cast<size_t>(index)];
    try {
      staged.copy_from(batch, /*non_blocking=*/true);
    } catch (const Error& error) {
      FT_FAIL(
          "a captured step takes batches of one shape: {}; set train.cuda_graphs = false for batches that "
          "change shape",
          error.what());
    }
  }

  void step() override {
    if (graph_) {
      graph_->replay();
      step_.count_replayed_step();
      return;
    }
    if (warmed_up_ < warmup_steps_) {
      on_side_stream([&] { eager_step(); });
      ++warmed_up_;
      return;
    }
    capture();
    graph_->replay();  // the captured step ran nothing: this replay is its step (already counted)
  }

 private:
  // The window's micro-batches through the trainer's step, as the eager engine runs them.
  void eager_step() {
    for (size_t i = 0; i < window_.size(); ++i) {
      step_.backward_micro_batch(window_[i], window_size_, i + 1 == window_.size());
    }
    step_.optimizer_step(step_.next_lr(), /*keep_gradients=*/false);
    window_.clear();
  }

  // Runs `work` on a side stream that waits for the current one, and the current one for it.
  template <typename Work>
  void on_side_stream(Work&& work) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    at::cuda::CUDAEvent before, after;
    before.record(current);
    before.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      work();
    }
    after.record(side);
    after.block(current);
  }

  void capture() {
    const auto start = std::chrono::steady_clock::now();
    // The static inputs: the capture step's own batches, where each replay's batches are copied.
    static_window_ = std::move(window_);
    window_.clear();
    for (auto& batch : static_window_) {
      batch = batch.map([](const torch::Tensor& t) { return t.clone(at::MemoryFormat::Preserve); });
    }
    step_.drop_gradients();  // gradients are allocated inside the graph's pool
    graph_ = std::make_unique<at::cuda::CUDAGraph>();
    on_side_stream([&] {
      // Thread-local capture: the loader's worker threads may allocate pinned memory meanwhile, which
      // a global capture would count as an unsafe call and fail (seen on an H100: text windows).
      graph_->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        for (size_t i = 0; i < static_window_.size(); ++i) {
          step_.backward_micro_batch(static_window_[i], window_size_, i + 1 == static_window_.size());
        }
        step_.optimizer_step(step_.next_lr_on_device(), /*keep_gradients=*/true);
      } catch (const std::exception& error) {
        end_failed_capture();
        FT_FAIL(
            "train.cuda_graphs: the step could not be captured as a CUDA graph: {}\nAn op of the model's "
            "forward or loss forbids capture (a host synchronisation such as .item() or a print of a CUDA "
            "tensor, a CPU tensor, a shape that depends on the data; in a TorchScript model, any of these in "
            "its forward); set train.cuda_graphs = false",
            message_of(error));
      }
      graph_->capture_end();
    });
    capture_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // As torch.cuda.graph's __exit__ after an error: the capture ends so the stream can be used again;
  // what ending it raises adds nothing to the error that stopped it.
  void end_failed_capture() {
    try {
      graph_->capture_end();
    } catch (const std::exception&) {
    }
    graph_.reset();
  }

  StepFunctions& step_;
  int warmup_steps_;
  int warmed_up_ = 0;
  double capture_seconds_ = 0;
  int64_t window_size_ = 0;
  std::vector<Batch> window_;         // before capture: the current window's micro-batches
  std::vector<Batch> static_window_;  // after: the graph's input buffers
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
};

std::unique_ptr<StepEngine> make_cuda_graph_engine(StepFunctions& step, int warmup_steps) {
  FT_CHECK(warmup_steps >= 1, "the CUDA-graph step needs at least one warm-up step, got {}", warmup_steps);
  return std::make_unique<CudaGraphEngine>(step, warmup_steps);
}

}  // namespace fasttrain

#endif  // FASTTRAIN_CUDA
