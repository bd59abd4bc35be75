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
// Output type C: T, or float for 16-bit inputs (weight gradients: bf16 operands, an fp32 gradient
// accumulated in place with beta = 1). A bias[n] added to every row of C (accumulate = false only)
// runs in cuBLASLt's BIAS epilogue for float / bf16 / fp16 when C is T; gemm() returns false when
// it could not apply the bias (double, or an operand not aligned for the epilogue) so the caller
// adds it with a kernel.
//
// Descriptors and the heuristic's algorithm are built once per (types, transposes, m, n, k,
// accumulate, bias, operand alignments) and cached in the blas_handle (a training step calls the
// same few shapes over and over); a cached call only sets the bias pointer and launches. A handle
// given a gemm_tuning table (blas_handle::tune) instead times the heuristic's first 16 candidates
// the first time it meets a problem and keeps the fastest (if 3% faster than the first) in the
// table's file, or takes the algorithm the file names (gemm_tuning.hpp says why the choice is kept).
#pragma once

#include <cublasLt.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "gemm_tuning.hpp"
#include "runtime.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

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


// Everything that selects descriptors and an algorithm.
// The epilogue fused into a GEMM: none (or BIAS), GELU of the product (+ bias) keeping the
// pre-activation in an aux buffer, or the product times GELU'(aux) (the GELU backward).
enum class gemm_epilogue : int { none = 0, gelu_aux = 1, dgelu = 2 };

struct gemm_key {
  int data_type, output_type;
  bool transpose_a, transpose_b, accumulate, bias, addend;
  int epilogue;
  index_t m, n, k;
  std::uint32_t align_a, align_b, align_c;
  int sm_target = 0;  // CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 0 for every SM (blas_handle::set_sm_target)
  bool operator==(const gemm_key&) const = default;
};
struct gemm_key_hash {
  std::size_t operator()(const gemm_key& key) const {
    std::size_t h = 1469598103934665603ull;
    const auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<std::uint64_t>(key.data_type) << 8 | static_cast<std::uint64_t>(key.output_type));
    mix(static_cast<std::uint64_t>(key.transpose_a) | static_cast<std::uint64_t>(key.transpose_b) << 1 |
        static_cast<std::uint64_t>(key.accumulate) << 2 | static_cast<std::uint64_t>(key.bias) << 3 |
        static_cast<std::uint64_t>(key.addend) << 4 | static_cast<std::uint64_t>(key.epilogue) << 5);
    mix(static_cast<std::uint64_t>(key.m));
    mix(static_cast<std::uint64_t>(key.n));
    mix(static_cast<std::uint64_t>(key.k));
    mix(static_cast<std::uint64_t>(key.align_a) << 32 | key.align_b);
    mix(static_cast<std::uint64_t>(key.align_c) << 32 | static_cast<std::uint32_t>(key.sm_target));
    return h;
  }
};
// The descriptors of one problem and the algorithm the heuristic chose for it.
struct gemm_plan {
  matmul_descriptor desc;
  layout_descriptor first, second, out_c, out_d;
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;  // the bias runs in the epilogue (else the caller adds it)
  bool fused = true;           // the requested GELU / dGELU epilogue runs (else nothing was planned for it)
};

}  // namespace detail

// A cuBLASLt handle and the device workspace its algorithms may use (32 MiB is what NVIDIA
// recommends on Hopper; the environment variable STRATA_CUBLASLT_WORKSPACE_KIB sets another size,
// 0 for none, which leaves out the algorithms that need one: about 10% slower GPT-2 steps on an
// H100, though it saves their memset per GEMM) and the plans built so far. The per-tensor FP8 GEMMs
// (fp8_gemm.hpp) are planned with no workspace unless STRATA_CUBLASLT_FP8_WORKSPACE_KIB says
// otherwise: the algorithms cuBLASLt picks for them without one made GPT 1.41B's and a 3B Llama's
// FP8 steps 0.4-0.8% faster on an H100 (no memset before each FP8 GEMM; bench/RESULTS.md). One per
// device; calls on different streams may share it only if they do not run at the same time, since
// they share the workspace.
class blas_handle {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;
  static constexpr std::size_t kDefaultFp8WorkspaceBytes = 0;

