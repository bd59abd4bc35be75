// strata/backend/cpu/reduce.hpp: reductions to one double (loss sum, gradient norm) and the
// clipping factor, each summed in double in index order so two runs give the same bits.
//
//   masked_loss_sum:  out[0] = sum_i mask_i * loss_i
//   sum_of_squares:   accumulator[0] += sum_i x_i^2
//   clip_factor:      norm = sqrt(square_sum); factor = max_norm / (norm + 1e-6) when max_norm > 0
//                     and that is below 1, else 1 (Megatron's clip_grad_norm)
#pragma once

#include <cmath>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class A>
void masked_loss_sum(const A* loss, const A* mask, index_t n, double* out) {
  double sum = 0;
  for (index_t i = 0; i < n; ++i) sum += static_cast<double>(mask[i]) * static_cast<double>(loss[i]);
  out[0] = sum;
}

template <class X>
void sum_of_squares(const X* x, index_t n, double* accumulator) {
  double sum = accumulator[0];
  for (index_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    sum += v * v;
  }
  accumulator[0] = sum;
}

inline void clip_factor(const double* square_sum, double max_norm, double* norm, double* factor) {
  const double value = std::sqrt(square_sum[0]);
  norm[0] = value;
  const double coefficient = max_norm / (value + 1.0e-6);
  factor[0] = (max_norm > 0 && coefficient < 1.0) ? coefficient : 1.0;
}

}  // namespace cpu
STRATA_NAMESPACE_END
