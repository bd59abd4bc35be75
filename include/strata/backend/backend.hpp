// strata/backend/backend.hpp: the compute `Backend` concept, every entry point of docs/DEVICE.md.
//
// A backend is an object per rank (`ctx.device`) with `using space = ...` naming the memory space
// its pointers live in. The CPU backend (`cpu::backend`) is empty with static entry points; the
// CUDA backend holds its streams and handles and its entry points are member functions. Layers call
// `ctx.device.name(...)` only, so both kinds satisfy one concept, checked through an object.
//
// Each family below is checked for float, double and bf16 (accumulate type A = float for bf16)
// where it applies; `check_backend<B>()` names the first missing family in a sentence.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>

#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "../core/space.hpp"
#include "../shard/shard_spec.hpp"
#include "moe_routing.hpp"
#include "adamw_step.hpp"
#include "attention_options.hpp"

STRATA_NAMESPACE_BEGIN

namespace backend_requirements {

template <class B>
concept has_space = requires { typename B::space; } && space::is_space_v<typename B::space>;

template <class B, class X>
concept memory_of = requires(B& b, X* x, const X* cx, index_t n) {
  b.template fill<X>(x, n, 1.0);
  b.template copy<X>(cx, n, x);
  b.template copy_to_host<X>(cx, n, x);
  b.template copy_from_host<X>(cx, n, x);
  b.template transpose<X>(cx, n, n, x);
};
template <class B>
concept memory = memory_of<B, float> && memory_of<B, double> && memory_of<B, bf16> && memory_of<B, std::int32_t> &&
                 requires(B& b) { b.synchronize(); };

template <class B, class X>
concept arithmetic_of = requires(B& b, X* x, const X* cx, const double* factor, index_t n) {
  b.template add<X>(cx, cx, n, x);
  b.template scale<X>(x, n, 0.5);
  b.template scale_by<X>(x, n, factor);
};
template <class B>
concept arithmetic = arithmetic_of<B, float> && arithmetic_of<B, double> && arithmetic_of<B, bf16> &&
                     requires(B& b, const float* f, const bf16* h, const double* d, float* fo, bf16* ho, double* dout,
                              index_t n) {
                       b.template convert<float, bf16>(f, n, ho);
                       b.template convert<bf16, float>(h, n, fo);
                       b.template convert<double, float>(d, n, fo);
                       b.template convert<float, double>(f, n, dout);
                     };

template <class B, class T, class A = accumulate_t<T>>
concept gemm_of = requires(B& b, const T* ct, T* t, A* a, index_t n) {
  b.template gemm<T>(false, true, n, n, n, ct, ct, t, false);
  b.template gemm<T>(false, true, n, n, n, ct, ct, t, false, ct);
  b.template gemm<T, A>(true, false, n, n, n, ct, ct, a, true);
  b.template gemm_gelu<T>(false, true, n, n, n, ct, ct, ct, t, t);
  b.template gemm_gelu_backward<T>(false, false, n, n, n, ct, ct, ct, t);
  b.template bias_add<T>(t, ct, n, n);
  b.template bias_grad<T>(ct, n, n, a);
};
template <class B>
concept gemm = gemm_of<B, float> && gemm_of<B, double> && gemm_of<B, bf16>;

template <class B, class T>
concept columns_of = requires(B& b, const T* ct, T* t, index_t n) {
  b.template slice_columns<T>(ct, n, n, n, n, t);
  b.template copy_columns<T>(ct, n, n, n, t, n);
  b.template unstack_columns<T>(ct, n, n, n, t);
  b.template qkv_split<T>(ct, n, n, n, n, t, t, t);
  b.template qkv_merge<T>(ct, ct, ct, n, n, n, n, t);
};
template <class B>
concept columns = columns_of<B, float> && columns_of<B, double> && columns_of<B, bf16>;

template <class B, class T, class A = accumulate_t<T>>
concept norm_of = requires(B& b, const T* ct, T* t, A* a, const A* ca, index_t n, A eps) {
  b.template layernorm_forward<T>(ct, ct, ct, n, n, eps, t, a, a, ct, t);  // residual, sum
  b.template layernorm_backward<T>(ct, ct, ct, ca, ca, n, n, t, a, a, ct, true, a);  // dresidual, accumulate, its column sums
  b.template rmsnorm_forward<T>(ct, ct, n, n, eps, t, a, ct, t);
  b.template rmsnorm_backward<T>(ct, ct, ct, ca, n, n, t, a, ct, true);
};
template <class B>
concept norm = norm_of<B, float> && norm_of<B, double> && norm_of<B, bf16>;

template <class B, class T>
concept activation_of = requires(B& b, const T* ct, T* t, index_t n) {
  b.template gelu_forward<T>(ct, n, t);
  b.template gelu_backward<T>(ct, ct, n, t);
  b.template swiglu_forward<T>(ct, n, n, t);
  b.template swiglu_backward<T>(ct, ct, n, n, t);
};
template <class B>
concept activation = activation_of<B, float> && activation_of<B, double> && activation_of<B, bf16>;

template <class B, class T>
concept rope_of = requires(B& b, T* t, index_t n) {
  b.template rope_forward<T>(t, n, n, n, 10000.0, n);
  b.template rope_backward<T>(t, n, n, n, 10000.0, n);
};
template <class B>
concept rope = rope_of<B, float> && rope_of<B, double> && rope_of<B, bf16>;

// Each with and without the trailing AttentionOptions (q, k, v read as strided views; dropout on
// the probabilities from a counter-based mask: backend/attention_options.hpp).
template <class B, class T, class A = accumulate_t<T>>
concept attention_of = requires(B& b, const T* ct, T* t, A* a, const A* ca, index_t n, A scale,
                                AttentionOptions options) {
  b.template attention_forward<T>(ct, ct, ct, n, n, n, n, n, scale, t, a);
  b.template attention_forward<T>(ct, ct, ct, n, n, n, n, n, scale, t, a, options);
  b.template attention_backward<T>(ct, ct, ct, ct, ct, ca, n, n, n, n, n, scale, t, t, t);
  b.template attention_backward<T>(ct, ct, ct, ct, ct, ca, n, n, n, n, n, scale, t, t, t, options);
  b.template prepare_attention<T>(n, n, n, n, n, true);
  b.template prepare_attention<T>(n, n, n, n, n, true, options);
  b.template attention_merge<T>(t, a, ct, ca, n, n, n, n);
};
template <class B>
concept attention = attention_of<B, float> && attention_of<B, double> && attention_of<B, bf16>;

template <class B, class T, class A = accumulate_t<T>>
concept embedding_of = requires(B& b, const std::int32_t* tokens, const T* ct, T* t, A* a, index_t n) {
  b.template embedding_forward<T>(tokens, n, ct, n, n, n, t);
  b.template embedding_backward<T>(tokens, n, ct, n, n, n, a);
  b.template position_add<T>(t, ct, n, n, n, n);
  b.template position_grad<T>(ct, n, n, n, n, a);
};
template <class B>
concept embedding = embedding_of<B, float> && embedding_of<B, double> && embedding_of<B, bf16>;

template <class B, class T, class A = accumulate_t<T>>
concept cross_entropy_of = requires(B& b, const T* ct, T* t, A* a, const A* ca, const std::int32_t* labels, index_t n,
                                    A smoothing, double* out) {
  b.template cross_entropy_max<T>(ct, n, n, n, a);
  b.template cross_entropy_sums<T>(ct, n, n, n, ca, labels, n, a);
  b.template cross_entropy_loss<A>(ca, ca, n, n, smoothing, a, a);
  b.template cross_entropy_backward<T>(ct, ca, labels, n, n, n, n, n, smoothing, ca, t);
  b.template cross_entropy_forward_backward<T>(t, labels, n, n, n, n, smoothing, ca, a);
  b.template masked_loss_sum<A>(ca, ca, n, out);
};
template <class B>
concept cross_entropy = cross_entropy_of<B, float> && cross_entropy_of<B, double> && cross_entropy_of<B, bf16>;

template <class B, class T>
concept dropout_of = requires(B& b, T* t, index_t n, GlobalIndexMap map, std::uint64_t key) {
  b.template dropout_forward<T>(t, n, map, 0.1, key);
  b.template dropout_backward<T>(t, n, map, 0.1, key);
};
template <class B>
concept dropout = dropout_of<B, float> && dropout_of<B, double> && dropout_of<B, bf16>;

template <class B, class T>
concept init_of = requires(B& b, T* t, index_t n, ShardIndexMap map, std::uint64_t key) {
  b.template init_normal<T>(t, n, map, key, 0.02);
};
template <class B>
concept init = init_of<B, float> && init_of<B, double> && init_of<B, bf16>;

template <class B, class T, class A = accumulate_t<T>>
concept adamw_of = requires(B& b, A* a, const A* ca, T* t, index_t n, const AdamWStep<A>& step) {
  b.template adamw_step<T>(a, a, a, ca, t, n, step);
};
template <class B>
concept adamw = adamw_of<B, float> && adamw_of<B, double> && adamw_of<B, bf16>;

template <class B>
concept reduction = requires(B& b, const float* f, const double* cd, double* d, index_t n) {
  b.template sum_of_squares<float>(f, n, d);
  b.template sum_of_squares<double>(cd, n, d);
  b.clip_factor(cd, 1.0, d, d);
};

// The mixture-of-experts entry points (cpu/moe.hpp lists them). Separate from Backend: only the
// MoE layers need them, and they check it with check_moe_backend.
template <class B, class T, class A = accumulate_t<T>>
concept moe_of = requires(B& b, const T* ct, T* t, const A* ca, A* a, const std::int32_t* ci, std::int32_t* i, index_t n,
                          MoeRouting routing, double* d, const index_t* sizes, const T* const* cts, T* const* ts,
                          A* const* as) {
  b.template moe_router_forward<A>(ca, n, n, n, routing, ca, i, a, a, a);
  b.template moe_router_backward<A>(ca, n, n, n, routing, ci, ca, ca, n, 1.0, 1.0, a);
  b.template moe_drop<A>(ci, ca, n, n, true, i);
  b.template moe_count<A>(ci, n, n, n, n, a, true);
  b.template moe_count<std::int32_t>(ci, n, n, n, n, i, false);
  b.moe_sort_by_expert(ci, n, n, n, n, n, i, i, n);
  b.template moe_gather_rows<T>(ct, n, ci, n, t);
  b.template moe_combine<T>(ct, ci, ca, n, n, n, t);
  b.template moe_combine_backward<T>(ct, ct, ci, ca, n, n, n, n, t, a);
  b.template moe_aux_loss<A>(ca, ca, n, 1.0, d, a);
  b.template moe_expert_bias_update<A>(ca, n, 1.0, a);
  b.template grouped_gemm<T>(false, true, n, sizes, sizes, sizes, cts, cts, ts, false);
  b.template grouped_gemm<T, A>(true, false, n, sizes, sizes, sizes, cts, cts, as, true);
  { b.template grouped_gemm_counts_on_device<T>(n, n) } -> std::convertible_to<bool>;
  b.template grouped_gemm_rows<T>(true, n, ci, n, n, n, ct, cts, t);
  b.template grouped_gemm_weights<T, A>(n, ci, n, n, n, ct, ct, as, true);
};
template <class B>
concept moe = moe_of<B, float> && moe_of<B, double> && moe_of<B, bf16>;

}  // namespace backend_requirements

