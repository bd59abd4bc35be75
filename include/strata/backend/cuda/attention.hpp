// strata/backend/cuda/attention.hpp: causal grouped-query flash attention on the GPU, the backend's
// attention_forward / attention_backward (docs/DEVICE.md).
//
//   forward   out = softmax(scale Q K^T, causal unless options.causal is false) V,  lse[b, heads, s] = natural-log log-sum-exp
//   backward  dq, dk, dv written from dout and the saved out and lse (probabilities recomputed)
//   q, out, dout, dq [s, b, heads, d];  k, v, dk, dv [s, b, groups, d];  query head h reads
//   key/value head h / (heads / groups). Never an s x s matrix kept between calls.
//   The trailing AttentionOptions (backend/attention_options.hpp): q, dq and k, v, dk, dv may be
//   strided views (the default is the contiguous layout): both engines read and write through the
//   strides, no copy is made; dropout on the probabilities (counter-based mask, lse undropped); and
//   context parallelism's blocks (causal false: every key seen; query/key offsets: the global
//   positions the dropout mask is drawn at). Both engines run non-causal blocks; only the dropout
//   mask reads the offsets, and dropout runs on the flash kernels.
//
// Which engine runs:
//   bf16, fp16 with cuDNN (STRATA_WITH_CUDNN, the strata::cudnn target): cuDNN 9 SDPA through the
//              frontend (cudnn_sdpa.hpp); one graph per (dtype, s, b, heads, groups, d, strides,
//              direction), built on first use and cached here. A call cuDNN refuses (the backward
//              at s = 1, a head size not a multiple of 8 or too large, a pointer not 16-byte
//              aligned, a stride not a multiple of 16 bytes) runs the flash kernels instead, and
//              the reason is kept (last_refusal()).
//   float, double, and bf16/fp16 without cuDNN: the flash kernels of flash_attention.hpp.
//   Any element type with a sliding window (AttentionOptions::window): the flash kernels (cuDNN's
//              diagonal band is not wired yet).
//   Attention sinks (AttentionOptions::softmax other than vanilla): refused with a sentence (CPU only
//              so far).
//   Any element type with attention dropout (probability > 0): the flash kernels, for forward and
//              backward. cuDNN's SDPA draws its dropout mask from its own Philox stream (seed and
//              offset, per cuDNN's layout of the s x s matrix), which cannot be made to draw
//              strata's mask: a pure function of (key, global head, batch, query, key position)
//              that a tensor-parallel split, the backward, a recompute and the CPU twin all draw
//              alike. The refusal says so; without dropout nothing changes.
// cuDNN's Stats and the flash kernels' lse are the same quantity in the same layout, so a forward
// on one engine and a backward on the other agree.
//
// attention_plans owns the cuDNN handle, the graph cache and one grow-only device workspace (the
// cuDNN workspace, or D = rowsum(dO * O) for the flash backward). Like a cuBLASLt handle it is one
// per device and per thread: calls on different streams must not overlap, since they share the
// workspace. Growing the workspace waits for the calling stream first.
//
// Needs nvcc (includes the kernels).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/shape.hpp"
#include "../../core/space.hpp"
#include "../attention_options.hpp"
#include "cudnn_sdpa.hpp"
#include "flash_attention.hpp"
#include "runtime.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

// The engine an attention call ran on.
enum class attention_engine { none, cudnn, flash };

inline std::string_view engine_name(attention_engine e) {
  switch (e) {
    case attention_engine::cudnn: return "cudnn";
    case attention_engine::flash: return "flash";
    default: return "none";
  }
}

class attention_plans {
 public:
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
  static constexpr bool has_cudnn = true;
#else
  static constexpr bool has_cudnn = false;
#endif

  // `memory`: where the workspace comes from. The backend passes its caching allocator, so growing
  // the workspace in the middle of a step never calls cudaFree (which synchronizes the device and,
  // with one process driving several GPUs, can wait on another GPU's collective that waits on this
  // thread). Without one, the workspace is a plain device_buffer.
  explicit attention_plans(int device, device_memory_resource* memory = nullptr) : device_(device), memory_(memory) {
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
    int previous = current_device();
    set_device(device_);
    const cudnnStatus_t status = cudnnCreate(&handle_);
    set_device(previous);
    if (status != CUDNN_STATUS_SUCCESS)
      fail<Error>("attention_plans: cudnnCreate on device ", device_, " failed: ", cudnnGetErrorString(status),
                  "; check that libcudnn.so.9 and its engine libraries are on the library path");
#endif
  }
  attention_plans(const attention_plans&) = delete;
  attention_plans& operator=(const attention_plans&) = delete;
  ~attention_plans() {
    if (memory_ && pooled_) memory_->deallocate(pooled_, pooled_bytes_);
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
    graphs_.clear();
    if (handle_) (void)cudnnDestroy(handle_);
#endif
  }

