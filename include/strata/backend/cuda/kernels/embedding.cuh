// strata/backend/cuda/kernels/embedding.cuh: vocabulary-parallel embedding gather and its
// deterministic scatter-add, and learned position embeddings.
//
//   embedding_forward   out[i, :] = weight[tokens[i] - row_begin, :] when row_begin <= tokens[i] <
//                       row_begin + rows_local, else 0          tokens [n], weight [rows_local, h], out [n, h]
//   embedding_backward  dweight[tokens[i] - row_begin, :] += dout[i, :] for the tokens held here;
//                       each row sums its positions in ascending order (accumulates, in A)
//   position_add        x[t, j, :] += weight[first + t, :]        x [s, b, h], weight [positions, h]
//   position_grad       dweight[first + t, :] += sum_j dy[t, j, :] (j ascending; accumulates, in A)
//
// The backward never adds floats atomically. A stable radix sort (CUB) of (local row, position)
// pairs puts the positions of each row next to each other, still ascending (the sort is stable and
// the positions enter in order); tokens held by another rank get the key rows_local and sort last.
// Then the thread at the start of each run of equal keys, for one column, adds that run's dout rows
// in order and adds the sum into dweight once. Same bits on every run. Workspace: see
// embedding_backward_workspace.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T>
__global__ void embedding_forward_kernel(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin,
                                         index_t rows_local, index_t h, T* out) {
  const index_t total = n * h;
  for (index_t e = blockIdx.x * index_t(blockDim.x) + threadIdx.x; e < total; e += index_t(gridDim.x) * blockDim.x) {
    const index_t i = e / h, c = e % h;  // out (n, h)
    const index_t row = static_cast<index_t>(tokens[i]) - row_begin;
    store(out, e, row >= 0 && row < rows_local ? load(weight, row * h + c) : accumulate_t<T>(0));  // weight (rows_local, h)
  }
}
template <class T>
void embedding_forward(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin, index_t rows_local,
                       index_t h, T* out, cudaStream_t stream) {
  if (n <= 0 || h <= 0) return;
  embedding_forward_kernel<T><<<grid_for(n * h), kThreads, 0, stream>>>(tokens, n, weight, row_begin, rows_local, h, out);
  check_launch("embedding_forward");
}

// keys[i] = local row of tokens[i] (rows_local when not held here), positions[i] = i.
template <class Key>
__global__ void embedding_keys_kernel(const Key* tokens, index_t n, index_t row_begin, index_t rows_local, Key* keys,
                                      Key* positions) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const index_t row = static_cast<index_t>(tokens[i]) - row_begin;
    keys[i] = static_cast<Key>(row >= 0 && row < rows_local ? row : rows_local);
    positions[i] = static_cast<Key>(i);
  }
}

// Block (256) over columns, grid.y over sorted entries: the entry that starts a run sums the run.
template <class T, class A = accumulate_t<T>>
__global__ void embedding_runs_kernel(const std::int32_t* sorted_keys, const std::int32_t* sorted_positions, index_t n,
                                      const T* dout, index_t rows_local, index_t h, A* dweight) {
  for (index_t s = blockIdx.y; s < n; s += gridDim.y) {
    const std::int32_t key = sorted_keys[s];
    if (key >= rows_local || (s > 0 && sorted_keys[s - 1] == key)) continue;
    for (index_t c = blockIdx.x * index_t(blockDim.x) + threadIdx.x; c < h; c += index_t(gridDim.x) * blockDim.x) {
      A sum = 0;
      for (index_t e = s; e < n && sorted_keys[e] == key; ++e) sum += load(dout, sorted_positions[e] * h + c);  // dout (n, h)
      dweight[key * h + c] += sum;  // dweight (rows_local, h)
    }
  }
}

// The key bits the sort looks at: keys lie in [0, rows_local].
STRATA_CUDA_INLINE int embedding_key_bits(index_t rows_local) {
  int end_bit = 1;
  while (end_bit < 31 && (index_t{1} << end_bit) <= rows_local) ++end_bit;
  return end_bit;
}

