// strata/backend/cuda/fp8_gemm.hpp: the scaled FP8 GEMM through cuBLASLt (Hopper, sm_89+).
//
//   C[m,n] = (or +=) a_scale_inv[0] b_scale_inv[0] op(A)[m,k] op(B)[k,n]
//
// with A and B FP8 codes (E4M3, or E5M2 for a gradient in the hybrid format; E5M2 x E5M2 is not
// a cuBLASLt combination and is refused), C bf16 / fp16 / float, products accumulated in float.
// The inverse scales are device scalars handed to cuBLASLt as CUBLASLT_MATMUL_DESC_{A,B}_SCALE_
// POINTER, so no scale ever visits the host.
//
// cuBLASLt's FP8 GEMMs take one layout only: column-major "TN" (the first operand transposed, the
// second not). In row-major terms (gemm.hpp says how the operands swap) that is op(A) = A stored
// [m, k] and op(B) = B^T with B stored [n, k]: the forward y = x W^T as it is; the layers cast the
// gradient GEMMs' operands transposed (fp8_cast_transpose) so theirs are TN too. Other transposes
// are served by transposing the codes into scratch first (one byte per element, fp8_transpose). cuBLASLt also wants k, and the leading dimensions, to be
// multiples of 16: a shape the heuristic has no algorithm for is refused with the shape named. Its
// scale pointers must be 16-byte aligned too (see fp8_gemm_tn).
#pragma once

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "../../core/fp8.hpp"
#include "../../core/tensor.hpp"
#include "gemm.hpp"
#include "kernels/launchers.hpp"
#if STRATA_CUDA_HEADER_ONLY
#include "kernels/fp8.cuh"
#endif

STRATA_NAMESPACE_BEGIN
namespace cuda {

namespace detail {
inline cudaDataType_t fp8_data_type(Fp8Format f) { return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
template <class C>
constexpr cudaDataType_t fp8_output_type() {
  if constexpr (std::is_same_v<C, bf16>) return CUDA_R_16BF;
  else if constexpr (std::is_same_v<C, fp16>) return CUDA_R_16F;
  else return CUDA_R_32F;
}

// The plan key of an FP8 TN problem; `kind` keeps the per-tensor (1000, 1100 with fast accumulation)
// and the block-scaled (2000) problems apart from each other and from gemm()'s keys.
template <class C>
gemm_key fp8_tn_key(const blas_handle& blas, int kind, Fp8Format fa, Fp8Format fb, index_t m, index_t n, index_t k,
                    const void* a, const void* b, const void* c, bool accumulate) {
  gemm_key key{};
  key.data_type = kind + static_cast<int>(fa) * 2 + static_cast<int>(fb);
  key.output_type = static_cast<int>(fp8_output_type<C>());
  key.transpose_a = false;
  key.transpose_b = true;
  key.accumulate = accumulate;
  key.m = m;
  key.n = n;
  key.k = k;
  key.align_a = pointer_alignment(a);
  key.align_b = pointer_alignment(b);
  key.align_c = pointer_alignment(c);
  key.sm_target = blas.sm_target();
  return key;
}

// A preference's largest workspace, in bytes.
inline void set_max_workspace(const preference_descriptor& preference, std::uint64_t bytes) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &bytes, sizeof(bytes)));
}

// The descriptor of the key's FP8 TN problem (fp32 compute, the key's SM target; column-major:
// first = b as [k, n] (ld k), transposed; second = a as [k, m] (ld k); C and D [n, m] (ld n)), and a
// preference for `workspace` bytes of the handle's workspace and the key's alignments. The caller
// adds its epilogue or scale modes before asking the heuristic. `fast`: cuBLASLt's FAST_ACCUM
// (Fp8Accumulation::fast).
template <class C>
void fp8_tn_describe(const blas_handle& blas, const gemm_key& key, Fp8Format fa, Fp8Format fb, gemm_plan& p,
                     preference_descriptor& preference, std::uint64_t workspace, bool fast = false) {
  const cudaDataType_t out_type = fp8_output_type<C>();
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof(transposed)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof(plain)));
  if (key.sm_target > 0)
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &key.sm_target,
                                                       sizeof(key.sm_target)));
  if (fast) {
    const std::int8_t on = 1;
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
  }
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.first.handle, fp8_data_type(fb), key.k, key.n, key.k));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.second.handle, fp8_data_type(fa), key.k, key.m, key.k));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.out_c.handle, out_type, key.n, key.m, key.n));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.out_d.handle, out_type, key.n, key.m, key.n));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
  set_max_workspace(preference, std::min<std::uint64_t>(workspace, blas.workspace_bytes()));
  for (auto [attribute, alignment] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
                                      std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
                                      std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
                                      std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}})
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, attribute, &alignment, sizeof(alignment)));
}

