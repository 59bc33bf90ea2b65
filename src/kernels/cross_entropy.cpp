#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "cpu/bodies.h"
#include "fasttrain/kernels/cpu.h"
#include "fasttrain/util/check.h"
#include "runnable.h"

namespace fasttrain::kernels {

namespace {

detail::CrossEntropyKernels cross_entropy_bodies(CpuCapability capability) {
  return FASTTRAIN_BODIES_FOR(cross_entropy_kernels, capability);
}

detail::CrossEntropyRows describe(const torch::Tensor& logits, const torch::Tensor& targets, double smoothing,
                                  int64_t ignore_target) {
  detail::CrossEntropyRows e;
  e.rows = logits.size(0);
  e.classes = logits.size(1);
  e.ignore_target = ignore_target;
  e.bf16 = logits.scalar_type() == torch::kBFloat16;
  e.smoothing = static_cast<float>(smoothing);
  e.logits = logits.data_ptr();
  e.targets = targets.data_ptr<int64_t>();
  return e;
}

// How many rows the mean counts: those whose target is not ignored. A bad target is an error that names
// it, as ATen's nll_loss refuses one: the kernel would read outside its row.
int64_t counted_rows(const torch::Tensor& targets, int64_t classes, int64_t ignore_target) {
  const int64_t* target = targets.data_ptr<int64_t>();
  int64_t counted = 0;
  for (int64_t r = 0; r < targets.numel(); ++r) {
    if (target[r] == ignore_target) continue;
    FT_CHECK(target[r] >= 0 && target[r] < classes,
             "cross_entropy: target {} of row {} is not a class id in [0, {}) (nor the ignored {})",
             target[r], r, classes, ignore_target);
    ++counted;
  }
  return counted;
}

template <typename Body>
void for_rows(const detail::CrossEntropyRows& e, const Body& body) {
  detail::parallel_pieces(0, e.rows, detail::rows_per_task(e.classes),
                          [&](int64_t begin, int64_t end) { body(begin, end); });
}

// Saves the logits, the targets and each row's maximum and log-sum-exp; backward recomputes the softmax
// from them instead of keeping a [rows, classes] fp32 copy.
class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits_in,
                               const torch::Tensor& targets_in, double smoothing, int64_t ignore_target,
                               int64_t capability) {
    const torch::Tensor logits = logits_in.contiguous(), targets = targets_in.contiguous();
    const int64_t counted = counted_rows(targets, logits.size(1), ignore_target);
    const auto fp32 = logits.options().dtype(torch::kFloat);
    // [3, rows]: each row's maximum, its log-sum-exp after the maximum, its loss.
    torch::Tensor rows = torch::empty({3, logits.size(0)}, fp32);
    detail::CrossEntropyRows e = describe(logits, targets, smoothing, ignore_target);
    e.row_max = rows.data_ptr<float>();
    e.log_sum = e.row_max + e.rows;
    e.losses = e.log_sum + e.rows;
    const auto kernel = cross_entropy_bodies(static_cast<CpuCapability>(capability)).forward;
    for_rows(e, [&](int64_t begin, int64_t end) { kernel(e, begin, end); });
    // The mean over the counted rows, summed in double on the host (no operator to dispatch); 0 where
    // every target is ignored, as fasttrain::cross_entropy's padded mean gives.
    double total = 0;
    for (int64_t r = 0; r < e.rows; ++r) total += e.losses[r];
    ctx->save_for_backward({logits, targets, rows});
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["ignore_target"] = ignore_target;
    ctx->saved_data["counted"] = counted;
    ctx->saved_data["capability"] = capability;
    return torch::full({}, total / static_cast<double>(std::max<int64_t>(counted, 1)), fp32);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::check_first_order("cross_entropy");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &logits = saved[0], &targets = saved[1], &rows = saved[2];
    // The loss's gradient read on the host: a CPU tensor, so no synchronisation (and no operator).
    const torch::Tensor grad_loss = grads[0].to(torch::kFloat).contiguous();
    const int64_t counted = std::max<int64_t>(ctx->saved_data["counted"].toInt(), 1);
    torch::Tensor grad_logits = torch::empty_like(logits);
    detail::CrossEntropyRows e = describe(logits, targets, ctx->saved_data["smoothing"].toDouble(),
                                          ctx->saved_data["ignore_target"].toInt());
    e.row_max = rows.data_ptr<float>();
    e.log_sum = e.row_max + e.rows;
    e.scale = *grad_loss.data_ptr<float>() / static_cast<float>(counted);
    e.grad_logits = grad_logits.data_ptr();
    const auto kernel =
        cross_entropy_bodies(static_cast<CpuCapability>(ctx->saved_data["capability"].toInt())).backward;
    for_rows(e, [&](int64_t begin, int64_t end) { kernel(e, begin, end); });
    return {grad_logits, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool cross_entropy_takes(const torch::Tensor& logits, const torch::Tensor& targets) {
  return detail::cpu_float_or_bf16(logits) && logits.dim() == 2 && logits.size(1) > 0 && targets.defined() &&
         targets.device().is_cpu() && targets.scalar_type() == torch::kLong && targets.dim() == 1 &&
         targets.size(0) == logits.size(0);
}

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, double label_smoothing,
                            int64_t ignore_target, CpuCapability capability) {
  FT_CHECK(
      cross_entropy_takes(logits, targets),
      "cross_entropy takes logits [N, C] on the CPU in fp32 or bf16 and int64 targets [N] on the CPU; got "
      "logits {} {}, targets {} {}",
      logits.sizes(), c10::toString(logits.scalar_type()),
      targets.defined() ? targets.sizes() : c10::IntArrayRef{},
      targets.defined() ? c10::toString(targets.scalar_type()) : "none");
  FT_CHECK(label_smoothing >= 0 && label_smoothing < 1,
           "cross_entropy: label_smoothing must be in [0, 1), got {}", label_smoothing);
  detail::check_runnable(capability, "cross_entropy");
  return CrossEntropyFunction::apply(logits, targets, label_smoothing, ignore_target,
                                     static_cast<int64_t>(capability));
}

}  // namespace fasttrain::kernels
