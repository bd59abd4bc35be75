// strata/backend/cpu/fp8.hpp: the FP8 kernels on the CPU, the twins the CUDA ones are tested
// against bit for bit (the GEMM within its accumulation bound).
//
//   fp8_amax(x, n, amax)            amax[0] = max(amax[0], max_i |x_i|) (NaN wins)
//   fp8_cast(x, n, f, scale, q, amax)
//                                   q_i = fp8_f(float(x_i) * scale[0]) (round to nearest even,
//                                   saturating); amax as fp8_amax when not null (one pass)
//   fp8_cast_transpose(x, rows, cols, f, scale, q, qt, amax)
//                                   q [rows, cols] (unless q is null) and qt [cols, rows] (unless
//                                   qt is null) of the same codes
//   fp8_cast_transpose_fused(p, x, pre, rows, cols, f, scale, q, qt, amax, column_sums)
//                                   the same for v = x (p copy), T(gelu(x)) (gelu),
//                                   T(x gelu'(pre)) (gelu_backward: x the output gradient), SwiGLU of
//                                   x = [gate | up] [rows, 2 cols] (swiglu) or its backward from the
//                                   activation's gradient x [rows, cols / 2] and pre [rows, cols]
//                                   (swiglu_backward), computed by gelu_forward / gelu_backward /
//                                   swiglu_forward / swiglu_backward; with column_sums, also
//                                   column_sums[c] = sum_r v[r, c] in accumulate_t<T>, rows in order
//                                   (written, not added); with `activation` (gelu_backward and
//                                   swiglu_backward alone; activation.codes not null), also
//                                   activation.codes [w, rows] = the codes of act^T, act [rows, w] =
//                                   T(gelu(pre)) (w = cols) or SwiGLU of pre (w = cols / 2), the
//                                   tensors the forward's gelu / swiglu producers cast, with
//                                   activation.format and scale (no amax: activation.amax must be
//                                   null, the forward folded it)
//   fp8_transpose(q, rows, cols, qt)  codes [rows, cols] -> [cols, rows]
//   fp8_gemm(ta, tb, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, c, accumulate, bias = null)
//                                   C = (or +=) a_scale_inv[0] b_scale_inv[0] op(A) op(B) (+ bias[n]
//                                   on every row, added to the rounded product; not with accumulate): the codes
//                                   decoded exactly, multiplied and summed in accumulate_t<C>
//                                   (float for bf16 and float outputs, double for double), the
//                                   scales applied to the sum (as cuBLASLt's scale pointers do)
//   fp8_update_scale(row, max, args)  the step update of one scaling row (core/fp8_recipe.hpp)
//   fp8_update_scales(rows, count, stride, maxes, args, aligned)  of every role's row of count states
//                                   at once, each new 1 / scale also into its 16-byte slot of aligned
//
// The blockwise recipe (core/fp8_recipe.hpp), B = the block length:
//   fp8_cast_blocks(x, rows, cols, f, B, q, q_scale_inv, qt, qt_scale_inv)
//                                   q [rows, cols] with one scale per run of B along a row:
//                                   q_scale_inv [ceil(cols/B), rows] (run kb of row r at kb rows + r);
//                                   qt [cols, rows], the codes of x^T with one scale per run of B
//                                   along a column of x: qt_scale_inv [ceil(rows/B), cols]. Either
//                                   output may be null (not written).
//   fp8_cast_tiles(x, rows, cols, f, B, q, qt, scale_inv, scale_inv_t)
//                                   q [rows, cols] and qt [cols, rows] (either may be null) with one
//                                   scale per B x B tile: scale_inv [ceil(rows/B), ceil(cols/B)] and
//                                   its transpose scale_inv_t [ceil(cols/B), ceil(rows/B)]
//   fp8_gemm_blocks(m, n, k, a, fa, a_scale_inv, a_tiles, b, fb, b_scale_inv, b_tiles, B, c, accumulate)
//                                   C[m, n] = (or +=) sum_k A(m, k) B(n, k), A [m, k] and B [n, k]
//                                   (both k-major: cuBLASLt's "TN"), each code decoded times its
//                                   block's 1 / scale: runs of B along k (tiles false: scale_inv
//                                   [ceil(k/B), rows]) or B x B tiles (true: [ceil(rows/B), ceil(k/B)]).
//                                   The scales are powers of two, so the decoded values are exact and
//                                   the GEMM of them is the block-scaled GEMM up to summation order.
// Each block's scale is fp8_block_scale(amax of the block, fp8_max), its 1 / scale stored.
//
// The product float(x) * scale is rounded to float before the FP8 rounding, as the GPU kernel
// computes it; for double tensors x is first rounded to float.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "../../core/fp8.hpp"
#include "../../core/fp8_recipe.hpp"
#include "activation.hpp"
#include "gemm.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

