// strata/backend/cuda/kernels/common.cuh: what every kernel family shares: element loads and stores
// in the accumulate type, the launch shape of grid-stride loops, a deterministic block sum, and the
// launch check.
//
// Elements are strata's own types (float, double, strata::bf16, int32_t). A bf16 is read as its 16
// bits and widened to float; a float is rounded to bf16 to nearest even (__float2bfloat16_rn, the
// rounding of bf16::from_float). Every sum runs in a fixed order that depends on the sizes only
// (never on timing or on the device), so two runs of a kernel give the same bits.
//
// CUDA only: the CPU build never includes a .cuh header; each family's launchers are declared,
// with their default arguments, in launchers.hpp.
#pragma once

#if !defined(__CUDACC__)
#error "strata/backend/cuda/kernels/*.cuh are CUDA sources: compile them with nvcc, or build with the host compiler against the compiled kernels (link strata::cuda_kernels, which sets STRATA_CUDA_KERNELS_LIBRARY=1; kernels/launchers.hpp)."
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../../../core/dtype.hpp"
#include "../../../core/shape.hpp"
#include "../runtime.hpp"
#include "launchers.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

inline constexpr int kThreads = 256;  // threads per block of the element-wise kernels

// Blocks of a grid-stride loop over n elements (at most 64 Ki blocks, enough to fill any GPU).
inline unsigned grid_for(index_t n, int threads = kThreads) {
  const index_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

// The current device's multiprocessor count (asked once per thread and device).
inline int multiprocessor_count() {
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  thread_local int cached_device = -1, cached_count = 0;
  if (device != cached_device) {
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&cached_count, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  return cached_count;
}

// How many blocks of `threads` threads of `kernel` (no dynamic shared memory) one multiprocessor of
// the current device runs at once, at most `cap` (asked once per thread, device, kernel and size).
template <class Kernel>
int resident_blocks(Kernel* kernel, int threads, int cap) {
  struct Entry {
    int device;
    const void* kernel;
    int threads, blocks;
  };
  thread_local std::vector<Entry> known;
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  int blocks = -1;
  for (const Entry& e : known)
    if (e.device == device && e.kernel == reinterpret_cast<const void*>(kernel) && e.threads == threads) blocks = e.blocks;
  if (blocks < 0) {
    STRATA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
    known.push_back({device, reinterpret_cast<const void*>(kernel), threads, blocks});
  }
  return blocks < 1 ? 1 : (blocks > cap ? cap : blocks);
}

inline void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    fail<Error>("cuda kernel ", kernel, " failed to launch: ", cudaGetErrorName(status), ": ",
                cudaGetErrorString(status));
}

// Reads element i as accumulate_t<T>.
template <class T>
__device__ __forceinline__ accumulate_t<T> load(const T* p, index_t i) {
  if constexpr (std::is_same_v<T, bf16>) {
    const std::uint16_t bits = reinterpret_cast<const std::uint16_t*>(p)[i];
    return __uint_as_float(static_cast<unsigned>(bits) << 16);
  } else if constexpr (std::is_same_v<T, fp16>) {
    const std::uint16_t bits = reinterpret_cast<const std::uint16_t*>(p)[i];
    return __half2float(__ushort_as_half(bits));
  } else {
    return p[i];
  }
}

// Writes v (any arithmetic type) to element i of T, rounding to nearest even.
template <class T, class V>
__device__ __forceinline__ void store(T* p, index_t i, V v) {
  if constexpr (std::is_same_v<T, bf16>) {
    reinterpret_cast<std::uint16_t*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(v)));
  } else if constexpr (std::is_same_v<T, fp16>) {
    reinterpret_cast<std::uint16_t*>(p)[i] = __half_as_ushort(__float2half_rn(static_cast<float>(v)));
  } else {
    p[i] = static_cast<T>(v);
  }
}

// The raw storage of an element (moves bits without converting; shared memory needs a type with
// no constructor).
template <class T>
using storage_t = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                     std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;

// 16 bytes of elements: what one vector load or store moves.
template <class T>
struct alignas(16) packed {
  static constexpr int width = 16 / sizeof(T);
  storage_t<T> raw[width];
};

