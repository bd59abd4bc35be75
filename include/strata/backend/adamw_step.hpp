// strata/backend/adamw_step.hpp: `AdamWStep<A>`, the per-step constants of one AdamW update, as
// the optimizer hands them to a backend's adamw_step kernel (by value, so trivially copyable).
//
//   decay = lr * weight_decay for parameters with weight decay, 0 for the others
//   bias_correction1 = 1 - beta1^t,  bias_correction2 = 1 - beta2^t   (computed in double, then A)
//   skip_unless_finite: when not null, a value in the backend's memory space (a device pointer on
//       the GPU) read by the kernel itself: if it is NaN or infinite the step changes nothing (not
//       the parameters, not the moments). The trainers point it at a running sum of every
//       iteration's loss and gradient norm, so a non-finite iteration stops all updates without
//       the host reading anything until its next log step.
//   grad_scale: when not null, a value in the backend's memory space by which the kernel multiplies
//       each gradient before it uses it (g = grad * A(*grad_scale), rounded to A as a separate
//       scale_by pass would store it): the trainers hand it the clipping factor, so clipping costs
//       no pass over the gradients of its own. The gradients in memory are left as they were.
#pragma once

#include <type_traits>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN

template <class A>
struct AdamWStep {
  A lr = 0, beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0, decay = 0;
  A bias_correction1 = 1, bias_correction2 = 1;
  const double* skip_unless_finite = nullptr;
  const double* grad_scale = nullptr;
};
static_assert(std::is_trivially_copyable_v<AdamWStep<float>>, "AdamWStep is passed to kernels by value, so it must be trivially copyable.");

// One parameter of a multi-tensor step (a backend's adamw_step_many, where it has one): its fp32
// main copy, moments and gradient, its value, its size and whether it decays (by step.decay).
template <class T, class A = accumulate_t<T>>
struct AdamWTensor {
  A* main;
  A* exp_avg;
  A* exp_avg_sq;
  const A* grad;
  T* value;
  index_t n;
  bool weight_decay;
};

STRATA_NAMESPACE_END