namespace detail {
// max over non-negative floats and NaN by their bits (NaN's bits are the largest): the order the
// GPU's integer atomicMax gives.
// |v| for the amax: any NaN becomes the canonical quiet NaN (bits 0x7fc00000), so the result does
// not depend on a NaN's payload or sign, here or on the GPU.
inline float amax_abs(float v) { return std::isnan(v) ? std::bit_cast<float>(0x7fc00000u) : std::fabs(v); }
inline float amax_combine(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) >= std::bit_cast<std::uint32_t>(b) ? a : b;
}
}  // namespace detail

template <class T>
void fp8_amax(const T* x, index_t n, float* amax) {
  float m = *amax;
  for (index_t i = 0; i < n; ++i) m = detail::amax_combine(m, detail::amax_abs(static_cast<float>(x[i])));
  *amax = m;
}

template <class T>
void fp8_cast(const T* x, index_t n, Fp8Format format, const float* scale, std::uint8_t* out, float* amax) {
  const float s = *scale;
  float m = amax ? *amax : 0.0f;
  for (index_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    m = detail::amax_combine(m, detail::amax_abs(v));
    out[i] = fp8_encode(v * s, format);
  }
  if (amax) *amax = m;
}

template <class T>
void fp8_cast_transpose(const T* x, index_t rows, index_t cols, Fp8Format format, const float* scale, std::uint8_t* out,
                        std::uint8_t* out_t, float* amax) {
  std::vector<std::uint8_t> own;
  if (!out) {
    own.resize(static_cast<std::size_t>(rows * cols));
    out = own.data();
  }
  fp8_cast<T>(x, rows * cols, format, scale, out, amax);
  if (!out_t) return;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) out_t[c * rows + r] = out[r * cols + c];
}

template <class T, class A = accumulate_t<T>>
void fp8_cast_transpose_fused(Fp8Producer producer, const T* x, const T* pre, index_t rows, index_t cols, Fp8Format format,
                              const float* scale, std::uint8_t* out, std::uint8_t* out_t, float* amax, A* column_sums,
                              const Fp8Output& activation = {}) {
  const index_t n = rows * cols;
  if (activation.codes) {  // the forward activation's codes of x^T, from pre
    if ((producer != Fp8Producer::gelu_backward && producer != Fp8Producer::swiglu_backward) || activation.amax)
      throw std::invalid_argument("fp8_cast_transpose_fused: activation codes come with gelu_backward or swiglu_backward "
                                  "alone, and fold no amax");
    const bool gelu = producer == Fp8Producer::gelu_backward;  // the forward's producer, of pre
    fp8_cast_transpose_fused<T, A>(gelu ? Fp8Producer::gelu : Fp8Producer::swiglu, pre, nullptr, rows, gelu ? cols : cols / 2,
                                   activation.format, activation.scale, nullptr, activation.codes, nullptr, nullptr);
  }
  std::vector<T> produced;
  const T* v = x;
  if (producer != Fp8Producer::copy) {
    produced.resize(static_cast<std::size_t>(n));
    if (producer == Fp8Producer::gelu) cpu::gelu_forward<T>(x, n, produced.data());
    else if (producer == Fp8Producer::gelu_backward) cpu::gelu_backward<T>(x, pre, n, produced.data());
    else if (producer == Fp8Producer::swiglu) cpu::swiglu_forward<T>(x, rows, cols, produced.data());
    else cpu::swiglu_backward<T>(x, pre, rows, cols / 2, produced.data());
    v = produced.data();
  }
  fp8_cast_transpose<T>(v, rows, cols, format, scale, out, out_t, amax);
  if (column_sums) {
    std::fill(column_sums, column_sums + cols, A(0));
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) column_sums[c] += A(v[r * cols + c]);
  }
}

// codes [rows, cols] -> [cols, rows]
inline void fp8_transpose(const std::uint8_t* in, index_t rows, index_t cols, std::uint8_t* out) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

template <class C>
void fp8_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
              const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, C* c, bool accumulate, const C* bias = nullptr) {
  using A = accumulate_t<C>;
  std::vector<A> a_values(static_cast<std::size_t>(m * k)), b_values(static_cast<std::size_t>(k * n));
  for (std::size_t i = 0; i < a_values.size(); ++i) a_values[i] = static_cast<A>(fp8_decode(a[i], fa));
  for (std::size_t i = 0; i < b_values.size(); ++i) b_values[i] = static_cast<A>(fp8_decode(b[i], fb));
  const A alpha = static_cast<A>(*a_scale_inv) * static_cast<A>(*b_scale_inv);
  cpu::gemm<A, C>(ta, tb, m, n, k, a_values.data(), b_values.data(), c, accumulate, alpha);
  if (bias) cpu::bias_add<C>(c, bias, m, n);  // after the product's rounding to C, as a bias add after the GEMM
}

