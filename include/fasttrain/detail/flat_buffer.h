#pragma once
// ZeRO's layout: a list of parameters in one flat buffer, padded to a multiple of the world size so
// that rank r owns the r-th contiguous part. The parameters become views into the buffer, with their
// memory layout kept (channels_last kernels stay so). Used by ZeRO-1/2 (dist/data_parallel.h, one
// buffer per optimizer group) and ZeRO-3 (dist/fully_sharded.h, one per block and group).
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace fasttrain {

struct FlatBuffer {
  std::vector<torch::Tensor> parameters;  // the model's, views into `whole`
  std::vector<int64_t> offsets;           // element offset of each parameter in `whole`
  torch::Tensor whole;                    // [world x part]: the parameters, then zero padding
  int64_t part = 0;
  int64_t world = 1;

  // Copies `parameters` (dense, one dtype and device) into a new buffer and makes them views into it.
  static FlatBuffer lay_out(std::vector<torch::Tensor> parameters, int64_t world);
  // whole[rank * part, (rank + 1) * part)
  torch::Tensor part_of(int64_t rank) const { return whole.narrow(0, rank * part, part); }
  // Every rank's part, in rank order: the outputs of an all-gather into `whole`.
  std::vector<torch::Tensor> parts() const;
  int64_t bytes() const { return whole.numel() * static_cast<int64_t>(whole.element_size()); }
  // [world x part]: the parameters' gradients in the flat layout (zero where there is none) times
  // 1 / world, as DDP's Reducer scales before it sums; the parameters' own gradients are dropped.
  // Undefined when no parameter has a gradient.
  torch::Tensor take_gradients() const;
};

}  // namespace fasttrain