  int device() const { return device_; }

  // false: the flash kernels for every element type (comparisons, debugging). Default true.
  void prefer_cudnn(bool on) { prefer_cudnn_ = on; }
  bool prefers_cudnn() const { return prefer_cudnn_; }

  // false: cuDNN's backward may accumulate dQ with atomic adds in any order (faster; the same inputs
  // then give slightly different dq bits from run to run). Default true: the deterministic
  // algorithm, so two runs give the same bits. Graphs are cached per setting; the flash kernels
  // are deterministic either way.
  void deterministic(bool on) { deterministic_ = on; }
  bool is_deterministic() const { return deterministic_; }

  // The engine of the most recent call, and why cuDNN was passed over for it (empty if it was not).
  attention_engine last_engine() const { return last_engine_; }
  const std::string& last_refusal() const { return last_refusal_; }
  // cuDNN graphs built so far (refused shapes included): each shape and direction is planned once.
  std::size_t graphs_built() const { return graphs_built_; }

  // After freeze(), a shape that was not planned before runs on the flash kernels instead of
  // building a cuDNN plan (whose code loading waits for every GPU of the process and can deadlock
  // against a peer GPU's collective when one process drives several GPUs); the refusal says so.
  // Plan the shapes first with prepare_attention.
  void freeze() { frozen_ = true; }
  bool frozen() const { return frozen_; }

  // Device scratch of at least `bytes`, valid until the next call on these plans.
  void* workspace(std::size_t bytes, cudaStream_t stream) {
    if (memory_) {  // stream-ordered: the old block is reused only by work enqueued after this call
      if (bytes > pooled_bytes_) {
        if (pooled_) memory_->deallocate(pooled_, pooled_bytes_);
        pooled_ = nullptr;
        pooled_bytes_ = 0;
        pooled_ = memory_->allocate_long_lived(bytes);
        pooled_bytes_ = bytes;
      }
      return pooled_;
    }
    if (bytes > workspace_.bytes()) {
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer may still be in use
      workspace_ = device_buffer<std::byte>();
      workspace_ = device_buffer<std::byte>(bytes);
    }
    return workspace_.data();
  }

#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
  cudnnHandle_t handle() const { return handle_; }

  // The graph for this shape, strides (resolved) and direction (built on first use), or one with
  // `refusal` set.
  template <class T>
  const sdpa::graph_entry& graph(index_t s, index_t b, index_t heads, index_t groups, index_t d,
                                 const AttentionStrides& strides, bool backward, bool causal = true) {
    const key k{std::is_same_v<T, bf16> ? 0 : 1, s, b, heads, groups, d, strides, backward, backward && !deterministic_,
                causal};
    auto found = graphs_.find(k);
    if (found != graphs_.end()) return found->second;
    const sdpa::shape x{s, b, heads, groups, d, strides, causal};
    sdpa::graph_entry entry;
    if (frozen_) {  // not cached: the refusal is the same each time, and nothing is built
      frozen_refusal_.refusal = "this shape was not planned before freeze() (prepare_attention), and building a plan "
                                "now could wait on another GPU's collective";
      return frozen_refusal_;
    }
    ++graphs_built_;
    try {
      entry = backward ? sdpa::build_backward<T>(handle_, x, deterministic_) : sdpa::build_forward<T>(handle_, x);
    } catch (const std::exception& e) {  // the frontend reports some refusals by throwing
      entry = sdpa::graph_entry{};
      entry.refusal = e.what();
    }
    return graphs_.emplace(k, std::move(entry)).first->second;
  }
#endif

  void note(attention_engine engine, std::string refusal = {}) {
    last_engine_ = engine;
    last_refusal_ = std::move(refusal);
  }

 private:
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

  int device_;
  bool prefer_cudnn_ = true;
  bool deterministic_ = true;
  bool frozen_ = false;
  attention_engine last_engine_ = attention_engine::none;
  std::string last_refusal_;
  std::size_t graphs_built_ = 0;
  device_buffer<std::byte> workspace_;
  device_memory_resource* memory_ = nullptr;  // when set, the workspace is pooled_ from it
  void* pooled_ = nullptr;
  std::size_t pooled_bytes_ = 0;
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
  cudnnHandle_t handle_ = nullptr;
  std::map<key, sdpa::graph_entry> graphs_;
  sdpa::graph_entry frozen_refusal_;
#endif
};

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
// Attention sinks are not on the GPU yet: a call with one is refused with this sentence.
inline void refuse_sink(const char* who, const AttentionOptions& options) {
  if (options.has_sink())
    fail<ConfigError>(who, ": attention sinks (--softmax-type ", options.softmax == SoftmaxType::learnable ? "learnable" : "off-by-one",
                      ") run on the CPU backend only so far (neither cuDNN's SDPA path nor strata's flash kernels add the sink "
                      "yet); train with --device cpu, or with --softmax-type vanilla");
}
// The flash kernels must run the call: dropout or a window (the reason, or null).
inline const char* flash_only(const AttentionOptions& options) {
  if (options.dropout.active()) return kDropoutRefusal;
  if (options.window >= 0) return kWindowRefusal;
  return nullptr;
}

