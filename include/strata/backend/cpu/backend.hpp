// strata/backend/cpu/backend.hpp: `cpu::backend`, the CPU model of the Backend concept: an empty
// object whose static entry points forward to the plain kernels of this folder (one family per
// header). These kernels are the reference every other backend is tested against.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "../../core/space.hpp"
#include "../backend.hpp"
#include "../tensor_ref.hpp"
#include "activation.hpp"
#include "adamw.hpp"
#include "attention.hpp"
#include "cross_entropy.hpp"
#include "dropout.hpp"
#include "elementwise.hpp"
#include "embedding.hpp"
#include "fp8.hpp"
#include "gemm.hpp"
#include "init.hpp"
#include "moe.hpp"
#include "norm.hpp"
#include "reduce.hpp"
#include "rope.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

struct backend {
  using space = strata::space::host;
  static constexpr std::string_view name = "cpu";

  // memory
  template <class X>
  static void fill(X* x, index_t n, double value) { cpu::fill<X>(x, n, value); }
  template <class X>
  static void copy(const X* src, index_t n, X* dst) { cpu::copy<X>(src, n, dst); }
  template <class X>
  static void copy_to_host(const X* src, index_t n, X* host) { cpu::copy<X>(src, n, host); }
  // The copy that does not wait on a GPU (cuda::backend): here it is made at once.
  template <class X>
  static void copy_to_host_start(const X* src, index_t n, X* host) { cpu::copy<X>(src, n, host); }
  static void wait_host_copies() {}
  template <class X>
  static void copy_from_host(const X* host, index_t n, X* dst) { cpu::copy<X>(host, n, dst); }
  template <class X>
  static void transpose(const X* in, index_t rows, index_t cols, X* out) { cpu::transpose<X>(in, rows, cols, out); }
  static void synchronize() {}

  // arithmetic
  template <class From, class To>
  static void convert(const From* src, index_t n, To* dst) { cpu::convert<From, To>(src, n, dst); }
  template <class X>
  static void add(const X* a, const X* b, index_t n, X* out) { cpu::add<X>(a, b, n, out); }
  template <class X>
  static void scale(X* x, index_t n, double factor) { cpu::scale<X>(x, n, factor); }
  template <class X>
  static void scale_by(X* x, index_t n, const double* factor) { cpu::scale<X>(x, n, *factor); }

