// strata/backend/cpu/gemm.hpp: row-major GEMM on the CPU through Eigen.
//
//   C[m,n] = (or +=) alpha * op(A)[m,k] * op(B)[k,n]  (+ bias[n] on every row, when not accumulating)
//   bias_add:  y[r,c] += bias[c];   bias_grad:  dbias[c] += sum_r dy[r,c] (rows in ascending order)
//
// A is stored [m,k] row-major, or [k,m] when transpose_a; B is stored [k,n], or [n,k] when
// transpose_b. float and double map straight onto Eigen; bf16 and fp16 are widened to float,
// multiplied in float, and rounded once on the way back (the CPU twin of a tensor-core GEMM with
// float accumulation).
#pragma once

#include <type_traits>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

namespace detail {
// C = (or +=) alpha * op(A) op(B) for float and double, through Eigen. Header-only, gemm_eigen.hpp
// (included at the end of this file) defines it. With STRATA_CPU_KERNELS_LIBRARY (code that links
// strata::cpu_kernels) it is only declared here: its instances are compiled once in
// backend/cpu/library/, and code that includes this header neither parses Eigen nor generates
// Eigen's GEMM kernels again (at -O0 they were a fifth of a test program's code).
//
// Two variants, in inline namespaces of their own so that both can be in one program: `portable`,
// and `native` for code compiled with -march=native (STRATA_CPU_GEMM_NATIVE=1, which CMake's
// strata_native_arch sets beside the flag; the library compiles it when STRATA_NATIVE_ARCH is on).
// They can round differently: Eigen's vectorized loops peel to the vector width's alignment, and
// a 16-byte heap block is aligned for SSE's width but not for AVX's, so only the portable variant's
// results are independent of where the buffers lie. The tests use it; the trainers use native.
#if defined(STRATA_CPU_GEMM_NATIVE) && STRATA_CPU_GEMM_NATIVE
#define STRATA_CPU_GEMM_VARIANT native
#else
#define STRATA_CPU_GEMM_VARIANT portable
#endif
inline namespace STRATA_CPU_GEMM_VARIANT {
template <class T>
void gemm_native(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, const T* a, const T* b, T* c,
                 bool accumulate, T alpha);
#if defined(STRATA_CPU_KERNELS_LIBRARY)
extern template void gemm_native<float>(bool, bool, index_t, index_t, index_t, const float*, const float*, float*, bool,
                                        float);
extern template void gemm_native<double>(bool, bool, index_t, index_t, index_t, const double*, const double*, double*,
                                         bool, double);
#endif
}  // namespace native / portable
}  // namespace detail

// C may be wider than the inputs (a bf16 GEMM accumulating into float gradients). The bias (if
// any) is added in the accumulate type before the single rounding to C.
template <class T, class C = T>
void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, const T* a, const T* b, C* c,
          bool accumulate, accumulate_t<T> alpha = accumulate_t<T>(1), const T* bias = nullptr) {
  if (accumulate) bias = nullptr;
  if constexpr (is_half_v<T> || is_half_v<C>) {
    std::vector<float> a32(static_cast<std::size_t>(m * k)), b32(static_cast<std::size_t>(k * n)),
        c32(static_cast<std::size_t>(m * n));
    for (std::size_t i = 0; i < a32.size(); ++i) a32[i] = static_cast<float>(a[i]);
    for (std::size_t i = 0; i < b32.size(); ++i) b32[i] = static_cast<float>(b[i]);
    if (accumulate)
      for (std::size_t i = 0; i < c32.size(); ++i) c32[i] = static_cast<float>(c[i]);
    detail::gemm_native<float>(transpose_a, transpose_b, m, n, k, a32.data(), b32.data(), c32.data(), accumulate,
                               static_cast<float>(alpha));
    if (bias)
      for (index_t r = 0; r < m; ++r)
        for (index_t j = 0; j < n; ++j) c32[static_cast<std::size_t>(r * n + j)] += static_cast<float>(bias[j]);
    for (std::size_t i = 0; i < c32.size(); ++i) c[i] = C(c32[i]);
  } else {
    static_assert(std::is_same_v<T, C>, "gemm: a wider output type is only supported for 16-bit inputs.");
    detail::gemm_native<T>(transpose_a, transpose_b, m, n, k, a, b, c, accumulate, alpha);
    if (bias)
      for (index_t r = 0; r < m; ++r)
        for (index_t j = 0; j < n; ++j) c[r * n + j] += bias[j];
  }
}

// y [rows, cols] += bias [cols]
template <class T>
void bias_add(T* y, const T* bias, index_t rows, index_t cols) {
  using A = accumulate_t<T>;
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < cols; ++j) y[r * cols + j] = T(A(y[r * cols + j]) + A(bias[j]));
}

// dbias [cols] += sum over rows of dy [rows, cols], rows in ascending order
template <class T, class A = accumulate_t<T>>
void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < cols; ++j) dbias[j] += A(dy[r * cols + j]);
}

}  // namespace cpu
STRATA_NAMESPACE_END

#if !defined(STRATA_CPU_KERNELS_LIBRARY)
#include "gemm_eigen.hpp"
#endif
