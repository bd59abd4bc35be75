// strata/backend/cuda/kernels/moe.cuh: the mixture-of-experts kernels, twins of backend/cpu/moe.hpp
// (which states each one's math). Straightforward and deterministic rather than fast:
//
//   router forward/backward  one thread per token running moe_math's row routines (the CPU code)
//   drop                     one thread per assignment, counting the assignments ahead of it
//   count                    one block per (group, expert), integer counts summed over the block
//                            (four assignments a 16-byte load)
//   sort_by_expert           one block per expert walking the assignments in order, a tile of
//                            4 x blockDim at a time (four a thread, a scan over the block: the
//                            serial order)
//   gather_rows, combine     one thread per 16 bytes of output (one element when the rows are not
//                            16-byte multiples), choices summed in ascending order
//   combine_backward         d_in zeroed, then one thread per (token, choice, 16 bytes of columns);
//                            the weight gradient one warp per (token, choice), a fixed butterfly sum
//   aux_loss, bias_update    one thread (a few hundred numbers)
// No atomics: every value is produced in a fixed order (or is an exact integer sum), so two runs give
// the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "../../moe_routing.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class A>
__global__ void moe_router_forward_kernel(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                                          const A* bias, std::int32_t* indices, A* weights, A* aux, A* lse) {
  for (index_t x = blockIdx.x * index_t(blockDim.x) + threadIdx.x; x < tokens; x += index_t(gridDim.x) * blockDim.x)
    moe_math::route_row<A>(logits + x * experts, experts, k, routing, bias, indices + x * k, weights + x * k,
                           aux ? aux + x * experts : nullptr, lse ? lse + x : nullptr);
}
template <class A>
void moe_router_forward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing, const A* bias,
                        std::int32_t* indices, A* weights, A* aux, A* lse, cudaStream_t stream) {
  if (tokens <= 0) return;
  moe_router_forward_kernel<A><<<grid_for(tokens, 128), 128, 0, stream>>>(logits, tokens, experts, k, routing, bias,
                                                                          indices, weights, aux, lse);
  check_launch("moe_router_forward");
}

template <class A>
__global__ void moe_router_backward_kernel(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                                           const std::int32_t* indices, const A* dweights, const A* coefficients,
                                           index_t groups, double aux_scale, double z_scale, A* dlogits) {
  for (index_t x = blockIdx.x * index_t(blockDim.x) + threadIdx.x; x < tokens; x += index_t(gridDim.x) * blockDim.x)
    moe_math::route_row_backward<A>(logits + x * experts, experts, k, routing, indices + x * k,
                                    dweights ? dweights + x * k : nullptr,
                                    coefficients ? coefficients + (x % groups) * experts : nullptr, aux_scale, z_scale,
                                    dlogits + x * experts);
}
template <class A>
void moe_router_backward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                         const std::int32_t* indices, const A* dweights, const A* coefficients, index_t groups,
                         double aux_scale, double z_scale, A* dlogits, cudaStream_t stream) {
  if (tokens <= 0) return;
  moe_router_backward_kernel<A><<<grid_for(tokens, 128), 128, 0, stream>>>(
      logits, tokens, experts, k, routing, indices, dweights, coefficients, groups, aux_scale, z_scale, dlogits);
  check_launch("moe_router_backward");
}