  // STRATA_CUBLASLT_WORKSPACE_KIB if set (KiB, at most 4 GiB), else kDefaultWorkspaceBytes.
  static std::size_t default_workspace_bytes() {
    return workspace_from_env("STRATA_CUBLASLT_WORKSPACE_KIB", kDefaultWorkspaceBytes);
  }
  // STRATA_CUBLASLT_FP8_WORKSPACE_KIB if set (KiB, at most 4 GiB), else kDefaultFp8WorkspaceBytes;
  // the per-tensor FP8 GEMMs use at most the smaller of it and the handle's workspace.
  static std::size_t default_fp8_workspace_bytes() {
    return workspace_from_env("STRATA_CUBLASLT_FP8_WORKSPACE_KIB", kDefaultFp8WorkspaceBytes);
  }

  explicit blas_handle(std::size_t workspace_bytes = default_workspace_bytes(),
                       std::size_t fp8_workspace_bytes = default_fp8_workspace_bytes())
      : workspace_(workspace_bytes), fp8_workspace_bytes_(fp8_workspace_bytes) {
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
  // What the per-tensor FP8 GEMMs' plans may ask of the workspace (see the class comment).
  std::size_t fp8_workspace_bytes() const { return std::min(fp8_workspace_bytes_, workspace_bytes()); }

  // The cached plans (descriptors + algorithm), one per distinct GEMM problem seen.
  detail::gemm_plan& plan(const detail::gemm_key& key, const std::function<void(detail::gemm_plan&)>& build) {
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      auto fresh = std::make_unique<detail::gemm_plan>();
      build(*fresh);
      it = plans_.emplace(key, std::move(fresh)).first;
    }
    return *it->second;
  }
  std::size_t cached_plans() const { return plans_.size(); }

  // The number of SMs the GEMMs planned from now on are told to use (cuBLASLt's
  // CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), 0 for all of them: set while a kernel of another stream
  // holds some SMs (a collective beside the GEMM), so the GEMM's grid is sized for the SMs left
  // instead of leaving a tail of blocks that wait for the other kernel to end. Part of the plan's
  // key: each problem is planned once per target. Returns the previous target.
  int set_sm_target(int sms) {
    if (sms < 0) fail<ConfigError>("cuda::blas_handle: the SM target must be at least 0 (0: every SM), got ", sms);
    return std::exchange(sm_target_, sms);
  }
  int sm_target() const { return sm_target_; }

  // Algorithms chosen by timing and kept in `tuning`'s file (null: the heuristic's first choice).
  // Set it before the first GEMM: problems already planned keep the algorithm they have.
  void tune(std::shared_ptr<gemm_tuning> tuning) { tuning_ = std::move(tuning); }
  gemm_tuning* tuning() const { return tuning_.get(); }

  // The library version and the current device, as a tuning file's platform line.
  const std::string& platform() {
    if (platform_.empty()) {
      int device = 0;
      STRATA_CUDA_CHECK(cudaGetDevice(&device));
      cudaDeviceProp properties{};
      STRATA_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
      platform_ = ::strata::detail::concat("cublasLt ", cublasLtGetVersion(), "; ", properties.name, ", sm_", properties.major,
                                 properties.minor, ", ", properties.multiProcessorCount, " SMs");
    }
    return platform_;
  }

