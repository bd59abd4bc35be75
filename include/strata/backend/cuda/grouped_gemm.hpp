// strata/backend/cuda/grouped_gemm.hpp: many row-major GEMMs of different sizes in one cuBLAS call
// (cublasGemmGroupedBatchedEx, cuBLAS 12.5 and later), the backend's grouped_gemm for the MoE experts.
//
//   for each group g:  C_g[m_g, n_g] (+)= op(A_g)[m_g, k_g] op(B_g)[k_g, n_g]
//
// The contract of cpu::grouped_gemm (backend/cpu/moe.hpp), each group as cuda::gemm (gemm.hpp): host
// arrays of sizes and of device pointers; a group with m or n = 0 is skipped, one with k = 0 writes
// zeros (adds nothing when accumulating). cuBLAS sees each row-major product as the column-major
// C^T[n,m] = op(B)^T[n,k] op(A)^T[k,m], as in gemm.hpp: the B buffer is its first operand.
//
// What runs in the grouped call, and what stays one cuda::gemm (cuBLASLt) per group:
//   grouped  C = T = bf16 or fp16 (CUBLAS_COMPUTE_32F: fp32 products, rounded once), float
//            (CUBLAS_COMPUTE_32F with the default math mode: plain FP32, no TF32, as gemm.hpp), double
//            (CUBLAS_COMPUTE_64F): the type rows of cuBLAS's table for this function.
//   loop     - T = bf16 / fp16 with C = float (the experts' fp32 weight gradients): the table has no
//              16-bit input with a 32-bit output for this function (cublasGemmEx and cuBLASLt do);
//            - a group whose A, B or C is not 16-byte aligned: cuBLAS asks 16 bytes of 16-bit
//              operands (or else an alignment that depends on k); strata asks it of every type, so no
//              odd layout reaches a case the tests do not cover. The experts' row slices are aligned
//              whenever the hidden and ffn sizes are multiples of 8;
//            - a size above INT_MAX (the 32-bit interface);
//            - a call whose C blocks overlap (cuBLAS requires them disjoint; the loop keeps the
//              sequential meaning) or with a single qualifying group (one cuBLASLt GEMM suits it best);
//            - cuBLAS older than 12.5, or cuBLAS answering CUBLAS_STATUS_NOT_SUPPORTED.
//   groups_in_grouped_call() says which groups a call sends to cuBLAS.
// Consecutive groups of the same (m, n, k) form one cuBLAS group (group_size > 1), so an evenly
// balanced routing is one batched problem.
//
// Memory: the A / B / C pointer arrays must be in device memory. They go into a block of the
// backend's caching allocator, written by kernels/pointer_table.cuh (the pointers travel in the
// kernel's argument), and the block is given back right after the call is enqueued: reuse is ordered
// on the same stream, so nothing waits for the host and a steady-state step makes no cudaMalloc.
// Sizes, transposes, leading dimensions, alpha and beta are host arrays, read during the call
// (CUBLAS_POINTER_MODE_HOST).
//
// Handle: cuBLASLt, which runs every other GEMM, has no grouped GEMM (cuBLAS 13.1 headers), so the backend
// keeps one cuBLAS handle for this call (cublas_handle), bound to the compute stream and to the
// blas_handle's workspace; the two run one after the other on one stream, never at once. cuBLAS gives
// the same bits on every run for the same sizes on the same GPU model and SM count when each stream
// has its own workspace (its reproducibility rule), and atomics stay off: two calls give the same bits.
//
// The experts' layers call the device-count forms below (grouped_gemm_rows / grouped_gemm_weights),
// whose group sizes are a device array: with bf16 on Hopper, and strata::cuda_kernels built with
// CUTLASS, one CUTLASS ptr-array grouped kernel each (grouped_gemm_sm90.hpp), fp32 weight gradients
// included, and the token counts never reach the host; otherwise they read the counts (one wait) and
// run the grouped_gemm above.
//
// Needs nvcc (includes a kernel), unless the kernels come compiled (kernels/launchers.hpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/shape.hpp"
#include "../../core/space.hpp"
#include "../moe_routing.hpp"
#include "allocator.hpp"
#include "gemm.hpp"
#include "grouped_gemm_sm90.hpp"
#include "kernels/launchers.hpp"
#if STRATA_CUDA_HEADER_ONLY
#include "kernels/pointer_table.cuh"
#endif
#include "runtime.hpp"

