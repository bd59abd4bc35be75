// strata/backend/cuda/gemm.hpp: row-major GEMM on the GPU through cuBLASLt.
//
//   C[m,n] = op(A)[m,k] * op(B)[k,n]        (accumulate = false)
//   C[m,n] += op(A)[m,k] * op(B)[k,n]       (accumulate = true)
//
// The same contract as strata::cpu::gemm, with a cuBLASLt handle and a stream in front: A is
// stored [m,k] row-major, or [k,m] when transpose_a; B is stored [k,n], or [n,k] when
// transpose_b; C is [m,n] row-major and dense. Element types: float, double, bf16, fp16; the
// products are summed in float (double for double), so a float GEMM is plain FP32 (no TF32) and
// matches the CPU path to rounding.
//
// cuBLASLt is column-major. A row-major [r,c] matrix is the column-major [c,r] one, so the row-
// major product C = op(A) op(B) is computed as the column-major C^T[n,m] = op(B)^T op(A)^T: the
// operands swap places and each keeps its own transpose flag.
//
// Every call builds its descriptors and asks the heuristic for one algorithm (a few
// microseconds on the host); layers that call the same shape repeatedly may cache later.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "runtime.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

// A cuBLASLt handle and the device workspace its algorithms may use (32 MiB is what NVIDIA
// recommends on Hopper). One per device; calls on different streams may share it only if they
// do not run at the same time, since they share the workspace.
class blas_handle {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;

  explicit blas_handle(std::size_t workspace_bytes = kDefaultWorkspaceBytes) : workspace_(workspace_bytes) {
    STRATA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  }
  blas_handle(const blas_handle&) = delete;
  blas_handle& operator=(const blas_handle&) = delete;
  ~blas_handle() {
    if (handle_) (void)cublasLtDestroy(handle_);
  }

  cublasLtHandle_t get() const { return handle_; }
  void* workspace() { return workspace_.data(); }
  std::size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  cublasLtHandle_t handle_ = nullptr;
  device_buffer<std::byte> workspace_;
};

// gemm_types<T>: the cuBLASLt data, compute and scale (alpha, beta) types for element type T.
template <class T>
struct gemm_types {
  static_assert(sizeof(T) == 0,
                "strata::cuda::gemm has no gemm_types<T> for this element type; it supports float, double, "
                "strata::bf16 and strata::fp16.");
};
template <>
struct gemm_types<float> {
  using scale = float;
  static constexpr cudaDataType_t scale_type = CUDA_R_32F;
  static constexpr cudaDataType_t data = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};
template <>
struct gemm_types<double> {
  using scale = double;
  static constexpr cudaDataType_t scale_type = CUDA_R_64F;
  static constexpr cudaDataType_t data = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
};
template <>
struct gemm_types<bf16> {
  using scale = float;
  static constexpr cudaDataType_t scale_type = CUDA_R_32F;
  static constexpr cudaDataType_t data = CUDA_R_16BF;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};
template <>
struct gemm_types<fp16> {
  using scale = float;
  static constexpr cudaDataType_t scale_type = CUDA_R_32F;
  static constexpr cudaDataType_t data = CUDA_R_16F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

namespace detail {

// Owns one cuBLASLt descriptor; Destroy is the matching cublasLt*Destroy function.
template <class Handle, cublasStatus_t (*Destroy)(Handle)>
struct lt_descriptor {
  Handle handle = nullptr;
  lt_descriptor() = default;
  lt_descriptor(const lt_descriptor&) = delete;
  lt_descriptor& operator=(const lt_descriptor&) = delete;
  ~lt_descriptor() {
    if (handle) (void)Destroy(handle);
  }
};
using matmul_descriptor = lt_descriptor<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using layout_descriptor = lt_descriptor<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using preference_descriptor = lt_descriptor<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// The largest power of two (at most 256) that divides the address: cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and a row slice of a tensor often is not.
inline std::uint32_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace detail

template <class T>
void gemm(blas_handle& blas, cudaStream_t stream, bool transpose_a, bool transpose_b, index_t m, index_t n,
          index_t k, const T* a, const T* b, T* c, bool accumulate) {
  using types = gemm_types<T>;
  using scale_t = typename types::scale;
  if (m < 0 || n < 0 || k < 0) fail<ShapeError>("cuda::gemm: negative size m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = 0, or C unchanged when accumulating
    if (!accumulate)
      STRATA_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<std::size_t>(m) * static_cast<std::size_t>(n) * sizeof(T), stream));
    return;
  }

  // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  // First cuBLASLt operand: the B buffer, stored col-major as [n,k] (ld n) or, transposed, [k,n] (ld k).
  // Second cuBLASLt operand: the A buffer, stored col-major as [k,m] (ld k) or, transposed, [m,k] (ld m).
  const auto u = [](index_t v) { return static_cast<std::uint64_t>(v); };
  const cublasOperation_t op_first = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;

  detail::matmul_descriptor desc;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.handle, types::compute, types::scale_type));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));

  detail::layout_descriptor first, second, out;
  if (transpose_b)
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&first.handle, types::data, u(k), u(n), k));
  else
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&first.handle, types::data, u(n), u(k), n));
  if (transpose_a)
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&second.handle, types::data, u(m), u(k), m));
  else
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&second.handle, types::data, u(k), u(m), k));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&out.handle, types::data, u(n), u(m), n));

  detail::preference_descriptor preference;
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
  const std::size_t workspace_bytes = blas.workspace_bytes();
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes, sizeof(workspace_bytes)));
  const std::uint32_t align_first = detail::pointer_alignment(b), align_second = detail::pointer_alignment(a),
                      align_out = detail::pointer_alignment(c);
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                           &align_first, sizeof(align_first)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                           &align_second, sizeof(align_second)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                           &align_out, sizeof(align_out)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                           &align_out, sizeof(align_out)));

  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  STRATA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(blas.get(), desc.handle, first.handle, second.handle, out.handle,
                                                     out.handle, preference.handle, 1, &heuristic, &found));
  if (found == 0)
    fail<Error>("cuda::gemm: cuBLASLt has no algorithm for ", dtype_name<T>(), " m=", m, " n=", n, " k=", k,
                " transpose_a=", transpose_a, " transpose_b=", transpose_b);

  const scale_t alpha = 1, beta = accumulate ? 1 : 0;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(blas.get(), desc.handle, &alpha, b, first.handle, a, second.handle, &beta, c,
                                     out.handle, c, out.handle, &heuristic.algo, blas.workspace(),
                                     blas.workspace_bytes(), stream));
}

}  // namespace cuda
STRATA_NAMESPACE_END
