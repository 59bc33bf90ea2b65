#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

// The inputs a parallel task takes: a multiple of every capability's run of 4 vectors (32 floats under AVX2,
// 64 under AVX512), so that only the last task has a shorter run.
constexpr int64_t kInputsPerTask = 128;

// Whether dz = dy where the ReLU passes it is nonzero at each element of [M, N] (1 or 0), written without
// branches: the ReLU's survivors fall at random, and a branch per element mispredicted on a good share of
// them (this serial pass was 2% of the main job's step on an AVX2 EPYC while the other thread waited). The
// ReLU passes dy where y is not <= 0, a NaN y included, as ATen's threshold_backward (the dense path) does.
struct ReluMask {
  std::vector<uint8_t> survives;
  int64_t nonzeros = 0;  // what decides between the sparse sums and the dense matmuls

  ReluMask(const torch::Tensor& y, const torch::Tensor& grad_y) : survives(static_cast<size_t>(y.numel())) {
    const float* ys = y.data_ptr<float>();
    const float* dys = grad_y.data_ptr<float>();
    for (size_t at = 0; at < survives.size(); ++at) survives[at] = !(ys[at] <= 0.f) & (dys[at] != 0.f);
    for (const uint8_t s : survives) nonzeros += s;
  }
};

// dz's nonzeros by row and by output (detail::LinearReluMaps): one pass lists each row's and counts each
// output's, a second places them by output. Each element is written at the list's end and the end moves on
// only where it survives: no branch on the mask (see ReluMask).
struct ReluSurvivors {
  std::vector<int64_t> by_output, by_row;
  std::vector<int32_t> output_rows, row_outputs;
  std::vector<float> output_values, row_values;

  ReluSurvivors(const torch::Tensor& grad_y, const ReluMask& mask) {
    const int64_t rows = grad_y.size(0), outputs = grad_y.size(1), nonzeros = mask.nonzeros;
    const float* dys = grad_y.data_ptr<float>();
    by_output.assign(outputs + 1, 0);
    by_row.assign(rows + 1, 0);
    // One past the last: each element is written before its mask byte says whether the list keeps it.
    row_outputs.resize(nonzeros + 1);
    row_values.resize(nonzeros + 1);
    int64_t listed = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < outputs; ++o) {
        const int64_t at = r * outputs + o;
        const uint8_t survives = mask.survives[at];
        row_outputs[listed] = static_cast<int32_t>(o);
        row_values[listed] = dys[at];
        by_output[o + 1] += survives;
        listed += survives;
      }
      by_row[r + 1] = listed;
    }
    row_outputs.resize(nonzeros);
    row_values.resize(nonzeros);
    for (int64_t o = 0; o < outputs; ++o) by_output[o + 1] += by_output[o];
    output_rows.resize(nonzeros);
    output_values.resize(nonzeros);
    std::vector<int64_t> next(by_output.begin(), by_output.end() - 1);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t e = by_row[r]; e < by_row[r + 1]; ++e) {
        const int64_t place = next[row_outputs[e]]++;
        output_rows[place] = static_cast<int32_t>(r);
        output_values[place] = row_values[e];
      }
    }
  }
};

detail::LinearReluMaps describe(const torch::Tensor& x, const torch::Tensor& weight,
                                const ReluSurvivors& dz) {
  detail::LinearReluMaps m;
  m.rows = x.size(0);
  m.inputs = x.size(1);
  m.outputs = weight.size(0);
  m.x = x.data_ptr<float>();
  m.weight = weight.data_ptr<float>();
  m.by_output = dz.by_output.data();
  m.output_rows = dz.output_rows.data();
  m.output_values = dz.output_values.data();
  m.by_row = dz.by_row.data();
  m.row_outputs = dz.row_outputs.data();
  m.row_values = dz.row_values.data();
  return m;
}

// Runs `kernel` over the inputs in parallel tasks of kInputsPerTask.
void over_inputs(const detail::LinearReluMaps& m, detail::LinearReluKernel kernel) {
  const int64_t tasks = (m.inputs + kInputsPerTask - 1) / kInputsPerTask;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    kernel(m, begin * kInputsPerTask, std::min(end * kInputsPerTask, m.inputs));
  });
}