template <class T>
__device__ __forceinline__ accumulate_t<T> unpack(storage_t<T> raw) {
  if constexpr (std::is_same_v<T, bf16>) return __uint_as_float(static_cast<unsigned>(raw) << 16);
  else if constexpr (std::is_same_v<T, fp16>) return __half2float(__ushort_as_half(raw));
  else if constexpr (std::is_same_v<T, float>) return __uint_as_float(raw);
  else if constexpr (std::is_same_v<T, double>) return __longlong_as_double(static_cast<long long>(raw));
  else return static_cast<T>(raw);  // integers
}
template <class T>
__device__ __forceinline__ storage_t<T> pack(accumulate_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else if constexpr (std::is_same_v<T, fp16>) return __half_as_ushort(__float2half_rn(v));
  else if constexpr (std::is_same_v<T, float>) return __float_as_uint(v);
  else if constexpr (std::is_same_v<T, double>) return static_cast<storage_t<T>>(__double_as_longlong(v));
  else return static_cast<storage_t<T>>(v);  // integers
}

inline bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
inline bool aligned_8(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 8 == 0; }

// out[i] = op(a[i], b[i], i) for i < n, in A = accumulate_t<T>; a and b may be null (read as 0) and
// out may alias either. When every pointer is 16-byte aligned, each thread moves 16 bytes at a time
// (8 bf16, 4 float, 2 double) and a scalar loop does the tail; the results are the same either way.
template <class T, class Op>
__global__ void map_kernel(const T* a, const T* b, index_t n, T* out, Op op, bool vectorized) {
  using A = accumulate_t<T>;
  constexpr int width = packed<T>::width;
  const index_t first = blockIdx.x * index_t(blockDim.x) + threadIdx.x, stride = index_t(gridDim.x) * blockDim.x;
  index_t done = 0;
  if (vectorized) {
    const index_t vectors = n / width;
    for (index_t v = first; v < vectors; v += stride) {
      packed<T> in_a{}, in_b{}, result;
      if (a) in_a = reinterpret_cast<const packed<T>*>(a)[v];
      if (b) in_b = reinterpret_cast<const packed<T>*>(b)[v];
#pragma unroll
      for (int j = 0; j < width; ++j)
        result.raw[j] = pack<T>(op(a ? unpack<T>(in_a.raw[j]) : A(0), b ? unpack<T>(in_b.raw[j]) : A(0), v * width + j));
      reinterpret_cast<packed<T>*>(out)[v] = result;
    }
    done = vectors * width;
  }
  for (index_t i = done + first; i < n; i += stride) store(out, i, op(a ? load(a, i) : A(0), b ? load(b, i) : A(0), i));
}

template <class T, class Op>
void map(const T* a, const T* b, index_t n, T* out, Op op, const char* name, cudaStream_t stream) {
  static_assert(std::is_trivially_copyable_v<Op>, "A kernel argument must be trivially copyable: the element operation is copied to the device.");
  if (n <= 0) return;
  const bool vectorized = (!a || aligned_16(a)) && (!b || aligned_16(b)) && aligned_16(out);
  const index_t work = vectorized ? (n + packed<T>::width - 1) / packed<T>::width : n;
  map_kernel<T, Op><<<grid_for(work), kThreads, 0, stream>>>(a, b, n, out, op, vectorized);
  check_launch(name);
}

// Math in the accumulate type: float calls the single-precision functions, double the double ones.
template <class A>
__device__ __forceinline__ A exp_(A v) {
  if constexpr (std::is_same_v<A, float>) return expf(v); else return exp(v);
}
template <class A>
__device__ __forceinline__ A log_(A v) {
  if constexpr (std::is_same_v<A, float>) return logf(v); else return log(v);
}
template <class A>
__device__ __forceinline__ A sqrt_(A v) {
  if constexpr (std::is_same_v<A, float>) return sqrtf(v); else return sqrt(v);
}
template <class A>
__device__ __forceinline__ A max_(A a, A b) { return a > b ? a : b; }
// a * b rounded on its own, never fused into a following add (so a product computed twice is
// the same value both times, as on the host).
template <class A>
__device__ __forceinline__ A mul_rn(A a, A b) {
  if constexpr (std::is_same_v<A, float>) return __fmul_rn(a, b); else return __dmul_rn(a, b);
}

