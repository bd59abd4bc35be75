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
//   Attention sinks (AttentionOptions::softmax other than vanilla): any engine above, then the sink
//              joins each row's denominator in place on out and lse (kernels/attention_sink.cuh); the
//              backward runs the engine on the saved out and lse, which hold the sink, and adds the
//              learnable sink's gradient.
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
// The kernels and the cuDNN plumbing are in attention_impl.cuh: header-only builds (nvcc) include it
// from here; with the compiled kernels (kernels/launchers.hpp, strata::cuda_kernels) this header is
// plain C++ and the library holds the definitions, instantiated for float, double, bf16 and fp16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/shape.hpp"
#include "../../core/space.hpp"
#include "../attention_options.hpp"
#include "kernels/launchers.hpp"
#include "runtime.hpp"

struct cudnnContext;  // cudnnHandle_t is a cudnnContext*

STRATA_NAMESPACE_BEGIN
namespace cuda {

namespace sdpa {
struct graph_entry;  // cudnn_sdpa.hpp
}
namespace detail {
struct cudnn_plans;  // attention_impl.cuh: the cuDNN handle and the graphs built so far
}

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
  // Whether cuDNN SDPA was built in (STRATA_WITH_CUDNN where the attention code was compiled: this
  // translation unit when header-only, strata::cuda_kernels when compiled).
  static bool has_cudnn();

  // `memory`: where the workspace comes from. The backend passes its caching allocator, so growing
  // the workspace in the middle of a step never calls cudaFree (which synchronizes the device and,
  // with one process driving several GPUs, can wait on another GPU's collective that waits on this
  // thread). Without one, the workspace is a plain device_buffer.
  explicit attention_plans(int device, device_memory_resource* memory = nullptr);
  attention_plans(const attention_plans&) = delete;
  attention_plans& operator=(const attention_plans&) = delete;
  ~attention_plans();

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

  // With cuDNN built in (attention_impl.cuh defines them then): the handle, and the graph for this
  // shape, strides (resolved) and direction (built on first use), or one with `refusal` set.
  cudnnContext* handle() const;
  template <class T>
  const sdpa::graph_entry& graph(index_t s, index_t b, index_t heads, index_t groups, index_t d,
                                 const AttentionStrides& strides, bool backward, bool causal = true);

  void note(attention_engine engine, std::string refusal = {}) {
    last_engine_ = engine;
    last_refusal_ = std::move(refusal);
  }

 private:
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
  std::unique_ptr<detail::cudnn_plans> cudnn_;  // the same layout with or without cuDNN
};

// Builds the cuDNN graphs for this shape and these strides now (forward, and backward when
// `backward`), so that the calls themselves plan nothing; a no-op for float and double, without
// cuDNN, when cuDNN is not preferred, for strides cuDNN cannot take, or with dropout (those calls
// run on the flash kernels). A refused shape is remembered as refused (the calls then run on the
// flash kernels).
template <class T>
void prepare_attention(attention_plans& plans, index_t s, index_t b, index_t heads, index_t groups, index_t d,
                       bool backward, AttentionOptions options = {});

// out [s, b, heads, d], lse [b, heads, s] (fp32 for bf16/fp16) written; see the note at the top.
template <class T>
void attention_forward(attention_plans& plans, cudaStream_t stream, const T* q, const T* k, const T* v, index_t s,
                       index_t b, index_t heads, index_t groups, index_t d, accumulate_t<T> scale, T* out,
                       accumulate_t<T>* lse, AttentionOptions options = {});

// dq [s, b, heads, d], dk, dv [s, b, groups, d] (or views through the strides of q and k, v)
// written from dout, q, k, v, out and lse.
template <class T>
void attention_backward(attention_plans& plans, cudaStream_t stream, const T* dout, const T* q, const T* k,
                        const T* v, const T* out, const accumulate_t<T>* lse, index_t s, index_t b, index_t heads,
                        index_t groups, index_t d, accumulate_t<T> scale, T* dq, T* dk, T* dv,
                        AttentionOptions options = {});

}  // namespace cuda
STRATA_NAMESPACE_END

#if STRATA_CUDA_HEADER_ONLY
#include "attention_impl.cuh"
#endif