// Sets the scale pointers (they take part in the heuristic's choice; fp8_tn_run sets each call's
// own) and asks the heuristic for the described problem's algorithm: into p.algo, false where it
// has none.
inline bool fp8_tn_algorithm(const blas_handle& blas, gemm_plan& p, const preference_descriptor& preference,
                             const float* a_scales, const float* b_scales) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scales,
                                                     sizeof(b_scales)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales,
                                                     sizeof(a_scales)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(blas.get(), p.desc.handle, p.first.handle, p.second.handle, p.out_c.handle, p.out_d.handle,
                                     preference.handle, 1, &result, &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
    return false;
  p.algo = result.algo;
  return true;
}

// Runs a planned FP8 TN problem with this call's scale pointers (cuBLASLt's A is our b, its B our a).
// With `addend` (not with accumulate), cuBLASLt's C operand is the addend and beta = 1: c = product
// (+ bias) + addend.
template <class C>
void fp8_tn_run(blas_handle& blas, cudaStream_t stream, const gemm_plan& plan, const std::uint8_t* a, const float* a_scales,
                const std::uint8_t* b, const float* b_scales, C* c, bool accumulate, const C* addend = nullptr) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.handle, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scales,
                                                     sizeof(b_scales)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.handle, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales,
                                                     sizeof(a_scales)));
  const float alpha = 1.0f, beta = accumulate || addend ? 1.0f : 0.0f;
  const void* input_c = addend ? static_cast<const void*>(addend) : static_cast<const void*>(c);
  STRATA_CUBLAS_CHECK(cublasLtMatmul(blas.get(), plan.desc.handle, &alpha, b, plan.first.handle, a, plan.second.handle, &beta,
                                     input_c, plan.out_c.handle, c, plan.out_d.handle, &plan.algo, blas.workspace(),
                                     blas.workspace_bytes(), stream));
}
}  // namespace detail

