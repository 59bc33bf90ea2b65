#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

// Beyond these the iteration's matmuls outweigh their dispatch, and ATen's blocked GEMMs are faster.
constexpr int64_t kLargestSmallerSide = 64;
constexpr int64_t kLargestMatrix = 65536;

detail::NewtonSchulzKernels newton_schulz_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(newton_schulz_kernels, capability);
}

bool takes_matrix_of(int64_t rows, int64_t cols) {
  return rows > 0 && cols > 0 && std::min(rows, cols) <= kLargestSmallerSide && rows * cols <= kLargestMatrix;
}

// The memory offset of each element of t in row-major order (what reshape reads), counted like an odometer.
std::vector<int64_t> memory_offsets(const torch::Tensor& t) {
  const auto sizes = t.sizes(), strides = t.strides();
  const int64_t dims = t.dim();
  std::vector<int64_t> offsets(static_cast<size_t>(t.numel())), index(static_cast<size_t>(dims), 0);
  int64_t offset = 0;
  for (auto& out : offsets) {
    out = offset;
    for (int64_t d = dims - 1; d >= 0; --d) {  // the next element: carry from the last dimension
      offset += strides[d];
      if (++index[d] < sizes[d]) break;
      offset -= strides[d] * sizes[d];
      index[d] = 0;
    }
  }
  return offsets;
}

}  // namespace

bool newton_schulz_takes(const torch::Tensor& update) {
  return detail::cpu_float_or_bf16(update) && update.dim() == 2 &&
         takes_matrix_of(update.size(0), update.size(1));
}

torch::Tensor newton_schulz(const torch::Tensor& update, int64_t steps,
                            const NewtonSchulzCoefficients& coefficients, CpuCapability capability) {
  FT_CHECK(
      newton_schulz_takes(update),
      "newton_schulz takes a matrix [A, B] on the CPU in fp32 or bf16 with min(A, B) <= {} and at most {} "
      "values; got {} {}",
      kLargestSmallerSide, kLargestMatrix, update.defined() ? update.sizes() : c10::IntArrayRef{},
      update.defined() ? c10::toString(update.scalar_type()) : "none");
  FT_CHECK(steps >= 0, "newton_schulz: steps must be >= 0, got {}", steps);
  detail::check_runnable(capability, "newton_schulz");
  torch::NoGradGuard no_grad;
  const bool tall = update.size(0) > update.size(1);
  torch::Tensor x = update.to(torch::kBFloat16);
  if (tall) x = x.t();                   // [S, L], S <= L
  x = x.to(torch::kFloat).contiguous();  // its bf16 values, in the fp32 the body computes in
  detail::NewtonSchulzMatrix matrix;
  matrix.rows = x.size(0);
  matrix.cols = x.size(1);
  matrix.steps = steps;
  matrix.a = static_cast<float>(coefficients.a);
  matrix.b = static_cast<float>(coefficients.b);
  matrix.c = static_cast<float>(coefficients.c);
  matrix.eps = static_cast<float>(coefficients.eps);
  matrix.x = x.data_ptr<float>();
  newton_schulz_bodies(capability).run(matrix);
  x = x.to(torch::kBFloat16);
  return tall ? x.t() : x;
}

bool muon_matrix_step_takes(const torch::Tensor& param, const torch::Tensor& grad,
                            const torch::Tensor& buffer) {
  auto fp32_laid_out_as_param = [&](const torch::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat &&
           t.is_non_overlapping_and_dense() && t.sizes() == param.sizes() && t.strides() == param.strides();
  };
  return fp32_laid_out_as_param(param) && fp32_laid_out_as_param(grad) && fp32_laid_out_as_param(buffer) &&
         param.dim() >= 2 && takes_matrix_of(param.size(0), param.numel() / param.size(0));
}

