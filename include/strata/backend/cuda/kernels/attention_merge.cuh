// strata/backend/cuda/kernels/attention_merge.cuh: context parallelism's merge of the attention of
// the same queries over another block of keys, in place on out and lse (the CPU twin is
// cpu::attention_merge, backend/cpu/attention.hpp):
//
//   out, block_out [s, b, heads, d];  lse, block_lse [b, heads, s] (accumulate type)
//   lse' = m + log(e^(lse - m) + e^(block_lse - m)),  m = max(lse, block_lse)
//   out' = e^(lse - lse') out + e^(block_lse - lse') block_out
//
// One warp per (query, batch, head) row (for_each_attention_row, common.cuh): every lane computes
// the row's two weights from the same two numbers (so the same bits), the lanes stride over the d
// columns, and lane 0 writes the merged lse after the warp has read the old one. A row that saw no
// key has lse -inf and weight 0 (both -inf: the row is left as it is).
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T, class A = accumulate_t<T>>
__global__ void attention_merge_kernel(T* out, A* lse, const T* block_out, const A* block_lse, index_t s, index_t b,
                                       index_t heads, index_t d) {
  for_each_attention_row(s, b, heads, [&](index_t row, index_t, index_t at, int lane) {
    const A l = lse[at], lb = block_lse[at];
    const A m = l > lb ? l : lb;
    if (isinf(m) && m < A(0)) return;  // neither saw a key: the row stays as it is
    const A merged = m + log(exp(l - m) + exp(lb - m));
    const A w = exp(l - merged), wb = exp(lb - merged);
    T* o = out + row * d;
    const T* ob = block_out + row * d;
    for (index_t e = lane; e < d; e += 32) store(o, e, w * load(o, e) + wb * load(ob, e));
    __syncwarp();
    if (lane == 0) lse[at] = merged;
  });
}

template <class T, class A>
void attention_merge(T* out, A* lse, const T* block_out, const A* block_lse, index_t s, index_t b, index_t heads,
                     index_t d, cudaStream_t stream) {
  const index_t rows = s * b * heads;
  if (rows <= 0 || d <= 0) return;
  attention_merge_kernel<T><<<grid_for(rows * 32), kThreads, 0, stream>>>(out, lse, block_out, block_lse, s, b, heads, d);
  check_launch("attention_merge");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
