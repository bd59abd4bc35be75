// strata/backend/cpu/activation.hpp: GELU (tanh approximation, as GPT-2) and SwiGLU, forward and
// backward, element-wise in accumulate_t<T>.
//
//   gelu(x)   = 0.5 x (1 + tanh(c (x + 0.044715 x^3))),  c = sqrt(2/pi)
//   swiglu(g, u) = silu(g) * u,  silu(g) = g * sigmoid(g)
#pragma once

#include <cmath>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void gelu_forward(const T* x, index_t n, T* y) {
  const A c = A(0.7978845608028654);
  for (index_t i = 0; i < n; ++i) {
    A v = A(x[i]);
    y[i] = T(A(0.5) * v * (A(1) + std::tanh(c * (v + A(0.044715) * v * v * v))));
  }
}

template <class T, class A = accumulate_t<T>>
void gelu_backward(const T* dy, const T* x, index_t n, T* dx) {
  const A c = A(0.7978845608028654);
  for (index_t i = 0; i < n; ++i) {
    A v = A(x[i]);
    A t = std::tanh(c * (v + A(0.044715) * v * v * v));
    A dt = (A(1) - t * t) * c * (A(1) + A(3) * A(0.044715) * v * v);
    dx[i] = T(A(dy[i]) * (A(0.5) * (A(1) + t) + A(0.5) * v * dt));
  }
}

// gate_up: [rows, 2f] with row layout [gate (f) | up (f)];  y: [rows, f]
template <class T, class A = accumulate_t<T>>
void swiglu_forward(const T* gate_up, index_t rows, index_t f, T* y) {
  for (index_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * f;
    const T* u = g + f;
    for (index_t i = 0; i < f; ++i) {
      A gv = A(g[i]);
      A sig = A(1) / (A(1) + std::exp(-gv));
      y[r * f + i] = T(gv * sig * A(u[i]));
    }
  }
}

template <class T, class A = accumulate_t<T>>
void swiglu_backward(const T* dy, const T* gate_up, index_t rows, index_t f, T* dgate_up) {
  for (index_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * f;
    const T* u = g + f;
    T* dg = dgate_up + r * 2 * f;
    T* du = dg + f;
    for (index_t i = 0; i < f; ++i) {
      A gv = A(g[i]);
      A sig = A(1) / (A(1) + std::exp(-gv));
      A silu = gv * sig;
      A d = A(dy[r * f + i]);
      du[i] = T(d * silu);
      dg[i] = T(d * A(u[i]) * sig * (A(1) + gv * (A(1) - sig)));
    }
  }
}

}  // namespace cpu
STRATA_NAMESPACE_END
