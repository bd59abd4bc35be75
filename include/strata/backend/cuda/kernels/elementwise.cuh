// strata/backend/cuda/kernels/elementwise.cuh: fill, convert, add, scale, scale_by and transpose.
//
//   fill       x[i] = value
//   convert    dst[i] = To(A(src[i])),  A = accumulate_t<From>
//   add        out[i] = a[i] + b[i]     in accumulate_t<X>; out may alias a or b
//   scale      x[i] *= factor           in accumulate_t<X>
//   scale_by   x[i] *= *factor          factor a device scalar in double (gradient clipping)
//   transpose  in [rows, cols] -> out [cols, rows], through a 32 x 33 shared tile (no bank conflicts)
//
// fill, add, scale and scale_by run through map (common.cuh): 16-byte loads and stores when the
// pointers allow, a scalar loop otherwise; each element is independent, so results do not depend on
// the launch shape or on the path.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

// The element operations (a, b are the two inputs of map, i the index).
template <class A>
struct fill_op {
  A value;
  __device__ A operator()(A, A, index_t) const { return value; }
};
template <class A>
struct add_op {
  __device__ A operator()(A a, A b, index_t) const { return a + b; }
};
template <class A>
struct scale_op {
  A factor;
  __device__ A operator()(A a, A, index_t) const { return a * factor; }
};
template <class A>
struct scale_by_op {
  const double* factor;  // a device scalar, read by every element (one cached load)
  __device__ A operator()(A a, A, index_t) const { return a * static_cast<A>(*factor); }
};

template <class X>
void fill(X* x, index_t n, double value, cudaStream_t stream) {
  using A = accumulate_t<X>;
  map<X>(nullptr, nullptr, n, x, fill_op<A>{static_cast<A>(value)}, "fill", stream);
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
void add(const X* a, const X* b, index_t n, X* out, cudaStream_t stream) {
  map<X>(a, b, n, out, add_op<accumulate_t<X>>{}, "add", stream);
}

template <class X>
void scale(X* x, index_t n, double factor, cudaStream_t stream) {
  using A = accumulate_t<X>;
  map<X>(x, nullptr, n, x, scale_op<A>{static_cast<A>(factor)}, "scale", stream);
}

template <class X>
void scale_by(X* x, index_t n, const double* factor, cudaStream_t stream) {
  map<X>(x, nullptr, n, x, scale_by_op<accumulate_t<X>>{factor}, "scale_by", stream);
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
