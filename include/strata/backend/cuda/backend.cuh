// strata/backend/cuda/backend.cuh: `cuda::backend`, the CUDA model of the backend object of
// docs/DEVICE.md: one per rank, every entry point a member function enqueued on the rank's compute
// stream.
//
// The object is a cheap handle: copies share one state (as a shared_ptr does), which holds
//   - the device ordinal, a compute stream and a communication stream (both non-blocking; the
//     compute stream may instead be one the caller owns, such as a NCCL communicator's),
//   - the cuBLASLt handle, its 32 MiB workspace and the cached GEMM plans (gemm.hpp), and the cuBLAS
//     handle of the grouped GEMM, which shares that workspace (grouped_gemm.hpp),
//   - the caching allocator (allocator.hpp), installed as current_device_resource() on the thread
//     that creates the backend (install() installs it on another thread of the same rank),
//   - the attention plans (cuDNN handle and graphs), created on first use.
// Kernels that need scratch memory (deterministic column sums, the embedding sort, sum of squares)
// take it from the caching allocator and give it back right after enqueuing: reuse is ordered on the
// same stream, so no synchronization is needed and a steady-state step makes no cudaMalloc. The
// column sums also use a few zeroed counters the state keeps (one kernel instead of two).
//
// Attention forwards to backend/cuda/attention.hpp: cuDNN SDPA for bf16 / fp16 when the translation
// unit is built with strata::cudnn (STRATA_WITH_CUDNN), the own flash kernels otherwise. The plans
// (cuDNN handle, graphs, workspace) are created on the first attention call.
//
// Pointers are device pointers in the backend's space; sizes are index_t; `A` is accumulate_t<T>.
// Everything returns as soon as the work is enqueued, except copy_to_host, wait_host_copies and
// synchronize, which wait, and copy_from_host, which returns once the host memory may be reused: small copies are staged
// in pinned memory and do not wait for the GPU (caching_allocator::copy).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>
#include <string_view>
#include <type_traits>
#include <utility>

#include "../../core/space.hpp"
#include "../adamw_step.hpp"
#include "../backend.hpp"
#include "../tensor_ref.hpp"
#include "allocator.hpp"
#include "attention.hpp"
#include "fp8_gemm.hpp"
#include "gemm.hpp"
#include "grouped_gemm.hpp"
#include "kernels/launchers.hpp"
#include "runtime.hpp"
#if STRATA_CUDA_HEADER_ONLY  // else the launchers come compiled from strata::cuda_kernels
#include "kernels/activation.cuh"
#include "kernels/attention_merge.cuh"
#include "kernels/bias.cuh"
#include "kernels/columns.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/fp8.cuh"
#include "kernels/moe.cuh"
#include "kernels/multi_tensor.cuh"
#include "kernels/norm.cuh"
#include "kernels/optimizer.cuh"
#include "kernels/random.cuh"
#include "kernels/rope.cuh"
#endif


STRATA_NAMESPACE_BEGIN
namespace cuda {

class backend {
 public:
  using space = strata::space::cuda;
  static constexpr std::string_view name = "cuda";

  // The backend of `device` (an ordinal below device_count()), installed on the calling thread.
  explicit backend(int device = 0) : state_(std::make_shared<state>(device, nullptr)) { start(); }
  // The same, enqueuing its work on `compute_stream` (a stream of `device` that outlives the
  // backend, e.g. a NCCL communicator's stream()), so kernels and collectives are ordered on one
  // stream. The backend synchronizes that stream when its last copy goes but never destroys it.
  backend(int device, cudaStream_t compute_stream) : state_(std::make_shared<state>(device, compute_stream)) { start(); }

  int device() const { return state_->device; }
  cudaStream_t stream() const { return state_->compute_stream; }
  cudaStream_t communication_stream() const { return state_->communication.get(); }
  caching_allocator& allocator() const { return state_->allocator; }
  allocator_stats memory_stats() const { return state_->allocator.stats(); }
  blas_handle& blas() const { return state_->blas; }
  // The attention plans (cuDNN handle and graphs, created on first use).
  attention_plans& attention() const {
    if (!state_->attention) state_->attention = std::make_shared<attention_plans>(state_->device, &state_->allocator);
    return *state_->attention;
  }

  // Installs the backend on the creating thread and creates the attention plans (the cuDNN handle)
  // now, before any collective: creating them later, in the middle of a step, makes CUDA calls that
  // wait for the whole device, which with one process driving several GPUs can wait on another GPU's
  // collective that waits on this thread.
  void start() const {
    install();
    (void)attention();
    state_->allocator.prepare_staging();
    state_->prepare_readback();
  }

  // Makes this backend's device current on the calling thread and installs its allocator as the
  // thread's current_device_resource() (a rank that runs on several threads calls it on each).
  void install() const {
    set_device(state_->device);
    current_device_resource() = &state_->allocator;
  }

