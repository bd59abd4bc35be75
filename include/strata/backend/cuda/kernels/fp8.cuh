// strata/backend/cuda/kernels/fp8.cuh: the FP8 kernels, twins of backend/cpu/fp8.hpp (bit for bit).
//
//   fp8_amax            amax[0] = max(amax[0], max_i |x_i|)
//   fp8_cast            q_i = fp8(float(x_i) * scale[0]), amax folded in the same pass (optional)
//   fp8_cast_transpose  q [rows, cols] (unless null) and qt [cols, rows] in one pass through a 32 x 33
//                       tile, with amax
//   fp8_transpose       codes [rows, cols] -> [cols, rows] (the layouts cuBLASLt's FP8 GEMM needs)
//   fp8_update_scale    the scaling row's step update (core/fp8_recipe.hpp), one thread
//   fp8_align_scales    two scale factors copied to 16-byte aligned slots, one thread
//
// The amax is a max over the bits of non-negative floats (a NaN counts as the canonical quiet NaN,
// whose bits are the largest, so NaN wins, as on the CPU): each block reduces its threads' maxima with warp shuffles and one atomicMax, so
// the result does not depend on the launch shape or on timing. The cast uses the hardware's
// cvt.rn.satfinite (`__nv_cvt_float_to_fp8`) on sm_89 and newer and core/fp8.hpp's integer
// conversion elsewhere; the GPU suite checks they agree on every float.
#pragma once

#include <cuda_fp8.h>

#include "../../../core/fp8.hpp"
#include "../../../core/fp8_recipe.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

__device__ __forceinline__ std::uint8_t fp8_round(float v, Fp8Format format) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<std::uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2));
#else
  return fp8_encode(v, format);
#endif
}

template <class T>
__device__ __forceinline__ float fp8_load(const T* x, index_t i) {
  return static_cast<float>(unpack<T>(reinterpret_cast<const storage_t<T>*>(x)[i]));
}

// |v| as the bits the amax compares: any NaN becomes the canonical quiet NaN 0x7fc00000 (above
// every finite float and infinity), as on the CPU, whatever payload the input or the hardware's
// fabs gives it.
__device__ __forceinline__ unsigned fp8_abs_bits(float v) { return isnan(v) ? 0x7fc00000u : __float_as_uint(fabsf(v)); }

// The block's max of `bits` into *amax (bits of non-negative floats, compared as unsigned).
__device__ __forceinline__ void fp8_block_amax(unsigned bits, float* amax) {
  __shared__ unsigned warp_max[32];
  for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_down_sync(0xffffffffu, bits, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = bits;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    bits = lane < warps ? warp_max[lane] : 0u;
    for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_down_sync(0xffffffffu, bits, offset));
    if (lane == 0) atomicMax(reinterpret_cast<unsigned*>(amax), bits);
  }
}

template <class T>
__global__ void fp8_amax_kernel(const T* x, index_t n, float* amax) {
  unsigned bits = 0;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    bits = max(bits, fp8_abs_bits(fp8_load(x, i)));
  fp8_block_amax(bits, amax);
}

template <class T>
__global__ void fp8_cast_kernel(const T* x, index_t n, Fp8Format format, const float* scale, std::uint8_t* out, float* amax) {
  const float s = *scale;
  unsigned bits = 0;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const float v = fp8_load(x, i);
    bits = max(bits, fp8_abs_bits(v));
    out[i] = fp8_round(v * s, format);
  }
  if (amax) fp8_block_amax(bits, amax);
}

// One 32 x 32 tile per block iteration; blockDim (32, 8).
template <class T>
__global__ void fp8_cast_transpose_kernel(const T* x, index_t rows, index_t cols, Fp8Format format, const float* scale,
                                          std::uint8_t* out, std::uint8_t* out_t, float* amax) {
  __shared__ std::uint8_t tile[32][33];
  const float s = *scale;
  unsigned bits = 0;
  for (index_t tile_row = blockIdx.y * index_t(32); tile_row < rows; tile_row += index_t(gridDim.y) * 32)
    for (index_t tile_col = blockIdx.x * index_t(32); tile_col < cols; tile_col += index_t(gridDim.x) * 32) {
      for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        const index_t row = tile_row + r, col = tile_col + threadIdx.x;
        if (row < rows && col < cols) {
          const float v = fp8_load(x, row * cols + col);  // x (rows, cols)
          bits = max(bits, fp8_abs_bits(v));
          const std::uint8_t q = fp8_round(v * s, format);
          if (out) out[row * cols + col] = q;
          tile[r][threadIdx.x] = q;
        }
      }
      __syncthreads();
      for (int c = threadIdx.y; c < 32; c += blockDim.y) {
        const index_t col = tile_col + c, row = tile_row + threadIdx.x;
        if (row < rows && col < cols) out_t[col * rows + row] = tile[threadIdx.x][c];  // out_t (cols, rows)
      }
      __syncthreads();
    }
  if (amax) {
    // fp8_block_amax wants a 1-D block: flatten the (32, 8) block's thread index.
    __shared__ unsigned warp_max[8];
    const int flat = threadIdx.y * 32 + threadIdx.x;
    for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_down_sync(0xffffffffu, bits, offset));
    if (flat % 32 == 0) warp_max[flat / 32] = bits;
    __syncthreads();
    if (flat == 0) {
      unsigned m = 0;
      for (int w = 0; w < 8; ++w) m = max(m, warp_max[w]);
      atomicMax(reinterpret_cast<unsigned*>(amax), m);
    }
  }
}