// The TN problem: a [m, k] and b [n, k] row-major codes (see the design note). With a bias (not
// with accumulate), cuBLASLt's BIAS epilogue adds it where it has an algorithm for the problem with
// it (bias in C's type, 16-byte aligned); returns whether the bias was added (true without one).
//
// With a GELU epilogue (not with accumulate): gelu_aux writes pre = product (+ bias) to `aux` and
// c = gelu_tanh(pre) (cuBLASLt's GELU_AUX(_BIAS), the GELU of the fp32 value before rounding);
// dgelu reads pre from `aux` and writes c = product * gelu_tanh'(pre) (DGELU). Those return false,
// having enqueued nothing, where cuBLASLt has no algorithm with the epilogue. `accumulation`: how the
// tensor cores accumulate (Fp8Accumulation). With `addend` (no GELU epilogue, not with accumulate;
// c itself allowed): c = product (+ bias) + addend, one rounding of the fp32 sum (beta = 1 with
// cuBLASLt's C operand the addend: the residual add in the epilogue, as gemm_add's).
template <class C>
bool fp8_gemm_tn(blas_handle& blas, cudaStream_t stream, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa,
                 const float* a_scale_inv, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, C* c, bool accumulate,
                 const C* bias = nullptr, detail::gemm_epilogue epilogue = detail::gemm_epilogue::none,
                 const C* aux = nullptr, Fp8Accumulation accumulation = Fp8Accumulation::split, const C* addend = nullptr) {
  static_assert(std::is_same_v<C, bf16> || std::is_same_v<C, fp16> || std::is_same_v<C, float>,
                "cuda::fp8_gemm writes bf16, fp16 or float outputs (cuBLASLt's FP8 GEMMs have no double output).");
  if (fa == Fp8Format::e5m2 && fb == Fp8Format::e5m2)
    fail<ConfigError>("cuda::fp8_gemm: E5M2 x E5M2 is not a cuBLASLt FP8 GEMM; one operand must be E4M3 (the hybrid "
                      "format keeps weights and activations in E4M3)");
  if (addend && (accumulate || epilogue != detail::gemm_epilogue::none))
    fail<Error>("cuda::fp8_gemm: an addend is only added to a written product (accumulate = false) without a GELU epilogue");
  if (m == 0 || n == 0) return true;
  // The epilogues with FP8 operands take 16-bit outputs here: with a float D, cuBLASLt offers an
  // algorithm for the BIAS epilogue and then refuses the call (CUBLAS_STATUS_INVALID_VALUE, H100,
  // cuBLASLt 13.1), so float outputs add the bias (and GELU) after the GEMM.
  constexpr bool epilogue_type = !std::is_same_v<C, float>;
  const bool gelu = epilogue != detail::gemm_epilogue::none;
  if (gelu && (!epilogue_type || accumulate || n % 8 != 0 || detail::pointer_alignment(aux) < 16 ||
               (bias && detail::pointer_alignment(bias) < 16)))
    return false;
  const bool use_bias = epilogue_type && bias != nullptr && !accumulate && detail::pointer_alignment(bias) >= 16;
  // cuBLASLt runs an FP8 GEMM only when both scale pointers are 16-byte aligned (an offset of 4 or
  // 8 bytes gives CUBLAS_STATUS_NOT_SUPPORTED on Hopper with cuBLASLt 13.1, for every algorithm the
  // heuristic offers); the scaling rows hold the inverse scales at any float offset, so unaligned
  // ones are first copied into an aligned pair (one single-thread kernel on the stream).
  Tensor<float, space::cuda> aligned;
  const auto misaligned = [](const float* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 != 0; };
  if (misaligned(a_scale_inv) || misaligned(b_scale_inv)) {
    aligned = Tensor<float, space::cuda>::empty(Shape{8});
    kernels::fp8_align_scales(a_scale_inv, b_scale_inv, aligned.data(), stream);
    a_scale_inv = aligned.data();
    b_scale_inv = aligned.data() + 4;
  }
  const bool fast = accumulation == Fp8Accumulation::fast;
  detail::gemm_key key = detail::fp8_tn_key<C>(blas, fast ? 1100 : 1000, fa, fb, m, n, k, a, b, c, accumulate);
  key.bias = use_bias;
  key.addend = addend != nullptr;
  if (addend) key.align_c = std::min(key.align_c, detail::pointer_alignment(addend));
  key.epilogue = static_cast<int>(epilogue);
  const cudaDataType_t out_type = detail::fp8_output_type<C>();
  detail::gemm_plan& plan = blas.plan(key, [&](detail::gemm_plan& p) {
    detail::preference_descriptor preference;
    // without a workspace unless the handle allows the FP8 GEMMs one (blas_handle says why); the
    // whole workspace where cuBLASLt has no algorithm for the problem without
    detail::fp8_tn_describe<C>(blas, key, fa, fb, p, preference, blas.fp8_workspace_bytes(), fast);
    const auto set_bias_epilogue = [&](bool on) {
      // the bias runs along the rows of the column-major D [n, m]: one value per row-major column
      const cublasLtEpilogue_t kind = epilogue == detail::gemm_epilogue::dgelu    ? CUBLASLT_EPILOGUE_DGELU
                                      : epilogue == detail::gemm_epilogue::gelu_aux ? (on ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                                          : CUBLASLT_EPILOGUE_GELU_AUX)
                                      : on                                        ? CUBLASLT_EPILOGUE_BIAS
                                                                                  : CUBLASLT_EPILOGUE_DEFAULT;
      STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)));
      if (gelu) {  // the aux matrix has D's column-major layout [n, m] (ld n) and type
        const std::int64_t ld = n;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
        const cudaDataType_t aux_type = out_type;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                           sizeof(aux_type)));
        const void* aux_pointer = aux;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                           &aux_pointer, sizeof(aux_pointer)));
      }
      if (on) {
        const cudaDataType_t bias_type = out_type;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                           sizeof(bias_type)));
        const void* bias_pointer = bias;
        STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                                           sizeof(bias_pointer)));
      }
      p.bias_epilogue = on;
    };
    set_bias_epilogue(use_bias);
    const auto search = [&] { return detail::fp8_tn_algorithm(blas, p, preference, a_scale_inv, b_scale_inv); };
    bool found = search();
    if (!found && blas.fp8_workspace_bytes() < blas.workspace_bytes()) {
      detail::set_max_workspace(preference, blas.workspace_bytes());
      found = search();
    }
    if (!found && gelu) {  // not fused: the caller runs the plain GEMM and the GELU kernel
      p.fused = false;
      return;
    }
    if (!found && use_bias) {  // no algorithm with the epilogue for this problem: the caller adds the bias
      set_bias_epilogue(false);
      found = search();
    }
    if (!found)
      fail<ConfigError>("cuda::fp8_gemm: cuBLASLt has no FP8 algorithm for m=", m, " n=", n, " k=", k, " (", fp8_format_name(fa),
                        " x ", fp8_format_name(fb), "); FP8 GEMMs need k and the row lengths to be multiples of 16 and "
                        "16-byte aligned operands: pad the hidden sizes, or run this layer without FP8");
    if (blas.tuning() != nullptr) {  // --gemm-tuning: the heuristic's candidates timed, as gemm()'s (tuned_algorithm)
      const float alpha = 1.0f, beta = accumulate || addend ? 1.0f : 0.0f;
      const void* input_c = addend ? static_cast<const void*>(addend) : static_cast<const void*>(c);
      const auto launch = [&](const cublasLtMatmulAlgo_t& algo, void* d) {
        return cublasLtMatmul(blas.get(), p.desc.handle, &alpha, b, p.first.handle, a, p.second.handle, &beta, input_c,
                              p.out_c.handle, d, p.out_d.handle, &algo, blas.workspace(), blas.workspace_bytes(), stream);
      };
      const void* out = c;
      const bool scratch = accumulate || out == bias || out == aux || out == addend;  // D is also read: time into scratch
      p.algo = detail::tuned_algorithm(blas, stream, key, p, preference.handle, p.algo, c,
                                       static_cast<std::size_t>(m) * static_cast<std::size_t>(n) * sizeof(C), scratch, launch);
    }
  });
  if (!plan.fused) return false;
  if (plan.bias_epilogue) {
    const void* bias_pointer = bias;
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                                       sizeof(bias_pointer)));
  }
  if (gelu) {
    const void* aux_pointer = aux;
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_pointer,
                                                       sizeof(aux_pointer)));
  }
  detail::fp8_tn_run<C>(blas, stream, plan, a, a_scale_inv, b, b_scale_inv, c, accumulate, addend);
  return bias == nullptr || plan.bias_epilogue;
}