// Forward: ATen's linear (MKL's sgemm after a copy of the bias) and an in-place ReLU; saves x, the weight and
// y, whose zeros are the ReLU's mask. Backward: where at most `sparse_up_to` of dz is nonzero, the bodies'
// sums over the nonzeros; above it, ATen's dense matmuls of dz.
class LinearReluFunction : public torch::autograd::Function<LinearReluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& weight_in, const torch::Tensor& bias, int64_t capability,
                               double sparse_up_to) {
    const torch::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
    torch::Tensor y = torch::linear(x, weight, bias).relu_();  // [M, N]
    ctx->save_for_backward({x, weight, y});
    ctx->saved_data["capability"] = capability;
    ctx->saved_data["sparse_up_to"] = sparse_up_to;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("linear_relu");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &y = saved[2];
    const torch::Tensor grad_y = grads[0].contiguous();  // [M, N]
    const ReluMask mask(y, grad_y);
    torch::autograd::variable_list out(5);
    if (mask.nonzeros > ctx->saved_data["sparse_up_to"].toDouble() * static_cast<double>(y.numel())) {
      const torch::Tensor dense = torch::threshold_backward(grad_y, y, 0);
      if (ctx->needs_input_grad(0)) out[0] = dense.mm(weight);
      if (ctx->needs_input_grad(1)) out[1] = dense.t().mm(x);
      if (ctx->needs_input_grad(2)) out[2] = dense.sum(0);
      return out;
    }
    const ReluSurvivors dz(grad_y, mask);
    if (ctx->needs_input_grad(2)) {  // db[o]: output o's nonzeros summed in row order
      out[2] = torch::zeros({weight.size(0)}, weight.options());
      float* db = out[2].data_ptr<float>();
      for (int64_t o = 0; o < weight.size(0); ++o)
        for (int64_t e = dz.by_output[o]; e < dz.by_output[o + 1]; ++e) db[o] += dz.output_values[e];
    }
    detail::LinearReluMaps m = describe(x, weight, dz);
    const auto kernels = FASTTRAIN_BODIES_FOR(
        linear_relu_kernels, static_cast<CpuCapability>(ctx->saved_data["capability"].toInt()));
    if (ctx->needs_input_grad(0)) {
      out[0] = torch::empty_like(x);
      m.grad_x = out[0].data_ptr<float>();
      over_inputs(m, kernels.input_gradient);
    }
    if (ctx->needs_input_grad(1)) {
      out[1] = torch::empty_like(weight);
      m.grad_weight = out[1].data_ptr<float>();
      over_inputs(m, kernels.weight_gradient);
    }
    return out;
  }
};

}  // namespace

bool linear_relu_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return detail::fp32_cpu(x) && x.dim() == 2 && x.size(0) > 0 && x.size(1) > 0 &&
         x.size(0) <= std::numeric_limits<int32_t>::max() && cpu_compute_dtype(x) == torch::kFloat &&
         detail::fp32_cpu(weight) && weight.dim() == 2 && weight.size(0) >= 1 &&
         weight.size(0) <= std::numeric_limits<int32_t>::max() && weight.size(1) == x.size(1) &&
         detail::fp32_cpu(bias) && bias.dim() == 1 && bias.size(0) == weight.size(0);
}

torch::Tensor linear_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          CpuCapability capability, double sparse_up_to) {
  FT_CHECK(
      linear_relu_takes(x, weight, bias),
      "linear_relu takes x [M, K] on the CPU in fp32 (not under CPU autocast in bf16), weight fp32 [N, K] "
      "and bias fp32 [N]; got x {}, weight {}, bias {}",
      detail::describe_tensor(x), detail::describe_tensor(weight), detail::describe_tensor(bias));
  detail::check_runnable(capability, "linear_relu");
  FT_CHECK(sparse_up_to >= 0 && sparse_up_to <= 1,
           "linear_relu's sparse_up_to is a share of dz, from 0 (always dense) to 1 (always sparse); got {}",
           sparse_up_to);
  return LinearReluFunction::apply(x, weight, bias, static_cast<int64_t>(capability), sparse_up_to);
}

}  // namespace fasttrain::kernels
