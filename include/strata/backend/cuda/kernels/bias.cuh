// strata/backend/cuda/kernels/bias.cuh: bias_add and a deterministic bias_grad.
//
//   bias_add    y[r, c] += bias[c]                     y [rows, cols], bias [cols]
//   bias_grad   dbias[c] += sum_r dy[r, c]             accumulates, in A = accumulate_t<T>
//
// bias_add: where cols * sizeof(T) % 16 == 0 and y, bias are 16-byte aligned, a thread adds one
// 16-byte vector of bias to one 16-byte vector of y (one index division per vector); otherwise map's
// element loop.
//
// bias_grad never adds floats atomically: phase 1 splits the rows into `chunks` equal ranges
// (column_sum_chunks, a function of `rows` only) and writes one partial per (chunk, column); phase 2
// adds the partials of each column over the chunks in ascending order. Phase 1, vector path (cols a
// multiple of the 16-byte width V, dy aligned): a block of kColumnWarps warps takes a tile of 32 * V
// columns of one chunk; lane l of warp w adds the vectors dy[r, tile + l * V ..] of the rows
// r = begin + w, begin + w + kColumnWarps, ... in ascending order (a warp reads 512 contiguous bytes
// per row, eight rows in flight), and the block adds its warps' sums in warp order through shared
// memory. Otherwise a thread per column walks its chunk's rows in order.
// Phase 2 of the vector path runs in the same kernel when the caller passes `tickets` (one zeroed
// counter per column tile, cuda::backend keeps them): each block, once its partials are written
// and fenced, takes a ticket of its tile; the block that draws the last one adds the tile's
// partials (chunk 0, 1, ... in order), adds the totals into dbias and sets the counter back to 0
// for the next call on the stream. Without tickets (or more tiles than counters) sum_partials does
// phase 2 as a second kernel. Both add in sum_partials' order, so they give the same bits, and every
// run gives the same bits.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T>
struct bias_add_op {  // a = y
  const T* bias;
  index_t cols;
  __device__ accumulate_t<T> operator()(accumulate_t<T> y, accumulate_t<T>, index_t i) const {
    return y + load(bias, i % cols);  // y (rows, cols), bias (cols)
  }
};

// y (rows, cols) as `vectors` 16-byte vectors, row_vectors = cols / V of them per row.
template <class T>
__global__ void bias_add_vector_kernel(T* y, const T* __restrict__ bias, index_t vectors, index_t row_vectors) {
  using A = accumulate_t<T>;
  constexpr int V = packed<T>::width;
  packed<T>* yv = reinterpret_cast<packed<T>*>(y);
  const packed<T>* bv = reinterpret_cast<const packed<T>*>(bias);
  for (index_t v = blockIdx.x * index_t(blockDim.x) + threadIdx.x; v < vectors; v += index_t(gridDim.x) * blockDim.x) {
    packed<T> value = yv[v];
    const packed<T> add = bv[v % row_vectors];  // bias (cols / V)
#pragma unroll
    for (int k = 0; k < V; ++k) value.raw[k] = pack<T>(A(unpack<T>(value.raw[k]) + unpack<T>(add.raw[k])));
    yv[v] = value;
  }
}

template <class T>
void bias_add(T* y, const T* bias, index_t rows, index_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  constexpr int V = packed<T>::width;
  if (cols % V == 0 && aligned_16(y) && aligned_16(bias)) {
    const index_t vectors = rows * cols / V;
    bias_add_vector_kernel<T><<<grid_for(vectors), kThreads, 0, stream>>>(y, bias, vectors, cols / V);
    check_launch("bias_add");
    return;
  }
  map<T>(y, nullptr, rows * cols, y, bias_add_op<T>{bias, cols}, "bias_add", stream);
}

// Chunks of rows of the column sums: at least 128 rows each, at most kColumnMaxChunks (few enough
// partials for one block per column tile to add them up at the end). A function of `rows` only.
inline constexpr int kColumnMaxChunks = 64;
inline constexpr int kColumnFinishLoads = 2 * kPartialGroups;  // partials a finishing thread loads at once
static_assert(kColumnMaxChunks % kColumnFinishLoads == 0 && kColumnFinishLoads % kPartialGroups == 0);
STRATA_CUDA_INLINE index_t column_sum_chunks(index_t rows) {
  const index_t by_rows = (rows + 127) / 128;
  return by_rows < 1 ? 1 : (by_rows > kColumnMaxChunks ? kColumnMaxChunks : by_rows);
}

inline constexpr int kColumnWarps = 8;  // warps per block of the vector column sums
inline constexpr int kColumnRowsInFlight = 8;  // rows a lane loads before adding them