// The block-scaled TN problem through cuBLASLt (Hopper, cuBLASLt 12.9+): a [m, k] and b [n, k]
// with one float 1/scale per 1 x 128 run along k (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) or per
// 128 x 128 tile (BLK128x128_32F). The scale tensors go to cuBLASLt as strata lays them out (runs
// [k/128, rows], tiles [rows/128, k/128]): the layouts cuBLASLt reads, as the GPU suite's probe
// shows against the CPU twin. Each problem is planned once (the blas handle's plan cache, with the
// answer "no algorithm" cached too); returns false, writing nothing, where cuBLASLt has none or k is
// not whole blocks of 128.
template <class C>
bool fp8_gemm_blocks_cublaslt(blas_handle& blas, cudaStream_t stream, index_t m, index_t n, index_t k, const std::uint8_t* a,
                              Fp8Format fa, const float* a_scales, bool a_tiles, const std::uint8_t* b, Fp8Format fb,
                              const float* b_scales, bool b_tiles, C* c, bool accumulate) {
  static_assert(std::is_same_v<C, bf16> || std::is_same_v<C, float>, "block-scaled FP8 GEMMs write bf16 or float");
  if (m == 0 || n == 0) return true;
  if (k % 128 != 0 || (fa == Fp8Format::e5m2 && fb == Fp8Format::e5m2)) return false;
  detail::gemm_key key = detail::fp8_tn_key<C>(blas, 2000, fa, fb, m, n, k, a, b, c, accumulate);
  key.epilogue = (a_tiles ? 1 : 0) | (b_tiles ? 2 : 0);
  detail::gemm_plan& plan = blas.plan(key, [&](detail::gemm_plan& p) {
    detail::preference_descriptor preference;
    detail::fp8_tn_describe<C>(blas, key, fa, fb, p, preference, blas.workspace_bytes());
    // cuBLASLt's A is our b, its B our a (see fp8_gemm_tn)
    const cublasLtMatmulMatrixScale_t mode_a = b_tiles ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                       : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const cublasLtMatmulMatrixScale_t mode_b = a_tiles ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                       : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
    p.fused = detail::fp8_tn_algorithm(blas, p, preference, a_scales, b_scales);  // "fused": cuBLASLt runs this problem
  });
  if (!plan.fused) return false;
  detail::fp8_tn_run<C>(blas, stream, plan, a, a_scales, b, b_scales, c, accumulate);
  return true;
}