inline void fp8_update_scale(float* row, float max, const Fp8UpdateArgs& args) { fp8_update_row(row, max, args); }
// Every role's row of `count` states (rows [count, kFp8Roles, stride]), row r with maxes.value[r];
// with `aligned` ([count, kFp8Roles, 4]), each row's new 1 / scale also at aligned[4 (3 i + r)].
inline void fp8_update_scales(float* rows, index_t count, index_t stride, const Fp8RoleMaxes& maxes, const Fp8UpdateArgs& args,
                              float* aligned) {
  for (index_t i = 0; i < count; ++i)
    for (int r = 0; r < kFp8Roles; ++r) {
      float* row = rows + (i * kFp8Roles + r) * stride;
      fp8_update_row(row, maxes.value[r], args);
      if (aligned) aligned[4 * (i * kFp8Roles + r)] = row[args.history + 1];
    }
}

inline index_t fp8_block_count(index_t n, index_t block) { return (n + block - 1) / block; }

namespace detail {
// One block of x [rows, cols], rows r0 .. r1 - 1 by columns c0 .. c1 - 1: its scale from its amax, its
// codes into q [rows, cols] and / or qt [cols, rows] (either may be null); returns 1 / scale.
template <class T>
float fp8_cast_block(const T* x, index_t rows, index_t cols, index_t r0, index_t r1, index_t c0, index_t c1, Fp8Format format,
                     std::uint8_t* q, std::uint8_t* qt) {
  float amax = 0.0f;
  for (index_t r = r0; r < r1; ++r)
    for (index_t c = c0; c < c1; ++c) amax = amax_combine(amax, amax_abs(static_cast<float>(x[r * cols + c])));
  const float scale = fp8_block_scale(amax, fp8_max(format));
  for (index_t r = r0; r < r1; ++r)
    for (index_t c = c0; c < c1; ++c) {
      const std::uint8_t code = fp8_encode(static_cast<float>(x[r * cols + c]) * scale, format);
      if (q) q[r * cols + c] = code;
      if (qt) qt[c * rows + r] = code;
    }
  return 1.0f / scale;
}
}  // namespace detail

template <class T>
void fp8_cast_blocks(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                     float* q_scale_inv, std::uint8_t* qt, float* qt_scale_inv) {
  if (q)
    for (index_t r = 0; r < rows; ++r)
      for (index_t c0 = 0; c0 < cols; c0 += block)  // the run [c0, c0 + B) of row r
        q_scale_inv[(c0 / block) * rows + r] =
            detail::fp8_cast_block(x, rows, cols, r, r + 1, c0, std::min(cols, c0 + block), format, q, nullptr);
  if (qt)
    for (index_t c = 0; c < cols; ++c)
      for (index_t r0 = 0; r0 < rows; r0 += block)  // the run [r0, r0 + B) of column c
        qt_scale_inv[(r0 / block) * cols + c] =
            detail::fp8_cast_block(x, rows, cols, r0, std::min(rows, r0 + block), c, c + 1, format, nullptr, qt);
}

template <class T>
void fp8_cast_tiles(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                    std::uint8_t* qt, float* scale_inv, float* scale_inv_t) {
  const index_t tile_rows = fp8_block_count(rows, block), tile_cols = fp8_block_count(cols, block);
  for (index_t tr = 0; tr < tile_rows; ++tr)
    for (index_t tc = 0; tc < tile_cols; ++tc) {
      const index_t r0 = tr * block, c0 = tc * block;
      const float inverse =
          detail::fp8_cast_block(x, rows, cols, r0, std::min(rows, r0 + block), c0, std::min(cols, c0 + block), format, q, qt);
      if (scale_inv) scale_inv[tr * tile_cols + tc] = inverse;
      if (scale_inv_t) scale_inv_t[tc * tile_rows + tr] = inverse;
    }
}

namespace detail {
// The decoded values of a block-scaled operand X [rows, k] (see fp8_gemm_blocks).
template <class A>
std::vector<A> fp8_decode_blocks(const std::uint8_t* x, index_t rows, index_t k, Fp8Format format, const float* scale_inv,
                                 bool tiles, index_t block) {
  std::vector<A> values(static_cast<std::size_t>(rows * k));
  const index_t k_blocks = fp8_block_count(k, block);
  for (index_t r = 0; r < rows; ++r)
    for (index_t i = 0; i < k; ++i) {
      const float inverse = tiles ? scale_inv[(r / block) * k_blocks + i / block] : scale_inv[(i / block) * rows + r];
      values[static_cast<std::size_t>(r * k + i)] = static_cast<A>(fp8_decode(x[r * k + i], format)) * static_cast<A>(inverse);
    }
  return values;
}
}  // namespace detail

template <class C>
void fp8_gemm_blocks(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                     bool a_tiles, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, bool b_tiles,
                     index_t block, C* c, bool accumulate) {
  using A = accumulate_t<C>;
  const std::vector<A> a_values = detail::fp8_decode_blocks<A>(a, m, k, fa, a_scale_inv, a_tiles, block);
  const std::vector<A> b_values = detail::fp8_decode_blocks<A>(b, n, k, fb, b_scale_inv, b_tiles, block);
  cpu::gemm<A, C>(false, true, m, n, k, a_values.data(), b_values.data(), c, accumulate, A(1));
}

}  // namespace cpu
STRATA_NAMESPACE_END