// Bytes of workspace embedding_backward needs for n tokens: four int32 arrays and CUB's scratch.
STRATA_CUDA_INLINE std::size_t embedding_backward_workspace(index_t n, index_t rows_local) {
  std::size_t cub_bytes = 0;
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const std::int32_t*>(nullptr),
                                                    static_cast<std::int32_t*>(nullptr),
                                                    static_cast<const std::int32_t*>(nullptr),
                                                    static_cast<std::int32_t*>(nullptr), static_cast<int>(n), 0,
                                                    embedding_key_bits(rows_local)));
  const std::size_t ints = (static_cast<std::size_t>(n) * sizeof(std::int32_t) + 255) / 256 * 256;
  return 4 * ints + cub_bytes;
}

template <class T, class A>
void embedding_backward(const std::int32_t* tokens, index_t n, const T* dout, index_t row_begin, index_t rows_local,
                        index_t h, A* dweight, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (n <= 0 || h <= 0 || rows_local <= 0) return;
  if (n > 0x7fffffff || rows_local > 0x7fffffff)
    fail<ShapeError>("cuda::embedding_backward: ", n, " tokens or ", rows_local,
                     " rows exceed the 32-bit sort keys; split the batch");
  const std::size_t ints = (static_cast<std::size_t>(n) * sizeof(std::int32_t) + 255) / 256 * 256;
  auto* bytes = static_cast<unsigned char*>(workspace);
  auto* keys = reinterpret_cast<std::int32_t*>(bytes);
  auto* positions = reinterpret_cast<std::int32_t*>(bytes + ints);
  auto* sorted_keys = reinterpret_cast<std::int32_t*>(bytes + 2 * ints);
  auto* sorted_positions = reinterpret_cast<std::int32_t*>(bytes + 3 * ints);
  void* cub_scratch = bytes + 4 * ints;
  std::size_t cub_bytes = workspace_bytes - 4 * ints;
  embedding_keys_kernel<std::int32_t><<<grid_for(n), kThreads, 0, stream>>>(tokens, n, row_begin, rows_local, keys, positions);
  check_launch("embedding_backward (keys)");
  const int end_bit = embedding_key_bits(rows_local);  // sorting only the keys' low bits is enough
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_scratch, cub_bytes, keys, sorted_keys, positions,
                                                    sorted_positions, static_cast<int>(n), 0, end_bit, stream));
  const dim3 grid(std::min<unsigned>(grid_for(h), 65535u), static_cast<unsigned>(std::min<index_t>(n, 65535)));
  embedding_runs_kernel<T, A><<<grid, kThreads, 0, stream>>>(sorted_keys, sorted_positions, n, dout, rows_local, h,
                                                            dweight);
  check_launch("embedding_backward");
}

template <class T>
__global__ void position_add_kernel(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first) {
  const index_t n = s * b * h;
  for (index_t e = blockIdx.x * index_t(blockDim.x) + threadIdx.x; e < n; e += index_t(gridDim.x) * blockDim.x) {
    const index_t t = e / (b * h), c = e % h;  // x (s, b, h)
    store(x, e, load(x, e) + load(weight, (first + t) * h + c));
  }
}
template <class T>
void position_add(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first, cudaStream_t stream) {
  if (s <= 0 || b <= 0 || h <= 0) return;
  position_add_kernel<T><<<grid_for(s * b * h), kThreads, 0, stream>>>(x, weight, s, b, h, first);
  check_launch("position_add");
}

template <class T, class A = accumulate_t<T>>
__global__ void position_grad_kernel(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight) {
  const index_t n = s * h;
  for (index_t e = blockIdx.x * index_t(blockDim.x) + threadIdx.x; e < n; e += index_t(gridDim.x) * blockDim.x) {
    const index_t t = e / h, c = e % h;
    A sum = 0;
    for (index_t j = 0; j < b; ++j) sum += load(dy, (t * b + j) * h + c);  // dy (s, b, h)
    dweight[(first + t) * h + c] += sum;
  }
}
template <class T, class A>
void position_grad(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight, cudaStream_t stream) {
  if (s <= 0 || h <= 0) return;
  position_grad_kernel<T, A><<<grid_for(s * h), kThreads, 0, stream>>>(dy, s, b, h, first, dweight);
  check_launch("position_grad");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
