#include "fasttrain/memory/checkpoint.h"

#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/nn/modules/container/any.h>

#include <mutex>
#include <optional>

#include "fasttrain/detail/tensor_guard.h"
#include "fasttrain/precision/autocast.h"
#include "fasttrain/util/check.h"
#include "fasttrain/util/rng.h"

namespace fasttrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs to rerun the block as forward ran it. Held by the autograd node through a
// capsule in saved_data (it cannot hold a std::function otherwise).
struct Recompute : torch::CustomClassHolder {
  CheckpointBlock block;
  size_t stand_in_count = 0;
  std::vector<torch::Tensor> buffers;  // restored after the recompute
  torch::Tensor cpu_rng;
  std::optional<torch::Device> device;  // the input's accelerator, whose RNG is also replayed
  torch::Tensor device_rng;
  AutocastState autocast;
};

// Sets the RNG states forward saw for the guard's lifetime and then puts back the current ones, so
// the recompute draws forward's dropout masks and leaves the training's random stream untouched
// (torch.random.fork_rng).
class RngReplay {
 public:
  explicit RngReplay(const Recompute& recompute) : recompute_(recompute) {
    cpu_now_ = generator_state(torch::kCPU);
    set_generator_state(torch::kCPU, recompute_.cpu_rng);
    if (recompute_.device) {
      device_now_ = generator_state(*recompute_.device);
      set_generator_state(*recompute_.device, recompute_.device_rng);
    }
  }
  ~RngReplay() {
    set_generator_state(torch::kCPU, cpu_now_);
    if (recompute_.device) set_generator_state(*recompute_.device, device_now_);
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  const Recompute& recompute_;
  torch::Tensor cpu_now_;
  torch::Tensor device_now_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Runs under no-grad (Function::apply), so the block's intermediate activations are freed as it
  // goes; only `input` is saved. `stand_in` (empty, or one tensor when the input is data) is an input
  // only so that the output requires grad.
  static torch::Tensor forward(AutogradContext* ctx, const CheckpointBlock& block,
                               const std::vector<torch::Tensor>& buffers, const torch::Tensor& input,
                               at::TensorList stand_in) {
    auto recompute = c10::make_intrusive<Recompute>();
    recompute->block = block;
    recompute->stand_in_count = stand_in.size();
    recompute->buffers = buffers;
    recompute->cpu_rng = generator_state(torch::kCPU);
    if (input.device().is_cuda()) {
      recompute->device = input.device();
      recompute->device_rng = generator_state(input.device());
    }
    recompute->autocast = AutocastState::current();

    const auto version = input._version();
    torch::Tensor output = block(input);
    FT_CHECK(input._version() == version,
             "checkpoint: the block modified its input in place (an in-place op such as ReLU(inplace=true) "
             "first?); the recompute in backward needs the input unchanged: make that op out-of-place or "
             "checkpoint it together with the layer before it");
    ctx->save_for_backward({input});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    torch::Tensor input = ctx->get_saved_variables()[0];
    torch::Tensor detached = input.detach();
    detached.requires_grad_(input.requires_grad());

    torch::Tensor output;
    {
      // The recompute updates the buffers a second time (BatchNorm's running statistics with the
      // same batch): forward's values are put back when this scope ends, after the backward below,
      // since the recomputed graph saved the buffers (batch_norm's backward checks their version;
      // training-mode gradients do not depend on their values).
      TensorValuesGuard keep_buffers(recompute->buffers);
      {
        RngReplay rng(*recompute);
        AutocastStateGuard autocast(recompute->autocast);
        torch::AutoGradMode grad_mode(true);
        output = recompute->block(detached);
      }
      // Reentrant backward through the recomputed graph: accumulates into the parameters' .grad and
      // into detached.grad.
      if (output.requires_grad()) torch::autograd::backward({output}, {grad_outputs[0]});
    }

    // One gradient per forward argument: none for the block and the buffers, the input's, none for
    // the stand-in (the parameters' were accumulated above).
    variable_list grads(3 + recompute->stand_in_count);
    if (detached.requires_grad()) grads[2] = detached.grad();
    return grads;
  }
};

}  // namespace

