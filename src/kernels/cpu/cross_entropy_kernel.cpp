// Cross-entropy with label smoothing over each row of logits, one pass forward and one backward, in fp32
// arithmetic whatever the logits' dtype (bf16 logits are read as they are, not copied to fp32 first):
//   forward   m = max_j x_j, s = log sum_j exp(x_j - m), loss = s - (1 - e) (x_t - m) - e mean_j (x_j - m)
//   backward  grad_j = scale (exp(x_j - m - s) - e / C - (1 - e) [j = t])
// ATen's log_softmax (which shifts by the maximum too), gather and mean, and their backward, as
// fasttrain::cross_entropy composes them (task/tasks.h). Compiled once per CPU capability (CMakeLists.txt),
// as attention_kernel.cpp is.
#include <cmath>
#include <limits>
#include <vector>

#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

void forward(const detail::CrossEntropyRows& e, int64_t begin, int64_t end) {
  const int64_t classes = e.classes;
  std::vector<float> scratch(e.bf16 ? classes : 0);
  for (int64_t r = begin; r < end; ++r) {
    const float* x = row_in(e.logits, e.bf16, r * classes, classes, scratch);
    // An infinite maximum would make x - m NaN for the others: shift by 0 there, and the row's loss is
    // the infinity (or NaN) it holds.
    const float max = row_max(x, classes), m = std::isfinite(max) ? max : 0.f;
    Vec exps(0.f), shifted(0.f);
    by_vectors(classes, [&](int64_t i, int64_t count) {
      const Vec d = load_or(x + i, count, m) - Vec(m);  // missing lanes: 0, adding nothing to `shifted`
      exps = exps + Vec::set(Vec(0.f), d.exp(), count);
      shifted = shifted + d;
    });
    const float log_sum = std::log(lanes_sum(exps));
    e.row_max[r] = m;
    e.log_sum[r] = log_sum;
    const int64_t target = e.targets[r];
    e.losses[r] = target == e.ignore_target
                      ? 0.f
                      : log_sum - (1.f - e.smoothing) * (x[target] - m) -
                            e.smoothing * lanes_sum(shifted) / static_cast<float>(classes);
  }
}

void backward(const detail::CrossEntropyRows& e, int64_t begin, int64_t end) {
  const int64_t classes = e.classes;
  std::vector<float> in_scratch(e.bf16 ? classes : 0), out_scratch(e.bf16 ? classes : 0);
  const Vec scale(e.scale), uniform(e.smoothing / static_cast<float>(classes));
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * classes, target = e.targets[r];
    float* grad = row_out(e.grad_logits, e.bf16, offset, out_scratch);
    if (target == e.ignore_target) {
      std::fill(grad, grad + classes, 0.f);
    } else {
      const float* x = row_in(e.logits, e.bf16, offset, classes, in_scratch);
      const Vec m(e.row_max[r]), log_sum(e.log_sum[r]);
      by_vectors(classes, [&](int64_t i, int64_t count) {
        (((Vec::loadu(x + i, count) - m - log_sum).exp() - uniform) * scale).store(grad + i, count);
      });
      grad[target] -= (1.f - e.smoothing) * e.scale;
    }
    finish_row(grad, e.grad_logits, e.bf16, offset, classes);
  }
}

}  // namespace

detail::CrossEntropyKernels cross_entropy_kernels() {
  return {&forward, &backward};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
