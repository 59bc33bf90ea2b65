#pragma once
// LibTorch's default random generators (dropout masks, torch::rand, anything drawn without an
// explicit generator): their states, to save, replay or put back.
//
//   {
//     fasttrain::RngStateGuard keep;   // torch.random.fork_rng()
//     torch::rand({4});                // draws that must not move the training's stream
//   }                                  // every default generator as it was
#include <torch/types.h>

#include <vector>

namespace fasttrain {

// CPU and every CUDA device of this machine.
std::vector<torch::Device> generator_devices();

// The state of `device`'s default generator (a U8 tensor) and setting it back; thread-safe.
torch::Tensor generator_state(const torch::Device& device);
void set_generator_state(const torch::Device& device, const torch::Tensor& state);

// Saves the states of every default generator and restores them when it goes out of scope.
class RngStateGuard {
 public:
  RngStateGuard();
  ~RngStateGuard();
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  std::vector<torch::Device> devices_;
  std::vector<torch::Tensor> states_;
};

}  // namespace fasttrain
