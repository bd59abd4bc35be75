// strata/backend/cpu/activation.hpp: GELU (tanh approximation, as GPT-2) and SwiGLU, forward and
// backward, element-wise in accumulate_t<T>.
//
//   gelu(x)   = 0.5 x (1 + tanh(u)),  u = c (x + 0.044715 x^3),  c = sqrt(2/pi)
//             = x * sigmoid(2u)                       (0.5 (1 + tanh(u)) = sigmoid(2u))
//   gelu'(x)  = s + x * 2 s (1 - s) * c (1 + 3 * 0.044715 x^2),  s = sigmoid(2u)
//   swiglu(g, u) = silu(g) * u,  silu(g) = g * sigmoid(g)
//   glu (backend/activation_options.hpp): act(min(g, c)) * (clamp(u, -c, c) + offset),
//             act(g) = g * sigmoid(alpha g), alpha 1 (silu) or 1.702 (quick_gelu)
//   squared_relu(x) = max(x, 0)^2
//
// Every sigmoid comes from one call of `vector_exp`, a branch-free exp (Cody-Waite range reduction
// to |r| <= ln2/2, a Taylor polynomial of degree 7 for float and 13 for double, the power of two
// assembled from its bits) that the compiler vectorizes, unlike a libm call per element. Written as
// x * sigmoid(2u), GELU has no cancellation for negative x, where 1 + tanh(u) would lose digits.
// Accuracy: a few ulp of float (float), about 1e-15 relative (double).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "../activation_options.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

// e^x for float or double, |x| clamped to 87 (float) or 708 (double) so the result stays normal.
// The clamp works on the bits (an integer minimum of the magnitude): a floating comparison may
// raise an exception flag, which keeps the compiler from turning it into a vector select.
template <class A>
inline A vector_exp(A x) {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "vector_exp computes in float or double.");
  constexpr bool single = std::is_same_v<A, float>;
  using Bits = std::conditional_t<single, std::uint32_t, std::uint64_t>;
  constexpr Bits sign_bit = Bits(1) << (sizeof(A) * 8 - 1);
  constexpr Bits limit = std::bit_cast<Bits>(single ? A(87) : A(708));
  constexpr A log2e = A(1.4426950408889634074);
  constexpr A ln2_hi = single ? A(0.693359375) : A(6.93147180369123816490e-01);
  constexpr A ln2_lo = single ? A(-2.12194440e-4) : A(1.90821492927058770002e-10);
  const Bits bits = std::bit_cast<Bits>(x), magnitude = bits & ~sign_bit;
  x = std::bit_cast<A>((bits & sign_bit) | (magnitude < limit ? magnitude : limit));
  // n = round(x / ln2), through a truncating conversion of a value shifted to be positive
  const std::int32_t n = static_cast<std::int32_t>(x * log2e + A(1024.5)) - 1024;
  const A fn = static_cast<A>(n);
  const A r = (x - fn * ln2_hi) - fn * ln2_lo;  // |r| <= ln2 / 2
  // e^r = 1 + r + r^2/2! + ... (Horner), times 2^n built from its exponent bits
  A p;
  if constexpr (single) {
    p = A(1.0 / 5040);
    p = p * r + A(1.0 / 720);
    p = p * r + A(1.0 / 120);
    p = p * r + A(1.0 / 24);
    p = p * r + A(1.0 / 6);
    p = p * r + A(0.5);
    p = p * r + A(1);
    p = p * r + A(1);
    return p * std::bit_cast<float>(static_cast<std::uint32_t>(n + 127) << 23);
  } else {
    p = A(1.0 / 6227020800.0);
    p = p * r + A(1.0 / 479001600.0);
    p = p * r + A(1.0 / 39916800.0);
    p = p * r + A(1.0 / 3628800.0);
    p = p * r + A(1.0 / 362880.0);
    p = p * r + A(1.0 / 40320.0);
    p = p * r + A(1.0 / 5040.0);
    p = p * r + A(1.0 / 720.0);
    p = p * r + A(1.0 / 120.0);
    p = p * r + A(1.0 / 24.0);
    p = p * r + A(1.0 / 6.0);
    p = p * r + A(0.5);
    p = p * r + A(1);
    p = p * r + A(1);
    return p * std::bit_cast<double>(static_cast<std::uint64_t>(static_cast<std::int64_t>(n) + 1023) << 52);
  }
}

// 1 / (1 + e^-x)
template <class A>
inline A vector_sigmoid(A x) {
  return A(1) / (A(1) + vector_exp<A>(-x));
}

template <class T, class A = accumulate_t<T>>
void gelu_forward(const T* x, index_t n, T* y) {
  const A c2 = A(2 * 0.7978845608028654), k = A(0.044715);
  for (index_t i = 0; i < n; ++i) {
    const A v = A(x[i]);
    y[i] = T(v * vector_sigmoid<A>(c2 * (v + k * v * v * v)));
  }
}

template <class T, class A = accumulate_t<T>>
void gelu_backward(const T* dy, const T* x, index_t n, T* dx) {
  const A c = A(0.7978845608028654), k = A(0.044715);
  for (index_t i = 0; i < n; ++i) {
    const A v = A(x[i]);
    const A s = vector_sigmoid<A>(A(2) * c * (v + k * v * v * v));
    const A du = c * (A(1) + A(3) * k * v * v);
    dx[i] = T(A(dy[i]) * (s + v * A(2) * s * (A(1) - s) * du));
  }
}