// The capacity drop: assignment a is kept when fewer than `capacity` assignments to its expert rank
// ahead of it (moe_math::kept_within_capacity, the CPU twin, states the rule; both count with
// moe_math::ranks_ahead). The n^2 comparisons are spread over a two-dimensional grid: block (x, y)
// holds assignments x * 128 .. x * 128 + 127, a thread each, and compares them with the tile y * 1024
// .. y * 1024 + 1023 of the list, read once into shared memory (broadcast reads); each thread adds
// its count to `routed[a]` (zeroed first) with an integer atomic, so the total is the twin's integer
// whatever order the blocks run in. A second pass turns each count into the expert or -1. (With a
// thread per assignment over the whole list, one block of 128 per 128 assignments, the padded
// Mixtral-shaped run on an H100 took 6.8 ms a step more than the dropless one over 8 layers of 16,384
// assignments; with this grid it takes 3 ms less, as it computes only the kept rows: so the old
// grid's cost was the drop, most likely its latency.) By position, the tiles wholly after a block's
// assignments count nothing and are skipped.
constexpr int kMoeDropThreads = 128;
constexpr int kMoeDropTile = 1024;
template <class A>
__global__ void __launch_bounds__(kMoeDropThreads) moe_drop_count_kernel(const std::int32_t* indices, const A* weights, index_t n,
                                                                         bool by_position, std::int32_t* ahead) {
  __shared__ std::int32_t tile_index[kMoeDropTile];
  __shared__ A tile_weight[kMoeDropTile];
  const index_t first = blockIdx.x * index_t(kMoeDropThreads), base = blockIdx.y * index_t(kMoeDropTile);
  if (by_position && base >= first + kMoeDropThreads) return;  // every compared assignment comes later (uniform)
  const int m = static_cast<int>(n - base < kMoeDropTile ? n - base : kMoeDropTile);
  for (int t = threadIdx.x; t < m; t += blockDim.x) {
    tile_index[t] = indices[base + t];
    tile_weight[t] = weights[base + t];
  }
  __syncthreads();
  const index_t a = first + threadIdx.x;
  if (a >= n) return;
  const std::int32_t e = indices[a];
  if (e < 0) return;
  const A w = weights[a];
  int count = 0;
  for (int t = 0; t < m; ++t)
    if (tile_index[t] == e && base + t != a && moe_math::ranks_ahead<A>(base + t, tile_weight[t], a, w, by_position)) ++count;
  if (count > 0) atomicAdd(ahead + a, count);
}
__global__ void moe_drop_decide_kernel(const std::int32_t* indices, index_t n, index_t capacity, std::int32_t* routed) {
  const index_t a = blockIdx.x * index_t(blockDim.x) + threadIdx.x;
  if (a >= n) return;
  const std::int32_t e = indices[a];
  routed[a] = e >= 0 && routed[a] < capacity ? e : -1;  // routed held the count ahead of a
}
template <class A>
void moe_drop(const std::int32_t* indices, const A* weights, index_t n, index_t capacity, bool by_position,
              std::int32_t* routed, cudaStream_t stream) {
  if (n <= 0) return;
  STRATA_CUDA_CHECK(cudaMemsetAsync(routed, 0, sizeof(std::int32_t) * n, stream));  // the counts, added into
  const index_t tiles = (n + kMoeDropTile - 1) / kMoeDropTile;  // the grid's y: at most 65535
  if (tiles > 65535) fail<ShapeError>("moe_drop: ", n, " assignments make more than 65535 tiles of ", kMoeDropTile);
  const dim3 grid(static_cast<unsigned>((n + kMoeDropThreads - 1) / kMoeDropThreads), static_cast<unsigned>(tiles));
  moe_drop_count_kernel<A><<<grid, kMoeDropThreads, 0, stream>>>(indices, weights, n, by_position, routed);
  check_launch("moe_drop");
  moe_drop_decide_kernel<<<grid_for(n), kThreads, 0, stream>>>(indices, n, capacity, routed);
  check_launch("moe_drop");
}

// A block's sum of one int64 per thread (blockDim.x a multiple of 32, at most 1024), returned to
// every thread. Integers: exact, so the order of the sum does not matter.
__device__ inline long long moe_block_sum(long long mine, long long* shared /* [32] */) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) mine += __shfl_down_sync(0xffffffffu, mine, offset);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = mine;
  __syncthreads();
  long long total = 0;
  for (unsigned w = 0; w < warps; ++w) total += shared[w];
  return total;
}

// The assignments a thread reads at once: four int32 (one 16-byte load) where `routed` is 16-byte
// aligned, then the tail one by one. Calls visit(a, expert) for every assignment of
// [0, n) the thread owns, in increasing a: the quads q = threadIdx.x, + blockDim.x, ..., then the tail.
template <class Visit>
__device__ __forceinline__ void moe_each_assignment(const std::int32_t* routed, index_t n, bool quads, Visit&& visit) {
  const index_t vectors = quads ? n / 4 : 0;
  const int4* quad = reinterpret_cast<const int4*>(routed);
  for (index_t q = threadIdx.x; q < vectors; q += blockDim.x) {
    const int4 e = quad[q];
    visit(4 * q, e.x);
    visit(4 * q + 1, e.y);
    visit(4 * q + 2, e.z);
    visit(4 * q + 3, e.w);
  }
  for (index_t a = 4 * vectors + threadIdx.x; a < n; a += blockDim.x) visit(a, routed[a]);
}

