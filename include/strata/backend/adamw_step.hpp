// strata/backend/adamw_step.hpp: `AdamWStep<A>`, the per-step constants of one AdamW update, as
// the optimizer hands them to a backend's adamw_step kernel (by value, so trivially copyable).
//
//   decay = lr * weight_decay for parameters with weight decay, 0 for the others
//   bias_correction1 = 1 - beta1^t,  bias_correction2 = 1 - beta2^t   (computed in double, then A)
#pragma once

#include <type_traits>

#include "../core/config.hpp"

STRATA_NAMESPACE_BEGIN

template <class A>
struct AdamWStep {
  A lr = 0, beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0, decay = 0;
  A bias_correction1 = 1, bias_correction2 = 1;
};
static_assert(std::is_trivially_copyable_v<AdamWStep<float>>, "AdamWStep is passed to kernels by value, so it must be trivially copyable.");

STRATA_NAMESPACE_END