void muon_matrix_step(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& buffer,
                      const MuonMatrixStep& step, CpuCapability capability) {
  FT_CHECK(
      muon_matrix_step_takes(param, grad, buffer),
      "muon_matrix_step takes a parameter [A, ...] (A x the rest within newton_schulz's sizes), its gradient "
      "and momentum buffer, all fp32 and of one shape and one dense layout, on the CPU; got {} {}, {} {}, {} "
      "{}",
      param.defined() ? param.sizes() : c10::IntArrayRef{},
      param.defined() ? c10::toString(param.scalar_type()) : "none",
      grad.defined() ? grad.sizes() : c10::IntArrayRef{},
      grad.defined() ? c10::toString(grad.scalar_type()) : "none",
      buffer.defined() ? buffer.sizes() : c10::IntArrayRef{},
      buffer.defined() ? c10::toString(buffer.scalar_type()) : "none");
  FT_CHECK(step.steps >= 0, "muon_matrix_step: steps must be >= 0, got {}", step.steps);
  detail::check_runnable(capability, "muon_matrix_step");
  detail::MuonMatrix m;
  m.rows = param.size(0);
  m.cols = param.numel() / m.rows;
  m.momentum = static_cast<float>(step.momentum);
  m.to_grad = static_cast<float>(1 - step.momentum);
  m.nesterov = step.nesterov;
  m.decay = static_cast<float>(step.decay);
  m.scale = static_cast<float>(step.scale);
  m.param = param.data_ptr<float>();
  m.grad = grad.data_ptr<float>();
  m.buffer = buffer.data_ptr<float>();
  std::vector<float> scratch(static_cast<size_t>(param.numel()));
  std::vector<int64_t> offsets;
  if (!param.is_contiguous()) offsets = memory_offsets(param);
  m.offsets = offsets.empty() ? nullptr : offsets.data();
  m.ns.rows = std::min(m.rows, m.cols);
  m.ns.cols = std::max(m.rows, m.cols);
  m.ns.steps = step.steps;
  m.ns.a = static_cast<float>(step.coefficients.a);
  m.ns.b = static_cast<float>(step.coefficients.b);
  m.ns.c = static_cast<float>(step.coefficients.c);
  m.ns.eps = static_cast<float>(step.coefficients.eps);
  m.ns.x = scratch.data();
  newton_schulz_bodies(capability).muon_step(m);
}

void muon_matrix_steps(const std::vector<MuonMatrixUpdate>& updates, CpuCapability capability) {
  // Everything muon_matrix_step refuses is refused here, on the calling thread, before any matrix changes.
  detail::check_runnable(capability, "muon_matrix_steps");
  std::set<const void*> written;  // two updates writing one tensor would race on the two threads
  for (const MuonMatrixUpdate& u : updates) {
    FT_CHECK(muon_matrix_step_takes(u.param, u.grad, u.buffer),
             "muon_matrix_steps: a matrix muon_matrix_step does not take: {} {}",
             u.param.defined() ? u.param.sizes() : c10::IntArrayRef{},
             u.param.defined() ? c10::toString(u.param.scalar_type()) : "none");
    FT_CHECK(u.step.steps >= 0, "muon_matrix_steps: steps must be >= 0, got {} for the matrix {}",
             u.step.steps, u.param.sizes());
    for (const torch::Tensor* t : {&u.param, &u.buffer}) {
      FT_CHECK(written.insert(t->data_ptr()).second,
               "muon_matrix_steps: the matrix {} shares its parameter or buffer with another update",
               u.param.sizes());
    }
  }
  std::vector<size_t> largest_first(updates.size());
  std::iota(largest_first.begin(), largest_first.end(), size_t{0});
  std::stable_sort(largest_first.begin(), largest_first.end(),
                   [&](size_t a, size_t b) { return updates[a].param.numel() > updates[b].param.numel(); });
  detail::take_pieces_in_turn(static_cast<int64_t>(updates.size()), [&](int64_t i) {
    const MuonMatrixUpdate& u = updates[largest_first[static_cast<size_t>(i)]];
    muon_matrix_step(u.param, u.grad, u.buffer, u.step, capability);
  });
}

torch::Tensor newton_schulz_aten(const torch::Tensor& update, int64_t steps,
                                 const NewtonSchulzCoefficients& coefficients) {
  const NewtonSchulzCoefficients& k = coefficients;
  const bool tall = update.size(0) > update.size(1);
  torch::Tensor x = update.to(torch::kBFloat16);
  if (tall) x = x.t();  // [S, L]: X X^T is the smaller Gram matrix
  x = x / x.norm().clamp_min(k.eps);
  for (int64_t step = 0; step < steps; ++step) {
    const torch::Tensor gram = torch::mm(x, x.t());                       // [S, S]
    const torch::Tensor poly = torch::addmm(gram, gram, gram, k.b, k.c);  // b G + c G G
    x = torch::addmm(x, poly, x, k.a);                                    // a X + P X
  }
  return tall ? x.t() : x;
}

}  // namespace fasttrain::kernels
