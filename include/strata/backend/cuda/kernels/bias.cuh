// strata/backend/cuda/kernels/bias.cuh: bias_add and a deterministic bias_grad.
//
//   bias_add    y[r, c] += bias[c]                     y [rows, cols], bias [cols]
//   bias_grad   dbias[c] += sum_r dy[r, c]             accumulates, in A = accumulate_t<T>
//
// bias_grad never adds floats atomically: phase 1 splits the rows into `chunks` equal ranges and
// writes one partial per (chunk, column) (a thread per column walks its chunk's rows in order, so
// neighbouring threads read neighbouring columns); phase 2 adds the partials of each column in chunk
// order. The chunk count is a function of `rows` only, so every run gives the same bits.
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
template <class T>
void bias_add(T* y, const T* bias, index_t rows, index_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  map<T>(y, nullptr, rows * cols, y, bias_add_op<T>{bias, cols}, "bias_add", stream);
}

// Rows per chunk of the column sums: at least 32 rows, at most 256 chunks.
inline index_t column_sum_chunks(index_t rows) {
  const index_t by_rows = (rows + 31) / 32;
  return by_rows < 1 ? 1 : (by_rows > 256 ? 256 : by_rows);
}

// partials[chunk, c] = sum of dy[r, c] over the rows r of the chunk, r ascending.
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

// workspace: column_sum_chunks(rows) * cols elements of A.
template <class T, class A = accumulate_t<T>>
void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias, A* workspace, cudaStream_t stream) {
  if (cols <= 0 || rows <= 0) return;
  const index_t chunks = column_sum_chunks(rows);
  const dim3 grid(std::min<unsigned>(grid_for(cols), 65535u), static_cast<unsigned>(chunks));
  column_partials_kernel<T, A><<<grid, kThreads, 0, stream>>>(dy, rows, cols, chunks, workspace);
  check_launch("bias_grad");
  sum_partials<A, A>(workspace, chunks, cols, dbias, true, stream);
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