  // --- memory ------------------------------------------------------------------------------------
  template <class X>
  void fill(X* x, index_t n, double value) const { kernels::fill<X>(x, n, value, stream()); }
  template <class X>
  void copy(const X* src, index_t n, X* dst) const {
    if (n > 0) STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes_of<X>(n), cudaMemcpyDeviceToDevice, stream()));
  }
  template <class From, class To>
  void convert(const From* src, index_t n, To* dst) const { kernels::convert<From, To>(src, n, dst, stream()); }
  template <class X>
  void add(const X* a, const X* b, index_t n, X* out) const { kernels::add<X>(a, b, n, out, stream()); }
  template <class X>
  void scale(X* x, index_t n, double factor) const { kernels::scale<X>(x, n, factor, stream()); }
  template <class X>
  void scale_by(X* x, index_t n, const double* factor) const { kernels::scale_by<X>(x, n, factor, stream()); }
  template <class X>
  void transpose(const X* in, index_t rows, index_t cols, X* out) const {
    kernels::transpose<X>(in, rows, cols, out, stream());
  }
  template <class X>
  void copy_to_host(const X* src, index_t n, X* host) const {
    if (n <= 0) return;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes_of<X>(n), cudaMemcpyDeviceToHost, stream()));
    synchronize();
  }
  // A copy to the host that does not wait: it is enqueued (into pinned memory) and `host` is written
  // by the next wait_host_copies(), which waits for the copies started since the last one and for
  // nothing enqueued after them. So the host can read a few values (token counts) while the GPU goes
  // on with work enqueued after the copy. `host` must stay valid until then. A copy larger than the
  // pinned area (64 KiB) is made at once, as copy_to_host.
  template <class X>
  void copy_to_host_start(const X* src, index_t n, X* host) const {
    if (n <= 0) return;
    state& s = *state_;
    const std::size_t bytes = bytes_of<X>(n);
    std::size_t offset = (s.readback_used + 15) / 16 * 16;
    if (offset + bytes > state::kReadbackBytes) {
      wait_host_copies();
      offset = 0;
    }
    if (bytes > state::kReadbackBytes) return copy_to_host(src, n, host);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(s.readback) + offset, src, bytes, cudaMemcpyDeviceToHost, stream()));
    STRATA_CUDA_CHECK(cudaEventRecord(s.readback_done, stream()));  // after every copy started so far
    s.readbacks.push_back({offset, bytes, host});
    s.readback_used = offset + bytes;
  }
  void wait_host_copies() const {
    state& s = *state_;
    if (s.readbacks.empty()) return;
    STRATA_CUDA_CHECK(cudaEventSynchronize(s.readback_done));
    for (const auto& c : s.readbacks) std::memcpy(c.host, static_cast<const char*>(s.readback) + c.offset, c.bytes);
    s.readbacks.clear();
    s.readback_used = 0;
  }
  template <class X>
  void copy_from_host(const X* host, index_t n, X* dst) const {
    if (n > 0) state_->allocator.copy(dst, host, bytes_of<X>(n), copy_kind::host_to_device);
  }
  void synchronize() const { STRATA_CUDA_CHECK(cudaStreamSynchronize(stream())); }

  // --- GEMM ----------------------------------------------------------------------------------------
  // SMs left to communication kernels beside GEMMs (0, the default: none). The layers mark the GEMMs
  // that run while a collective of theirs is in flight on the communication stream
  // (gemms_beside_communication); those are planned for the device's SMs less this margin
  // (blas_handle::set_sm_target). Without it a GEMM whose grid fills every SM either waits for the
  // collective's blocks to leave or holds the SMs the collective waits for. Returns the previous margin.
  int set_communication_sm_margin(int sms) const {
    if (sms < 0 || sms >= state_->sm_count)
      fail<ConfigError>("cuda::backend: the SM margin for communication must be from 0 to ", state_->sm_count - 1,
                        " (device ", state_->device, " has ", state_->sm_count, " SMs), got ", sms);
    const int previous = std::exchange(state_->sm_margin, sms);
    state_->apply_sm_target();
    return previous;
  }
  int communication_sm_margin() const { return state_->sm_margin; }
  int sm_count() const { return state_->sm_count; }
  // Marks the GEMMs enqueued from now on as running beside a collective (on) or not (off); returns the
  // previous mark. A no-op while the margin is 0.
  bool gemms_beside_communication(bool on) const {
    const bool previous = std::exchange(state_->beside_communication, on);
    state_->apply_sm_target();
    return previous;
  }

  // FP8 (kernels/fp8.cuh, fp8_gemm.hpp; the twins of backend/cpu/fp8.hpp): casts with amax, the
  // scaled GEMM through cuBLASLt, the scaling update.
  template <class T>
  void fp8_amax(const T* x, index_t n, float* amax) const { kernels::fp8_amax<T>(x, n, amax, stream()); }
  template <class T>
  void fp8_cast(const T* x, index_t n, Fp8Format format, const float* scale, std::uint8_t* out, float* amax) const {
    kernels::fp8_cast<T>(x, n, format, scale, out, amax, stream());
  }
  template <class T>
  void fp8_cast_transpose(const T* x, index_t rows, index_t cols, Fp8Format format, const float* scale, std::uint8_t* out,
                          std::uint8_t* out_t, float* amax) const {
    kernels::fp8_cast_transpose<T>(x, rows, cols, format, scale, out, out_t, amax, stream());
  }
  // codes [rows, cols] -> [cols, rows]
  void fp8_transpose(const std::uint8_t* in, index_t rows, index_t cols, std::uint8_t* out) const {
    kernels::fp8_transpose(in, rows, cols, out, stream());
  }
  // fp8_cast_transpose of x, gelu(x) or x gelu'(pre) (Fp8Producer), with their column sums (written)
  // when column_sums is given, and (the backward producers) the forward activation's codes^T when
  // activation.codes is set.
  template <class T, class A = accumulate_t<T>>
  void fp8_cast_transpose_fused(Fp8Producer producer, const T* x, const T* pre, index_t rows, index_t cols, Fp8Format format,
                                const float* scale, std::uint8_t* out, std::uint8_t* out_t, float* amax, A* column_sums,
                                const Fp8Output& activation = {}) const {
    std::optional<scratch<A>> partials;  // the column sums' per-tile partials, when asked for
    if (column_sums) partials.emplace(state_->allocator, static_cast<std::size_t>(kernels::fp8_tile_rows(rows) * cols));
    kernels::fp8_cast_transpose_fused<T, A>(producer, x, pre, rows, cols, format, scale, out, out_t, amax, column_sums,
                                            partials ? partials->data() : nullptr, activation, stream());
  }
  template <class C>
  void fp8_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, C* c, bool accumulate,
                const C* bias = nullptr, Fp8Accumulation accumulation = Fp8Accumulation::split) const {
    if constexpr (std::is_same_v<C, double>) {
      fail<ConfigError>("cuda::backend::fp8_gemm: FP8 GEMMs have no double output on the GPU; train in bf16 or float with FP8");
    } else {
      // the bias in cuBLASLt's epilogue where it has an algorithm with it, else a kernel after
      if (!cuda::fp8_gemm<C>(state_->blas, stream(), ta, tb, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, c, accumulate, bias,
                             accumulation))
        kernels::bias_add<C>(c, bias, m, n, stream());
    }
  }
  // TN, out = product (+ bias) + addend in one cuBLASLt GEMM (beta = 1 with the addend as its C
  // operand; the residual add in the epilogue of a layer's last FP8 GEMM; optional in the backend
  // contract, has_fp8_gemm_add). out may be the addend.
  template <class C>
  void fp8_gemm_add(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                    const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, const C* bias, const C* addend, C* out,
                    Fp8Accumulation accumulation = Fp8Accumulation::split) const {
    if constexpr (std::is_same_v<C, double>) {
      fail<ConfigError>("cuda::backend::fp8_gemm_add: FP8 GEMMs have no double output on the GPU");
    } else if (!cuda::fp8_gemm_add<C>(state_->blas, stream(), m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, bias, addend, out,
                                      accumulation)) {
      kernels::bias_add<C>(out, bias, m, n, stream());
    }
  }
  // TN (the forward's layout): pre = product (+ bias), out = gelu(pre): the FP8 GEMM and the GELU
  // kernel, or with STRATA_FP8_GELU_EPILOGUE=1 one cuBLASLt GEMM with the GELU epilogue where it has
  // an algorithm (slower on an H100: fp8_gelu_epilogues).
  template <class C>
  void fp8_gemm_gelu(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                     const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, const C* bias, C* pre, C* out,
                     Fp8Accumulation accumulation = Fp8Accumulation::split) const {
    if constexpr (std::is_same_v<C, double>) {
      fail<ConfigError>("cuda::backend::fp8_gemm_gelu: FP8 GEMMs have no double output on the GPU");
    } else if (!cuda::fp8_gemm_gelu<C>(state_->blas, stream(), m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, bias, pre, out,
                                       accumulation)) {
      fp8_gemm<C>(false, true, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, pre, false, bias, accumulation);
      kernels::gelu_forward<C>(pre, m * n, out, stream());
    }
  }
  // TN: out = product * gelu'(pre): the FP8 GEMM and the GELU backward kernel, or with
  // STRATA_FP8_GELU_EPILOGUE=1 one cuBLASLt GEMM with the DGELU epilogue where it can.
  template <class C>
  void fp8_gemm_gelu_backward(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                              const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, const C* pre, C* out) const {
    if constexpr (std::is_same_v<C, double>) {
      fail<ConfigError>("cuda::backend::fp8_gemm_gelu_backward: FP8 GEMMs have no double output on the GPU");
    } else if (!cuda::fp8_gemm_dgelu<C>(state_->blas, stream(), m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, pre, out)) {
      fp8_gemm<C>(false, true, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, out, false);
      kernels::gelu_backward<C>(out, pre, m * n, out, stream());
    }
  }
  void fp8_update_scale(float* row, float max, const Fp8UpdateArgs& args) const {
    kernels::fp8_update_scale(row, max, args, stream());
  }
  // Every role's row of one state (rows [kFp8Roles, stride]) in one launch.
  void fp8_update_scales(float* rows, index_t count, index_t stride, const Fp8RoleMaxes& maxes, const Fp8UpdateArgs& args,
                         float* aligned) const {
    kernels::fp8_update_scales(rows, count, stride, maxes, args, aligned, stream());
  }
  // The blockwise recipe (the twins of cpu::fp8_cast_blocks / _tiles / fp8_gemm_blocks). The GEMM
  // runs as cuBLASLt's block-scaled FP8 GEMM (fp8_gemm_blocks_cublaslt) where it can: blocks of 128,
  // k whole blocks, a shape cuBLASLt has an algorithm for. Elsewhere both operands are decoded to
  // bf16 (exact: the scales are powers of two) for the bf16 GEMM, correct but slower.
  template <class T>
  void fp8_cast_blocks(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                       float* q_scale_inv, std::uint8_t* qt, float* qt_scale_inv) const {
    kernels::fp8_cast_blocks<T>(x, rows, cols, format, block, q, q_scale_inv, qt, qt_scale_inv, stream());
  }
  template <class T>
  void fp8_cast_tiles(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                      std::uint8_t* qt, float* scale_inv, float* scale_inv_t) const {
    kernels::fp8_cast_tiles<T>(x, rows, cols, format, block, q, qt, scale_inv, scale_inv_t, stream());
  }
  template <class C>
  void fp8_gemm_blocks(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                       bool a_tiles, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, bool b_tiles,
                       index_t block, C* c, bool accumulate) const {
    if constexpr (!std::is_same_v<C, bf16> && !std::is_same_v<C, float>) {
      fail<ConfigError>("cuda::backend::fp8_gemm_blocks: block-scaled FP8 GEMMs write bf16 or float on the GPU; train in bf16 "
                        "or float with --fp8-recipe blockwise");
    } else {
      if (block == 128 && cuda::fp8_gemm_blocks_cublaslt<C>(state_->blas, stream(), m, n, k, a, fa, a_scale_inv, a_tiles, b, fb,
                                                            b_scale_inv, b_tiles, c, accumulate))
        return;
      auto da = Tensor<bf16, space>::empty(Shape{m, k}), db = Tensor<bf16, space>::empty(Shape{n, k});
      kernels::fp8_decode_blocks<bf16>(a, m, k, fa, a_scale_inv, a_tiles, block, da.data(), stream());
      kernels::fp8_decode_blocks<bf16>(b, n, k, fb, b_scale_inv, b_tiles, block, db.data(), stream());
      cuda::gemm<bf16, C>(state_->blas, stream(), false, true, m, n, k, da.data(), db.data(), c, accumulate, nullptr);
    }
  }

  // C[m,n] = op(A) op(B) (+= when accumulate) (+ bias[n] on every row, only when !accumulate).
  template <class T, class C = T>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, C* c, bool accumulate,
            const T* bias = nullptr) const {
    const bool bias_done = cuda::gemm<T, C>(state_->blas, stream(), ta, tb, m, n, k, a, b, c, accumulate, bias);
    if (!bias_done) {
      if constexpr (std::is_same_v<T, C>) kernels::bias_add<T>(c, bias, m, n, stream());
    }
  }

  // out = addend + op(A) op(B) (+ bias[n]) in one GEMM (the residual add in the epilogue of the
  // layer's last GEMM; optional in the backend contract, has_gemm_add).
  template <class T>
  void gemm_add(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, const T* bias, const T* addend,
                T* out) const {
    if (!cuda::gemm_add<T>(state_->blas, stream(), ta, tb, m, n, k, a, b, bias, addend, out))
      kernels::bias_add<T>(out, bias, m, n, stream());
  }

  // pre = op(A) op(B) (+ bias[n]), out = gelu(pre), in one cuBLASLt GEMM (GELU_AUX epilogue) where it
  // can run, else the GEMM and the GELU kernel.
  template <class T>
  void gemm_gelu(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, const T* bias, T* pre,
                 T* out) const {
    if (cuda::gemm_gelu<T>(state_->blas, stream(), ta, tb, m, n, k, a, b, bias, pre, out)) return;
    gemm<T>(ta, tb, m, n, k, a, b, pre, false, bias);
    kernels::gelu_forward<T>(pre, m * n, out, stream());
  }
  // out = (op(A) op(B)) * gelu'(pre), in one GEMM (DGELU epilogue) where it can run.
  template <class T>
  void gemm_gelu_backward(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, const T* pre,
                          T* out) const {
    if (cuda::gemm_dgelu<T>(state_->blas, stream(), ta, tb, m, n, k, a, b, pre, out)) return;
    gemm<T>(ta, tb, m, n, k, a, b, out, false);
    kernels::gelu_backward<T>(out, pre, m * n, out, stream());  // element-wise, in place
  }

  // --- bias, columns, heads ----------------------------------------------------------------------
  template <class T>
  void bias_add(T* y, const T* bias, index_t rows, index_t cols) const {
    kernels::bias_add<T>(y, bias, rows, cols, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias) const {
    if (rows <= 0 || cols <= 0) return;
    scratch<A> workspace(state_->allocator, static_cast<std::size_t>(kernels::column_sum_chunks(rows) * cols));
    kernels::bias_grad<T, A>(dy, rows, cols, dbias, workspace.data(), stream(), state_->tickets.data(), state::kTickets);
  }
  template <class T>
  void slice_columns(const T* in, index_t rows, index_t cols, index_t begin, index_t width, T* out) const {
    kernels::slice_columns<T>(in, rows, cols, begin, width, out, stream());
  }
  template <class T>
  void copy_columns(const T* in, index_t in_cols, index_t rows, index_t width, T* out, index_t out_cols) const {
    kernels::copy_columns<T>(in, in_cols, rows, width, out, out_cols, stream());
  }
  template <class T>
  void unstack_columns(const T* stacked, index_t parts, index_t rows, index_t width, T* out) const {
    kernels::unstack_columns<T>(stacked, parts, rows, width, out, stream());
  }
  template <class T>
  void qkv_split(const T* qkv, index_t rows, index_t groups, index_t heads_per_group, index_t d, T* q, T* k,
                 T* v) const {
    kernels::qkv_split<T>(qkv, rows, groups, heads_per_group, d, q, k, v, stream());
  }
  template <class T>
  void qkv_merge(const T* dq, const T* dk, const T* dv, index_t rows, index_t groups, index_t heads_per_group,
                 index_t d, T* dqkv) const {
    kernels::qkv_merge<T>(dq, dk, dv, rows, groups, heads_per_group, d, dqkv, stream());
  }

  // --- norms (optionally fused with the residual add: kernels/norm.cuh) ---------------------------
  template <class T, class A = accumulate_t<T>>
  void layernorm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean,
                         A* rstd, const T* residual = nullptr, T* sum = nullptr, A weight_offset = A(0)) const {
    kernels::layernorm_forward<T, A>(x, g, b, rows, h, eps, y, mean, rstd, residual, sum, stream(), weight_offset);
  }
  template <class T, class A = accumulate_t<T>>
  void layernorm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows, index_t h,
                          T* dx, A* dg, A* db, const T* dresidual = nullptr, bool accumulate = false,
                          A* dresidual_sums = nullptr, A weight_offset = A(0)) const {
    const index_t arrays = dresidual && dresidual_sums ? 3 : 2;
    scratch<A> workspace(state_->allocator, static_cast<std::size_t>(arrays * kernels::norm_backward_blocks(rows) * h));
    kernels::layernorm_backward<T, A>(dy, x, g, mean, rstd, rows, h, dx, dg, db, dresidual, workspace.data(), accumulate,
                                      stream(), dresidual_sums, weight_offset);
  }
  template <class T, class A = accumulate_t<T>>
  void rmsnorm_forward(const T* x, const T* g, index_t rows, index_t h, A eps, T* y, A* rstd,
                       const T* residual = nullptr, T* sum = nullptr, A weight_offset = A(0)) const {
    kernels::rmsnorm_forward<T, A>(x, g, rows, h, eps, y, rstd, residual, sum, stream(), weight_offset);
  }
  // The forwards with the output written as FP8 codes (Fp8Output) instead of in T, in the norm's own
  // pass: the codes and amax fp8_cast of the T output would make (kernels/norm.cuh).
  template <class T, class A = accumulate_t<T>>
  void layernorm_forward_fp8(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, A* mean, A* rstd,
                             const T* residual, T* sum, A weight_offset, Fp8Output out) const {
    kernels::layernorm_forward<T, A>(x, g, b, rows, h, eps, nullptr, mean, rstd, residual, sum, stream(), weight_offset, out);
  }
  template <class T, class A = accumulate_t<T>>
  void rmsnorm_forward_fp8(const T* x, const T* g, index_t rows, index_t h, A eps, A* rstd, const T* residual, T* sum,
                           A weight_offset, Fp8Output out) const {
    kernels::rmsnorm_forward<T, A>(x, g, rows, h, eps, nullptr, rstd, residual, sum, stream(), weight_offset, out);
  }
  template <class T, class A = accumulate_t<T>>
  void rmsnorm_backward(const T* dy, const T* x, const T* g, const A* rstd, index_t rows, index_t h, T* dx,
                        A* dg, const T* dresidual = nullptr, bool accumulate = false, A weight_offset = A(0)) const {
    scratch<A> workspace(state_->allocator, static_cast<std::size_t>(kernels::norm_backward_blocks(rows) * h));
    kernels::rmsnorm_backward<T, A>(dy, x, g, rstd, rows, h, dx, dg, dresidual, workspace.data(), accumulate, stream(),
                                    weight_offset);
  }

  // --- activations and RoPE ------------------------------------------------------------------------
  template <class T>
  void gelu_forward(const T* x, index_t n, T* y) const { kernels::gelu_forward<T>(x, n, y, stream()); }
  template <class T>
  void gelu_backward(const T* dy, const T* x, index_t n, T* dx) const {
    kernels::gelu_backward<T>(dy, x, n, dx, stream());
  }
  template <class T>
  void swiglu_forward(const T* gu, index_t rows, index_t f, T* y) const {
    kernels::swiglu_forward<T>(gu, rows, f, y, stream());
  }
  template <class T>
  void swiglu_backward(const T* dy, const T* gu, index_t rows, index_t f, T* dgu) const {
    kernels::swiglu_backward<T>(dy, gu, rows, f, dgu, stream());
  }
  template <class T>
  void rope_forward(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset,
                    RopeOptions options = {}) const {
    kernels::rope<T>(x, s, n, d, base, position_offset, false, stream(), options);
  }
  template <class T>
  void rope_backward(T* dx, index_t s, index_t n, index_t d, double base, index_t position_offset,
                     RopeOptions options = {}) const {
    kernels::rope<T>(dx, s, n, d, base, position_offset, true, stream(), options);
  }
  // qkv_split of the packed projection [s * b rows] with rope_forward on q and k in the same pass, and
  // qkv_merge with rope_backward on dq and dk (dq, dk unchanged): kernels/rope.cuh's qkv_rope, whose
  // kernel only reads the side it is given as input.
  template <class T>
  void qkv_split_rope(const T* qkv, index_t s, index_t b, index_t groups, index_t heads_per_group, index_t d, T* q, T* k,
                      T* v, double base, index_t position_offset, RopeOptions options = {}) const {
    kernels::qkv_rope<T>(const_cast<T*>(qkv), q, k, v, s, b, groups, heads_per_group, d, base, position_offset, false,
                         stream(), options);
  }
  template <class T>
  void qkv_merge_rope(const T* dq, const T* dk, const T* dv, index_t s, index_t b, index_t groups, index_t heads_per_group,
                      index_t d, T* dqkv, double base, index_t position_offset, RopeOptions options = {}) const {
    kernels::qkv_rope<T>(dqkv, const_cast<T*>(dq), const_cast<T*>(dk), const_cast<T*>(dv), s, b, groups, heads_per_group, d,
                         base, position_offset, true, stream(), options);
  }
  // qkv_merge_rope with the packed gradient written as FP8 codes (Fp8Output) instead of in T, in the
  // same pass: the codes and amax fp8_cast of the packed gradient would make.
  template <class T>
  void qkv_merge_rope_fp8(const T* dq, const T* dk, const T* dv, index_t s, index_t b, index_t groups,
                          index_t heads_per_group, index_t d, double base, index_t position_offset, RopeOptions options,
                          Fp8Output out) const {
    kernels::qkv_rope<T>(nullptr, const_cast<T*>(dq), const_cast<T*>(dk), const_cast<T*>(dv), s, b, groups, heads_per_group,
                         d, base, position_offset, true, stream(), options, out);
  }
  template <class T>
  void glu_forward(const T* gu, index_t rows, index_t f, GluActivation activation, T* y) const {
    kernels::glu_forward<T>(gu, rows, f, activation, y, stream());
  }
  template <class T>
  void sigmoid_gate_forward(const T* x, const T* z, index_t rows, index_t cols, T* y) const {
    kernels::sigmoid_gate_forward<T>(x, z, rows, cols, y, stream());
  }
  template <class T>
  void sigmoid_gate_backward(const T* dy, const T* x, const T* z, index_t rows, index_t cols, T* dx, T* dz) const {
    kernels::sigmoid_gate_backward<T>(dy, x, z, rows, cols, dx, dz, stream());
  }
  template <class T>
  void glu_backward(const T* dy, const T* gu, index_t rows, index_t f, GluActivation activation, T* dgu) const {
    kernels::glu_backward<T>(dy, gu, rows, f, activation, dgu, stream());
  }
  template <class T>
  void squared_relu_forward(const T* x, index_t n, T* y) const {
    kernels::squared_relu_forward<T>(x, n, y, stream());
  }
  template <class T>
  void squared_relu_backward(const T* dy, const T* x, index_t n, T* dx) const {
    kernels::squared_relu_backward<T>(dy, x, n, dx, stream());
  }

  // --- attention (cuDNN SDPA or the flash kernels through backend/cuda/attention.hpp) ---------------
  template <class T, class A = accumulate_t<T>>
  void attention_forward(const T* q, const T* k, const T* v, index_t s, index_t b, index_t heads, index_t groups,
                         index_t d, A scale, T* out, A* lse, AttentionOptions options = {}) const {
    cuda::attention_forward<T>(attention(), stream(), q, k, v, s, b, heads, groups, d, scale, out, lse, options);
  }
  template <class T, class A = accumulate_t<T>>
  void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const A* lse, index_t s,
                          index_t b, index_t heads, index_t groups, index_t d, A scale, T* dq, T* dk, T* dv,
                          AttentionOptions options = {}) const {
    cuda::attention_backward<T>(attention(), stream(), dout, q, k, v, out, lse, s, b, heads, groups, d, scale, dq, dk,
                                dv, options);
  }
  // Context parallelism's merge of the attention of the same queries over another block of keys
  // (kernels/attention_merge.cuh): out, lse updated in place.
  template <class T, class A = accumulate_t<T>>
  void attention_merge(T* out, A* lse, const T* block_out, const A* block_lse, index_t s, index_t b, index_t heads,
                       index_t d) const {
    kernels::attention_merge<T>(out, lse, block_out, block_lse, s, b, heads, d, stream());
  }
  // Builds now the cuDNN plans the calls of this shape will use (forward, and backward when asked).
  // Building one compiles and loads GPU code, which waits for every GPU of the process: with one
  // process driving several GPUs that must happen before the first collective, never while a peer
  // GPU may be inside one (docs/DEVICE.md). A no-op where the calls run on the flash kernels.
  template <class T>
  void prepare_attention(index_t s, index_t b, index_t heads, index_t groups, index_t d, bool backward,
                         AttentionOptions options = {}) const {
    cuda::prepare_attention<T>(attention(), s, b, heads, groups, d, backward, options);
  }

  // --- embeddings ----------------------------------------------------------------------------------
  template <class T>
  void embedding_forward(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin, index_t rows_local,
                         index_t h, T* out) const {
    kernels::embedding_forward<T>(tokens, n, weight, row_begin, rows_local, h, out, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void embedding_backward(const std::int32_t* tokens, index_t n, const T* dout, index_t row_begin, index_t rows_local,
                          index_t h, A* dweight) const {
    if (n <= 0 || h <= 0 || rows_local <= 0) return;
    const std::size_t bytes = kernels::embedding_backward_workspace(n, rows_local);
    scratch<unsigned char> workspace(state_->allocator, bytes);
    kernels::embedding_backward<T, A>(tokens, n, dout, row_begin, rows_local, h, dweight, workspace.data(), bytes,
                                      stream());
  }
  template <class T>
  void position_add(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first) const {
    kernels::position_add<T>(x, weight, s, b, h, first, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void position_grad(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight) const {
    kernels::position_grad<T, A>(dy, s, b, h, first, dweight, stream());
  }

  // --- cross-entropy -------------------------------------------------------------------------------
  template <class T, class A = accumulate_t<T>>
  void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max) const {
    kernels::cross_entropy_max<T, A>(logits, rows, local, used, row_max, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                          const std::int32_t* labels, index_t begin, A* sums) const {
    kernels::cross_entropy_sums<T, A>(logits, rows, local, used, row_max, labels, begin, sums, stream());
  }
  template <class A>
  void cross_entropy_loss(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing, A* loss,
                          A* lse) const {
    kernels::cross_entropy_loss<A>(sums, row_max, rows, vocab, smoothing, loss, lse, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin, index_t rows,
                              index_t local, index_t used, index_t vocab, A smoothing, const A* dloss,
                              T* dlogits) const {
    kernels::cross_entropy_backward<T, A>(logits, lse, labels, begin, rows, local, used, vocab, smoothing, dloss,
                                          dlogits, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void cross_entropy_forward_backward(T* logits, const std::int32_t* labels, index_t rows, index_t local,
                                      index_t used, index_t vocab, A smoothing, const A* dloss, A* loss) const {
    kernels::cross_entropy_forward_backward<T, A>(logits, labels, rows, local, used, vocab, smoothing, dloss, loss,
                                                  stream());
  }
  template <class A>
  void masked_loss_sum(const A* loss, const A* mask, index_t n, double* out) const {
    kernels::masked_loss_sum<A>(loss, mask, n, out, stream());
  }

  // --- randomness ----------------------------------------------------------------------------------
  // Map: GlobalIndexMap / ShardIndexMap (anything trivially copyable with a host-device operator()).
  template <class T, class Map>
  void dropout_forward(T* x, index_t n, Map map, double p, std::uint64_t key) const {
    kernels::dropout<T, Map>(x, n, map, p, key, stream());
  }
  template <class T, class Map>
  void dropout_backward(T* dy, index_t n, Map map, double p, std::uint64_t key) const {
    kernels::dropout<T, Map>(dy, n, map, p, key, stream());
  }
  template <class T, class Map>
  void init_normal(T* x, index_t n, Map map, std::uint64_t key, double stddev) const {
    kernels::init_normal<T, Map>(x, n, map, key, stddev, stream());
  }

  // --- optimizer -----------------------------------------------------------------------------------
  template <class T, class Step, class A = accumulate_t<T>>
  void adamw_step(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n, const Step& step) const {
    kernels::adamw_step<T, Step, A>(main, exp_avg, exp_avg_sq, grad, value, n, step, stream());
  }
  // The step on many parameters in a few launches; each tensor decays by step.decay when its
  // weight_decay is set, else not at all.
  template <class T, class Step, class A = accumulate_t<T>>
  void adamw_step_many(std::span<const kernels::adamw_tensor<T, A>> tensors, const Step& step) const {
    kernels::adamw_step_many<T, Step, A>(tensors.data(), tensors.size(), step, stream());
  }
  template <class X>
  void sum_of_squares(const X* x, index_t n, double* accumulator) const {
    if (n <= 0) return;
    scratch<double> workspace(state_->allocator, static_cast<std::size_t>(kernels::reduce_blocks(n)));
    kernels::sum_of_squares<X>(x, n, accumulator, workspace.data(), stream());
  }
  void clip_factor(const double* square_sum, double max_norm, double* norm, double* factor) const {
    kernels::clip_factor(square_sum, max_norm, norm, factor, stream());
  }
  // sum_of_squares, scale_by and fill on many tensors in a few launches (backend/tensor_ref.hpp): the
  // same bits as the one-tensor calls in list order.
  template <class X>
  void sum_of_squares_many(std::span<const SquaresTensor<X>> tensors, double* accumulator) const {
    const std::size_t doubles = kernels::sum_of_squares_many_workspace<X>(tensors.data(), tensors.size());
    if (doubles == 0) return;
    scratch<double> workspace(state_->allocator, doubles);
    kernels::sum_of_squares_many<X>(tensors.data(), tensors.size(), accumulator, workspace.data(), stream());
  }
  template <class X>
  void scale_by_many(std::span<const TensorRef<X>> tensors, const double* factor) const {
    kernels::scale_by_many<X>(tensors.data(), tensors.size(), factor, stream());
  }
  template <class X>
  void fill_many(std::span<const TensorRef<X>> tensors, double value) const {
    kernels::fill_many<X>(tensors.data(), tensors.size(), value, stream());
  }

  // --- mixture of experts (kernels/moe.cuh; the math in backend/cpu/moe.hpp) ----------------------
  template <class A>
  void moe_router_forward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                          const A* expert_bias, std::int32_t* indices, A* weights, A* aux_scores, A* logsumexp) const {
    kernels::moe_router_forward<A>(logits, tokens, experts, k, routing, expert_bias, indices, weights, aux_scores, logsumexp,
                                   stream());
  }
  template <class A>
  void moe_router_backward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                           const std::int32_t* indices, const A* dweights, const A* aux_coefficients, index_t groups,
                           double aux_scale, double z_scale, A* dlogits) const {
    kernels::moe_router_backward<A>(logits, tokens, experts, k, routing, indices, dweights, aux_coefficients, groups,
                                    aux_scale, z_scale, dlogits, stream());
  }
  template <class A>
  void moe_drop(const std::int32_t* indices, const A* weights, index_t assignments, index_t capacity, bool by_position,
                std::int32_t* routed) const {
    kernels::moe_drop<A>(indices, weights, assignments, capacity, by_position, routed, stream());
  }
  template <class C>
  void moe_count(const std::int32_t* routed, index_t assignments, index_t k, index_t groups, index_t experts, C* counts,
                 bool accumulate) const {
    kernels::moe_count<C>(routed, assignments, k, groups, experts, counts, accumulate, stream());
  }
  void moe_sort_by_expert(const std::int32_t* routed, index_t assignments, index_t k, index_t first_expert, index_t experts,
                          index_t capacity, std::int32_t* slot_of, std::int32_t* token_of_slot, index_t slots) const {
    kernels::moe_sort_by_expert(routed, assignments, k, first_expert, experts, capacity, slot_of, token_of_slot, slots,
                                stream());
  }
  // The row maps of an exchange padded to capacity, compacted (backend/cpu/moe.hpp): one small kernel.
  void moe_chunk_maps(const std::int32_t* chunk_counts, index_t chunks, index_t local, index_t capacity, std::int32_t* to_expert,
                      std::int32_t* to_chunk, std::int32_t* expert_counts) const {
    scratch<std::int32_t> start(state_->allocator, static_cast<std::size_t>(std::max<index_t>(1, chunks * local)));
    kernels::moe_chunk_maps(chunk_counts, chunks, local, capacity, start.data(), to_expert, to_chunk, expert_counts, stream());
  }
  template <class T>
  void moe_gather_rows(const T* in, index_t cols, const std::int32_t* rows, index_t n, T* out) const {
    kernels::moe_gather_rows<T>(in, cols, rows, n, out, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void moe_combine(const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k, index_t cols,
                   T* out) const {
    kernels::moe_combine<T, A>(in, slot, weights, tokens, k, cols, out, stream());
  }
  template <class T, class A = accumulate_t<T>>
  void moe_combine_backward(const T* dy, const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k,
                            index_t cols, index_t slots, T* d_in, A* dweights) const {
    kernels::moe_combine_backward<T, A>(dy, in, slot, weights, tokens, k, cols, slots, d_in, dweights, stream());
  }
  template <class A>
  void moe_aux_loss(const A* prob_sums, const A* counts, index_t n, double factor, double* loss, A* coefficients) const {
    kernels::moe_aux_loss<A>(prob_sums, counts, n, factor, loss, coefficients, stream());
  }
  template <class A>
  void moe_expert_bias_update(const A* counts, index_t experts, double rate, A* bias) const {
    kernels::moe_expert_bias_update<A>(counts, experts, rate, bias, stream());
  }
  // C_g (+)= op(A_g) op(B_g) for each group (host arrays of sizes and device pointers); an empty inner
  // dimension writes zeros (or adds nothing). One cuBLAS grouped GEMM where it runs, else one cuBLASLt
  // GEMM per group: the fp32 output of 16-bit inputs (the weight gradients) and misaligned groups
  // stay a loop (grouped_gemm.hpp lists the cases).
  template <class T, class C = T>
  void grouped_gemm(bool ta, bool tb, index_t groups, const index_t* m, const index_t* n, const index_t* k,
                    const T* const* a, const T* const* b, C* const* c, bool accumulate) const {
    (void)cuda::grouped_gemm<T, C>(state_->blas, state_->grouped_blas, state_->allocator, stream(), ta, tb, groups, m, n,
                                   k, a, b, c, accumulate);
  }
  // The experts' grouped GEMMs with the group sizes in device memory (cpu/moe.hpp states them): no
  // wait for the host with bf16 on Hopper and CUTLASS (grouped_gemm_sm90.hpp), else a read of the
  // counts and grouped_gemm.
  // Whether the two run without reading the counts on the host for these sizes (bf16, multiples of 8,
  // the Hopper kernel built and on an sm_90 GPU). When not, the experts read the counts once per
  // layer and call grouped_gemm instead of waiting in every call.
  template <class T>
  bool grouped_gemm_counts_on_device(index_t n, index_t k) const {
    return std::is_same_v<T, bf16> && n % 8 == 0 && k % 8 == 0 && cuda::sm90::grouped_gemm_ready();
  }
  template <class T>
  void grouped_gemm_rows(bool tb, index_t groups, const std::int32_t* counts, index_t rows, index_t n, index_t k,
                         const T* a, const T* const* b, T* c) const {
    cuda::grouped_gemm_rows<T>(state_->blas, state_->grouped_blas, state_->allocator, stream(), tb, groups, counts, rows,
                               n, k, a, b, c);
  }
  template <class T, class C = T>
  void grouped_gemm_weights(index_t groups, const std::int32_t* counts, index_t rows, index_t m, index_t n, const T* a,
                            const T* b, C* const* c, bool accumulate) const {
    cuda::grouped_gemm_weights<T, C>(state_->blas, state_->grouped_blas, state_->allocator, stream(), groups, counts, rows,
                                     m, n, a, b, c, accumulate);
  }

 private:
  struct state {
    int device;
    cuda::stream compute, communication;
    cudaStream_t compute_stream;  // `compute`, or the stream the backend was given
    caching_allocator allocator;
    blas_handle blas;
    cublas_handle grouped_blas;  // the grouped GEMM's (grouped_gemm.hpp)
    std::shared_ptr<attention_plans> attention;
    // Counters of the one-kernel column sums (kernels/bias.cuh), one per column tile: zero between
    // kernels, used only on the compute stream.
    device_buffer<unsigned> tickets;
    int sm_count = 0;
    int sm_margin = 0;                  // set_communication_sm_margin
    bool beside_communication = false;  // gemms_beside_communication

    // The GEMMs' SM target that the margin and the mark give: SMs less the margin beside a
    // collective, else every SM (0).
    void apply_sm_target() {
      (void)blas.set_sm_target(beside_communication && sm_margin > 0 ? sm_count - sm_margin : 0);
    }

    static constexpr index_t kTickets = 4096;

    // copy_to_host_start / wait_host_copies: the pinned area the started copies land in, the event
    // recorded after the latest, and where each goes on the host.
    struct readback_copy {
      std::size_t offset, bytes;
      void* host;
    };
    static constexpr std::size_t kReadbackBytes = std::size_t{64} << 10;
    void* readback = nullptr;
    cudaEvent_t readback_done = nullptr;
    std::size_t readback_used = 0;
    std::vector<readback_copy> readbacks;
    void prepare_readback() {  // at start: cudaHostAlloc in a step could wait on the device
      if (readback != nullptr) return;
      STRATA_CUDA_CHECK(cudaHostAlloc(&readback, kReadbackBytes, cudaHostAllocDefault));
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&readback_done, cudaEventDisableTiming));
    }

    state(int ordinal, cudaStream_t given)
        : device(checked(ordinal)),
          compute(),
          communication(),
          compute_stream(given != nullptr ? given : compute.get()),
          allocator(ordinal, compute_stream),
          blas(),
          grouped_blas(),
          tickets(static_cast<std::size_t>(kTickets)) {
      tickets.zero(compute_stream);
      STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      (void)cudaSetDevice(device);
      (void)cudaStreamSynchronize(compute_stream);
      (void)cudaStreamSynchronize(communication.get());
      if (current_device_resource() == &allocator) current_device_resource() = nullptr;
      if (readback_done != nullptr) (void)cudaEventDestroy(readback_done);
      if (readback != nullptr) (void)cudaFreeHost(readback);
    }
    // Validates the ordinal and makes it current before the streams and handles are created on it.
    static int checked(int ordinal) {
      const int count = device_count();
      if (ordinal < 0 || ordinal >= count)
        fail<ConfigError>("cuda::backend: device ", ordinal, " does not exist; this machine has ", count,
                          " CUDA device(s) (ordinals 0 to ", count - 1, "); check LOCAL_RANK and CUDA_VISIBLE_DEVICES");
      set_device(ordinal);
      return ordinal;
    }
  };

  template <class X>
  static std::size_t bytes_of(index_t n) { return static_cast<std::size_t>(n) * sizeof(X); }


  std::shared_ptr<state> state_;
};

static_assert(check_backend<backend>());
static_assert(check_moe_backend<backend>());

}  // namespace cuda
STRATA_NAMESPACE_END
