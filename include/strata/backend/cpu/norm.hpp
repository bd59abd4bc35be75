// strata/backend/cpu/norm.hpp: LayerNorm and RMSNorm over the last dimension, forward and backward.
//
//   LayerNorm: y = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + eps)
//   RMSNorm:   y = x * rstd * gamma,                   rstd = 1 / sqrt(mean(x^2) + eps)
//
// weight_offset (Megatron's --apply-layernorm-1p, zero-centred gamma): the kernels scale by
// gamma + weight_offset, added in A (the stored gamma is w - 1 with an offset of 1, so a bf16 weight
// keeps its precision near zero); gradients are those of gamma itself (d(gamma + c) / d gamma = 1).
//
// Statistics are computed and saved in accumulate_t<T>. Parameter gradients are summed over rows in
// ascending order, then written (=), or added to what is there with `accumulate` (grad + the sum,
// the bits of writing the sum and adding it after).
//
// Fused with the residual add of a transformer layer:
//   forward with `residual`:   sum = T(x + residual) is written (sum may be x or residual) and the
//                              norm is taken of sum, as if the caller had added first
//   backward with `dresidual`: dx = T(dresidual + the norm's dx), one rounding (dx may be dresidual)
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

// x, y: [rows, h]; gamma, beta: [h]; mean, rstd: [rows]
template <class T, class A = accumulate_t<T>>
void layernorm_forward(const T* x, const T* gamma, const T* beta, index_t rows, index_t h, A eps, T* y, A* mean,
                       A* rstd, const T* residual = nullptr, T* sum = nullptr, A weight_offset = A(0)) {
  for (index_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    if (residual) {  // sum (rows, h) = x + residual, then the norm of sum
      T* sr = sum + r * h;
      for (index_t i = 0; i < h; ++i) sr[i] = T(A(xr[i]) + A(residual[r * h + i]));
      xr = sr;
    }
    A sum = 0;
    for (index_t i = 0; i < h; ++i) sum += A(xr[i]);
    A mu = sum / A(h);
    A var = 0;
    for (index_t i = 0; i < h; ++i) {
      A d = A(xr[i]) - mu;
      var += d * d;
    }
    A rs = A(1) / std::sqrt(var / A(h) + eps);
    mean[r] = mu;
    rstd[r] = rs;
    T* yr = y + r * h;
    for (index_t i = 0; i < h; ++i) yr[i] = T((A(xr[i]) - mu) * rs * (A(gamma[i]) + weight_offset) + (beta ? A(beta[i]) : A(0)));
  }
}

namespace detail {
// Where a norm's parameter-gradient sums go: the output itself (written), or zeroed scratch that
// finish() adds into the output (accumulate).
template <class A>
struct norm_grad_sums {
  A* out;
  index_t h;
  std::vector<A> scratch;
  norm_grad_sums(A* o, index_t n, bool accumulate) : out(o), h(n) {
    if (!out) return;
    if (accumulate) scratch.assign(static_cast<std::size_t>(h), A(0));
    else std::fill(out, out + h, A(0));
  }
  A* sums() { return out && !scratch.empty() ? scratch.data() : out; }
  void finish() {
    if (!out || scratch.empty()) return;
    for (index_t i = 0; i < h; ++i) out[i] += scratch[static_cast<std::size_t>(i)];
  }
};
}  // namespace detail

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma;  dgamma = sum dy * xhat;  dbeta = sum dy
// dresidual_sums (with dresidual) += the column sums of dresidual, row by row (bias_grad's order).
template <class T, class A = accumulate_t<T>>
void layernorm_backward(const T* dy, const T* x, const T* gamma, const A* mean, const A* rstd, index_t rows, index_t h,
                        T* dx, A* dgamma_out, A* dbeta_out, const T* dresidual = nullptr, bool accumulate = false,
                        A* dresidual_sums = nullptr, A weight_offset = A(0)) {
  if (!dresidual) dresidual_sums = nullptr;
  detail::norm_grad_sums<A> gamma_sums(dgamma_out, h, accumulate), beta_sums(dbeta_out, h, accumulate);
  A* dgamma = gamma_sums.sums();
  A* dbeta = beta_sums.sums();
  for (index_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    A mean_g = 0, mean_gx = 0;
    for (index_t i = 0; i < h; ++i) {
      A xhat = (A(xr[i]) - mean[r]) * rstd[r];
      A g = A(dyr[i]) * (A(gamma[i]) + weight_offset);
      mean_g += g;
      mean_gx += g * xhat;
      dgamma[i] += A(dyr[i]) * xhat;
      if (dbeta) dbeta[i] += A(dyr[i]);
    }
    mean_g /= A(h);
    mean_gx /= A(h);
    T* dxr = dx + r * h;
    for (index_t i = 0; i < h; ++i) {
      A xhat = (A(xr[i]) - mean[r]) * rstd[r];
      A g = A(dyr[i]) * (A(gamma[i]) + weight_offset);
      const A grad = rstd[r] * (g - mean_g - xhat * mean_gx);
      dxr[i] = dresidual ? T(A(dresidual[r * h + i]) + grad) : T(grad);
      if (dresidual_sums) dresidual_sums[i] += A(dresidual[r * h + i]);
    }
  }
  gamma_sums.finish();
  beta_sums.finish();
}

template <class T, class A = accumulate_t<T>>
void rmsnorm_forward(const T* x, const T* gamma, index_t rows, index_t h, A eps, T* y, A* rstd,
                     const T* residual = nullptr, T* sum = nullptr, A weight_offset = A(0)) {
  for (index_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    if (residual) {  // sum (rows, h) = x + residual, then the norm of sum
      T* sr = sum + r * h;
      for (index_t i = 0; i < h; ++i) sr[i] = T(A(xr[i]) + A(residual[r * h + i]));
      xr = sr;
    }
    A ss = 0;
    for (index_t i = 0; i < h; ++i) ss += A(xr[i]) * A(xr[i]);
    A rs = A(1) / std::sqrt(ss / A(h) + eps);
    rstd[r] = rs;
    T* yr = y + r * h;
    for (index_t i = 0; i < h; ++i) yr[i] = T(A(xr[i]) * rs * (A(gamma[i]) + weight_offset));
  }
}

// dx = rstd * (g - xhat * mean(g * xhat)),  g = dy * gamma;  dgamma = sum dy * xhat
template <class T, class A = accumulate_t<T>>
void rmsnorm_backward(const T* dy, const T* x, const T* gamma, const A* rstd, index_t rows, index_t h, T* dx,
                      A* dgamma_out, const T* dresidual = nullptr, bool accumulate = false, A weight_offset = A(0)) {
  detail::norm_grad_sums<A> gamma_sums(dgamma_out, h, accumulate);
  A* dgamma = gamma_sums.sums();
  for (index_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    A mean_gx = 0;
    for (index_t i = 0; i < h; ++i) {
      A xhat = A(xr[i]) * rstd[r];
      A g = A(dyr[i]) * (A(gamma[i]) + weight_offset);
      mean_gx += g * xhat;
      dgamma[i] += A(dyr[i]) * xhat;
    }
    mean_gx /= A(h);
    T* dxr = dx + r * h;
    for (index_t i = 0; i < h; ++i) {
      A xhat = A(xr[i]) * rstd[r];
      const A grad = rstd[r] * (A(dyr[i]) * (A(gamma[i]) + weight_offset) - xhat * mean_gx);
      dxr[i] = dresidual ? T(A(dresidual[r * h + i]) + grad) : T(grad);
    }
  }
  gamma_sums.finish();
}

}  // namespace cpu
STRATA_NAMESPACE_END
