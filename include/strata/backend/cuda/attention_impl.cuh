// strata/backend/cuda/attention_impl.cuh: the definitions behind attention.hpp: attention_plans'
// cuDNN state, and the dispatch between cuDNN SDPA (cudnn_sdpa.hpp) and the flash kernels
// (flash_attention.hpp). Header-only builds include it from attention.hpp (nvcc); strata::cuda_kernels
// compiles it once with the host compiler (backend/cuda/library/attention.cpp), the flash kernels
// apart (library/flash_attention.cu), so the cuDNN frontend is parsed by the host compiler alone.
#pragma once

#include <algorithm>
#include <map>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "attention.hpp"
#include "cudnn_sdpa.hpp"
#include "flash_launchers.hpp"
#if STRATA_CUDA_HEADER_ONLY  // else the flash and sink kernels come compiled (library/)
#include "flash_attention.hpp"
#include "kernels/attention_sink.cuh"
#endif

#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
#define STRATA_ATTENTION_CUDNN 1
#else
#define STRATA_ATTENTION_CUDNN 0
#endif

STRATA_NAMESPACE_BEGIN
namespace cuda {

namespace detail {
// The cuDNN handle and the graphs built so far, one per (dtype, shape, strides, direction, dQ
// algorithm, causality); empty without cuDNN.
struct cudnn_plans {
#if STRATA_ATTENTION_CUDNN
  struct key {
    int dtype;
    index_t s, b, heads, groups, d;
    AttentionStrides strides;  // resolved
    bool backward;
    bool atomic_dq;  // a backward built without the deterministic algorithm
    bool causal;
    friend bool operator<(const key& x, const key& y) {
      return std::tie(x.dtype, x.s, x.b, x.heads, x.groups, x.d, x.strides.q_row, x.strides.q_head, x.strides.kv_row,
                      x.strides.kv_head, x.backward, x.atomic_dq, x.causal) <
             std::tie(y.dtype, y.s, y.b, y.heads, y.groups, y.d, y.strides.q_row, y.strides.q_head, y.strides.kv_row,
                      y.strides.kv_head, y.backward, y.atomic_dq, y.causal);
    }
  };
  cudnnHandle_t handle = nullptr;
  std::map<key, sdpa::graph_entry> graphs;
  sdpa::graph_entry frozen_refusal;
#endif
};
}  // namespace detail

STRATA_CUDA_INLINE bool attention_plans::has_cudnn() { return STRATA_ATTENTION_CUDNN != 0; }

STRATA_CUDA_INLINE attention_plans::attention_plans(int device, device_memory_resource* memory)
    : device_(device), memory_(memory), cudnn_(std::make_unique<detail::cudnn_plans>()) {
#if STRATA_ATTENTION_CUDNN
  int previous = current_device();
  set_device(device_);
  const cudnnStatus_t status = cudnnCreate(&cudnn_->handle);
  set_device(previous);
  if (status != CUDNN_STATUS_SUCCESS)
    fail<Error>("attention_plans: cudnnCreate on device ", device_, " failed: ", cudnnGetErrorString(status),
                "; check that libcudnn.so.9 and its engine libraries are on the library path");
#endif
}

STRATA_CUDA_INLINE attention_plans::~attention_plans() {
  if (memory_ && pooled_) memory_->deallocate(pooled_, pooled_bytes_);
#if STRATA_ATTENTION_CUDNN
  cudnn_->graphs.clear();
  if (cudnn_->handle) (void)cudnnDestroy(cudnn_->handle);
#endif
}

#if STRATA_ATTENTION_CUDNN
STRATA_CUDA_INLINE cudnnContext* attention_plans::handle() const { return cudnn_->handle; }
#endif

#if STRATA_ATTENTION_CUDNN
template <class T>
const sdpa::graph_entry& attention_plans::graph(index_t s, index_t b, index_t heads, index_t groups, index_t d,
                                                const AttentionStrides& strides, bool backward, bool causal) {
  const detail::cudnn_plans::key k{std::is_same_v<T, bf16> ? 0 : 1, s, b, heads, groups, d, strides, backward,
                                   backward && !deterministic_, causal};
  auto found = cudnn_->graphs.find(k);
  if (found != cudnn_->graphs.end()) return found->second;
  const sdpa::shape x{s, b, heads, groups, d, strides, causal};
  sdpa::graph_entry entry;
  if (frozen_) {  // not cached: the refusal is the same each time, and nothing is built
    cudnn_->frozen_refusal.refusal = "this shape was not planned before freeze() (prepare_attention), and building a "
                                     "plan now could wait on another GPU's collective";
    return cudnn_->frozen_refusal;
  }
  ++graphs_built_;
  try {
    entry = backward ? sdpa::build_backward<T>(cudnn_->handle, x, deterministic_) : sdpa::build_forward<T>(cudnn_->handle, x);
  } catch (const std::exception& e) {  // the frontend reports some refusals by throwing
    entry = sdpa::graph_entry{};
    entry.refusal = e.what();
  }
  return cudnn_->graphs.emplace(k, std::move(entry)).first->second;
}
#endif

namespace detail {
// `options` with its strides resolved.
inline AttentionOptions with_strides(AttentionOptions options, const AttentionStrides& resolved) {
  options.strides = resolved;
  return options;
}
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Why a call with attention dropout runs on the flash kernels (bf16 / fp16, where cuDNN would run).
inline constexpr const char* kDropoutRefusal =
    "attention dropout: cuDNN's SDPA cannot draw strata's counter-based mask, so the flash kernels run";
// Why a call with a sliding window runs on the flash kernels.
inline constexpr const char* kWindowRefusal =
    "sliding window: cuDNN's diagonal band is not used yet, so the flash kernels run";
// `options` without the sink: what the engines run (the sink is applied around them,
// kernels/attention_sink.cuh).
inline AttentionOptions without_sink(AttentionOptions options) {
  options.softmax = SoftmaxType::vanilla;
  options.sinks = nullptr;
  options.sink_gradient = nullptr;
  return options;
}
// The flash kernels must run the call: dropout or a window (the reason, or null).
inline const char* flash_only(const AttentionOptions& options) {
  if (options.dropout.active()) return kDropoutRefusal;
  if (options.window >= 0) return kWindowRefusal;
  return nullptr;
}

#if STRATA_ATTENTION_CUDNN
// Whether every stride (resolved) keeps each head's start 16-byte aligned, as cuDNN requires.
template <class T>
bool strides_aligned16(const AttentionStrides& x) {
  constexpr index_t step = 16 / static_cast<index_t>(sizeof(T));
  return x.q_row % step == 0 && x.q_head % step == 0 && x.kv_row % step == 0 && x.kv_head % step == 0;
}

// The cuDNN graph to run, or nullptr with the reason noted on `plans`. `strides` resolved.
template <class T>
const sdpa::graph_entry* cudnn_graph(attention_plans& plans, index_t s, index_t b, index_t heads, index_t groups,
                                     index_t d, const AttentionStrides& strides, bool backward, bool causal,
                                     std::initializer_list<const void*> pointers) {
  if (!plans.prefers_cudnn()) {
    plans.note(attention_engine::flash, "cuDNN switched off with prefer_cudnn(false)");
    return nullptr;
  }
  for (const void* p : pointers)
    if (!aligned16(p)) {
      plans.note(attention_engine::flash, "a tensor pointer is not 16-byte aligned, which cuDNN requires");
      return nullptr;
    }
  if (!strides_aligned16<T>(strides)) {
    plans.note(attention_engine::flash, "a stride of q, k or v is not a multiple of 16 bytes, which cuDNN requires");
    return nullptr;
  }
  const sdpa::graph_entry& entry = plans.graph<T>(s, b, heads, groups, d, strides, backward, causal);
  if (!entry.graph) {
    plans.note(attention_engine::flash, "cuDNN refused the shape: " + entry.refusal);
    return nullptr;
  }
  return &entry;
}
#endif
}  // namespace detail

// The three entry points (attention.hpp says what each does).
template <class T>
void prepare_attention(attention_plans& plans, index_t s, index_t b, index_t heads, index_t groups, index_t d,
                       bool backward, AttentionOptions options) {
  flash::check_attention_shape("prepare_attention", s, b, heads, groups, d);
  const AttentionStrides resolved = checked_attention_strides("prepare_attention", options.strides, heads, groups, d);
  check_attention_block("prepare_attention", options);
  (void)attention_dropout_mask<accumulate_t<T>>("prepare_attention", options.dropout);  // checks the probability
#if STRATA_ATTENTION_CUDNN
  if constexpr (is_half_v<T>) {
    if (s == 0 || b == 0 || !plans.prefers_cudnn() || !detail::strides_aligned16<T>(resolved) ||
        detail::flash_only(options))
      return;
    std::size_t bytes = 0;
    for (bool direction : {false, true}) {
      if (direction && !backward) break;
      const sdpa::graph_entry& entry = plans.graph<T>(s, b, heads, groups, d, resolved, direction, options.causal);
      if (entry.graph) bytes = std::max(bytes, static_cast<std::size_t>(entry.workspace_bytes));
    }
    if (bytes > 0) (void)plans.workspace(bytes, nullptr);  // sized now, not in the middle of a step
  }
#else
  (void)plans;
  (void)backward;
  (void)resolved;
#endif
}

template <class T>
void attention_forward(attention_plans& plans, cudaStream_t stream, const T* q, const T* k, const T* v, index_t s,
                       index_t b, index_t heads, index_t groups, index_t d, accumulate_t<T> scale, T* out,
                       accumulate_t<T>* lse, AttentionOptions options) {
  static_assert(Element<T>, "attention_forward takes float, double, bf16 or fp16 elements.");
  flash::check_attention_shape("attention_forward", s, b, heads, groups, d);
  const AttentionStrides resolved = checked_attention_strides("attention_forward", options.strides, heads, groups, d);
  check_attention_block("attention_forward", options);  // refuses a sink in a context-parallel block
  (void)attention_dropout_mask<accumulate_t<T>>("attention_forward", options.dropout);  // checks the probability
  if (s == 0 || b == 0) {
    plans.note(attention_engine::none);
    return;
  }
  if (options.has_sink()) {  // the engine's attention, then the sink joins each row's denominator
    attention_forward<T>(plans, stream, q, k, v, s, b, heads, groups, d, scale, out, lse, detail::without_sink(options));
    const T* sinks = options.softmax == SoftmaxType::learnable ? static_cast<const T*>(options.sinks) : nullptr;
    kernels::attention_sink_forward<T>(out, lse, sinks, s, b, heads, d, stream);
    return;
  }
  if (const char* reason = detail::flash_only(options)) {  // dropout or a window (see the note at the top)
    flash_attention_forward<T>(stream, q, k, v, s, b, heads, groups, d, scale, out, lse,
                               detail::with_strides(options, resolved));
    plans.note(attention_engine::flash, is_half_v<T> ? reason : "");
    return;
  }
#if STRATA_ATTENTION_CUDNN
  if constexpr (is_half_v<T>) {
    if (const sdpa::graph_entry* entry =
            detail::cudnn_graph<T>(plans, s, b, heads, groups, d, resolved, false, options.causal, {q, k, v, out, lse})) {
      STRATA_CUDNN_CHECK(cudnnSetStream(plans.handle(), stream));
      float scale_value = scale;
      std::unordered_map<std::int64_t, void*> pack{
          {sdpa::kQ, const_cast<T*>(q)}, {sdpa::kK, const_cast<T*>(k)}, {sdpa::kV, const_cast<T*>(v)},
          {sdpa::kO, out},               {sdpa::kStats, lse},           {sdpa::kScale, &scale_value}};
      void* ws = plans.workspace(static_cast<std::size_t>(entry->workspace_bytes), stream);
      sdpa::execute(*entry, plans.handle(), pack, ws);
      plans.note(attention_engine::cudnn);
      return;
    }
    flash_attention_forward<T>(stream, q, k, v, s, b, heads, groups, d, scale, out, lse, detail::with_strides(options, resolved));  // reason noted
    return;
  }
#endif
  flash_attention_forward<T>(stream, q, k, v, s, b, heads, groups, d, scale, out, lse, detail::with_strides(options, resolved));
  plans.note(attention_engine::flash, is_half_v<T> ? "built without cuDNN" : "");
}

template <class T>
void attention_backward(attention_plans& plans, cudaStream_t stream, const T* dout, const T* q, const T* k,
                        const T* v, const T* out, const accumulate_t<T>* lse, index_t s, index_t b, index_t heads,
                        index_t groups, index_t d, accumulate_t<T> scale, T* dq, T* dk, T* dv,
                        AttentionOptions options) {
  static_assert(Element<T>, "attention_backward takes float, double, bf16 or fp16 elements.");
  using A = accumulate_t<T>;
  flash::check_attention_shape("attention_backward", s, b, heads, groups, d);
  const AttentionStrides resolved = checked_attention_strides("attention_backward", options.strides, heads, groups, d);
  check_attention_block("attention_backward", options);  // refuses a sink in a context-parallel block
  (void)attention_dropout_mask<A>("attention_backward", options.dropout);  // checks the probability
  if (s == 0 || b == 0) {
    plans.note(attention_engine::none);
    return;
  }
  if (options.has_sink()) {  // out and lse hold the sink: the engine's backward is exact as it is
    if (options.softmax == SoftmaxType::learnable && options.sink_gradient != nullptr)
      kernels::attention_sink_backward<T>(dout, out, lse, static_cast<const T*>(options.sinks), s, b, heads, d,
                                          static_cast<A*>(options.sink_gradient), stream);
    attention_backward<T>(plans, stream, dout, q, k, v, out, lse, s, b, heads, groups, d, scale, dq, dk, dv,
                          detail::without_sink(options));
    return;
  }
  if (const char* reason = detail::flash_only(options)) {  // dropout or a window (see the note at the top)
    A* delta = static_cast<A*>(plans.workspace(sizeof(A) * static_cast<std::size_t>(b * heads * s), stream));
    flash_attention_backward<T>(stream, dout, q, k, v, out, lse, s, b, heads, groups, d, scale, dq, dk, dv, delta,
                                detail::with_strides(options, resolved));
    plans.note(attention_engine::flash, is_half_v<T> ? reason : "");
    return;
  }
#if STRATA_ATTENTION_CUDNN
  if constexpr (is_half_v<T>) {
    if (const sdpa::graph_entry* entry =
            detail::cudnn_graph<T>(plans, s, b, heads, groups, d, resolved, true, options.causal,
                                   {dout, q, k, v, out, lse, dq, dk, dv})) {
      STRATA_CUDNN_CHECK(cudnnSetStream(plans.handle(), stream));
      float scale_value = scale;
      std::unordered_map<std::int64_t, void*> pack{
          {sdpa::kQ, const_cast<T*>(q)},   {sdpa::kK, const_cast<T*>(k)},
          {sdpa::kV, const_cast<T*>(v)},   {sdpa::kO, const_cast<T*>(out)},
          {sdpa::kDO, const_cast<T*>(dout)}, {sdpa::kStats, const_cast<A*>(lse)},
          {sdpa::kScale, &scale_value},    {sdpa::kDQ, dq},
          {sdpa::kDK, dk},                 {sdpa::kDV, dv}};
      void* ws = plans.workspace(static_cast<std::size_t>(entry->workspace_bytes), stream);
      sdpa::execute(*entry, plans.handle(), pack, ws);
      plans.note(attention_engine::cudnn);
      return;
    }
    A* delta = static_cast<A*>(plans.workspace(sizeof(A) * static_cast<std::size_t>(b * heads * s), stream));
    flash_attention_backward<T>(stream, dout, q, k, v, out, lse, s, b, heads, groups, d, scale, dq, dk, dv, delta,
                              detail::with_strides(options, resolved));
    return;
  }
#endif
  A* delta = static_cast<A*>(plans.workspace(sizeof(A) * static_cast<std::size_t>(b * heads * s), stream));
  flash_attention_backward<T>(stream, dout, q, k, v, out, lse, s, b, heads, groups, d, scale, dq, dk, dv, delta,
                              detail::with_strides(options, resolved));
  plans.note(attention_engine::flash, is_half_v<T> ? "built without cuDNN" : "");
}

}  // namespace cuda
STRATA_NAMESPACE_END
