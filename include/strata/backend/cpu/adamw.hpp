// strata/backend/cpu/adamw.hpp: one AdamW update of one parameter (the math of optim/adamw.hpp).
//
//   main -= decay * main;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   main -= lr * (m / bc1) / (sqrt(v / bc2) + eps);  value = T(main)       all in A
// Nothing changes when step.skip_unless_finite points at a non-finite value; g = grad * A(*step.grad_scale)
// when step.grad_scale is set.
#pragma once

#include <cmath>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "../adamw_step.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void adamw_step(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n, const AdamWStep<A>& step) {
  if (step.skip_unless_finite != nullptr && !std::isfinite(*step.skip_unless_finite)) return;
  const A scale = step.grad_scale != nullptr ? static_cast<A>(*step.grad_scale) : A(1);
  for (index_t i = 0; i < n; ++i) {
    const A g = static_cast<A>(grad[i] * scale);  // rounded as a scale_by pass would store it (x 1 is exact)
    A x = main[i];
    x = x - step.decay * x;
    exp_avg[i] = step.beta1 * exp_avg[i] + step.one_minus_beta1 * g;
    exp_avg_sq[i] = step.beta2 * exp_avg_sq[i] + step.one_minus_beta2 * g * g;
    const A m_hat = exp_avg[i] / step.bias_correction1;
    const A v_hat = exp_avg_sq[i] / step.bias_correction2;
    x = x - step.lr * m_hat / (std::sqrt(v_hat) + step.eps);
    main[i] = x;
    value[i] = static_cast<T>(x);
  }
}

}  // namespace cpu
STRATA_NAMESPACE_END