// Any transposes (the contract of cpu::fp8_gemm): the operands that are not in the TN layout are
// transposed into scratch codes first.
template <class C>
bool fp8_gemm(blas_handle& blas, cudaStream_t stream, bool ta, bool tb, index_t m, index_t n, index_t k, const std::uint8_t* a,
              Fp8Format fa, const float* a_scale_inv, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, C* c,
              bool accumulate, const C* bias = nullptr, Fp8Accumulation accumulation = Fp8Accumulation::split) {
  Tensor<std::uint8_t, space::cuda> a_rows, b_rows;
  if (ta) {  // a stored [k, m]: make it [m, k]
    a_rows = Tensor<std::uint8_t, space::cuda>::empty(Shape{m, k});
    kernels::fp8_transpose(a, k, m, a_rows.data(), stream);
    a = a_rows.data();
  }
  if (!tb) {  // b stored [k, n]: make it [n, k]
    b_rows = Tensor<std::uint8_t, space::cuda>::empty(Shape{n, k});
    kernels::fp8_transpose(b, k, n, b_rows.data(), stream);
    b = b_rows.data();
  }
  return fp8_gemm_tn<C>(blas, stream, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, c, accumulate, bias,
                        detail::gemm_epilogue::none, nullptr, accumulation);
}

// TN, c = product (+ bias) + addend in one GEMM (the residual add of a layer's last GEMM). Returns
// whether the bias was added (true without one); the addend is added either way.
template <class C>
bool fp8_gemm_add(blas_handle& blas, cudaStream_t stream, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa,
                  const float* a_scale_inv, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, const C* bias,
                  const C* addend, C* c, Fp8Accumulation accumulation = Fp8Accumulation::split) {
  return fp8_gemm_tn<C>(blas, stream, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, c, false, bias,
                        detail::gemm_epilogue::none, nullptr, accumulation, addend);
}

// Whether the FP8 GEMMs take the GELU epilogues: only with STRATA_FP8_GELU_EPILOGUE=1. On an H100
// (cuBLASLt 13.1, GPT 1.41B in bf16 with delayed FP8: bench/RESULTS.md) the GEMMs with them ran the
// step 8% slower than the plain FP8 GEMMs beside the GELU kernels, so they are off by default. Read once.
inline bool fp8_gelu_epilogues() {
  static const bool on = [] {
    const char* v = std::getenv("STRATA_FP8_GELU_EPILOGUE");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

// TN, pre = product (+ bias) and out = gelu_tanh(pre) in one GEMM; false (nothing enqueued) where
// cuBLASLt has no algorithm with the epilogue.
template <class C>
bool fp8_gemm_gelu(blas_handle& blas, cudaStream_t stream, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa,
                   const float* a_scale_inv, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, const C* bias, C* pre,
                   C* out, Fp8Accumulation accumulation = Fp8Accumulation::split) {
  return fp8_gelu_epilogues() && fp8_gemm_tn<C>(blas, stream, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, out, false, bias,
                                                detail::gemm_epilogue::gelu_aux, pre, accumulation);
}
// TN, out = product * gelu_tanh'(pre) in one GEMM; false (nothing enqueued) where unavailable.
template <class C>
bool fp8_gemm_dgelu(blas_handle& blas, cudaStream_t stream, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa,
                    const float* a_scale_inv, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, const C* pre, C* out) {
  return fp8_gelu_epilogues() && fp8_gemm_tn<C>(blas, stream, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, out, false,
                                                nullptr, detail::gemm_epilogue::dgelu, pre);
}

}  // namespace cuda
STRATA_NAMESPACE_END
