// strata/backend/cpu/gemm_eigen.hpp: the definition of cpu::detail::gemm_native (gemm.hpp), row-major
// GEMM through Eigen maps for float and double. Header-only builds include it from gemm.hpp; with
// strata::cpu_kernels it is compiled once, in backend/cpu/library/gemm.cpp, and no other code
// includes it.
#pragma once

#include <Eigen/Core>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "gemm.hpp"  // the declaration, in the variant's namespace (STRATA_CPU_GEMM_VARIANT)

STRATA_NAMESPACE_BEGIN
namespace cpu {

namespace detail {
inline namespace STRATA_CPU_GEMM_VARIANT {  // native or portable: gemm.hpp
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
}  // namespace native / portable
}  // namespace detail

}  // namespace cpu
STRATA_NAMESPACE_END