// Attention's rows, one warp each (attention_merge.cuh, attention_sink.cuh): f(row, h, at, lane) for
// every (query i, batch, head h) row of out [s, b, heads, d], row = (i b + batch) heads + h, with
// `at` = (batch heads + h) s + i its entry in lse [b, heads, s] and `lane` the thread's lane. The
// grid strides over the rows; launch grid_for(rows * 32) threads.
template <class F>
__device__ __forceinline__ void for_each_attention_row(index_t s, index_t b, index_t heads, F f) {
  constexpr int kWarp = 32;
  const index_t rows = s * b * heads;
  const int lane = threadIdx.x % kWarp;
  const index_t warps = index_t(gridDim.x) * (blockDim.x / kWarp);
  for (index_t row = (blockIdx.x * index_t(blockDim.x) + threadIdx.x) / kWarp; row < rows; row += warps) {
    const index_t h = row % heads, batch = (row / heads) % b, i = row / (heads * b);
    f(row, h, (batch * heads + h) * s + i, lane);
  }
}

// The sum of `value` over the block, returned to every thread. Fixed order: a butterfly within each
// warp, then warp 0 sums the per-warp results in order. blockDim.x is a multiple of 32, at most 1024.
template <class A>
__device__ A block_sum(A value) {
  __shared__ A partial[32];
  __shared__ A total;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // a previous call may still read `total`
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    A v = lane < warps ? partial[lane] : A(0);
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// The maximum of `value` over the block, returned to every thread (same shape as block_sum).
template <class A>
__device__ A block_max(A value) {
  __shared__ A partial[32];
  __shared__ A total;
  for (int offset = 16; offset > 0; offset /= 2) value = max_(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    A v = lane < warps ? partial[lane] : -INFINITY;
    for (int offset = 16; offset > 0; offset /= 2) v = max_(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// out[c] (= or +=) sum_{p < parts} partials[p, c] for c < cols (the second phase of the
// deterministic column sums: weight gradients of norms, bias gradients). A block of
// (32, kPartialGroups) threads takes 32 columns: thread (x, y) adds the parts p = y, y + groups, ...
// in ascending order, then thread (x, 0) adds the groups' subtotals in order y = 0, 1, ... The order
// depends on `parts` only, so every run gives the same bits. With `second`, columns c >= split go to
// second[c - split] (two sums from one array of partials, e.g. a norm's dg and db). The partials'
// rows are `stride` elements apart (cols when not given).
inline constexpr int kPartialGroups = 16;

template <class A, class Out>
__global__ void __launch_bounds__(32 * kPartialGroups) sum_partials_kernel(const A* __restrict__ partials, index_t parts,
                                                                           index_t cols, Out* first, bool accumulate,
                                                                           Out* second, index_t split, index_t stride) {
  __shared__ A subtotal[kPartialGroups][33];
  for (index_t tile = blockIdx.x; tile * 32 < cols; tile += gridDim.x) {
    const index_t c = tile * 32 + threadIdx.x;
    A part = 0;
    if (c < cols) {
#pragma unroll 8
      for (index_t p = threadIdx.y; p < parts; p += kPartialGroups) part += partials[p * stride + c];  // partials (parts, stride)
    }
    subtotal[threadIdx.y][threadIdx.x] = part;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      A total = subtotal[0][threadIdx.x];
      for (int y = 1; y < kPartialGroups; ++y) total += subtotal[y][threadIdx.x];
      Out* out = c < split ? first + c : second + (c - split);
      *out = static_cast<Out>(accumulate ? A(*out) + total : total);
    }
    __syncthreads();
  }
}

template <class A, class Out>
void sum_partials(const A* partials, index_t parts, index_t cols, Out* out, bool accumulate, cudaStream_t stream,
                  Out* second = nullptr, index_t split = -1, index_t stride = -1) {
  if (cols == 0) return;
  if (!second) split = cols;
  if (stride < 0) stride = cols;
  const auto tiles = static_cast<unsigned>(std::min<index_t>((cols + 31) / 32, 65535));
  sum_partials_kernel<A, Out><<<tiles, dim3(32, kPartialGroups), 0, stream>>>(partials, parts, cols, out, accumulate,
                                                                               second, split, stride);
  check_launch("sum_partials");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