  // FP8 (backend/cpu/fp8.hpp): casts with amax, the scaled GEMM, the scaling update
  template <class T>
  static void fp8_amax(const T* x, index_t n, float* amax) { cpu::fp8_amax<T>(x, n, amax); }
  template <class T>
  static void fp8_cast(const T* x, index_t n, Fp8Format format, const float* scale, std::uint8_t* out, float* amax) {
    cpu::fp8_cast<T>(x, n, format, scale, out, amax);
  }
  template <class T>
  static void fp8_cast_transpose(const T* x, index_t rows, index_t cols, Fp8Format format, const float* scale,
                                 std::uint8_t* out, std::uint8_t* out_t, float* amax) {
    cpu::fp8_cast_transpose<T>(x, rows, cols, format, scale, out, out_t, amax);
  }
  static void fp8_transpose(const std::uint8_t* in, index_t rows, index_t cols, std::uint8_t* out) {
    cpu::fp8_transpose(in, rows, cols, out);
  }
  template <class T, class A = accumulate_t<T>>
  static void fp8_cast_transpose_fused(Fp8Producer producer, const T* x, const T* pre, index_t rows, index_t cols,
                                       Fp8Format format, const float* scale, std::uint8_t* out, std::uint8_t* out_t,
                                       float* amax, A* column_sums, const Fp8Output& activation = {}) {
    cpu::fp8_cast_transpose_fused<T>(producer, x, pre, rows, cols, format, scale, out, out_t, amax, column_sums, activation);
  }
  // Fp8Accumulation changes how a GPU's tensor cores accumulate; the twin sums exactly either way.
  template <class C>
  static void fp8_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa,
                       const float* a_scale_inv, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, C* c,
                       bool accumulate, const C* bias = nullptr, Fp8Accumulation = Fp8Accumulation::split) {
    cpu::fp8_gemm<C>(ta, tb, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, c, accumulate, bias);
  }
  // TN: pre = product (+ bias), out = gelu(pre); and out = product * gelu'(pre): the FP8 GEMM, then
  // the GELU (the CUDA backend fuses them into one GEMM epilogue).
  template <class C>
  static void fp8_gemm_gelu(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                            const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, const C* bias, C* pre, C* out,
                            Fp8Accumulation = Fp8Accumulation::split) {
    cpu::fp8_gemm<C>(false, true, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, pre, false, bias);
    cpu::gelu_forward<C>(pre, m * n, out);
  }
  template <class C>
  static void fp8_gemm_gelu_backward(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa,
                                     const float* a_scale_inv, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv,
                                     const C* pre, C* out) {
    cpu::fp8_gemm<C>(false, true, m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, out, false);
    cpu::gelu_backward<C>(out, pre, m * n, out);  // element-wise, in place
  }
  static void fp8_update_scale(float* row, float max, const Fp8UpdateArgs& args) { cpu::fp8_update_scale(row, max, args); }
  static void fp8_update_scales(float* rows, index_t count, index_t stride, const Fp8RoleMaxes& maxes, const Fp8UpdateArgs& args,
                                float* aligned) {
    cpu::fp8_update_scales(rows, count, stride, maxes, args, aligned);
  }
  // the blockwise recipe's casts (runs and tiles) and block-scaled GEMM
  template <class T>
  static void fp8_cast_blocks(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                              float* q_scale_inv, std::uint8_t* qt, float* qt_scale_inv) {
    cpu::fp8_cast_blocks<T>(x, rows, cols, format, block, q, q_scale_inv, qt, qt_scale_inv);
  }
  template <class T>
  static void fp8_cast_tiles(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                             std::uint8_t* qt, float* scale_inv, float* scale_inv_t) {
    cpu::fp8_cast_tiles<T>(x, rows, cols, format, block, q, qt, scale_inv, scale_inv_t);
  }
  template <class C>
  static void fp8_gemm_blocks(index_t m, index_t n, index_t k, const std::uint8_t* a, Fp8Format fa, const float* a_scale_inv,
                              bool a_tiles, const std::uint8_t* b, Fp8Format fb, const float* b_scale_inv, bool b_tiles,
                              index_t block, C* c, bool accumulate) {
    cpu::fp8_gemm_blocks<C>(m, n, k, a, fa, a_scale_inv, a_tiles, b, fb, b_scale_inv, b_tiles, block, c, accumulate);
  }

  // gemm and bias
  template <class T, class C = T>
  static void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, C* c, bool accumulate,
                   const T* bias = nullptr) {
    cpu::gemm<T, C>(ta, tb, m, n, k, a, b, c, accumulate, accumulate_t<T>(1), bias);
  }
  // pre = op(A) op(B) (+ bias), out = gelu(pre); and out = (op(A) op(B)) * gelu'(pre): the GEMM, then
  // the GELU (the CUDA backend fuses them into one GEMM epilogue).
  template <class T>
  static void gemm_gelu(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, const T* bias, T* pre,
                        T* out) {
    gemm<T>(ta, tb, m, n, k, a, b, pre, false, bias);
    cpu::gelu_forward<T>(pre, m * n, out);
  }
  template <class T>
  static void gemm_gelu_backward(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, const T* pre,
                                 T* out) {
    gemm<T>(ta, tb, m, n, k, a, b, out, false);
    cpu::gelu_backward<T>(out, pre, m * n, out);  // element-wise, in place
  }
  template <class T>
  static void bias_add(T* y, const T* bias, index_t rows, index_t cols) { cpu::bias_add<T>(y, bias, rows, cols); }
  template <class T, class A = accumulate_t<T>>
  static void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias) { cpu::bias_grad<T>(dy, rows, cols, dbias); }

  // columns
  template <class T>
  static void slice_columns(const T* in, index_t rows, index_t cols, index_t begin, index_t width, T* out) {
    cpu::slice_columns<T>(in, rows, cols, begin, width, out);
  }
  template <class T>
  static void copy_columns(const T* in, index_t in_cols, index_t rows, index_t width, T* out, index_t out_cols) {
    cpu::copy_columns<T>(in, in_cols, rows, width, out, out_cols);
  }
  template <class T>
  static void unstack_columns(const T* stacked, index_t parts, index_t rows, index_t width, T* out) {
    cpu::unstack_columns<T>(stacked, parts, rows, width, out);
  }
  template <class T>
  static void qkv_split(const T* qkv, index_t rows, index_t groups, index_t heads_per_group, index_t d, T* q, T* k, T* v) {
    cpu::qkv_split<T>(qkv, rows, groups, heads_per_group, d, q, k, v);
  }
  template <class T>
  static void qkv_merge(const T* dq, const T* dk, const T* dv, index_t rows, index_t groups, index_t heads_per_group,
                        index_t d, T* dqkv) {
    cpu::qkv_merge<T>(dq, dk, dv, rows, groups, heads_per_group, d, dqkv);
  }

  // norms (optionally fused with the residual add: cpu/norm.hpp)
  template <class T, class A = accumulate_t<T>>
  static void layernorm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean,
                                A* rstd, const T* residual = nullptr, T* sum = nullptr, A weight_offset = A(0)) {
    cpu::layernorm_forward<T>(x, g, b, rows, h, eps, y, mean, rstd, residual, sum, weight_offset);
  }
  template <class T, class A = accumulate_t<T>>
  static void layernorm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows,
                                 index_t h, T* dx, A* dg, A* db, const T* dresidual = nullptr,
                                 bool accumulate = false, A* dresidual_sums = nullptr, A weight_offset = A(0)) {
    cpu::layernorm_backward<T>(dy, x, g, mean, rstd, rows, h, dx, dg, db, dresidual, accumulate, dresidual_sums,
                               weight_offset);
  }
  template <class T, class A = accumulate_t<T>>
  static void rmsnorm_forward(const T* x, const T* g, index_t rows, index_t h, A eps, T* y, A* rstd,
                              const T* residual = nullptr, T* sum = nullptr, A weight_offset = A(0)) {
    cpu::rmsnorm_forward<T>(x, g, rows, h, eps, y, rstd, residual, sum, weight_offset);
  }
  template <class T, class A = accumulate_t<T>>
  static void rmsnorm_backward(const T* dy, const T* x, const T* g, const A* rstd, index_t rows, index_t h, T* dx,
                               A* dg, const T* dresidual = nullptr, bool accumulate = false, A weight_offset = A(0)) {
    cpu::rmsnorm_backward<T>(dy, x, g, rstd, rows, h, dx, dg, dresidual, accumulate, weight_offset);
  }
  // The forwards with the output written as FP8 codes (Fp8Output) instead of in T: the norm into T,
  // then fp8_cast of it, so the codes and amax are those of the two steps by construction.
  template <class T, class A = accumulate_t<T>>
  static void layernorm_forward_fp8(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, A* mean, A* rstd,
                                    const T* residual, T* sum, A weight_offset, Fp8Output out) {
    std::vector<T> y(static_cast<std::size_t>(rows * h));
    cpu::layernorm_forward<T>(x, g, b, rows, h, eps, y.data(), mean, rstd, residual, sum, weight_offset);
    cpu::fp8_cast<T>(y.data(), rows * h, out.format, out.scale, out.codes, out.amax);
  }
  template <class T, class A = accumulate_t<T>>
  static void rmsnorm_forward_fp8(const T* x, const T* g, index_t rows, index_t h, A eps, A* rstd, const T* residual,
                                  T* sum, A weight_offset, Fp8Output out) {
    std::vector<T> y(static_cast<std::size_t>(rows * h));
    cpu::rmsnorm_forward<T>(x, g, rows, h, eps, y.data(), rstd, residual, sum, weight_offset);
    cpu::fp8_cast<T>(y.data(), rows * h, out.format, out.scale, out.codes, out.amax);
  }

  // activations
  template <class T>
  static void gelu_forward(const T* x, index_t n, T* y) { cpu::gelu_forward<T>(x, n, y); }
  template <class T>
  static void gelu_backward(const T* dy, const T* x, index_t n, T* dx) { cpu::gelu_backward<T>(dy, x, n, dx); }
  template <class T>
  static void swiglu_forward(const T* gu, index_t rows, index_t f, T* y) { cpu::swiglu_forward<T>(gu, rows, f, y); }
  template <class T>
  static void swiglu_backward(const T* dy, const T* gu, index_t rows, index_t f, T* dgu) {
    cpu::swiglu_backward<T>(dy, gu, rows, f, dgu);
  }
  template <class T>
  static void glu_forward(const T* gu, index_t rows, index_t f, GluActivation activation, T* y) {
    cpu::glu_forward<T>(gu, rows, f, activation, y);
  }
  template <class T>
  static void sigmoid_gate_forward(const T* x, const T* z, index_t rows, index_t cols, T* y) {
    cpu::sigmoid_gate_forward<T>(x, z, rows, cols, y);
  }
  template <class T>
  static void sigmoid_gate_backward(const T* dy, const T* x, const T* z, index_t rows, index_t cols, T* dx, T* dz) {
    cpu::sigmoid_gate_backward<T>(dy, x, z, rows, cols, dx, dz);
  }
  template <class T>
  static void glu_backward(const T* dy, const T* gu, index_t rows, index_t f, GluActivation activation, T* dgu) {
    cpu::glu_backward<T>(dy, gu, rows, f, activation, dgu);
  }
  template <class T>
  static void squared_relu_forward(const T* x, index_t n, T* y) { cpu::squared_relu_forward<T>(x, n, y); }
  template <class T>
  static void squared_relu_backward(const T* dy, const T* x, index_t n, T* dx) {
    cpu::squared_relu_backward<T>(dy, x, n, dx);
  }

  // rotary embedding and attention
  template <class T>
  static void rope_forward(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset,
                           const RopeOptions& options = {}) {
    cpu::rope_forward<T>(x, s, n, d, base, position_offset, options);
  }
  template <class T>
  static void rope_backward(T* dx, index_t s, index_t n, index_t d, double base, index_t position_offset,
                            const RopeOptions& options = {}) {
    cpu::rope_backward<T>(dx, s, n, d, base, position_offset, options);
  }
  // qkv_split then rope_forward on q and k; rope_backward of copies of dq and dk then qkv_merge: the
  // two steps, so the bits are theirs by construction (the GPU fuses them into one pass)
  template <class T>
  static void qkv_split_rope(const T* qkv, index_t s, index_t b, index_t groups, index_t heads_per_group, index_t d, T* q,
                             T* k, T* v, double base, index_t position_offset, const RopeOptions& options = {}) {
    cpu::qkv_split<T>(qkv, s * b, groups, heads_per_group, d, q, k, v);
    cpu::rope_forward<T>(q, s, b * groups * heads_per_group, d, base, position_offset, options);
    cpu::rope_forward<T>(k, s, b * groups, d, base, position_offset, options);
  }
  template <class T>
  static void qkv_merge_rope(const T* dq, const T* dk, const T* dv, index_t s, index_t b, index_t groups,
                             index_t heads_per_group, index_t d, T* dqkv, double base, index_t position_offset,
                             const RopeOptions& options = {}) {
    std::vector<T> q(dq, dq + s * b * groups * heads_per_group * d), k(dk, dk + s * b * groups * d);
    cpu::rope_backward<T>(q.data(), s, b * groups * heads_per_group, d, base, position_offset, options);
    cpu::rope_backward<T>(k.data(), s, b * groups, d, base, position_offset, options);
    cpu::qkv_merge<T>(q.data(), k.data(), dv, s * b, groups, heads_per_group, d, dqkv);
  }
  // qkv_merge_rope into T, then fp8_cast of it (the GPU writes the codes in the merge's pass)
  template <class T>
  static void qkv_merge_rope_fp8(const T* dq, const T* dk, const T* dv, index_t s, index_t b, index_t groups,
                                 index_t heads_per_group, index_t d, double base, index_t position_offset,
                                 const RopeOptions& options, Fp8Output out) {
    const index_t n = s * b * groups * (heads_per_group + 2) * d;
    std::vector<T> packed(static_cast<std::size_t>(n));
    qkv_merge_rope<T>(dq, dk, dv, s, b, groups, heads_per_group, d, packed.data(), base, position_offset, options);
    cpu::fp8_cast<T>(packed.data(), n, out.format, out.scale, out.codes, out.amax);
  }
  template <class T, class A = accumulate_t<T>>
  static void attention_forward(const T* q, const T* k, const T* v, index_t s, index_t b, index_t heads, index_t groups,
                                index_t d, A scale, T* out, A* lse, AttentionOptions options = {}) {
    cpu::attention_forward<T>(q, k, v, s, b, heads, groups, d, scale, out, lse, options);
  }
  template <class T, class A = accumulate_t<T>>
  static void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const A* lse,
                                 index_t s, index_t b, index_t heads, index_t groups, index_t d, A scale, T* dq, T* dk,
                                 T* dv, AttentionOptions options = {}) {
    cpu::attention_backward<T>(dout, q, k, v, out, lse, s, b, heads, groups, d, scale, dq, dk, dv, options);
  }
  template <class T, class A = accumulate_t<T>>
  static void attention_merge(T* out, A* lse, const T* block_out, const A* block_lse, index_t s, index_t b,
                              index_t heads, index_t d) {
    cpu::attention_merge<T>(out, lse, block_out, block_lse, s, b, heads, d);
  }
  // Nothing to plan on the CPU.
  template <class T>
  static void prepare_attention(index_t, index_t, index_t, index_t, index_t, bool, AttentionOptions = {}) {}

  // embeddings
  template <class T>
  static void embedding_forward(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin,
                                index_t rows_local, index_t h, T* out) {
    cpu::embedding_forward<T>(tokens, n, weight, row_begin, rows_local, h, out);
  }
  template <class T, class A = accumulate_t<T>>
  static void embedding_backward(const std::int32_t* tokens, index_t n, const T* dout, index_t row_begin,
                                 index_t rows_local, index_t h, A* dweight) {
    cpu::embedding_backward<T>(tokens, n, dout, row_begin, rows_local, h, dweight);
  }
  template <class T>
  static void position_add(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first) {
    cpu::position_add<T>(x, weight, s, b, h, first);
  }
  template <class T, class A = accumulate_t<T>>
  static void position_grad(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight) {
    cpu::position_grad<T>(dy, s, b, h, first, dweight);
  }

  // cross-entropy
  template <class T, class A = accumulate_t<T>>
  static void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max) {
    cpu::cross_entropy_max<T>(logits, rows, local, used, row_max);
  }
  template <class T, class A = accumulate_t<T>>
  static void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                                 const std::int32_t* labels, index_t begin, A* sums) {
    cpu::cross_entropy_sums<T>(logits, rows, local, used, row_max, labels, begin, sums);
  }
  template <class A>
  static void cross_entropy_loss(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing, A* loss,
                                 A* lse) {
    cpu::cross_entropy_loss<A>(sums, row_max, rows, vocab, smoothing, loss, lse);
  }
  template <class T, class A = accumulate_t<T>>
  static void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin,
                                     index_t rows, index_t local, index_t used, index_t vocab, A smoothing,
                                     const A* dloss, T* dlogits) {
    cpu::cross_entropy_backward<T>(logits, lse, labels, begin, rows, local, used, vocab, smoothing, dloss, dlogits);
  }
  template <class T, class A = accumulate_t<T>>
  static void cross_entropy_forward_backward(T* logits, const std::int32_t* labels, index_t rows, index_t local,
                                             index_t used, index_t vocab, A smoothing, const A* dloss, A* loss) {
    cpu::cross_entropy_forward_backward<T>(logits, labels, rows, local, used, vocab, smoothing, dloss, loss);
  }
  template <class A>
  static void masked_loss_sum(const A* loss, const A* mask, index_t n, double* out) {
    cpu::masked_loss_sum<A>(loss, mask, n, out);
  }

  // dropout and init
  template <class T>
  static void dropout_forward(T* x, index_t n, GlobalIndexMap map, double p, std::uint64_t key) {
    cpu::dropout_forward<T>(x, n, map, p, key);
  }
  template <class T>
  static void dropout_backward(T* dy, index_t n, GlobalIndexMap map, double p, std::uint64_t key) {
    cpu::dropout_backward<T>(dy, n, map, p, key);
  }
  template <class T>
  static void init_normal(T* x, index_t n, ShardIndexMap map, std::uint64_t key, double stddev) {
    cpu::init_normal<T>(x, n, map, key, stddev);
  }

  // optimizer and reductions
  template <class T, class A = accumulate_t<T>>
  static void adamw_step(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n,
                         const AdamWStep<A>& step) {
    cpu::adamw_step<T>(main, exp_avg, exp_avg_sq, grad, value, n, step);
  }
  template <class X>
  static void sum_of_squares(const X* x, index_t n, double* accumulator) { cpu::sum_of_squares<X>(x, n, accumulator); }
  static void clip_factor(const double* square_sum, double max_norm, double* norm, double* factor) {
    cpu::clip_factor(square_sum, max_norm, norm, factor);
  }
  // The multi-tensor forms (backend/tensor_ref.hpp): the one-tensor calls in list order.
  template <class X>
  static void sum_of_squares_many(std::span<const SquaresTensor<X>> tensors, double* accumulator) {
    for (const auto& t : tensors) cpu::sum_of_squares<X>(t.data, t.n, accumulator);
  }
  template <class X>
  static void scale_by_many(std::span<const TensorRef<X>> tensors, const double* factor) {
    for (const auto& t : tensors) cpu::scale<X>(t.data, t.n, *factor);
  }
  template <class X>
  static void fill_many(std::span<const TensorRef<X>> tensors, double value) {
    for (const auto& t : tensors) cpu::fill<X>(t.data, t.n, value);
  }

  // mixture of experts (cpu/moe.hpp)
  template <class A>
  static void moe_router_forward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                                 const A* expert_bias, std::int32_t* indices, A* weights, A* aux_scores, A* logsumexp) {
    cpu::moe_router_forward<A>(logits, tokens, experts, k, routing, expert_bias, indices, weights, aux_scores, logsumexp);
  }
  template <class A>
  static void moe_router_backward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                                  const std::int32_t* indices, const A* dweights, const A* aux_coefficients,
                                  index_t groups, double aux_scale, double z_scale, A* dlogits) {
    cpu::moe_router_backward<A>(logits, tokens, experts, k, routing, indices, dweights, aux_coefficients, groups,
                                aux_scale, z_scale, dlogits);
  }
  template <class A>
  static void moe_drop(const std::int32_t* indices, const A* weights, index_t assignments, index_t capacity,
                       bool by_position, std::int32_t* routed) {
    cpu::moe_drop<A>(indices, weights, assignments, capacity, by_position, routed);
  }
  template <class C>
  static void moe_count(const std::int32_t* routed, index_t assignments, index_t k, index_t groups, index_t experts,
                        C* counts, bool accumulate) {
    cpu::moe_count<C>(routed, assignments, k, groups, experts, counts, accumulate);
  }
  static void moe_sort_by_expert(const std::int32_t* routed, index_t assignments, index_t k, index_t first_expert,
                                 index_t experts, index_t capacity, std::int32_t* slot_of, std::int32_t* token_of_slot,
                                 index_t slots) {
    cpu::moe_sort_by_expert(routed, assignments, k, first_expert, experts, capacity, slot_of, token_of_slot, slots);
  }
  static void moe_chunk_maps(const std::int32_t* chunk_counts, index_t chunks, index_t local, index_t capacity,
                             std::int32_t* to_expert, std::int32_t* to_chunk, std::int32_t* expert_counts) {
    cpu::moe_chunk_maps(chunk_counts, chunks, local, capacity, to_expert, to_chunk, expert_counts);
  }
  template <class T>
  static void moe_gather_rows(const T* in, index_t cols, const std::int32_t* rows, index_t n, T* out) {
    cpu::moe_gather_rows<T>(in, cols, rows, n, out);
  }
  template <class T, class A = accumulate_t<T>>
  static void moe_combine(const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k, index_t cols,
                          T* out) {
    cpu::moe_combine<T, A>(in, slot, weights, tokens, k, cols, out);
  }
  template <class T, class A = accumulate_t<T>>
  static void moe_combine_backward(const T* dy, const T* in, const std::int32_t* slot, const A* weights, index_t tokens,
                                   index_t k, index_t cols, index_t slots, T* d_in, A* dweights) {
    cpu::moe_combine_backward<T, A>(dy, in, slot, weights, tokens, k, cols, slots, d_in, dweights);
  }
  template <class A>
  static void moe_aux_loss(const A* prob_sums, const A* counts, index_t n, double factor, double* loss, A* coefficients) {
    cpu::moe_aux_loss<A>(prob_sums, counts, n, factor, loss, coefficients);
  }
  template <class A>
  static void moe_expert_bias_update(const A* counts, index_t experts, double rate, A* bias) {
    cpu::moe_expert_bias_update<A>(counts, experts, rate, bias);
  }
  template <class T, class C = T>
  static void grouped_gemm(bool ta, bool tb, index_t groups, const index_t* m, const index_t* n, const index_t* k,
                           const T* const* a, const T* const* b, C* const* c, bool accumulate) {
    cpu::grouped_gemm<T, C>(ta, tb, groups, m, n, k, a, b, c, accumulate);
  }
  // Whether grouped_gemm_rows / grouped_gemm_weights read the counts without waiting (here: always,
  // they are host memory). The experts read the counts on the host once and call grouped_gemm when not.
  template <class T>
  static constexpr bool grouped_gemm_counts_on_device(index_t /*n*/, index_t /*k*/) {
    return true;
  }
  template <class T>
  static void grouped_gemm_rows(bool tb, index_t groups, const std::int32_t* counts, index_t rows, index_t n, index_t k,
                                const T* a, const T* const* b, T* c) {
    cpu::grouped_gemm_rows<T>(tb, groups, counts, rows, n, k, a, b, c);
  }
  template <class T, class C = T>
  static void grouped_gemm_weights(index_t groups, const std::int32_t* counts, index_t rows, index_t m, index_t n,
                                   const T* a, const T* b, C* const* c, bool accumulate) {
    cpu::grouped_gemm_weights<T, C>(groups, counts, rows, m, n, a, b, c, accumulate);
  }
};

static_assert(check_backend<backend>());

}  // namespace cpu
STRATA_NAMESPACE_END