// gate_up: [rows, 2f] with row layout [gate (f) | up (f)];  y: [rows, f]
template <class T, class A = accumulate_t<T>>
void swiglu_forward(const T* gate_up, index_t rows, index_t f, T* y) {
  for (index_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * f;
    const T* u = g + f;
    for (index_t i = 0; i < f; ++i) {
      const A gv = A(g[i]);
      y[r * f + i] = T(gv * vector_sigmoid<A>(gv) * A(u[i]));
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
      const A gv = A(g[i]);
      const A sig = vector_sigmoid<A>(gv);
      const A silu = gv * sig;
      const A d = A(dy[r * f + i]);
      du[i] = T(d * silu);
      dg[i] = T(d * A(u[i]) * sig * (A(1) + gv * (A(1) - sig)));
    }
  }
}

// The gated activation of `activation` (backend/activation_options.hpp). gate_up [rows, 2f], y [rows, f].
template <class T, class A = accumulate_t<T>>
void glu_forward(const T* gate_up, index_t rows, index_t f, GluActivation activation, T* y) {
  const A alpha = A(glu_alpha(activation.kind)), clamp = A(activation.clamp), offset = A(activation.linear_offset);
  const bool clamped = activation.clamp > 0;
  for (index_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * f;  // (f) gate, then (f) up
    const T* u = g + f;
    for (index_t i = 0; i < f; ++i) {
      A gv = A(g[i]), uv = A(u[i]);
      if (clamped) {
        gv = std::min(gv, clamp);
        uv = std::min(std::max(uv, -clamp), clamp);
      }
      y[r * f + i] = T(gv * vector_sigmoid<A>(alpha * gv) * (uv + offset));
    }
  }
}

template <class T, class A = accumulate_t<T>>
void glu_backward(const T* dy, const T* gate_up, index_t rows, index_t f, GluActivation activation, T* dgate_up) {
  const A alpha = A(glu_alpha(activation.kind)), clamp = A(activation.clamp), offset = A(activation.linear_offset);
  const bool clamped = activation.clamp > 0;
  for (index_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * f;
    const T* u = g + f;
    T* dg = dgate_up + r * 2 * f;
    T* du = dg + f;
    for (index_t i = 0; i < f; ++i) {
      const A graw = A(g[i]), uraw = A(u[i]);
      const bool gate_passes = !clamped || graw <= clamp, up_passes = !clamped || (uraw >= -clamp && uraw <= clamp);
      const A gv = gate_passes ? graw : clamp, uv = up_passes ? uraw : (uraw < 0 ? -clamp : clamp);
      const A sig = vector_sigmoid<A>(alpha * gv);
      const A d = A(dy[r * f + i]);
      du[i] = up_passes ? T(d * (gv * sig)) : T(0);
      dg[i] = gate_passes ? T(d * (uv + offset) * sig * (A(1) + alpha * gv * (A(1) - sig))) : T(0);
    }
  }
}

// y = max(x, 0)^2;  dx = dy * 2 max(x, 0)
template <class T, class A = accumulate_t<T>>
void squared_relu_forward(const T* x, index_t n, T* y) {
  for (index_t i = 0; i < n; ++i) {
    const A v = std::max(A(x[i]), A(0));
    y[i] = T(v * v);
  }
}

template <class T, class A = accumulate_t<T>>
void squared_relu_backward(const T* dy, const T* x, index_t n, T* dx) {
  for (index_t i = 0; i < n; ++i) dx[i] = T(A(dy[i]) * A(2) * std::max(A(x[i]), A(0)));
}

// Rows scaled by the sigmoid of one logit each (the shared experts' gate, Qwen2-MoE):
//   y[r, :] = sigmoid(z[r]) x[r, :];   dx[r, :] = sigmoid(z[r]) dy[r, :],
//   dz[r] = sigmoid(z[r]) (1 - sigmoid(z[r])) sum_c dy[r, c] x[r, c]  (summed in A, c ascending)
template <class T, class A = accumulate_t<T>>
void sigmoid_gate_forward(const T* x, const T* z, index_t rows, index_t cols, T* y) {
  for (index_t r = 0; r < rows; ++r) {
    const A g = A(1) / (A(1) + std::exp(-A(z[r])));
    for (index_t c = 0; c < cols; ++c) y[r * cols + c] = T(g * A(x[r * cols + c]));
  }
}

template <class T, class A = accumulate_t<T>>
void sigmoid_gate_backward(const T* dy, const T* x, const T* z, index_t rows, index_t cols, T* dx, T* dz) {
  for (index_t r = 0; r < rows; ++r) {
    const A g = A(1) / (A(1) + std::exp(-A(z[r])));
    A dot = 0;
    for (index_t c = 0; c < cols; ++c) {
      dot += A(dy[r * cols + c]) * A(x[r * cols + c]);
      dx[r * cols + c] = T(g * A(dy[r * cols + c]));
    }
    dz[r] = T(g * (A(1) - g) * dot);
  }
}

}  // namespace cpu
STRATA_NAMESPACE_END