 private:
  // `name`'s value in KiB (a whole number up to 4 GiB) as bytes, else `otherwise`; a ConfigError
  // names the variable and the value it could not read.
  static std::size_t workspace_from_env(const char* name, std::size_t otherwise) {
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') return otherwise;
    char* end = nullptr;
    const unsigned long long kib = std::strtoull(env, &end, 10);
    if (end == env || *end != '\0' || *env == '-' || kib > (std::size_t{4} << 20))
      fail<ConfigError>(name, " must be a whole number of KiB from 0 to 4194304 (4 GiB), got '", env, "'");
    return static_cast<std::size_t>(kib) << 10;
  }

  cublasLtHandle_t handle_ = nullptr;
  std::shared_ptr<gemm_tuning> tuning_;
  std::string platform_;
  int sm_target_ = 0;
  device_buffer<std::byte> workspace_;
  std::size_t fp8_workspace_bytes_ = 0;
  std::unordered_map<detail::gemm_key, std::unique_ptr<detail::gemm_plan>, detail::gemm_key_hash> plans_;
};



namespace detail {

// A problem's key as a tuning file's text (gemm_tuning.hpp); `bias` is whether the plan runs the
// bias in its epilogue.
inline std::string problem_text(const gemm_key& key, bool bias) {
  static constexpr const char* epilogues[] = {"none", "gelu_aux", "dgelu"};
  return ::strata::detail::concat("types=", key.data_type, ">", key.output_type, " ta=", key.transpose_a, " tb=",
                                  key.transpose_b, " m=", key.m, " n=", key.n, " k=", key.k, " accumulate=", key.accumulate,
                                  " bias=", bias, " addend=", key.addend, " epilogue=", epilogues[key.epilogue],
                                  " align=", key.align_a, ",", key.align_b, ",", key.align_c,
                                  key.sm_target > 0 ? ::strata::detail::concat(" sms=", key.sm_target) : std::string());
}

// The algorithm of a problem under a tuning table: the one its file names, or (a problem the file
// lacks) the heuristic's first choice unless one of its next candidates (up to kCandidates in all) is
// at least kMargin faster. Each candidate runs once to load it, then kRepeats times, each call timed
// alone between events on `stream` (which is synchronized) after a write of twice the L2 cache, so
// its operands come from memory as in a step; its time is the median. The margin keeps choices made
// on noise out: timed alone, algorithms within a few percent of each other do not keep their order
// inside a training step. The choice is added to the file. `launch(algo, d)` enqueues the problem
// with that algorithm writing D to `d`; the timing writes to `d`, or to scratch memory of d_bytes
// when `scratch` (D is also an input: accumulating, or an addend in the same buffer), so the operands
// and the output's later contents are as without tuning. Inside a stream capture, or when the
// scratch cannot be allocated, the heuristic's first choice is kept (and recorded, so later runs
// agree).
template <class Launch>
cublasLtMatmulAlgo_t tuned_algorithm(blas_handle& blas, cudaStream_t stream, const gemm_key& key, const gemm_plan& p,
                                     cublasLtMatmulPreference_t preference, const cublasLtMatmulAlgo_t& first,
                                     void* d, std::size_t d_bytes, bool scratch, Launch&& launch) {
  static constexpr int kCandidates = 16, kRepeats = 5;
  static constexpr double kMargin = 0.03;
  gemm_tuning& tuning = *blas.tuning();
  tuning.bind(blas.platform());
  const std::string problem = problem_text(key, p.bias_epilogue);
  static_assert(sizeof(cublasLtMatmulAlgo_t::data) == sizeof(gemm_tuning::algorithm_words));
  if (const auto known = tuning.find(problem)) {
    cublasLtMatmulAlgo_t algo{};
    std::memcpy(algo.data, known->algorithm.data(), sizeof(algo.data));
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(blas.get(), p.desc.handle, p.first.handle, p.second.handle, p.out_c.handle,
                                p.out_d.handle, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > blas.workspace_bytes())
      fail<FileError>("GEMM tuning file ", tuning.file(), ": the algorithm it names for \"", problem,
                      "\" is not usable with this library and device. Delete the file (or name another) to time the GEMMs again");
    return algo;
  }
  gemm_tuning::choice chosen;
  std::memcpy(chosen.algorithm.data(), first.data, sizeof(first.data));
  const auto keep_first = [&] {
    tuning.record(problem, chosen);
    return first;
  };
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  STRATA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return keep_first();
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  STRATA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(blas.get(), p.desc.handle, p.first.handle, p.second.handle, p.out_c.handle,
                                                     p.out_d.handle, preference, kCandidates, results, &found));
  void* target = d;
  if (scratch) {
    if (cudaMalloc(&target, d_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return keep_first();
    }
  }
  // Twice the L2 cache, written before each timed call (none when it cannot be allocated).
  int l2_bytes = 0;
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const std::size_t flush_bytes = 2 * static_cast<std::size_t>(l2_bytes);
  void* flush = nullptr;
  if (flush_bytes > 0 && cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    flush = nullptr;
  }
  cudaEvent_t begin[kRepeats] = {}, end[kRepeats] = {};
  for (int r = 0; r < kRepeats; ++r) {
    STRATA_CUDA_CHECK(cudaEventCreate(&begin[r]));
    STRATA_CUDA_CHECK(cudaEventCreate(&end[r]));
  }
  // The median milliseconds of one call of an algorithm, or a negative value when it does not launch.
  const auto time = [&](const cublasLtMatmulAlgo_t& algo) {
    if (launch(algo, target) != CUBLAS_STATUS_SUCCESS) return -1.0;
    for (int r = 0; r < kRepeats; ++r) {
      if (flush) STRATA_CUDA_CHECK(cudaMemsetAsync(flush, r & 1, flush_bytes, stream));
      STRATA_CUDA_CHECK(cudaEventRecord(begin[r], stream));
      if (launch(algo, target) != CUBLAS_STATUS_SUCCESS) return -1.0;
      STRATA_CUDA_CHECK(cudaEventRecord(end[r], stream));
    }
    STRATA_CUDA_CHECK(cudaEventSynchronize(end[kRepeats - 1]));
    double ms[kRepeats];
    for (int r = 0; r < kRepeats; ++r) {
      float elapsed = 0;
      STRATA_CUDA_CHECK(cudaEventElapsedTime(&elapsed, begin[r], end[r]));
      ms[r] = elapsed;
    }
    std::sort(ms, ms + kRepeats);
    return ms[kRepeats / 2];
  };
  cublasLtMatmulAlgo_t best = first;
  chosen.first_ms = chosen.ms = time(first);
  chosen.candidates = 1;
  double fastest = chosen.first_ms * (1 - kMargin);  // what a candidate must beat
  for (int i = 0; i < found; ++i) {
    const auto& candidate = results[i];
    if (candidate.state != CUBLAS_STATUS_SUCCESS || candidate.workspaceSize > blas.workspace_bytes() ||
        std::memcmp(candidate.algo.data, first.data, sizeof(first.data)) == 0)
      continue;
    const double ms = time(candidate.algo);
    if (ms < 0) continue;
    ++chosen.candidates;
    if (ms < fastest) {  // ties keep the earlier (the heuristic's order)
      fastest = chosen.ms = ms;
      best = candidate.algo;
    }
  }
  for (int r = 0; r < kRepeats; ++r) {
    (void)cudaEventDestroy(begin[r]);
    (void)cudaEventDestroy(end[r]);
  }
  if (flush) STRATA_CUDA_CHECK(cudaFree(flush));
  if (scratch) STRATA_CUDA_CHECK(cudaFree(target));
  if (chosen.first_ms < 0)
    fail<Error>("cuda::gemm: the heuristic's own algorithm for \"", problem, "\" failed to launch while timing");
  std::memcpy(chosen.algorithm.data(), best.data, sizeof(best.data));
  tuning.record(problem, chosen);
  return best;
}

// The GEMM of gemm(), gemm_gelu() and gemm_dgelu(). With a GELU epilogue (C = T, !accumulate) `aux`
// is the pre-activation [m, n] (written by gelu_aux, read by dgelu); returns false, having enqueued
// nothing, when cuBLASLt has no algorithm with that epilogue (the caller then runs the unfused path).
// Without one, returns whether the bias was applied (always true when bias is null). With `addend`
// (no epilogue, !accumulate) C is written as addend + op(A) op(B) (+ bias): cuBLASLt's beta = 1 with
// its C operand the addend and its D operand c.
template <class T, class C = T>
bool gemm_impl(blas_handle& blas, cudaStream_t stream, bool transpose_a, bool transpose_b, index_t m, index_t n,
               index_t k, const T* a, const T* b, C* c, bool accumulate, const T* bias, gemm_epilogue epilogue,
               const T* aux, const C* addend = nullptr) {
  static_assert(std::is_same_v<C, T> || (is_half_v<T> && std::is_same_v<C, float>),
                "cuda::gemm writes C of the input type, or float for 16-bit inputs (fp32 weight gradients).");
  using types = gemm_types<T>;
  using scale_t = typename types::scale;
  if (m < 0 || n < 0 || k < 0) fail<ShapeError>("cuda::gemm: negative size m=", m, " n=", n, " k=", k);
  if (bias && accumulate)
    fail<Error>("cuda::gemm: a bias is only added when the product is written (accumulate = false); add it to the "
                "output before accumulating into it");
  if (addend && (accumulate || epilogue != gemm_epilogue::none))
    fail<Error>("cuda::gemm: an addend is only added to a written product (accumulate = false) without a GELU epilogue");
  if (epilogue != gemm_epilogue::none) {
    constexpr bool gelu_types = !std::is_same_v<T, double> && std::is_same_v<C, T>;
    if (!gelu_types || accumulate || m == 0 || n == 0 || k == 0 || n % 8 != 0 || pointer_alignment(aux) < 16 ||
        (bias && pointer_alignment(bias) < 16))
      return false;
  }
  if (m == 0 || n == 0) return true;
  if (k == 0) {  // an empty sum: C = 0 (or the addend), or C unchanged when accumulating (a bias is left to the caller)
    const std::size_t bytes = static_cast<std::size_t>(m) * static_cast<std::size_t>(n) * sizeof(C);
    if (addend) STRATA_CUDA_CHECK(cudaMemcpyAsync(c, addend, bytes, cudaMemcpyDeviceToDevice, stream));
    else if (!accumulate) STRATA_CUDA_CHECK(cudaMemsetAsync(c, 0, bytes, stream));
    return bias == nullptr;
  }
  constexpr bool epilogue_types = !std::is_same_v<T, double> && std::is_same_v<C, T>;
  const bool use_bias = bias != nullptr && epilogue_types && pointer_alignment(bias) >= 16;
  const cudaDataType_t output_type = std::is_same_v<C, T> ? types::data : CUDA_R_32F;

  const std::uint32_t align_c = addend ? std::min(pointer_alignment(c), pointer_alignment(addend)) : pointer_alignment(c);
  const gemm_key key{static_cast<int>(types::data), static_cast<int>(output_type), transpose_a, transpose_b,
                     accumulate, use_bias, addend != nullptr, static_cast<int>(epilogue), m, n, k, pointer_alignment(a),
                     pointer_alignment(b), align_c, blas.sm_target()};
  gemm_plan& plan = blas.plan(key, [&](gemm_plan& p) {
    // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
    // First cuBLASLt operand: the B buffer, stored col-major as [n,k] (ld n) or, transposed, [k,n] (ld k).
    // Second cuBLASLt operand: the A buffer, stored col-major as [k,m] (ld k) or, transposed, [m,k] (ld m).
    const auto u = [](index_t v) { return static_cast<std::uint64_t>(v); };
    const cublasOperation_t op_first = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    // The descriptor, with the BIAS epilogue or without it (and the GELU epilogue when asked).
    const auto describe = [&](bool with_bias) {
      if (p.desc.handle) {
        (void)cublasLtMatmulDescDestroy(p.desc.handle);
        p.desc.handle = nullptr;
      }
      STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc.handle, types::compute, types::scale_type));
      STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
      STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
      if (key.sm_target > 0) {
        const std::int32_t sms = key.sm_target;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
      }
      if (epilogue != gemm_epilogue::none) {
        // The aux matrix has D's column-major layout [n, m] (ld n).
        const cublasLtEpilogue_t kind = epilogue == gemm_epilogue::dgelu
                                            ? CUBLASLT_EPILOGUE_DGELU
                                            : (with_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)));
        const std::int64_t ld = n;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
        const void* aux_pointer = aux;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                           &aux_pointer, sizeof(aux_pointer)));
        if (with_bias) {
          const void* bias_pointer = bias;
          STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                                             sizeof(bias_pointer)));
        }
      } else if (with_bias) {
        // The bias runs along the rows of the column-major D [n, m]: one value per row-major column.
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        const void* bias_pointer = bias;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                                           sizeof(bias_pointer)));
      }
      p.bias_epilogue = with_bias;
    };
    if (transpose_b)
      STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.first.handle, types::data, u(k), u(n), k));
    else
      STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.first.handle, types::data, u(n), u(k), n));
    if (transpose_a)
      STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.second.handle, types::data, u(m), u(k), m));
    else
      STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.second.handle, types::data, u(k), u(m), k));
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.out_c.handle, output_type, u(n), u(m), n));
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.out_d.handle, output_type, u(n), u(m), n));

    preference_descriptor preference;
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
    const std::size_t workspace_bytes = blas.workspace_bytes();
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes, sizeof(workspace_bytes)));
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                             &key.align_b, sizeof(key.align_b)));
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                             &key.align_a, sizeof(key.align_a)));
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                             &key.align_c, sizeof(key.align_c)));
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                             &key.align_c, sizeof(key.align_c)));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const auto ask = [&] {
      STRATA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(blas.get(), p.desc.handle, p.first.handle, p.second.handle,
                                                         p.out_c.handle, p.out_d.handle, preference.handle, 1,
                                                         &heuristic, &found));
    };
    describe(use_bias);
    ask();
    if (found == 0 && epilogue != gemm_epilogue::none) {  // not fused: the caller runs the plain path
      p.fused = false;
      return;
    }
    if (found == 0 && use_bias) {  // no algorithm with the epilogue for this shape: the caller adds the bias
      describe(false);
      ask();
    }
    if (found == 0)
      fail<Error>("cuda::gemm: cuBLASLt has no algorithm for ", dtype_name<T>(), " -> ", dtype_name<C>(), " m=", m,
                  " n=", n, " k=", k, " transpose_a=", transpose_a, " transpose_b=", transpose_b, " bias=", use_bias,
                  "; check the operands' alignment and the element types");
    p.algo = heuristic.algo;
    if (blas.tuning() != nullptr) {
      const scale_t alpha = 1, beta = accumulate || addend ? 1 : 0;
      const void* input_c = addend ? static_cast<const void*>(addend) : static_cast<const void*>(c);
      const auto launch = [&](const cublasLtMatmulAlgo_t& algo, void* d) {
        return cublasLtMatmul(blas.get(), p.desc.handle, &alpha, b, p.first.handle, a, p.second.handle, &beta, input_c,
                              p.out_c.handle, d, p.out_d.handle, &algo, blas.workspace(), blas.workspace_bytes(), stream);
      };
      // D is also read (accumulating, or the addend in place) or is an operand: time into scratch.
      const void* out = c;
      const bool scratch = accumulate || out == addend || out == a || out == b || out == bias || out == aux;
      p.algo = tuned_algorithm(blas, stream, key, p, preference.handle, heuristic.algo, c,
                               static_cast<std::size_t>(m) * static_cast<std::size_t>(n) * sizeof(C), scratch, launch);
    }
  });
  if (!plan.fused) return false;
  if (plan.bias_epilogue) {
    const void* bias_pointer = bias;
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                                       sizeof(bias_pointer)));
  }
  if (epilogue != gemm_epilogue::none) {
    const void* aux_pointer = aux;
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                       &aux_pointer, sizeof(aux_pointer)));
  }
  const scale_t alpha = 1, beta = accumulate || addend ? 1 : 0;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(blas.get(), plan.desc.handle, &alpha, b, plan.first.handle, a, plan.second.handle,
                                     &beta, addend ? addend : c, plan.out_c.handle, c, plan.out_d.handle, &plan.algo, blas.workspace(),
                                     blas.workspace_bytes(), stream));
  return bias == nullptr || plan.bias_epilogue;
}
}  // namespace detail