// One block per (group, expert) bin: its threads count the bin's assignments (four a load where the
// array is 16-byte aligned), then the block sums the integer counts (exact, so the bits are those of
// one thread counting in order).
template <class C>
__global__ void moe_count_kernel(const std::int32_t* routed, index_t n, index_t k, index_t groups, index_t experts,
                                 C* counts, bool accumulate, bool quads) {
  __shared__ long long partial[32];
  for (index_t bin = blockIdx.x; bin < groups * experts; bin += gridDim.x) {
    const index_t group = bin / experts, expert = bin % experts;
    long long mine = 0;
    if (groups == 1)
      moe_each_assignment(routed, n, quads, [&](index_t, std::int32_t e) { mine += e == expert; });
    else
      moe_each_assignment(routed, n, quads, [&](index_t a, std::int32_t e) { mine += e == expert && (a / k) % groups == group; });
    const long long total = moe_block_sum(mine, partial);
    if (threadIdx.x == 0) counts[bin] = (accumulate ? counts[bin] : C(0)) + C(total);
  }
}
template <class C>
void moe_count(const std::int32_t* routed, index_t n, index_t k, index_t groups, index_t experts, C* counts, bool accumulate,
               cudaStream_t stream) {
  if (groups * experts <= 0) return;
  const index_t blocks = std::min<index_t>(groups * experts, 65535);
  moe_count_kernel<C><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(routed, n, k, groups, experts, counts, accumulate,
                                                                          aligned_16(routed));
  check_launch("moe_count");
}

// One block per expert: its first slot is the count of the experts before it (or e * capacity); then
// the block walks the assignments in order, a tile of 4 x blockDim at a time, thread t holding the
// tile's assignments 4t .. 4t + 3 (one 16-byte load where the array is aligned): each thread counts
// its matches, an exclusive scan over the block gives the matches before its four, and the thread
// hands out the expert's next slots in order. That is the order one thread scanning the assignments
// would give.
// A template (of nothing) so that the kernel, defined in a header, may be in many translation units.
template <int = 0>
__global__ void moe_sort_by_expert_kernel(const std::int32_t* routed, index_t n, index_t k, index_t first_expert,
                                          index_t experts, index_t capacity, std::int32_t* slot_of,
                                          std::int32_t* token_of_slot, bool quads) {
  __shared__ long long partial[32];
  __shared__ int warp_matches[32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (index_t e = blockIdx.x; e < experts; e += gridDim.x) {
    const std::int32_t expert = static_cast<std::int32_t>(first_expert + e);
    index_t next = 0;
    if (capacity > 0) {
      next = e * capacity;
    } else {
      long long before = 0;
      moe_each_assignment(routed, n, quads,
                          [&](index_t, std::int32_t r) { before += r >= first_expert && r < expert; });
      next = static_cast<index_t>(moe_block_sum(before, partial));
    }
    const index_t tile_size = 4 * index_t(blockDim.x);
    for (index_t base = 0; base < n; base += tile_size) {
      const index_t first = base + 4 * index_t(threadIdx.x);
      std::int32_t mine[4] = {-1, -1, -1, -1};
      if (quads && first + 3 < n) {
        const int4 q = *reinterpret_cast<const int4*>(routed + first);
        mine[0] = q.x, mine[1] = q.y, mine[2] = q.z, mine[3] = q.w;
      } else {
        for (int j = 0; j < 4; ++j)
          if (first + j < n) mine[j] = routed[first + j];
      }
      int matches = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) matches += mine[j] == expert;
      // inclusive scan over the warp, then the warps' totals
      int scan = matches;
#pragma unroll
      for (int offset = 1; offset < 32; offset *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, scan, offset);
        if (lane >= static_cast<unsigned>(offset)) scan += up;
      }
      __syncthreads();  // warp_matches of the previous tile has been read
      if (lane == 31) warp_matches[warp] = scan;
      __syncthreads();
      index_t offset = scan - matches, tile = 0;
      for (unsigned w = 0; w < warps; ++w) {
        if (w < warp) offset += warp_matches[w];
        tile += warp_matches[w];
      }
      if (matches > 0) {
        index_t slot = next + offset;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (mine[j] == expert) {
            slot_of[first + j] = static_cast<std::int32_t>(slot);
            token_of_slot[slot] = static_cast<std::int32_t>((first + j) / k);
            ++slot;
          }
      }
      next += tile;
    }
  }
}
template <int = 0>
__global__ void moe_unrouted_kernel(const std::int32_t* routed, index_t n, index_t first_expert, index_t experts,
                                    std::int32_t* slot_of) {
  for (index_t a = blockIdx.x * index_t(blockDim.x) + threadIdx.x; a < n; a += index_t(gridDim.x) * blockDim.x)
    if (routed[a] < first_expert || routed[a] >= first_expert + experts) slot_of[a] = -1;
}
STRATA_CUDA_INLINE void moe_sort_by_expert(const std::int32_t* routed, index_t n, index_t k, index_t first_expert, index_t experts,
                               index_t capacity, std::int32_t* slot_of, std::int32_t* token_of_slot, index_t slots,
                               cudaStream_t stream) {
  if (slots > 0) STRATA_CUDA_CHECK(cudaMemsetAsync(token_of_slot, 0xff, sizeof(std::int32_t) * slots, stream));  // -1
  if (n > 0) {
    moe_unrouted_kernel<><<<grid_for(n), kThreads, 0, stream>>>(routed, n, first_expert, experts, slot_of);
    check_launch("moe_sort_by_expert");
  }
  if (experts <= 0 || n <= 0) return;
  moe_sort_by_expert_kernel<><<<static_cast<unsigned>(std::min<index_t>(experts, 65535)), 256, 0, stream>>>(
      routed, n, k, first_expert, experts, capacity, slot_of, token_of_slot, aligned_16(routed));
  check_launch("moe_sort_by_expert");
}

