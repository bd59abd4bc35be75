// strata/backend/cuda/kernels/elementwise.cuh: fill, convert, add, scale, scale_by and transpose.
//
//   fill       x[i] = value
//   convert    dst[i] = To(A(src[i])),  A = accumulate_t<From>
//   add        out[i] = a[i] + b[i]     in accumulate_t<X>; out may alias a or b
//   scale      x[i] *= factor           in accumulate_t<X>
//   scale_by   x[i] *= *factor          factor a device scalar in double (gradient clipping)
//   transpose  in [rows, cols] -> out [cols, rows], through a 32 x 33 shared tile (no bank conflicts)
//
// Grid-stride loops over 256-thread blocks; each element is independent, so results do not depend
// on the launch shape.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class X>
__global__ void fill_kernel(X* x, index_t n, double value) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    store(x, i, static_cast<accumulate_t<X>>(value));
}
template <class X>
void fill(X* x, index_t n, double value, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<X><<<grid_for(n), kThreads, 0, stream>>>(x, n, value);
  check_launch("fill");
}

template <class From, class To>
__global__ void convert_kernel(const From* src, index_t n, To* dst) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    store(dst, i, load(src, i));
}
template <class From, class To>
void convert(const From* src, index_t n, To* dst, cudaStream_t stream) {
  if (n <= 0) return;
  convert_kernel<From, To><<<grid_for(n), kThreads, 0, stream>>>(src, n, dst);
  check_launch("convert");
}

template <class X>
__global__ void add_kernel(const X* a, const X* b, index_t n, X* out) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    store(out, i, load(a, i) + load(b, i));
}
template <class X>
void add(const X* a, const X* b, index_t n, X* out, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<X><<<grid_for(n), kThreads, 0, stream>>>(a, b, n, out);
  check_launch("add");
}

template <class X>
__global__ void scale_kernel(X* x, index_t n, accumulate_t<X> factor) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    store(x, i, load(x, i) * factor);
}
template <class X>
void scale(X* x, index_t n, double factor, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<X><<<grid_for(n), kThreads, 0, stream>>>(x, n, static_cast<accumulate_t<X>>(factor));
  check_launch("scale");
}

template <class X>
__global__ void scale_by_kernel(X* x, index_t n, const double* factor) {
  const auto f = static_cast<accumulate_t<X>>(*factor);
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    store(x, i, load(x, i) * f);
}
template <class X>
void scale_by(X* x, index_t n, const double* factor, cudaStream_t stream) {
  if (n <= 0) return;
  scale_by_kernel<X><<<grid_for(n), kThreads, 0, stream>>>(x, n, factor);
  check_launch("scale_by");
}

// in [rows, cols] -> out [cols, rows]. Block (32, 8) moves a 32 x 32 tile: read rows of `in`
// coalesced into tile[row][col], write rows of `out` coalesced from tile[col][row].
template <class S>
__global__ void transpose_kernel(const S* in, index_t rows, index_t cols, S* out) {
  __shared__ S tile[32][33];
  for (index_t tile_row = blockIdx.y * index_t(32); tile_row < rows; tile_row += index_t(gridDim.y) * 32) {
    for (index_t tile_col = blockIdx.x * index_t(32); tile_col < cols; tile_col += index_t(gridDim.x) * 32) {
      for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        const index_t row = tile_row + r, col = tile_col + threadIdx.x;
        if (row < rows && col < cols) tile[r][threadIdx.x] = in[row * cols + col];  // in (rows, cols)
      }
      __syncthreads();
      for (int c = threadIdx.y; c < 32; c += blockDim.y) {
        const index_t col = tile_col + c, row = tile_row + threadIdx.x;
        if (row < rows && col < cols) out[col * rows + row] = tile[threadIdx.x][c];  // out (cols, rows)
      }
      __syncthreads();
    }
  }
}
template <class X>
void transpose(const X* in, index_t rows, index_t cols, X* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  using S = storage_t<X>;
  static_assert(sizeof(S) == sizeof(X), "transpose moves elements as raw storage of the same size.");
  const auto tiles = [](index_t extent) { return static_cast<unsigned>(std::min<index_t>((extent + 31) / 32, 65535)); };
  const dim3 grid(tiles(cols), tiles(rows)), block(32, 8);
  transpose_kernel<S><<<grid, block, 0, stream>>>(reinterpret_cast<const S*>(in), rows, cols, reinterpret_cast<S*>(out));
  check_launch("transpose");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
