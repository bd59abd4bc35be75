// strata/backend/cpu/fp8.hpp: the FP8 kernels on the CPU, the twins the CUDA ones are tested
// against bit for bit (the GEMM within its accumulation bound).
//
//   fp8_amax(x, n, amax)            amax[0] = max(amax[0], max_i |x_i|) (NaN wins)
//   fp8_cast(x, n, f, scale, q, amax)
//                                   q_i = fp8_f(float(x_i) * scale[0]) (round to nearest even,
//                                   saturating); amax as fp8_amax when not null (one pass)
//   fp8_cast_transpose(x, rows, cols, f, scale, q, qt, amax)
//                                   q [rows, cols] (unless q is null) and qt [cols, rows] of the
//                                   same codes
//   fp8_gemm(ta, tb, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, c, accumulate)
//                                   C = (or +=) a_scale_inv[0] b_scale_inv[0] op(A) op(B): the codes
//                                   decoded exactly, multiplied and summed in accumulate_t<C>
//                                   (float for bf16 and float outputs, double for double), the
//                                   scales applied to the sum (as cuBLASLt's scale pointers do)
//   fp8_update_scale(row, max, args)  the step update of one scaling row (core/fp8_recipe.hpp)
//
// The product float(x) * scale is rounded to float before the FP8 rounding, as the GPU kernel
// computes it; for double tensors x is first rounded to float.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../../core/fp8.hpp"
#include "../../core/fp8_recipe.hpp"
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
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) out_t[c * rows + r] = out[r * cols + c];
}

template <class C>
void fp8_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
              const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, C* c, bool accumulate) {
  using A = accumulate_t<C>;
  std::vector<A> a_values(static_cast<std::size_t>(m * k)), b_values(static_cast<std::size_t>(k * n));
  for (std::size_t i = 0; i < a_values.size(); ++i) a_values[i] = static_cast<A>(fp8_decode(a[i], fa));
  for (std::size_t i = 0; i < b_values.size(); ++i) b_values[i] = static_cast<A>(fp8_decode(b[i], fb));
  const A alpha = static_cast<A>(*a_scale_inv) * static_cast<A>(*b_scale_inv);
  cpu::gemm<A, C>(ta, tb, m, n, k, a_values.data(), b_values.data(), c, accumulate, alpha);
}

inline void fp8_update_scale(float* row, float max, const Fp8UpdateArgs& args) { fp8_update_row(row, max, args); }

}  // namespace cpu
STRATA_NAMESPACE_END