// moe_chunk_maps (backend/cpu/moe.hpp has the definition): one block. The chunks' expert-order
// starts by one thread (chunks x local of them: a few hundred at most), then every row of the maps
// by the block, -1 first where no real row lands.
template <int = 0>
__global__ void moe_chunk_maps_kernel(const std::int32_t* chunk_counts, index_t chunks, index_t local, index_t capacity,
                                      std::int32_t* start, std::int32_t* to_expert, std::int32_t* to_chunk,
                                      std::int32_t* expert_counts) {
  const index_t n = chunks * local, rows = n * capacity;
  if (threadIdx.x == 0) {
    index_t at = 0;
    for (index_t l = 0; l < local; ++l) {
      const index_t first = at;
      for (index_t g = 0; g < chunks; ++g) {
        start[g * local + l] = static_cast<std::int32_t>(at);
        at += chunk_counts[g * local + l];
      }
      expert_counts[l] = static_cast<std::int32_t>(at - first);
    }
  }
  for (index_t r = threadIdx.x; r < rows; r += blockDim.x) to_expert[r] = -1;
  __syncthreads();
  for (index_t i = threadIdx.x; i < rows; i += blockDim.x) {
    const index_t c = i / capacity, j = i % capacity;
    if (j < chunk_counts[c]) {
      const index_t r = start[c] + j;
      to_chunk[i] = static_cast<std::int32_t>(r);
      to_expert[r] = static_cast<std::int32_t>(i);
    } else {
      to_chunk[i] = -1;
    }
  }
}
STRATA_CUDA_INLINE void moe_chunk_maps(const std::int32_t* chunk_counts, index_t chunks, index_t local, index_t capacity,
                                       std::int32_t* start, std::int32_t* to_expert, std::int32_t* to_chunk,
                                       std::int32_t* expert_counts, cudaStream_t stream) {
  if (chunks <= 0 || local <= 0 || capacity <= 0) return;
  moe_chunk_maps_kernel<><<<1, 1024, 0, stream>>>(chunk_counts, chunks, local, capacity, start, to_expert, to_chunk,
                                                   expert_counts);
  check_launch("moe_chunk_maps");
}

// The row kernels below move W elements per thread: 16 bytes (packed<T>) when the row length and
// every pointer allow it, else 1. Each element's arithmetic is the same either way (same bits).
template <class T>
int row_vector_width(index_t cols, std::initializer_list<const void*> pointers) {
  if (cols % packed<T>::width != 0) return 1;
  for (const void* p : pointers)
    if (p != nullptr && !aligned_16(p)) return 1;
  return packed<T>::width;
}

