#include "max_pool.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

detail::MaxPoolKernels max_pool_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(max_pool_kernels, capability);
}

// input [N, C, H, W] (NHWC in memory).
detail::MaxPoolImages describe(c10::IntArrayRef input_sizes, bool bf16) {
  detail::MaxPoolImages p;
  p.batch = input_sizes[0];
  p.channels = input_sizes[1];
  p.height = input_sizes[2];
  p.width = input_sizes[3];
  p.out_height = p.height / 2;
  p.out_width = p.width / 2;
  p.bf16 = bf16;
  return p;
}

// body(begin, end) over the output rows, in parallel.
template <typename Body>
void for_output_rows(const detail::MaxPoolImages& p, const Body& body) {
  detail::parallel_pieces(0, p.batch * p.out_height, detail::rows_per_task(p.width * p.channels), body);
}

// Saves the argmax bytes, not the input: backward needs neither the input nor ATen's int64 indices.
class MaxPool2x2Function : public torch::autograd::Function<MaxPool2x2Function> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               int64_t capability) {
    detail::Pooled pooled = detail::pool2x2(input, static_cast<CpuCapability>(capability));
    ctx->save_for_backward({pooled.argmax});
    ctx->saved_data["input_sizes"] = input.sizes();
    ctx->saved_data["dtype"] = static_cast<int64_t>(input.scalar_type());
    ctx->saved_data["capability"] = capability;
    return pooled.output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("max_pool2x2");
    const torch::Tensor argmax = ctx->get_saved_variables()[0];
    const auto sizes = ctx->saved_data["input_sizes"].toIntVector();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const torch::Tensor grad_output = grads[0].to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
    const auto capability = static_cast<CpuCapability>(ctx->saved_data["capability"].toInt());
    return {detail::unpool2x2(grad_output, argmax, sizes, capability), torch::Tensor()};
  }
};

}  // namespace

detail::Pooled detail::pool2x2(const torch::Tensor& input, CpuCapability capability) {
  detail::MaxPoolImages p = describe(input.sizes(), input.scalar_type() == torch::kBFloat16);
  Pooled pooled;
  pooled.output = torch::empty({p.batch, p.channels, p.out_height, p.out_width},
                               input.options().memory_format(torch::MemoryFormat::ChannelsLast));
  pooled.argmax = torch::empty({pooled.output.numel()}, input.options().dtype(torch::kByte));
  p.input = input.data_ptr();
  p.output = pooled.output.data_ptr();
  p.argmax = pooled.argmax.data_ptr<uint8_t>();
  const auto kernel = max_pool_bodies(capability).forward;
  for_output_rows(p, [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
  return pooled;
}

torch::Tensor detail::unpool2x2(const torch::Tensor& grad_output, const torch::Tensor& argmax,
                                c10::IntArrayRef input_sizes, CpuCapability capability) {
  torch::Tensor grad_input =
      torch::empty(input_sizes, grad_output.options().memory_format(torch::MemoryFormat::ChannelsLast));
  detail::MaxPoolImages p = describe(input_sizes, grad_output.scalar_type() == torch::kBFloat16);
  p.argmax = argmax.data_ptr<uint8_t>();
  p.grad_output = grad_output.data_ptr();
  p.grad_input = grad_input.data_ptr();
  const auto kernel = max_pool_bodies(capability).backward;
  for_output_rows(p, [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
  return grad_input;
}

bool max_pool2x2_takes(const torch::Tensor& input) {
  return detail::cpu_float_or_bf16(input) && input.dim() == 4 && input.size(0) > 0 && input.size(1) > 0 &&
         input.size(2) >= 2 && input.size(3) >= 2 && input.is_contiguous(torch::MemoryFormat::ChannelsLast);
}

torch::Tensor max_pool2x2(const torch::Tensor& input, CpuCapability capability) {
  FT_CHECK(max_pool2x2_takes(input),
           "max_pool2x2 takes images [N, C, H, W] (H and W at least 2) in channels_last on the CPU in fp32 "
           "or bf16; got {} {}{}",
           input.defined() ? input.sizes() : c10::IntArrayRef{},
           input.defined() ? c10::toString(input.scalar_type()) : "none",
           input.defined() && input.dim() == 4 && !input.is_contiguous(torch::MemoryFormat::ChannelsLast)
               ? " not in channels_last"
               : "");
  detail::check_runnable(capability, "max_pool2x2");
  return MaxPool2x2Function::apply(input, static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