template <class B>
concept Backend = backend_requirements::has_space<B> && backend_requirements::memory<B> &&
                  backend_requirements::arithmetic<B> && backend_requirements::gemm<B> &&
                  backend_requirements::columns<B> && backend_requirements::norm<B> &&
                  backend_requirements::activation<B> && backend_requirements::rope<B> &&
                  backend_requirements::attention<B> && backend_requirements::embedding<B> &&
                  backend_requirements::cross_entropy<B> && backend_requirements::dropout<B> &&
                  backend_requirements::init<B> && backend_requirements::adamw<B> &&
                  backend_requirements::reduction<B>;

// One static_assert per family, each a sentence naming what is missing (docs/DEVICE.md lists the
// exact signatures).
template <class B>
constexpr bool check_backend() {
  namespace r = backend_requirements;
  static_assert(r::has_space<B>, "The backend needs `using space = strata::space::host` (or space::cuda): the memory space its pointers live in.");
  static_assert(r::memory<B>, "The backend is missing a memory entry point: fill, copy, copy_to_host, copy_from_host or transpose for float, double, bf16 and int32_t, or synchronize().");
  static_assert(r::arithmetic<B>, "The backend is missing an arithmetic entry point: add, scale or scale_by for float, double and bf16, or convert between float, bf16 and double.");
  static_assert(r::gemm<B>, "The backend is missing gemm (with and without bias, and with an accumulate-type output), gemm_gelu, gemm_gelu_backward, bias_add or bias_grad for float, double or bf16.");
  static_assert(r::columns<B>, "The backend is missing a column entry point: slice_columns, unstack_columns, qkv_split or qkv_merge for float, double or bf16.");
  static_assert(r::norm<B>, "The backend is missing a norm entry point: layernorm_forward, layernorm_backward, rmsnorm_forward or rmsnorm_backward (with the residual arguments) for float, double or bf16.");
  static_assert(r::activation<B>, "The backend is missing an activation entry point: gelu_forward, gelu_backward, swiglu_forward or swiglu_backward for float, double or bf16.");
  static_assert(r::rope<B>, "The backend is missing rope_forward or rope_backward for float, double or bf16.");
  static_assert(r::attention<B>, "The backend is missing attention_forward, attention_backward (causal, saving the log-sum-exp) or prepare_attention, each with and without a trailing AttentionOptions (strides and dropout), or attention_merge (context parallelism's log-sum-exp merge), for float, double or bf16.");
  static_assert(r::embedding<B>, "The backend is missing an embedding entry point: embedding_forward, embedding_backward, position_add or position_grad for float, double or bf16.");
  static_assert(r::cross_entropy<B>, "The backend is missing a cross-entropy entry point: cross_entropy_max, cross_entropy_sums, cross_entropy_loss, cross_entropy_backward, cross_entropy_forward_backward or masked_loss_sum for float, double or bf16.");
  static_assert(r::dropout<B>, "The backend is missing dropout_forward or dropout_backward (mask recomputed from a key and a GlobalIndexMap) for float, double or bf16.");
  static_assert(r::init<B>, "The backend is missing init_normal (normal values at a ShardIndexMap's global index) for float, double or bf16.");
  static_assert(r::adamw<B>, "The backend is missing adamw_step (fp32 main parameters and moments, an AdamWStep of constants) for float, double or bf16.");
  static_assert(r::reduction<B>, "The backend is missing sum_of_squares for float or double, or clip_factor.");
  return true;
}

// What the mixture-of-experts layers need beyond Backend (layers/moe/), checked by them.
template <class B>
constexpr bool check_moe_backend() {
  static_assert(backend_requirements::moe<B>,
                "The backend is missing a mixture-of-experts entry point: moe_router_forward, moe_router_backward, "
                "moe_drop, moe_count, moe_sort_by_expert, moe_gather_rows, moe_combine, moe_combine_backward, "
                "moe_aux_loss, moe_expert_bias_update, grouped_gemm, grouped_gemm_counts_on_device, grouped_gemm_rows or grouped_gemm_weights (backend/cpu/moe.hpp lists their signatures) "
                "for float, double or bf16.");
  return true;
}

STRATA_NAMESPACE_END
