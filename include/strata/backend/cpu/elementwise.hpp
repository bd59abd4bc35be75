// strata/backend/cpu/elementwise.hpp: the element-wise and data-movement kernels of the CPU
// backend: fill, copy, convert, add, scale, transpose, column slices and the qkv split / merge.
//
// Arithmetic is carried in accumulate_t<T> and rounded once on the way out, as on the device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

// Arithmetic type of an element: accumulate_t for floating types, the type itself otherwise.
template <class X>
using arithmetic_t = std::conditional_t<Element<X>, accumulate_t<X>, X>;

template <class X>
void fill(X* x, index_t n, double value) {
  const X v = static_cast<X>(static_cast<arithmetic_t<X>>(value));
  std::fill(x, x + n, v);
}

template <class X>
void copy(const X* src, index_t n, X* dst) {
  std::copy(src, src + n, dst);
}

template <class From, class To>
void convert(const From* src, index_t n, To* dst) {
  for (index_t i = 0; i < n; ++i) dst[i] = static_cast<To>(static_cast<arithmetic_t<From>>(src[i]));
}

// out = a + b (out may alias a or b)
template <class X>
void add(const X* a, const X* b, index_t n, X* out) {
  using A = arithmetic_t<X>;
  for (index_t i = 0; i < n; ++i) out[i] = static_cast<X>(static_cast<A>(a[i]) + static_cast<A>(b[i]));
}

template <class X>
void scale(X* x, index_t n, double factor) {
  using A = arithmetic_t<X>;
  const A f = static_cast<A>(factor);
  for (index_t i = 0; i < n; ++i) x[i] = static_cast<X>(static_cast<A>(x[i]) * f);
}

// in [rows, cols] -> out [cols, rows]
template <class X>
void transpose(const X* in, index_t rows, index_t cols, X* out) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// in [rows, cols] -> out [rows, width] = in[:, begin : begin + width]
template <class X>
void slice_columns(const X* in, index_t rows, index_t cols, index_t begin, index_t width, X* out) {
  for (index_t r = 0; r < rows; ++r) std::copy_n(in + r * cols + begin, width, out + r * width);
}

// out[r * out_cols + j] = in[r * in_cols + j] for j < width: a block of columns of a row-major
// matrix into a block of columns of another (either pointer may start at a column offset)
template <class X>
void copy_columns(const X* in, index_t in_cols, index_t rows, index_t width, X* out, index_t out_cols) {
  for (index_t r = 0; r < rows; ++r) std::copy_n(in + r * in_cols, width, out + r * out_cols);
}

// stacked [parts, rows, width] -> out [rows, parts * width]
template <class X>
void unstack_columns(const X* stacked, index_t parts, index_t rows, index_t width, X* out) {
  for (index_t p = 0; p < parts; ++p)
    for (index_t r = 0; r < rows; ++r)
      std::copy_n(stacked + (p * rows + r) * width, width, out + (r * parts + p) * width);
}

// qkv [rows, groups, hpg + 2, d] -> q [rows, groups * hpg, d], k, v [rows, groups, d]
template <class X>
void qkv_split(const X* qkv, index_t rows, index_t groups, index_t heads_per_group, index_t d, X* q, X* k, X* v) {
  const index_t hpg = heads_per_group, block = (hpg + 2) * d;
  for (index_t r = 0; r < rows; ++r)
    for (index_t g = 0; g < groups; ++g) {
      const X* in = qkv + (r * groups + g) * block;                 // (hpg + 2, d)
      std::copy_n(in, hpg * d, q + (r * groups + g) * hpg * d);     // (hpg, d)
      std::copy_n(in + hpg * d, d, k + (r * groups + g) * d);       // (d)
      std::copy_n(in + (hpg + 1) * d, d, v + (r * groups + g) * d); // (d)
    }
}

// The inverse of qkv_split.
template <class X>
void qkv_merge(const X* dq, const X* dk, const X* dv, index_t rows, index_t groups, index_t heads_per_group, index_t d,
               X* dqkv) {
  const index_t hpg = heads_per_group, block = (hpg + 2) * d;
  for (index_t r = 0; r < rows; ++r)
    for (index_t g = 0; g < groups; ++g) {
      X* out = dqkv + (r * groups + g) * block;
      std::copy_n(dq + (r * groups + g) * hpg * d, hpg * d, out);
      std::copy_n(dk + (r * groups + g) * d, d, out + hpg * d);
      std::copy_n(dv + (r * groups + g) * d, d, out + (hpg + 1) * d);
    }
}

}  // namespace cpu
STRATA_NAMESPACE_END
