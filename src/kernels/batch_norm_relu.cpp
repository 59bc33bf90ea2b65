#include "batch_norm_relu.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <cmath>
#include <vector>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

detail::BatchNormReluKernels batch_norm_relu_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(batch_norm_relu_kernels, capability);
}

// The terms of a batch's or the running mean and variance (double [C] each).
detail::ChannelTerms channel_terms(const std::vector<double>& mean, const std::vector<double>& variance,
                                   const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
  const int64_t channels = static_cast<int64_t>(mean.size());
  detail::ChannelTerms terms{torch::empty({4, channels}, torch::kFloat)};
  const float* w = weight.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  for (int64_t c = 0; c < channels; ++c) {
    terms.mean()[c] = static_cast<float>(mean[c]);
    terms.invstd()[c] = static_cast<float>(1.0 / std::sqrt(variance[c] + eps));
    terms.scale()[c] = w[c] * terms.invstd()[c];
    terms.shift()[c] = b[c];
  }
  return terms;
}

std::vector<double> as_doubles(const torch::Tensor& values) {
  const float* v = values.data_ptr<float>();
  return std::vector<double>(v, v + values.numel());
}

// x's maps; the statistics' bodies read nothing else.
detail::BatchNormReluMaps describe(const torch::Tensor& x) {
  detail::BatchNormReluMaps m;
  m.channels = x.size(1);
  m.rows = x.numel() / m.channels;
  m.bf16 = x.scalar_type() == torch::kBFloat16;
  m.x = x.data_ptr();
  return m;
}

detail::BatchNormReluMaps describe(const torch::Tensor& x, detail::ChannelTerms& terms) {
  detail::BatchNormReluMaps m = describe(x);
  m.mean = terms.mean();
  m.scale = terms.scale();
  m.shift = terms.shift();
  return m;
}

// Each chunk's two partial rows [chunks][channels] from a chunked body (statistics, backward_sums).
struct ChunkPartials {
  detail::RowChunks chunks;
  std::vector<float> first, second;
};

template <typename ChunkedBody>
ChunkPartials run_by_chunks(detail::BatchNormReluMaps m, ChunkedBody body) {
  ChunkPartials partials{detail::row_chunks(m.rows, detail::kPiecesPerThread), {}, {}};
  partials.first.resize(partials.chunks.count * m.channels);
  partials.second.resize(partials.chunks.count * m.channels);
  m.partial_first = partials.first.data();
  m.partial_second = partials.second.data();
  detail::for_each_row_chunk(m.rows, partials.chunks,
                             [&](int64_t begin, int64_t end, int64_t chunk) { body(m, begin, end, chunk); });
  return partials;
}

// The batch's mean and biased variance per channel, from each chunk's mean and squared deviations
// (join_moments, in double): two passes over L1-sized blocks, no cancellation.
void batch_statistics(const detail::BatchNormReluMaps& m, const detail::BatchNormReluKernels& kernels,
                      std::vector<double>& mean, std::vector<double>& variance) {
  const ChunkPartials partials = run_by_chunks(m, kernels.statistics);
  const detail::RowChunks& chunks = partials.chunks;
  const std::vector<float>&chunk_mean = partials.first, &chunk_squares = partials.second;
  for (int64_t c = 0; c < m.channels; ++c) {
    double count = 0, centre = 0, squares = 0;
    for (int64_t k = 0; k < chunks.count; ++k) {
      const double n =
          static_cast<double>(std::min(m.rows, (k + 1) * chunks.rows_each) - k * chunks.rows_each);
      if (n <= 0) continue;
      detail::join_moments(count, n, chunk_mean[k * m.channels + c], chunk_squares[k * m.channels + c],
                           centre, squares);
      count += n;
    }
    mean[c] = centre;
    variance[c] = squares / count;
  }
}

// running = (1 - momentum) running + momentum batch, the variance unbiased (as ATen's batch_norm), in
// place: their versions move, as an in-place op's would.
void update_running(const torch::Tensor& running_mean, const torch::Tensor& running_var,
                    const std::vector<double>& mean, const std::vector<double>& variance, int64_t rows,
                    double momentum) {
  running_mean.unsafeGetTensorImpl()->bump_version();
  running_var.unsafeGetTensorImpl()->bump_version();
  float* rm = running_mean.data_ptr<float>();
  float* rv = running_var.data_ptr<float>();
  const double unbiased = static_cast<double>(rows) / static_cast<double>(rows - 1);
  for (size_t c = 0; c < mean.size(); ++c) {
    rm[c] = static_cast<float>((1 - momentum) * rm[c] + momentum * mean[c]);
    rv[c] = static_cast<float>((1 - momentum) * rv[c] + momentum * variance[c] * unbiased);
  }
}

