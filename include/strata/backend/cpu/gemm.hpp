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

#include <Eigen/Core>
#include <type_traits>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

namespace detail {
template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
void gemm_native(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, const T* a, const T* b, T* c,
                 bool accumulate, T alpha) {
  using Map = Eigen::Map<const RowMatrix<T>>;
  Eigen::Map<RowMatrix<T>> out(c, m, n);
  if (k == 0) {
    if (!accumulate) out.setZero();
    return;
  }
  auto run = [&](const auto& lhs, const auto& rhs) {
    if (accumulate) out.noalias() += alpha * (lhs * rhs);
    else if (alpha == T(1)) out.noalias() = lhs * rhs;
    else out.noalias() = alpha * (lhs * rhs);
  };
  Map a_stored(a, transpose_a ? k : m, transpose_a ? m : k);
  Map b_stored(b, transpose_b ? n : k, transpose_b ? k : n);
  if (!transpose_a && !transpose_b) run(a_stored, b_stored);
  else if (!transpose_a && transpose_b) run(a_stored, b_stored.transpose());
  else if (transpose_a && !transpose_b) run(a_stored.transpose(), b_stored);
  else run(a_stored.transpose(), b_stored.transpose());
}
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