// STRATA_CUBLAS_GROUPED_GEMM: 1 when the cuBLAS headers declare cublasGemmGroupedBatchedEx (12.5+).
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
#define STRATA_CUBLAS_GROUPED_GEMM 1
#else
#define STRATA_CUBLAS_GROUPED_GEMM 0
#endif

STRATA_NAMESPACE_BEGIN
namespace cuda {

// A cuBLAS handle with host pointer mode, the default math mode (no TF32) and atomics off. bind()
// points it at a stream and a workspace and returns it; it calls cuBLAS only when either changed,
// since cublasSetStream also puts cuBLAS's own workspace pool back. One per device, used from one
// thread at a time (as blas_handle).
class cublas_handle {
 public:
  cublas_handle() {
    STRATA_CUBLAS_CHECK(cublasCreate(&handle_));
    STRATA_CUBLAS_CHECK(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST));
    STRATA_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    STRATA_CUBLAS_CHECK(cublasSetAtomicsMode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() {
    if (handle_) (void)cublasDestroy(handle_);
  }

  cublasHandle_t bind(cudaStream_t stream, void* workspace, std::size_t workspace_bytes) {
    if (!bound_ || stream != stream_ || workspace != workspace_ || workspace_bytes != workspace_bytes_) {
      STRATA_CUBLAS_CHECK(cublasSetStream(handle_, stream));
      STRATA_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace, workspace_bytes));
      bound_ = true;
      stream_ = stream;
      workspace_ = workspace;
      workspace_bytes_ = workspace_bytes;
    }
    return handle_;
  }