// Saves x and the per-channel terms, not y: backward recomputes ReLU's mask from x.
class BatchNormReluFunction : public torch::autograd::Function<BatchNormReluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& running_mean, const torch::Tensor& running_var,
                               bool training, double momentum, double eps, int64_t capability) {
    const auto kernels = batch_norm_relu_bodies(static_cast<CpuCapability>(capability));
    detail::ChannelTerms terms;
    if (training) {
      std::vector<double> mean(x.size(1)), variance(x.size(1));
      const detail::BatchNormReluMaps statistics_maps = describe(x);
      batch_statistics(statistics_maps, kernels, mean, variance);
      update_running(running_mean, running_var, mean, variance, statistics_maps.rows, momentum);
      terms = channel_terms(mean, variance, weight, bias, eps);
    } else {
      terms = channel_terms(as_doubles(running_mean), as_doubles(running_var), weight, bias, eps);
    }
    detail::BatchNormReluMaps m = describe(x, terms);
    torch::Tensor y = torch::empty_like(x, x.options(), kChannelsLast);
    m.y = y.data_ptr();
    detail::parallel_pieces(0, m.rows, detail::rows_per_task(m.channels),
                            [&](int64_t begin, int64_t end) { kernels.normalize(m, begin, end); });
    ctx->save_for_backward({x, terms.all});
    ctx->saved_data["training"] = training;
    ctx->saved_data["capability"] = capability;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("batch_norm_relu");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    detail::ChannelTerms terms{saved[1]};
    const auto kernels =
        batch_norm_relu_bodies(static_cast<CpuCapability>(ctx->saved_data["capability"].toInt()));
    const torch::Tensor grad_y = grads[0].to(x.scalar_type()).contiguous(kChannelsLast);
    detail::BatchNormReluMaps m = describe(x, terms);
    m.grad_y = grad_y.data_ptr();

    // sum g and sum g (x - mean) per channel: the bias's and (times invstd) the weight's gradients.
    const ChunkPartials partials = run_by_chunks(m, kernels.backward_sums);
    const detail::RowChunks& chunks = partials.chunks;
    const std::vector<float>&grad_sums = partials.first, &grad_dots = partials.second;
    torch::Tensor grad_weight = torch::empty({m.channels}, x.options().dtype(torch::kFloat));
    torch::Tensor grad_bias = torch::empty({m.channels}, x.options().dtype(torch::kFloat));
    // grad_x's coefficients: with batch statistics, the gradient through the mean and the variance.
    torch::Tensor coefficients = torch::zeros({2, m.channels}, x.options().dtype(torch::kFloat));
    float* centred = coefficients.data_ptr<float>();
    float* offset = centred + m.channels;
    float* bias_grad = grad_bias.data_ptr<float>();
    float* weight_grad = grad_weight.data_ptr<float>();
    const bool training = ctx->saved_data["training"].toBool();
    for (int64_t c = 0; c < m.channels; ++c) {
      double sum = 0, dot = 0;
      for (int64_t k = 0; k < chunks.count; ++k) {
        sum += grad_sums[k * m.channels + c];
        dot += grad_dots[k * m.channels + c];
      }
      const double invstd = terms.invstd()[c], scale = terms.scale()[c];
      bias_grad[c] = static_cast<float>(sum);
      weight_grad[c] = static_cast<float>(dot * invstd);
      if (training) {
        centred[c] = static_cast<float>(-scale * invstd * invstd * dot / static_cast<double>(m.rows));
        offset[c] = static_cast<float>(-scale * sum / static_cast<double>(m.rows));
      }
    }
    m.grad_centered = centred;
    m.grad_offset = offset;
    m.batch_statistics = training;
    torch::Tensor grad_x = torch::empty_like(x, x.options(), kChannelsLast);
    m.grad_x = grad_x.data_ptr();
    detail::parallel_pieces(0, m.rows, detail::rows_per_task(m.channels),
                            [&](int64_t begin, int64_t end) { kernels.backward_input(m, begin, end); });
    return {grad_x,          grad_weight,     grad_bias,       torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

namespace detail {

bool channel_vector(const torch::Tensor& t, int64_t channels) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.dim() == 1 &&
         t.size(0) == channels && t.is_contiguous();
}

ChannelTerms batch_norm_relu_running_terms(const torch::Tensor& weight, const torch::Tensor& bias,
                                           const torch::Tensor& running_mean,
                                           const torch::Tensor& running_var, double eps) {
  return channel_terms(as_doubles(running_mean), as_doubles(running_var), weight, bias, eps);
}

}  // namespace detail

bool batch_norm_relu_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                           const torch::Tensor& running_mean, const torch::Tensor& running_var,
                           bool training) {
  if (!detail::cpu_float_or_bf16(x) || x.dim() != 4 || x.numel() == 0 || !x.is_contiguous(kChannelsLast))
    return false;
  const int64_t channels = x.size(1);
  // One value per channel has no variance: ATen's batch_norm says so.
  if (training && x.numel() / channels < 2) return false;
  return detail::channel_vector(weight, channels) && detail::channel_vector(bias, channels) &&
         detail::channel_vector(running_mean, channels) && detail::channel_vector(running_var, channels);
}

torch::Tensor batch_norm_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              const torch::Tensor& running_mean, const torch::Tensor& running_var,
                              bool training, double momentum, double eps, CpuCapability capability) {
  FT_CHECK(
      batch_norm_relu_takes(x, weight, bias, running_mean, running_var, training),
      "batch_norm_relu takes maps [N, C, H, W] in channels_last on the CPU in fp32 or bf16 (at least two "
      "values per channel when training) with weight, bias, running_mean and running_var fp32 [C]; got "
      "{} {}{}, weight {}, running_mean {}",
      x.defined() ? x.sizes() : c10::IntArrayRef{}, x.defined() ? c10::toString(x.scalar_type()) : "none",
      x.defined() && x.dim() == 4 && !x.is_contiguous(kChannelsLast) ? " not in channels_last" : "",
      weight.defined() ? weight.sizes() : c10::IntArrayRef{},
      running_mean.defined() ? running_mean.sizes() : c10::IntArrayRef{});
  detail::check_runnable(capability, "batch_norm_relu");
  return BatchNormReluFunction::apply(x, weight, bias, running_mean, running_var, training, momentum, eps,
                                      static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