// partials[chunk, c] = sum of dy[r, c] over the rows r of the chunk: grid (column tiles, chunks).
// With tickets, the last block of each tile also adds the tile's partials into dbias (see above).
template <class T, class A = accumulate_t<T>>
__global__ void __launch_bounds__(kColumnWarps * 32) column_partials_vector_kernel(const T* __restrict__ dy, index_t rows,
                                                                                   index_t cols, index_t chunks, A* partials,
                                                                                   unsigned* tickets, A* dbias) {
  constexpr int V = packed<T>::width, kTile = 32 * V, R = kColumnRowsInFlight;
  __shared__ A sums[kColumnWarps][kTile];
  __shared__ bool last;
  const index_t chunk = blockIdx.y;
  const index_t per_chunk = (rows + chunks - 1) / chunks;
  const index_t begin = chunk * per_chunk, end = begin + per_chunk < rows ? begin + per_chunk : rows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const index_t row_vectors = cols / V;
  const packed<T>* dyv = reinterpret_cast<const packed<T>*>(dy);  // dy (rows, cols / V) vectors
  for (index_t tile = blockIdx.x; tile * kTile < cols; tile += gridDim.x) {
    const index_t v = tile * 32 + lane;  // this lane's vector within a row
    A sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0;
    if (v < row_vectors) {
      index_t r = begin + warp;
      // R rows' loads in flight at a time, added in ascending row order.
      for (; r + (R - 1) * kColumnWarps < end; r += R * kColumnWarps) {
        packed<T> in[R];
#pragma unroll
        for (int u = 0; u < R; ++u) in[u] = dyv[(r + u * kColumnWarps) * row_vectors + v];
#pragma unroll
        for (int u = 0; u < R; ++u)
#pragma unroll
          for (int k = 0; k < V; ++k) sum[k] += unpack<T>(in[u].raw[k]);
      }
      for (; r < end; r += kColumnWarps) {
        const packed<T> in = dyv[r * row_vectors + v];
#pragma unroll
        for (int k = 0; k < V; ++k) sum[k] += unpack<T>(in.raw[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) sums[warp][lane * V + k] = sum[k];
    __syncthreads();
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const index_t c = tile * kTile + i;
      if (c < cols) {
        A total = sums[0][i];
        for (int w = 1; w < kColumnWarps; ++w) total += sums[w][i];
        partials[chunk * cols + c] = total;  // partials (chunks, cols)
      }
    }
    if (tickets) {
      __threadfence();  // this block's partials are visible to the block that draws the last ticket
      __syncthreads();
      if (threadIdx.x == 0) last = atomicAdd(&tickets[tile], 1u) == static_cast<unsigned>(chunks - 1);
      __syncthreads();
      if (last) {
        __threadfence();
        for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
          const index_t c = tile * kTile + i;
          if (c >= cols) continue;
          // sum_partials' order, so both paths give the same bits: group y adds the chunks y, y + 16,
          // ... in ascending order, then the groups are added in order. kColumnFinishLoads loads in
          // flight (from L2, not a stale L1); the zeros past `chunks` add nothing (a group's sum is
          // never -0).
          A part[kPartialGroups];
#pragma unroll
          for (int y = 0; y < kPartialGroups; ++y) part[y] = 0;
#pragma unroll
          for (int base = 0; base < kColumnMaxChunks; base += kColumnFinishLoads) {
            A value[kColumnFinishLoads];
#pragma unroll
            for (int u = 0; u < kColumnFinishLoads; ++u)
              value[u] = base + u < chunks ? __ldcg(partials + (base + u) * cols + c) : A(0);
#pragma unroll
            for (int u = 0; u < kColumnFinishLoads; ++u) part[u % kPartialGroups] += value[u];
          }
          A total = part[0];
#pragma unroll
          for (int y = 1; y < kPartialGroups; ++y) total += part[y];
          dbias[c] += total;
        }
        if (threadIdx.x == 0) tickets[tile] = 0;  // ready for the next call on the stream
      }
    }
    __syncthreads();
  }
}

// The same sums, a thread per column (any cols, any alignment).
template <class T, class A = accumulate_t<T>>
__global__ void column_partials_kernel(const T* dy, index_t rows, index_t cols, index_t chunks, A* partials) {
  const index_t chunk = blockIdx.y;
  const index_t per_chunk = (rows + chunks - 1) / chunks;
  const index_t begin = chunk * per_chunk, end = begin + per_chunk < rows ? begin + per_chunk : rows;
  for (index_t c = blockIdx.x * index_t(blockDim.x) + threadIdx.x; c < cols; c += index_t(gridDim.x) * blockDim.x) {
    A sum = 0;
    for (index_t r = begin; r < end; ++r) sum += load(dy, r * cols + c);  // dy (rows, cols)
    partials[chunk * cols + c] = sum;                                     // partials (chunks, cols)
  }
}

// workspace: column_sum_chunks(rows) * cols elements of A. tickets: null, or `ticket_count` counters
// that are zero (and are zero again when the kernel ends).
template <class T, class A>
void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias, A* workspace, cudaStream_t stream,
               unsigned* tickets, index_t ticket_count) {
  if (cols <= 0 || rows <= 0) return;
  constexpr int V = packed<T>::width;
  const index_t chunks = column_sum_chunks(rows);
  if (cols % V == 0 && aligned_16(dy)) {
    const index_t tile_count = (cols + 32 * V - 1) / (32 * V);
    unsigned* used = tile_count <= ticket_count ? tickets : nullptr;
    const auto tiles = static_cast<unsigned>(std::min<index_t>(tile_count, 65535));
    column_partials_vector_kernel<T, A><<<dim3(tiles, static_cast<unsigned>(chunks)), kColumnWarps * 32, 0, stream>>>(
        dy, rows, cols, chunks, workspace, used, dbias);
    check_launch("bias_grad");
    if (!used) sum_partials<A, A>(workspace, chunks, cols, dbias, true, stream);
    return;
  }
  const dim3 grid(std::min<unsigned>(grid_for(cols), 65535u), static_cast<unsigned>(chunks));
  column_partials_kernel<T, A><<<grid, kThreads, 0, stream>>>(dy, rows, cols, chunks, workspace);
  check_launch("bias_grad");
  sum_partials<A, A>(workspace, chunks, cols, dbias, true, stream);
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