torch::Tensor checkpoint(const CheckpointBlock& block, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters,
                         const std::vector<torch::Tensor>& buffers) {
  FT_CHECK(static_cast<bool>(block), "checkpoint: the block is empty");
  if (!torch::GradMode::is_enabled()) return block(input);
  std::vector<torch::Tensor> trainable;
  for (const torch::Tensor& parameter : parameters) {
    if (parameter.requires_grad()) trainable.push_back(parameter);
  }
  FT_CHECK(
      input.requires_grad() || !trainable.empty(),
      "checkpoint: neither the input nor any of the {} given parameters requires grad, so backward would "
      "never reach the block and its parameters would get no gradient; pass the block's parameters",
      parameters.size());
  if (input.requires_grad()) return CheckpointFunction::apply(block, buffers, input, at::TensorList());
  // The input is data: a stand-in that requires grad makes the output require it, so backward reaches
  // the block. Not the parameters themselves: an edge to their gradient accumulators would run them a
  // second time, with no gradient, and DDP's Reducer would count each parameter ready twice.
  torch::Tensor stand_in = torch::zeros({}, input.options().dtype(torch::kFloat)).requires_grad_();
  return CheckpointFunction::apply(block, buffers, input, at::TensorList(stand_in));
}

CheckpointPolicy CheckpointPolicy::every_k(int64_t k) {
  FT_CONFIG_CHECK(k >= 1, "memory.checkpoint_every must be >= 1 with memory.checkpoint = 'every_k', got {}",
                  k);
  return {k};
}

CheckpointPolicy CheckpointPolicy::parse(const std::string& mode, int64_t every) {
  if (mode == "none") return none();
  if (mode == "blocks") return blocks();
  FT_CONFIG_CHECK(mode == "every_k", "memory.checkpoint must be one of none, blocks, every_k; got '{}'",
                  mode);
  return every_k(every);
}

std::vector<std::pair<size_t, size_t>> checkpoint_blocks(torch::nn::SequentialImpl& sequential) {
  auto starts_block = [](const torch::nn::AnyModule& child) {
    for (const torch::Tensor& parameter : child.ptr()->parameters()) {
      if (parameter.dim() >= 2) return true;
    }
    return false;
  };
  std::vector<std::pair<size_t, size_t>> blocks;
  for (size_t index = 0; index < sequential.size(); ++index) {
    if (blocks.empty() || starts_block(*(sequential.begin() + index))) {
      blocks.emplace_back(index, index + 1);
    } else {
      blocks.back().second = index + 1;
    }
  }
  return blocks;
}

torch::Tensor checkpoint_sequential(torch::nn::SequentialImpl& sequential, const torch::Tensor& input,
                                    const CheckpointPolicy& policy, BlockHooks* hooks) {
  if (!hooks && (!policy.enabled() || !torch::GradMode::is_enabled())) return sequential.forward(input);
  torch::Tensor x = input;
  const auto blocks = checkpoint_blocks(sequential);
  for (size_t block = 0; block < blocks.size(); ++block) {
    // Copies of the AnyModules share the children; the autograd graph keeps them alive.
    std::vector<torch::nn::AnyModule> children;
    std::vector<torch::Tensor> parameters, buffers;
    bool trainable = x.requires_grad();
    for (size_t index = blocks[block].first; index < blocks[block].second; ++index) {
      children.push_back(*(sequential.begin() + index));
      for (const torch::Tensor& parameter : children.back().ptr()->parameters()) {
        parameters.push_back(parameter);
        trainable |= parameter.requires_grad();
      }
      for (const torch::Tensor& buffer : children.back().ptr()->buffers()) buffers.push_back(buffer);
    }
    auto run = [children](const torch::Tensor& t) mutable {
      torch::Tensor y = t;
      for (auto& child : children) y = child.forward(y);
      return y;
    };
    // A block with nothing to differentiate (parameter-free layers on the data) has no activations
    // worth recomputing: it runs normally.
    if (hooks) hooks->before_block(sequential, blocks[block].first);
    if (policy.applies(static_cast<int64_t>(block)) && trainable && torch::GradMode::is_enabled()) {
      x = checkpoint(run, x, parameters, buffers);
    } else {
      x = run(x);
    }
    if (hooks) x = hooks->after_block(sequential, blocks[block].first, std::move(x));
  }
  return x;
}

}  // namespace fasttrain
