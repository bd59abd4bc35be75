// strata/backend/cuda/kernels/adamw_math.cuh: one element's AdamW step in registers and the vector
// types of the multi-tensor step, shared by optimizer.cuh's kernels and fp8.cuh's
// adamw_cast_transpose (templates only, so any number of translation units may include it).
#pragma once

#include "../../../core/config.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

// One element's step in registers: x (the main copy), m and v updated in place from the gradient g
// (already times the gradient scale).
template <class A>
__device__ __forceinline__ void adamw_update(A& x, A& m, A& v, A g, A decay, A lr, A beta1, A beta2, A one_minus_beta1,
                                             A one_minus_beta2, A eps, A bias_correction1, A bias_correction2) {
  x = x - decay * x;
  m = beta1 * m + one_minus_beta1 * g;
  v = beta2 * v + one_minus_beta2 * g * g;
  x = x - lr * (m / bias_correction1) / (sqrt_(v / bias_correction2) + eps);
}

template <class A>
__device__ __forceinline__ void adamw_element(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, index_t i, A decay,
                                              A lr, A beta1, A beta2, A one_minus_beta1, A one_minus_beta2, A eps,
                                              A bias_correction1, A bias_correction2, A grad_scale, A& out) {
  const A g = grad[i] * grad_scale;  // rounded to A, as a scale_by pass would store it (x 1 is exact)
  A x = main[i], m = exp_avg[i], v = exp_avg_sq[i];
  adamw_update<A>(x, m, v, g, decay, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, bias_correction1,
                  bias_correction2);
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  main[i] = x;
  out = x;
}

// 16 bytes of A (four floats, two doubles), and as many elements of T, for the vector loads and
// stores of adamw_many_kernel.
template <class A>
struct alignas(16) adamw_vector {
  static constexpr int width = 16 / sizeof(A);
  A e[width];
};
template <class T, int W>
struct alignas(W * sizeof(T)) adamw_values {
  storage_t<T> raw[W];
};

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
