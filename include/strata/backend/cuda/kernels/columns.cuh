// strata/backend/cuda/kernels/columns.cuh: column slices and the attention head permutations.
//
//   slice_columns    out[r, j] = in[r, begin + j]                        in [rows, cols], out [rows, width]
//   unstack_columns  out[r, p * width + w] = stacked[p, r, w]            stacked [parts, rows, width]
//   qkv_split        qkv [rows, groups, heads_per_group + 2, d] -> q [rows, groups * heads_per_group, d],
//                    k, v [rows, groups, d]: slot j < heads_per_group of group g is query head
//                    g * heads_per_group + j, slot heads_per_group is k, the last slot v
//   qkv_merge        the inverse (dq, dk, dv -> dqkv)
//
// Pure data movement, results independent of the launch shape: a thread per output element for the
// column slices, a warp per head row (16-byte words where aligned) for the qkv permutations.
#pragma once

#include <cstdint>

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

// A warp per unit: one head's d values of one row, i.e. unit u of packed (rows, groups, slots, d)
// with slots = heads_per_group + 2 (the query heads of the group, then k, then v). Each lane copies
// `Word`s (16 bytes when every unit is 16-byte aligned, else single elements): the index arithmetic
// (two 64-bit divisions) is per unit, not per element. `merge` picks the direction.
template <class Word, bool merge>
__global__ void qkv_permute_kernel(Word* packed, index_t units, index_t groups, index_t heads_per_group, index_t words,
                                   Word* q, Word* k, Word* v) {
  const index_t slots = heads_per_group + 2;
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (index_t u = blockIdx.x * index_t(warps) + threadIdx.x / 32; u < units; u += index_t(gridDim.x) * warps) {
    const index_t slot = u % slots, rg = u / slots;  // rg = r * groups + g
    Word* target;
    if (slot < heads_per_group)
      target = q + (rg * heads_per_group + slot) * words;  // q (rows, groups * heads_per_group, d)
    else
      target = (slot == heads_per_group ? k : v) + rg * words;  // k, v (rows, groups, d)
    Word* unit = packed + u * words;
    for (index_t e = lane; e < words; e += 32) {
      if constexpr (merge) unit[e] = target[e];
      else target[e] = unit[e];
    }
  }
  (void)groups;
}

template <bool merge, class S>
void qkv_permute(S* packed, index_t rows, index_t groups, index_t heads_per_group, index_t d, S* q, S* k, S* v,
                 cudaStream_t stream, const char* name) {
  const index_t units = rows * groups * (heads_per_group + 2);
  if (units <= 0 || d <= 0) return;
  constexpr int kWarpsPerBlock = 8;
  const unsigned blocks = grid_for(units, kWarpsPerBlock);
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if ((d * index_t(sizeof(S))) % 16 == 0 && aligned(packed) && aligned(q) && aligned(k) && aligned(v)) {
    const index_t words = d * index_t(sizeof(S)) / 16;
    qkv_permute_kernel<uint4, merge><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
        reinterpret_cast<uint4*>(packed), units, groups, heads_per_group, words, reinterpret_cast<uint4*>(q),
        reinterpret_cast<uint4*>(k), reinterpret_cast<uint4*>(v));
  } else {
    qkv_permute_kernel<S, merge><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(packed, units, groups, heads_per_group, d,
                                                                             q, k, v);
  }
  check_launch(name);
}
template <class T>
void qkv_split(const T* qkv, index_t rows, index_t groups, index_t heads_per_group, index_t d, T* q, T* k, T* v,
               cudaStream_t stream) {
  using S = storage_t<T>;
  qkv_permute<false>(const_cast<S*>(reinterpret_cast<const S*>(qkv)), rows, groups, heads_per_group, d,
                     reinterpret_cast<S*>(q), reinterpret_cast<S*>(k), reinterpret_cast<S*>(v), stream, "qkv_split");
}
template <class T>
void qkv_merge(const T* dq, const T* dk, const T* dv, index_t rows, index_t groups, index_t heads_per_group, index_t d,
               T* dqkv, cudaStream_t stream) {
  using S = storage_t<T>;
  qkv_permute<true>(reinterpret_cast<S*>(dqkv), rows, groups, heads_per_group, d, const_cast<S*>(reinterpret_cast<const S*>(dq)),
                    const_cast<S*>(reinterpret_cast<const S*>(dk)), const_cast<S*>(reinterpret_cast<const S*>(dv)),
                    stream, "qkv_merge");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
