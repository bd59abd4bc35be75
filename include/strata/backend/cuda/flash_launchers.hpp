// strata/backend/cuda/flash_launchers.hpp: the host side of the flash attention kernels
// (flash_attention.hpp), as declarations a host compiler reads, and the shape check they share with
// attention.hpp. Header-only builds define the launchers in flash_attention.hpp; with the compiled
// kernels (kernels/launchers.hpp, strata::cuda_kernels) they are instantiated once, for float,
// double, bf16 and fp16, in backend/cuda/library/flash_attention.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/shape.hpp"
#include "../attention_options.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {
namespace flash {

inline constexpr index_t kMaxHeadSize = 256;  // the head sizes the flash kernels hold in registers

// Refuses shapes the kernels cannot run, naming the value.
inline void check_attention_shape(const char* who, index_t s, index_t b, index_t heads, index_t groups, index_t d) {
  if (s < 0 || b < 0 || heads <= 0 || groups <= 0)
    fail<ShapeError>(who, ": s = ", s, ", b = ", b, ", heads = ", heads, ", groups = ", groups,
                     " must be non-negative (heads and groups positive)");
  if (heads % groups != 0)
    fail<ShapeError>(who, ": heads = ", heads, " is not a multiple of groups = ", groups,
                     "; grouped-query attention gives every key/value head the same number of query heads");
  if (d <= 0 || d > kMaxHeadSize)
    fail<ShapeError>(who, ": head size d = ", d, " is outside 1..", kMaxHeadSize,
                     ", the range the flash kernels hold in registers; split the heads or use the cuDNN path");
  if (b * heads > 65535)
    fail<ShapeError>(who, ": b * heads = ", b * heads, " exceeds the 65535 blocks of a grid's y dimension; "
                     "call attention on fewer sequences at a time");
}

}  // namespace flash

// out [s, b, heads, d] and lse [b, heads, s] from q [s, b, heads, d], k, v [s, b, groups, d] (or
// strided views of them), with dropout on the probabilities when options.dropout is active.
template <class T>
void flash_attention_forward(cudaStream_t stream, const T* q, const T* k, const T* v, index_t s, index_t b,
                             index_t heads, index_t groups, index_t d, accumulate_t<T> scale, T* out,
                             accumulate_t<T>* lse, AttentionOptions options = {});

// dq, dk, dv written (through the same strides as q and k, v), through the forward's dropout mask
// when options.dropout is active (the forward's options). `delta` is scratch of b * heads * s
// accumulate_t<T> elements (D = rowsum(dO * O)).
template <class T>
void flash_attention_backward(cudaStream_t stream, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const accumulate_t<T>* lse, index_t s, index_t b, index_t heads, index_t groups,
                              index_t d, accumulate_t<T> scale, T* dq, T* dk, T* dv, accumulate_t<T>* delta,
                              AttentionOptions options = {});

}  // namespace cuda
STRATA_NAMESPACE_END
