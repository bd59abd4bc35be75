// strata/backend/cuda/kernels/columns.cuh: column slices and the attention head permutations.
//
//   slice_columns    out[r, j] = in[r, begin + j]                        in [rows, cols], out [rows, width]
//   unstack_columns  out[r, p * width + w] = stacked[p, r, w]            stacked [parts, rows, width]
//   qkv_split        qkv [rows, groups, heads_per_group + 2, d] -> q [rows, groups * heads_per_group, d],
//                    k, v [rows, groups, d]: slot j < heads_per_group of group g is query head
//                    g * heads_per_group + j, slot heads_per_group is k, the last slot v
//   qkv_merge        the inverse (dq, dk, dv -> dqkv)
//
// Pure data movement: a thread per output element, results independent of the launch shape.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class S>
__global__ void slice_columns_kernel(const S* in, index_t rows, index_t cols, index_t begin, index_t width, S* out) {
  const index_t n = rows * width;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const index_t r = i / width, j = i % width;  // out (rows, width)
    out[i] = in[r * cols + begin + j];           // in (rows, cols)
  }
}
template <class T>
void slice_columns(const T* in, index_t rows, index_t cols, index_t begin, index_t width, T* out, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return;
  using S = storage_t<T>;
  slice_columns_kernel<S><<<grid_for(rows * width), kThreads, 0, stream>>>(
      reinterpret_cast<const S*>(in), rows, cols, begin, width, reinterpret_cast<S*>(out));
  check_launch("slice_columns");
}

template <class S>
__global__ void unstack_columns_kernel(const S* stacked, index_t parts, index_t rows, index_t width, S* out) {
  const index_t n = parts * rows * width;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const index_t w = i % width, r = (i / width) % rows, p = i / (width * rows);  // stacked (parts, rows, width)
    out[(r * parts + p) * width + w] = stacked[i];                               // out (rows, parts * width)
  }
}
template <class T>
void unstack_columns(const T* stacked, index_t parts, index_t rows, index_t width, T* out, cudaStream_t stream) {
  if (parts <= 0 || rows <= 0 || width <= 0) return;
  using S = storage_t<T>;
  unstack_columns_kernel<S><<<grid_for(parts * rows * width), kThreads, 0, stream>>>(
      reinterpret_cast<const S*>(stacked), parts, rows, width, reinterpret_cast<S*>(out));
  check_launch("unstack_columns");
}

// A thread per element of qkv (split) or dqkv (merge); `merge` picks the direction.
template <class S, bool merge>
__global__ void qkv_permute_kernel(S* packed, index_t rows, index_t groups, index_t heads_per_group, index_t d, S* q,
                                   S* k, S* v) {
  const index_t slots = heads_per_group + 2;
  const index_t n = rows * groups * slots * d;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    // packed (rows, groups, slots, d)
    const index_t e = i % d, slot = (i / d) % slots, g = (i / (d * slots)) % groups, r = i / (d * slots * groups);
    S* target;
    if (slot < heads_per_group)
      target = q + ((r * groups + g) * heads_per_group + slot) * d + e;  // q (rows, groups * heads_per_group, d)
    else
      target = (slot == heads_per_group ? k : v) + (r * groups + g) * d + e;  // k, v (rows, groups, d)
    if constexpr (merge) packed[i] = *target;
    else *target = packed[i];
  }
}
template <class T>
void qkv_split(const T* qkv, index_t rows, index_t groups, index_t heads_per_group, index_t d, T* q, T* k, T* v,
               cudaStream_t stream) {
  const index_t n = rows * groups * (heads_per_group + 2) * d;
  if (n <= 0) return;
  using S = storage_t<T>;
  qkv_permute_kernel<S, false><<<grid_for(n), kThreads, 0, stream>>>(
      const_cast<S*>(reinterpret_cast<const S*>(qkv)), rows, groups, heads_per_group, d, reinterpret_cast<S*>(q),
      reinterpret_cast<S*>(k), reinterpret_cast<S*>(v));
  check_launch("qkv_split");
}
template <class T>
void qkv_merge(const T* dq, const T* dk, const T* dv, index_t rows, index_t groups, index_t heads_per_group, index_t d,
               T* dqkv, cudaStream_t stream) {
  const index_t n = rows * groups * (heads_per_group + 2) * d;
  if (n <= 0) return;
  using S = storage_t<T>;
  qkv_permute_kernel<S, true><<<grid_for(n), kThreads, 0, stream>>>(
      reinterpret_cast<S*>(dqkv), rows, groups, heads_per_group, d, const_cast<S*>(reinterpret_cast<const S*>(dq)),
      const_cast<S*>(reinterpret_cast<const S*>(dk)), const_cast<S*>(reinterpret_cast<const S*>(dv)));
  check_launch("qkv_merge");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
