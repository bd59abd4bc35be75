// strata/backend/cuda/kernels/columns.cuh: column slices and the attention head permutations.
//
//   slice_columns    out[r, j] = in[r, begin + j]                        in [rows, cols], out [rows, width]
//   copy_columns     out[r * out_cols + j] = in[r * in_cols + j], j < width (blocks of columns; one 2D copy)
//   unstack_columns  out[r, p * width + w] = stacked[p, r, w]            stacked [parts, rows, width]
//   qkv_split        qkv [rows, groups, heads_per_group + 2, d] -> q [rows, groups * heads_per_group, d],
//                    k, v [rows, groups, d]: slot j < heads_per_group of group g is query head
//                    g * heads_per_group + j, slot heads_per_group is k, the last slot v
//   qkv_merge        the inverse (dq, dk, dv -> dqkv)
//
// Pure data movement, results independent of the launch shape: a thread per output element for the
// column slices, a thread per 16-byte word (where aligned) for the qkv permutations.
#pragma once

#include <cstdint>
#include <type_traits>

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

// A 2D copy on the stream (the copy engines or a copy kernel, as the driver picks): rows of `width`
// elements at pitches in_cols and out_cols.
template <class T>
void copy_columns(const T* in, index_t in_cols, index_t rows, index_t width, T* out, index_t out_cols, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return;
  STRATA_CUDA_CHECK(cudaMemcpy2DAsync(out, static_cast<std::size_t>(out_cols) * sizeof(T), in,
                                      static_cast<std::size_t>(in_cols) * sizeof(T), static_cast<std::size_t>(width) * sizeof(T),
                                      static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, stream));
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

// A thread per word of packed (rows, groups, slots, d) with slots = heads_per_group + 2 (the query
// heads of the group, then k, then v): unit u = one head's d values of one row. Words are 16 bytes
// when every unit is 16-byte aligned, else single elements; neighbouring threads take neighbouring
// words, so a warp covers several short units (d = 64 bf16 is 8 words) with full loads. Index
// arithmetic in 32 bits (I) when the word count allows. `merge` picks the direction.
template <class Word, class I, bool merge>
__global__ void qkv_permute_kernel(Word* packed, I total, I heads_per_group, I words, Word* q, Word* k, Word* v) {
  const I slots = heads_per_group + 2;
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I u = i / words, e = i - u * words;
    const I rg = u / slots, slot = u - rg * slots;  // rg = r * groups + g
    Word* target;
    if (slot < heads_per_group)
      target = q + (std::size_t(rg) * heads_per_group + slot) * words;  // q (rows, groups * heads_per_group, d)
    else
      target = (slot == heads_per_group ? k : v) + std::size_t(rg) * words;  // k, v (rows, groups, d)
    if constexpr (merge) packed[i] = target[e];
    else target[e] = packed[i];
  }
}

template <class Word, bool merge>
void launch_qkv_permute(Word* packed, index_t units, index_t heads_per_group, index_t words, Word* q, Word* k, Word* v,
                        cudaStream_t stream) {
  const index_t total = units * words;
  if (total < (index_t(1) << 31))
    qkv_permute_kernel<Word, std::uint32_t, merge><<<grid_for(total), kThreads, 0, stream>>>(
        packed, std::uint32_t(total), std::uint32_t(heads_per_group), std::uint32_t(words), q, k, v);
  else
    qkv_permute_kernel<Word, index_t, merge><<<grid_for(total), kThreads, 0, stream>>>(packed, total, heads_per_group, words,
                                                                                       q, k, v);
}

template <bool merge, class S>
void qkv_permute(S* packed, index_t rows, index_t groups, index_t heads_per_group, index_t d, S* q, S* k, S* v,
                 cudaStream_t stream, const char* name) {
  const index_t units = rows * groups * (heads_per_group + 2);
  if (units <= 0 || d <= 0) return;
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if ((d * index_t(sizeof(S))) % 16 == 0 && aligned(packed) && aligned(q) && aligned(k) && aligned(v))
    launch_qkv_permute<uint4, merge>(reinterpret_cast<uint4*>(packed), units, heads_per_group, d * index_t(sizeof(S)) / 16,
                                     reinterpret_cast<uint4*>(q), reinterpret_cast<uint4*>(k), reinterpret_cast<uint4*>(v),
                                     stream);
  else
    launch_qkv_permute<S, merge>(packed, units, heads_per_group, d, q, k, v, stream);
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