template <class T, int W>
struct row_chunk {  // W elements of a row, read and written as one vector when W > 1
  storage_t<T> raw[W];
  __device__ __forceinline__ static row_chunk load_from(const T* p) {
    row_chunk out;
    if constexpr (W == packed<T>::width && W > 1) {
      const packed<T> v = *reinterpret_cast<const packed<T>*>(p);
#pragma unroll
      for (int w = 0; w < W; ++w) out.raw[w] = v.raw[w];
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) out.raw[w] = reinterpret_cast<const storage_t<T>*>(p)[w];
    }
    return out;
  }
  __device__ __forceinline__ void store_to(T* p) const {
    if constexpr (W == packed<T>::width && W > 1) {
      packed<T> v;
#pragma unroll
      for (int w = 0; w < W; ++w) v.raw[w] = raw[w];
      *reinterpret_cast<packed<T>*>(p) = v;
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) reinterpret_cast<storage_t<T>*>(p)[w] = raw[w];
    }
  }
};

template <class T, int W>
__global__ void moe_gather_rows_kernel(const T* in, index_t cols, const std::int32_t* rows, index_t n, T* out) {
  const index_t per_row = cols / W;
  for (index_t v = blockIdx.x * index_t(blockDim.x) + threadIdx.x; v < n * per_row; v += index_t(gridDim.x) * blockDim.x) {
    const index_t r = v / per_row, c = (v % per_row) * W;
    const std::int32_t row = rows[r];
    row_chunk<T, W> chunk{};
    if (row >= 0) chunk = row_chunk<T, W>::load_from(in + static_cast<index_t>(row) * cols + c);
    else
#pragma unroll
      for (int w = 0; w < W; ++w) chunk.raw[w] = pack<T>(accumulate_t<T>(0));
    chunk.store_to(out + r * cols + c);
  }
}
template <class T>
void moe_gather_rows(const T* in, index_t cols, const std::int32_t* rows, index_t n, T* out, cudaStream_t stream) {
  if (n * cols <= 0) return;
  if (row_vector_width<T>(cols, {in, out}) > 1) {
    constexpr int W = packed<T>::width;
    moe_gather_rows_kernel<T, W><<<grid_for(n * cols / W), kThreads, 0, stream>>>(in, cols, rows, n, out);
  } else {
    moe_gather_rows_kernel<T, 1><<<grid_for(n * cols), kThreads, 0, stream>>>(in, cols, rows, n, out);
  }
  check_launch("moe_gather_rows");
}

template <class T, class A, int W>
__global__ void moe_combine_kernel(const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k,
                                   index_t cols, T* out) {
  const index_t per_row = cols / W;
  for (index_t v = blockIdx.x * index_t(blockDim.x) + threadIdx.x; v < tokens * per_row; v += index_t(gridDim.x) * blockDim.x) {
    const index_t x = v / per_row, c = (v % per_row) * W;
    A sum[W];
#pragma unroll
    for (int w = 0; w < W; ++w) sum[w] = 0;
    for (index_t j = 0; j < k; ++j) {
      const std::int32_t s = slot[x * k + j];
      if (s < 0) continue;
      const auto chunk = row_chunk<T, W>::load_from(in + static_cast<index_t>(s) * cols + c);
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const A value = unpack<T>(chunk.raw[w]);
        sum[w] += weights ? weights[x * k + j] * value : value;
      }
    }
    row_chunk<T, W> result;
#pragma unroll
    for (int w = 0; w < W; ++w) result.raw[w] = pack<T>(sum[w]);
    result.store_to(out + x * cols + c);
  }
}
template <class T, class A>
void moe_combine(const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k, index_t cols, T* out,
                 cudaStream_t stream) {
  if (tokens * cols <= 0) return;
  if (row_vector_width<T>(cols, {in, out}) > 1) {
    constexpr int W = packed<T>::width;
    moe_combine_kernel<T, A, W><<<grid_for(tokens * cols / W), kThreads, 0, stream>>>(in, slot, weights, tokens, k, cols, out);
  } else {
    moe_combine_kernel<T, A, 1><<<grid_for(tokens * cols), kThreads, 0, stream>>>(in, slot, weights, tokens, k, cols, out);
  }
  check_launch("moe_combine");
}

