#pragma once
// Gradient clipping by global L2 norm, without a host-device synchronisation: the norm stays a
// tensor and the scale is clamped on the device (torch.nn.utils.clip_grad_norm_ of PyTorch 2.x).
//
//   torch::Tensor norm = fasttrain::clip_grad_norm(model->parameters(), 1.0);  // 0-dim, pre-clip norm
#include <torch/types.h>

#include <functional>
#include <vector>

namespace fasttrain {

// Sums a 0-dim squared norm over the holders of the other gradients (ZeRO: the other ranks' parts).
using SquaredNormReducer = std::function<void(torch::Tensor&)>;

// Scales all gradients by min(1, max_norm / (norm + 1e-6)); parameters without a gradient are
// skipped. Returns the total norm before clipping (0-dim tensor; 0 when no parameter has one).
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                             const SquaredNormReducer& reduce = nullptr);

// The global L2 norm of the gradients, as clip_grad_norm measures it, without clipping.
torch::Tensor grad_norm(const std::vector<torch::Tensor>& parameters,
                        const SquaredNormReducer& reduce = nullptr);

}  // namespace fasttrain