// (Kernels are templates, so a header-defined kernel has one definition in every translation unit.)
template <class Byte = std::uint8_t>
__global__ void fp8_transpose_kernel(const Byte* in, index_t rows, index_t cols, Byte* out) {
  __shared__ Byte tile[32][33];
  for (index_t tile_row = blockIdx.y * index_t(32); tile_row < rows; tile_row += index_t(gridDim.y) * 32)
    for (index_t tile_col = blockIdx.x * index_t(32); tile_col < cols; tile_col += index_t(gridDim.x) * 32) {
      for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        const index_t row = tile_row + r, col = tile_col + threadIdx.x;
        if (row < rows && col < cols) tile[r][threadIdx.x] = in[row * cols + col];
      }
      __syncthreads();
      for (int c = threadIdx.y; c < 32; c += blockDim.y) {
        const index_t col = tile_col + c, row = tile_row + threadIdx.x;
        if (row < rows && col < cols) out[col * rows + row] = tile[threadIdx.x][c];
      }
      __syncthreads();
    }
}

// out[0] = *a, out[4] = *b: two scale factors into 16-byte aligned slots (cuBLASLt's scale pointers).
template <class F = float>
__global__ void fp8_align_scales_kernel(const F* a, const F* b, F* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out[0] = *a;
    out[4] = *b;
  }
}

template <class Args = Fp8UpdateArgs>
__global__ void fp8_update_scale_kernel(float* row, float max, Args args) {
  if (blockIdx.x == 0 && threadIdx.x == 0) fp8_update_row(row, max, args);
}

// The grids. A kernel that folds an amax ends each block with one atomicMax on the same word, and
// those serialize in L2: a grid of one block per 256 elements (65,536 blocks for a 4096 x 4096
// tensor) spent about 80 us per cast on an H100 in atomics alone. So those kernels run at most
// 8 blocks per multiprocessor (grid-stride loops; about a thousand atomics), the cast-transpose at
// most 32 x 32 blocks of tiles; the plain transpose, with no atomics, one block per tile.
inline dim3 fp8_tile_grid(index_t rows, index_t cols, index_t cap = 65535) {
  const auto tiles = [cap](index_t extent) { return static_cast<unsigned>(std::min<index_t>((extent + 31) / 32, cap)); };
  return dim3(tiles(cols), tiles(rows));
}
inline unsigned fp8_amax_grid(index_t n) {
  return std::min<unsigned>(grid_for(n), static_cast<unsigned>(8 * multiprocessor_count()));
}

template <class T>
void fp8_amax(const T* x, index_t n, float* amax, cudaStream_t stream) {
  if (n <= 0) return;
  fp8_amax_kernel<T><<<fp8_amax_grid(n), kThreads, 0, stream>>>(x, n, amax);
  check_launch("fp8_amax");
}
template <class T>
void fp8_cast(const T* x, index_t n, Fp8Format format, const float* scale, std::uint8_t* out, float* amax, cudaStream_t stream) {
  if (n <= 0) return;
  fp8_cast_kernel<T><<<amax ? fp8_amax_grid(n) : grid_for(n), kThreads, 0, stream>>>(x, n, format, scale, out, amax);
  check_launch("fp8_cast");
}
template <class T>
void fp8_cast_transpose(const T* x, index_t rows, index_t cols, Fp8Format format, const float* scale, std::uint8_t* out,
                        std::uint8_t* out_t, float* amax, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid = fp8_tile_grid(rows, cols, amax ? 32 : 65535);
  fp8_cast_transpose_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(x, rows, cols, format, scale, out, out_t, amax);
  check_launch("fp8_cast_transpose");
}
STRATA_CUDA_INLINE void fp8_transpose(const std::uint8_t* in, index_t rows, index_t cols, std::uint8_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  fp8_transpose_kernel<std::uint8_t><<<fp8_tile_grid(rows, cols), dim3(32, 8), 0, stream>>>(in, rows, cols, out);
  check_launch("fp8_transpose");
}
STRATA_CUDA_INLINE void fp8_align_scales(const float* a, const float* b, float* out, cudaStream_t stream) {
  fp8_align_scales_kernel<float><<<1, 1, 0, stream>>>(a, b, out);
  check_launch("fp8_align_scales");
}
static_assert(std::is_trivially_copyable_v<Fp8UpdateArgs>, "kernel arguments are trivially copyable");
STRATA_CUDA_INLINE void fp8_update_scale(float* row, float max, const Fp8UpdateArgs& args, cudaStream_t stream) {
  fp8_update_scale_kernel<Fp8UpdateArgs><<<1, 1, 0, stream>>>(row, max, args);
  check_launch("fp8_update_scale");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