template <class T, class A, int W>
__global__ void moe_combine_backward_input_kernel(const T* dy, const std::int32_t* slot, const A* weights, index_t tokens,
                                                  index_t k, index_t cols, T* d_in) {
  const index_t per_row = cols / W;
  for (index_t v = blockIdx.x * index_t(blockDim.x) + threadIdx.x; v < tokens * k * per_row;
       v += index_t(gridDim.x) * blockDim.x) {
    const index_t assignment = v / per_row, c = (v % per_row) * W, x = assignment / k;
    const std::int32_t s = slot[assignment];
    if (s < 0) continue;
    const A weight = weights ? weights[assignment] : A(1);
    auto chunk = row_chunk<T, W>::load_from(dy + x * cols + c);
#pragma unroll
    for (int w = 0; w < W; ++w) chunk.raw[w] = pack<T>(weight * unpack<T>(chunk.raw[w]));
    chunk.store_to(d_in + static_cast<index_t>(s) * cols + c);
  }
}
// One warp per assignment: the lanes take the columns in strides of 32 (coalesced), then a butterfly
// sum over the lanes, a fixed order (the same bits every run).
template <class T, class A>
__global__ void moe_combine_backward_weight_kernel(const T* dy, const T* in, const std::int32_t* slot, index_t tokens,
                                                   index_t k, index_t cols, A* dweights) {
  const unsigned lane = threadIdx.x % 32;
  const index_t warps = index_t(gridDim.x) * (blockDim.x / 32);
  for (index_t a = blockIdx.x * index_t(blockDim.x / 32) + threadIdx.x / 32; a < tokens * k; a += warps) {
    const std::int32_t s = slot[a];
    A dot = 0;
    if (s >= 0) {
      const T* row_dy = dy + (a / k) * cols;
      const T* row_in = in + static_cast<index_t>(s) * cols;
      for (index_t c = lane; c < cols; c += 32) dot += load(row_dy, c) * load(row_in, c);
    }
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (lane == 0) dweights[a] = dot;
  }
}
template <class T, class A>
void moe_combine_backward(const T* dy, const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k,
                          index_t cols, index_t slots, T* d_in, A* dweights, cudaStream_t stream) {
  if (slots * cols > 0) STRATA_CUDA_CHECK(cudaMemsetAsync(d_in, 0, sizeof(T) * slots * cols, stream));
  if (tokens * k * cols > 0) {
    if (row_vector_width<T>(cols, {dy, d_in}) > 1) {
      constexpr int W = packed<T>::width;
      moe_combine_backward_input_kernel<T, A, W><<<grid_for(tokens * k * cols / W), kThreads, 0, stream>>>(
          dy, slot, weights, tokens, k, cols, d_in);
    } else {
      moe_combine_backward_input_kernel<T, A, 1><<<grid_for(tokens * k * cols), kThreads, 0, stream>>>(
          dy, slot, weights, tokens, k, cols, d_in);
    }
    check_launch("moe_combine_backward");
  }
  if (dweights && tokens * k > 0) {
    moe_combine_backward_weight_kernel<T, A><<<grid_for(tokens * k * 32, 256), 256, 0, stream>>>(dy, in, slot, tokens, k,
                                                                                                  cols, dweights);
    check_launch("moe_combine_backward");
  }
}

template <class A>
__global__ void moe_aux_loss_kernel(const A* prob_sums, const A* counts, index_t n, double factor, double* loss,
                                    A* coefficients) {
  double sum = 0;
  for (index_t i = 0; i < n; ++i) {
    sum += static_cast<double>(prob_sums[i]) * static_cast<double>(counts[i]);
    coefficients[i] = static_cast<A>(factor * static_cast<double>(counts[i]));
  }
  loss[0] += factor * sum;
}
template <class A>
void moe_aux_loss(const A* prob_sums, const A* counts, index_t n, double factor, double* loss, A* coefficients,
                  cudaStream_t stream) {
  moe_aux_loss_kernel<A><<<1, 1, 0, stream>>>(prob_sums, counts, n, factor, loss, coefficients);
  check_launch("moe_aux_loss");
}

template <class A>
__global__ void moe_expert_bias_update_kernel(const A* counts, index_t experts, double rate, A* bias) {
  double mean = 0;
  for (index_t e = 0; e < experts; ++e) mean += static_cast<double>(counts[e]);
  mean /= static_cast<double>(experts);
  for (index_t e = 0; e < experts; ++e) {
    const double offset = mean - static_cast<double>(counts[e]);
    bias[e] = static_cast<A>(static_cast<double>(bias[e]) + rate * (offset > 0 ? 1.0 : (offset < 0 ? -1.0 : 0.0)));
  }
}
template <class A>
void moe_expert_bias_update(const A* counts, index_t experts, double rate, A* bias, cudaStream_t stream) {
  if (experts <= 0) return;
  moe_expert_bias_update_kernel<A><<<1, 1, 0, stream>>>(counts, experts, rate, bias);
  check_launch("moe_expert_bias_update");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