 private:
  cublasHandle_t handle_ = nullptr;
  bool bound_ = false;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

// Whether cublasGemmGroupedBatchedEx takes operands of type T with an output of type C (its table:
// bf16 -> bf16, fp16 -> fp16, float -> float, double -> double; no 16-bit input with a float output).
template <class T, class C>
inline constexpr bool grouped_gemm_takes = STRATA_CUBLAS_GROUPED_GEMM && std::is_same_v<T, C> && Element<T>;

// The largest group (2 m n k FLOPs) sent to the grouped call; larger ones run as one cuBLASLt GEMM
// each. Measured on an H200 (bench/bench_grouped_gemm.cu, bench/RESULTS.md): at Mixtral-like expert
// shapes (12 GFLOP per group and up) cublasGemmGroupedBatchedEx reached 250-300 TFLOP/s where the
// per-expert cuBLASLt GEMMs reached 600-700, so large experts keep their own GEMM; the grouped call
// is kept for many small groups, whose launches it saves (not yet measured there).
inline constexpr double kGroupedGemmMaxFlops = 1e9;

// The groups of a grouped_gemm call that run in the one cuBLAS grouped call, ascending (the others run
// one cuBLASLt GEMM each, or are empty): none unless grouped_gemm_takes<T, C>, at least two groups
// qualify and no two C blocks overlap. A group qualifies when m, n, k > 0, they fit an int, its A,
// B and C are 16-byte aligned and it is at most kGroupedGemmMaxFlops.
template <class T, class C = T>
std::vector<index_t> groups_in_grouped_call(index_t groups, const index_t* m, const index_t* n, const index_t* k,
                                            const T* const* a, const T* const* b, C* const* c) {
  std::vector<index_t> chosen;
  if constexpr (grouped_gemm_takes<T, C>) {
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> outputs;  // [begin, end) bytes of each C written
    for (index_t g = 0; g < groups; ++g) {
      if (m[g] <= 0 || n[g] <= 0) continue;
      const auto begin = reinterpret_cast<std::uintptr_t>(c[g]);
      outputs.emplace_back(begin, begin + static_cast<std::uintptr_t>(m[g]) * static_cast<std::uintptr_t>(n[g]) * sizeof(C));
      if (k[g] <= 0 || m[g] > INT_MAX || n[g] > INT_MAX || k[g] > INT_MAX) continue;
      if (detail::pointer_alignment(a[g]) < 16 || detail::pointer_alignment(b[g]) < 16 ||
          detail::pointer_alignment(c[g]) < 16)
        continue;
      if (2.0 * static_cast<double>(m[g]) * static_cast<double>(n[g]) * static_cast<double>(k[g]) > kGroupedGemmMaxFlops) continue;
      chosen.push_back(g);
    }
    std::sort(outputs.begin(), outputs.end());
    for (std::size_t i = 1; i < outputs.size(); ++i)
      if (outputs[i].first < outputs[i - 1].second) return {};
    if (chosen.size() < 2) chosen.clear();
  } else {
    (void)groups, (void)m, (void)n, (void)k, (void)a, (void)b, (void)c;
  }
  return chosen;
}

namespace detail {

// The chosen groups in one cublasGemmGroupedBatchedEx call. Returns false, having enqueued no GEMM,
// when cuBLAS answers CUBLAS_STATUS_NOT_SUPPORTED (the caller then runs them one by one).
template <class T, class C>
bool grouped_call(blas_handle& blas, cublas_handle& handle, device_memory_resource& memory, cudaStream_t stream,
                  bool transpose_a, bool transpose_b, const std::vector<index_t>& chosen, const index_t* m,
                  const index_t* n, const index_t* k, const T* const* a, const T* const* b, C* const* c,
                  bool accumulate) {
#if STRATA_CUBLAS_GROUPED_GEMM
  using types = gemm_types<T>;
  using scale_t = typename types::scale;
  const std::size_t problems = chosen.size();
  // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  // First cuBLAS operand: the B buffer, col-major [n,k] (ld n) or, transposed, [k,n] (ld k).
  // Second cuBLAS operand: the A buffer, col-major [k,m] (ld k) or, transposed, [m,k] (ld m).
  std::vector<void*> pointers(3 * problems);  // first operands, then second operands, then outputs
  std::vector<cublasOperation_t> op_first, op_second;
  std::vector<int> rows, cols, inner, ld_first, ld_second, ld_out, group_size;  // cuBLAS's m, n, k = n, m, k
  std::vector<scale_t> alpha, beta;
  for (std::size_t p = 0; p < problems; ++p) {
    const index_t g = chosen[p];
    pointers[p] = const_cast<T*>(b[g]);
    pointers[problems + p] = const_cast<T*>(a[g]);
    pointers[2 * problems + p] = c[g];
    if (p > 0) {
      const index_t previous = chosen[p - 1];
      if (m[g] == m[previous] && n[g] == n[previous] && k[g] == k[previous]) {
        ++group_size.back();
        continue;
      }
    }
    const int mi = static_cast<int>(m[g]), ni = static_cast<int>(n[g]), ki = static_cast<int>(k[g]);
    op_first.push_back(transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    op_second.push_back(transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    rows.push_back(ni);
    cols.push_back(mi);
    inner.push_back(ki);
    ld_first.push_back(transpose_b ? ki : ni);
    ld_second.push_back(transpose_a ? mi : ki);
    ld_out.push_back(ni);
    alpha.push_back(scale_t(1));
    beta.push_back(scale_t(accumulate ? 1 : 0));
    group_size.push_back(1);
  }
  scratch<void*> table(memory, 3 * problems);  // (3 x problems) device pointers
  kernels::store_pointers<void*>(pointers.data(), pointers.size(), table.data(), stream);
  void* const* first = table.data();
  void* const* second = first + problems;
  void* const* out = second + problems;
  const cudaDataType_t output_type = std::is_same_v<C, T> ? types::data : CUDA_R_32F;
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(
      handle.bind(stream, blas.workspace(), blas.workspace_bytes()), op_first.data(), op_second.data(), rows.data(),
      cols.data(), inner.data(), alpha.data(), first, types::data, ld_first.data(), second, types::data,
      ld_second.data(), beta.data(), out, output_type, ld_out.data(), static_cast<int>(group_size.size()),
      group_size.data(), types::compute);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  STRATA_CUBLAS_CHECK(status);
  return true;
#else
  (void)blas, (void)handle, (void)memory, (void)stream, (void)transpose_a, (void)transpose_b, (void)chosen;
  (void)m, (void)n, (void)k, (void)a, (void)b, (void)c, (void)accumulate;
  return false;
#endif
}

}  // namespace detail

// C_g (+)= op(A_g) op(B_g) for g < groups, enqueued on `stream`: the groups of
// groups_in_grouped_call() in one cuBLAS grouped GEMM, the others one cuda::gemm each. `memory`
// gives the block of device pointer arrays (the backend's caching allocator, ordered on `stream`).
// Returns how many groups ran in the grouped call.
template <class T, class C = T>
index_t grouped_gemm(blas_handle& blas, cublas_handle& grouped_blas, device_memory_resource& memory, cudaStream_t stream,
                     bool transpose_a, bool transpose_b, index_t groups, const index_t* m, const index_t* n,
                     const index_t* k, const T* const* a, const T* const* b, C* const* c, bool accumulate) {
  static_assert(std::is_same_v<C, T> || (is_half_v<T> && std::is_same_v<C, float>),
                "cuda::grouped_gemm writes C of the input type, or float for 16-bit inputs (fp32 weight gradients).");
  if (groups < 0) fail<ShapeError>("cuda::grouped_gemm: negative group count ", groups);
  for (index_t g = 0; g < groups; ++g)
    if (m[g] < 0 || n[g] < 0 || k[g] < 0)
      fail<ShapeError>("cuda::grouped_gemm: group ", g, " has a negative size m=", m[g], " n=", n[g], " k=", k[g]);
  const std::vector<index_t> chosen = groups_in_grouped_call<T, C>(groups, m, n, k, a, b, c);
  std::size_t next = 0;
  for (index_t g = 0; g < groups; ++g) {  // the others: cuda::gemm skips an empty C and zeroes it for k = 0
    if (next < chosen.size() && chosen[next] == g) {
      ++next;
      continue;
    }
    gemm<T, C>(blas, stream, transpose_a, transpose_b, m[g], n[g], k[g], a[g], b[g], c[g], accumulate);
  }
  if (chosen.empty()) return 0;
  if (detail::grouped_call<T, C>(blas, grouped_blas, memory, stream, transpose_a, transpose_b, chosen, m, n, k, a, b, c,
                                 accumulate))
    return static_cast<index_t>(chosen.size());
  for (const index_t g : chosen)
    gemm<T, C>(blas, stream, transpose_a, transpose_b, m[g], n[g], k[g], a[g], b[g], c[g], accumulate);
  return 0;
}

namespace detail {

// The counts of a device-count grouped GEMM on the host (the fallback's one wait for the stream).
inline std::vector<std::int32_t> counts_on_host(const char* who, const std::int32_t* counts, index_t groups, index_t rows,
                                                cudaStream_t stream) {
  std::vector<std::int32_t> host(static_cast<std::size_t>(groups));
  if (groups > 0) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(host.data(), counts, sizeof(std::int32_t) * host.size(), cudaMemcpyDeviceToHost, stream));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  (void)moe_math::grouped_rows_total(who, groups, host.data(), rows);
  return host;
}

}  // namespace detail

// The row-grouped GEMM of the MoE experts with the group sizes in device memory (the contract of
// cpu::grouped_gemm_rows): C[rows, n] = A[rows, k] op(B_g) over consecutive groups of counts[g] rows,
// the rows past the counts' total zero. bf16 on an sm_90 GPU with strata::cuda_kernels built with
// CUTLASS: one grouped kernel reading the counts on the device (grouped_gemm_sm90.hpp), nothing
// waits. Otherwise the counts are read on the host and the call is cuda::grouped_gemm's.
template <class T>
void grouped_gemm_rows(blas_handle& blas, cublas_handle& grouped_blas, device_memory_resource& memory, cudaStream_t stream,
                       bool transpose_b, index_t groups, const std::int32_t* counts, index_t rows, index_t n, index_t k,
                       const T* a, const T* const* b, T* c) {
  if (groups < 0 || rows < 0 || n < 0 || k < 0)
    fail<ShapeError>("cuda::grouped_gemm_rows: negative size: groups=", groups, " rows=", rows, " n=", n, " k=", k);
#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
  if constexpr (std::is_same_v<T, bf16>) {
    if (rows > 0 && sm90::grouped_gemm_rows(stream, memory, transpose_b, groups, counts, rows, n, k, a, b, c)) return;
  }
#endif
  const std::vector<std::int32_t> host = detail::counts_on_host("cuda::grouped_gemm_rows", counts, groups, rows, stream);
  std::vector<index_t> m(host.begin(), host.end()), ns(static_cast<std::size_t>(groups), n), ks(ns.size(), k);
  std::vector<const T*> as(ns.size());
  std::vector<T*> cs(ns.size());
  index_t at = 0;
  for (index_t g = 0; g < groups; ++g) as[g] = a + at * k, cs[g] = c + at * n, at += m[g];
  (void)grouped_gemm<T, T>(blas, grouped_blas, memory, stream, false, transpose_b, groups, m.data(), ns.data(), ks.data(),
                           as.data(), b, cs.data(), false);
  if (rows > at) STRATA_CUDA_CHECK(cudaMemsetAsync(c + at * n, 0, sizeof(T) * static_cast<std::size_t>((rows - at) * n), stream));
}

// The experts' weight gradients with the group sizes in device memory (the contract of
// cpu::grouped_gemm_weights): C_g[m, n] (+)= A_g^T B_g over group g's rows of A [rows, m] and
// B [rows, n]. bf16 operands with a float C on an sm_90 GPU with CUTLASS: one grouped kernel;
// otherwise the counts are read on the host and the call is cuda::grouped_gemm's.
template <class T, class C>
void grouped_gemm_weights(blas_handle& blas, cublas_handle& grouped_blas, device_memory_resource& memory,
                          cudaStream_t stream, index_t groups, const std::int32_t* counts, index_t rows, index_t m,
                          index_t n, const T* a, const T* b, C* const* c, bool accumulate) {
  if (groups < 0 || rows < 0 || m < 0 || n < 0)
    fail<ShapeError>("cuda::grouped_gemm_weights: negative size: groups=", groups, " rows=", rows, " m=", m, " n=", n);
#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
  if constexpr (std::is_same_v<T, bf16> && std::is_same_v<C, float>) {
    if (m > 0 && n > 0 && sm90::grouped_gemm_weights(stream, memory, groups, counts, m, n, a, b, c, accumulate)) return;
  }
#endif
  const std::vector<std::int32_t> host = detail::counts_on_host("cuda::grouped_gemm_weights", counts, groups, rows, stream);
  std::vector<index_t> ks(host.begin(), host.end()), ms(static_cast<std::size_t>(groups), m), ns(ms.size(), n);
  std::vector<const T*> as(ms.size()), bs(ms.size());
  index_t at = 0;
  for (index_t g = 0; g < groups; ++g) as[g] = a + at * m, bs[g] = b + at * n, at += ks[g];
  (void)grouped_gemm<T, C>(blas, grouped_blas, memory, stream, true, false, groups, ms.data(), ns.data(), ks.data(),
                           as.data(), bs.data(), c, accumulate);
}

}  // namespace cuda
STRATA_NAMESPACE_END