// Row-major C[m,n] (= or +=) op(A) op(B) (+ bias[n] on every row when bias and !accumulate), enqueued
// on `stream`. Returns whether the bias was applied (always true when bias is null).
template <class T, class C = T>
bool gemm(blas_handle& blas, cudaStream_t stream, bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k,
          const T* a, const T* b, C* c, bool accumulate, const T* bias = nullptr) {
  return detail::gemm_impl<T, C>(blas, stream, transpose_a, transpose_b, m, n, k, a, b, c, accumulate, bias,
                                 detail::gemm_epilogue::none, nullptr);
}

// C[m,n] = addend[m,n] + op(A) op(B) (+ bias[n] on every row), in one GEMM (beta = 1 with cuBLASLt's
// C operand the addend; one rounding of the fp32 sum, where a GEMM then an add would round twice).
// Returns whether the bias was applied (always true when bias is null).
template <class T>
bool gemm_add(blas_handle& blas, cudaStream_t stream, bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k,
              const T* a, const T* b, const T* bias, const T* addend, T* c) {
  return detail::gemm_impl<T, T>(blas, stream, transpose_a, transpose_b, m, n, k, a, b, c, false, bias,
                                 detail::gemm_epilogue::none, nullptr, addend);
}

// pre[m,n] = op(A) op(B) (+ bias[n]) and out = gelu_tanh(pre), in one GEMM (cuBLASLt's GELU_AUX(_BIAS)
// epilogue; GELU computed from the fp32 product before rounding). Returns false, having enqueued
// nothing, when that epilogue is unavailable (double, n not a multiple of 8, misaligned pointers,
// no algorithm): the caller then runs gemm + gelu_forward.
template <class T>
bool gemm_gelu(blas_handle& blas, cudaStream_t stream, bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k,
               const T* a, const T* b, const T* bias, T* pre, T* out) {
  return detail::gemm_impl<T, T>(blas, stream, transpose_a, transpose_b, m, n, k, a, b, out, false, bias,
                                 detail::gemm_epilogue::gelu_aux, pre);
}

// out[m,n] = (op(A) op(B)) * gelu_tanh'(pre), in one GEMM (cuBLASLt's DGELU epilogue). Returns false,
// having enqueued nothing, when unavailable: the caller runs gemm + gelu_backward.
template <class T>
bool gemm_dgelu(blas_handle& blas, cudaStream_t stream, bool transpose_a, bool transpose_b, index_t m, index_t n,
                index_t k, const T* a, const T* b, const T* pre, T* out) {
  return detail::gemm_impl<T, T>(blas, stream, transpose_a, transpose_b, m, n, k, a, b, out, false, nullptr,
                                 detail::gemm_epilogue::dgelu, pre);
}

}  // namespace cuda
STRATA_NAMESPACE_END
