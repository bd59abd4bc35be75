// strata/backend/cpu/rope.hpp: rotary position embedding, in place (variants: backend/rope_options.hpp).
//
//   x [s, n, d] (n = batch * heads), position of row t is offset + t; of each head the first
//   rotary_dim = rope_rotary_dim(options, d) dimensions turn, for i < rotary_dim / 2:
//     angle = (offset + t) * rope_inverse_frequency(i)   (in double, then cos / sin rounded to A)
//     forward:   (a, b) -> (a cos - b sin, b cos + a sin)   for the pair (x[i], x[i + rotary_dim/2]),
//                or (x[2i], x[2i+1]) when interleaved
//     backward:  the transpose rotation (angle -> -angle)
//   cos and sin are multiplied by rope_attention_factor(options) (YaRN's concentration, else 1) in
//   double before the rounding, so the backward is the transpose of the scaled rotation too.
#pragma once

#include <cmath>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "../rope_options.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void rope_rotate(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, bool inverse,
                 const RopeOptions& options = {}) {
  const index_t rotary_dim = rope_rotary_dim(options, d), half = rotary_dim / 2;
  std::vector<A> cosv(static_cast<std::size_t>(half)), sinv(static_cast<std::size_t>(half));
  const double factor = rope_attention_factor(options);
  for (index_t t = 0; t < s; ++t) {
    for (index_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(position_offset + t) * rope_inverse_frequency(i, rotary_dim, base, options);
      cosv[i] = A(factor * std::cos(angle));
      sinv[i] = A(factor * (inverse ? -std::sin(angle) : std::sin(angle)));
    }
    for (index_t r = 0; r < n; ++r) {
      T* row = x + (t * n + r) * d;  // (d)
      for (index_t i = 0; i < half; ++i) {
        const index_t first = options.interleaved ? 2 * i : i, second = options.interleaved ? 2 * i + 1 : i + half;
        const A a = A(row[first]), b = A(row[second]);
        row[first] = T(a * cosv[i] - b * sinv[i]);
        row[second] = T(b * cosv[i] + a * sinv[i]);
      }
    }
  }
}

template <class T>
void rope_forward(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset,
                  const RopeOptions& options = {}) {
  rope_rotate<T>(x, s, n, d, base, position_offset, false, options);
}

template <class T>
void rope_backward(T* dx, index_t s, index_t n, index_t d, double base, index_t position_offset,
                   const RopeOptions& options = {}) {
  rope_rotate<T>(dx, s, n, d, base, position_offset, true, options);
}

}  // namespace cpu
STRATA_NAMESPACE_END
