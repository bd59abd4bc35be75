// strata/backend/cpu/rope.hpp: rotary position embedding (rotate-half convention), in place.
//
//   x [s, n, d] (n = batch * heads), position of row t is offset + t, for i < d/2:
//     angle = (offset + t) * base^(-2i/d)          (in double, then cos / sin rounded to A)
//     forward:   (a, b) -> (a cos - b sin, b cos + a sin)   for the pair (x[i], x[i + d/2])
//     backward:  the transpose rotation (angle -> -angle)
#pragma once

#include <cmath>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void rope_rotate(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, bool inverse) {
  const index_t half = d / 2;
  std::vector<A> cosv(static_cast<std::size_t>(half)), sinv(static_cast<std::size_t>(half));
  for (index_t t = 0; t < s; ++t) {
    for (index_t i = 0; i < half; ++i) {
      const double freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double angle = static_cast<double>(position_offset + t) * freq;
      cosv[i] = A(std::cos(angle));
      sinv[i] = A(inverse ? -std::sin(angle) : std::sin(angle));
    }
    for (index_t r = 0; r < n; ++r) {
      T* row = x + (t * n + r) * d;  // (d)
      for (index_t i = 0; i < half; ++i) {
        const A a = A(row[i]), b = A(row[i + half]);
        row[i] = T(a * cosv[i] - b * sinv[i]);
        row[i + half] = T(b * cosv[i] + a * sinv[i]);
      }
    }
  }
}

template <class T>
void rope_forward(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset) {
  rope_rotate<T>(x, s, n, d, base, position_offset, false);
}

template <class T>
void rope_backward(T* dx, index_t s, index_t n, index_t d, double base, index_t position_offset) {
  rope_rotate<T>(dx, s, n, d, base, position_offset, true);
}

}  // namespace cpu
STRATA_NAMESPACE_END
