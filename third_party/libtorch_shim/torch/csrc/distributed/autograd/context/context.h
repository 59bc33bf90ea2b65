#pragma once
// Debian's libtorch-dev (LibTorch 1.13) ships torch/csrc/distributed/c10d/reducer.hpp but not the
// distributed-autograd header it includes. The Reducer only names two things from it: the type of
// a gradient callback (checked by a static_assert) and a shared_ptr to a context, which has the
// same layout whatever the context is. CMake adds this directory to the include path only when the
// LibTorch found lacks the real header; a full LibTorch (the GPU machine's 2.x) uses its own.
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