#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
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

// Builds the cuDNN graphs for this shape and these strides now (forward, and backward when
// `backward`), so that the calls themselves plan nothing; a no-op for float and double, without
// cuDNN, when cuDNN is not preferred, for strides cuDNN cannot take, or with dropout (those calls
// run on the flash kernels). A refused shape is remembered as refused (the calls then run on the
// flash kernels).
template <class T>
void prepare_attention(attention_plans& plans, index_t s, index_t b, index_t heads, index_t groups, index_t d,
                       bool backward, AttentionOptions options = {}) {
  flash::check_attention_shape("prepare_attention", s, b, heads, groups, d);
  const AttentionStrides resolved = checked_attention_strides("prepare_attention", options.strides, heads, groups, d);
  check_attention_block("prepare_attention", options);
  detail::refuse_sink("prepare_attention", options);
  (void)attention_dropout_mask<accumulate_t<T>>("prepare_attention", options.dropout);  // checks the probability
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
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

// out [s, b, heads, d], lse [b, heads, s] (fp32 for bf16/fp16) written; see the note at the top.
template <class T>
void attention_forward(attention_plans& plans, cudaStream_t stream, const T* q, const T* k, const T* v, index_t s,
                       index_t b, index_t heads, index_t groups, index_t d, accumulate_t<T> scale, T* out,
                       accumulate_t<T>* lse, AttentionOptions options = {}) {
  static_assert(Element<T>, "attention_forward takes float, double, bf16 or fp16 elements.");
  flash::check_attention_shape("attention_forward", s, b, heads, groups, d);
  const AttentionStrides resolved = checked_attention_strides("attention_forward", options.strides, heads, groups, d);
  check_attention_block("attention_forward", options);
  detail::refuse_sink("attention_forward", options);
  (void)attention_dropout_mask<accumulate_t<T>>("attention_forward", options.dropout);  // checks the probability
  if (s == 0 || b == 0) {
    plans.note(attention_engine::none);
    return;
  }
  if (const char* reason = detail::flash_only(options)) {  // dropout or a window (see the note at the top)
    flash_attention_forward<T>(stream, q, k, v, s, b, heads, groups, d, scale, out, lse,
                               detail::with_strides(options, resolved));
    plans.note(attention_engine::flash, is_half_v<T> ? reason : "");
    return;
  }
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
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

// dq [s, b, heads, d], dk, dv [s, b, groups, d] (or views through the strides of q and k, v)
// written from dout, q, k, v, out and lse.
template <class T>
void attention_backward(attention_plans& plans, cudaStream_t stream, const T* dout, const T* q, const T* k,
                        const T* v, const T* out, const accumulate_t<T>* lse, index_t s, index_t b, index_t heads,
                        index_t groups, index_t d, accumulate_t<T> scale, T* dq, T* dk, T* dv,
                        AttentionOptions options = {}) {
  static_assert(Element<T>, "attention_backward takes float, double, bf16 or fp16 elements.");
  using A = accumulate_t<T>;
  flash::check_attention_shape("attention_backward", s, b, heads, groups, d);
  const AttentionStrides resolved = checked_attention_strides("attention_backward", options.strides, heads, groups, d);
  check_attention_block("attention_backward", options);
  detail::refuse_sink("attention_backward", options);
  (void)attention_dropout_mask<A>("attention_backward", options.dropout);  // checks the probability
  if (s == 0 || b == 0) {
    plans.note(attention_engine::none);
    return;
  }
  if (const char* reason = detail::flash_only(options)) {  // dropout or a window (see the note at the top)
    A* delta = static_cast<A*>(plans.workspace(sizeof(A) * static_cast<std::size_t>(b * heads * s), stream));
    flash_attention_backward<T>(stream, dout, q, k, v, out, lse, s, b, heads, groups, d, scale, dq, dk, dv, delta,
                                detail::with_strides(options, resolved));
    plans.note(attention_engine::flash, is_half_v<T> ? reason : "");
    return;
  }
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
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
