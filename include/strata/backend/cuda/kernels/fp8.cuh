// strata/backend/cuda/kernels/fp8.cuh: the FP8 kernels, twins of backend/cpu/fp8.hpp (bit for bit).
//
//   fp8_amax            amax[0] = max(amax[0], max_i |x_i|)
//   fp8_cast            q_i = fp8(float(x_i) * scale[0]), amax folded in the same pass (optional);
//                       eight elements a thread (16-byte loads, 8-byte stores)
//   fp8_cast_transpose  q [rows, cols] (unless null) and qt [cols, rows] in one pass through 64 x 65
//                       byte tiles in shared memory, with amax
//   fp8_cast_transpose_fused  the same of x, gelu(x), x gelu'(pre), SwiGLU or its backward (Fp8Producer), with the column
//                       sums of those values when asked (per-tile partials, then sum_partials); SwiGLU's
//                       backward a gate tile and its up twin a block (d, gate and up read once);
//                       with the backward producers, optionally also the codes of the forward's
//                       activation^T (gelu(pre), SwiGLU of pre) from the same read of pre
//   fp8_transpose       codes [rows, cols] -> [cols, rows] (the layouts cuBLASLt's FP8 GEMM needs)
//   fp8_update_scale    the scaling row's step update (core/fp8_recipe.hpp), one thread
//   fp8_update_scales   that of every row of many states (a thread per row), each new 1 / scale
//                       also copied to its 16-byte aligned slot
//   fp8_align_scales    two scale factors copied to 16-byte aligned slots, one thread
//   fp8_cast_blocks     the blockwise recipe's runs of B: along rows (one warp per run; B = 128:
//                       a half-warp, eight elements a lane) and, for x^T, along columns (B = 128:
//                       128 x 64 tiles through shared memory, x^T written 32 bytes a thread; else
//                       one thread per run), each run's scale from its amax
//   fp8_cast_tiles      B x B tiles, one block per tile, both layouts (B = 128: eight elements a
//                       thread, x^T through shared memory, 16-byte stores)
//   fp8_decode_blocks   codes times their block's 1 / scale, written as bf16 (exact: an FP8 value
//                       times a power of two is a bf16 value unless it falls below 2^-133), the
//                       operands of the block-scaled GEMM's fallback
//
// The amax is a max over the bits of non-negative floats (a NaN counts as the canonical quiet NaN,
// whose bits are the largest, so NaN wins, as on the CPU): each block reduces its threads' maxima with warp shuffles and one atomicMax, so
// the result does not depend on the launch shape or on timing. The cast uses the hardware's
// cvt.rn.satfinite (`__nv_cvt_float_to_fp8`, and its paired form for eight codes at a time) on
// sm_89 and newer and core/fp8.hpp's integer conversion elsewhere; the GPU suite checks they agree
// on every float.
#pragma once

#include <cuda_fp8.h>

#include <stdexcept>

#include "../../../core/fp8.hpp"
#include "../../../core/fp8_recipe.hpp"
#include "activation.cuh"
#include "common.cuh"
#include "fp8_codes.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T>
__device__ __forceinline__ float fp8_load(const T* x, index_t i) {
  return static_cast<float>(unpack<T>(reinterpret_cast<const storage_t<T>*>(x)[i]));
}

template <class T>
__global__ void fp8_amax_kernel(const T* x, index_t n, float* amax) {
  unsigned bits = 0;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    bits = max(bits, fp8_abs_bits(fp8_load(x, i)));
  fp8_block_amax(bits, amax);
}

// Eight elements of x from element i (x + i 16-byte aligned) as floats: one to four 16-byte loads.
template <class T>
__device__ __forceinline__ void fp8_load8(const T* x, index_t i, float (&v)[8]) {
  constexpr int width = packed<T>::width;  // 8 bf16, 4 float, 2 double
  static_assert(8 % width == 0, "eight elements are whole 16-byte vectors");
  const packed<T>* p = reinterpret_cast<const packed<T>*>(x + i);
#pragma unroll
  for (int k = 0; k < 8 / width; ++k) {
    const packed<T> chunk = p[k];
#pragma unroll
    for (int j = 0; j < width; ++j) v[k * width + j] = static_cast<float>(unpack<T>(chunk.raw[j]));
  }
}

// With `vectorized` (x 16-byte and out 8-byte aligned), each thread reads eight elements with
// 16-byte loads and writes their eight codes with one 8-byte store; a scalar loop does the tail.
template <class T>
__global__ void fp8_cast_kernel(const T* x, index_t n, Fp8Format format, const float* scale, std::uint8_t* out, float* amax,
                                bool vectorized) {
  const float s = *scale;
  unsigned bits = 0;
  const index_t first = blockIdx.x * index_t(blockDim.x) + threadIdx.x, stride = index_t(gridDim.x) * blockDim.x;
  index_t done = 0;
  if (vectorized) {
    const index_t vectors = n / 8;
    for (index_t v = first; v < vectors; v += stride) {
      float e[8];
      fp8_load8(x, v * 8, e);
      reinterpret_cast<uint2*>(out)[v] = fp8_round8(e, s, format, bits);
    }
    done = vectors * 8;
  }
  for (index_t i = done + first; i < n; i += stride) {
    const float v = fp8_load(x, i);
    bits = max(bits, fp8_abs_bits(v));
    out[i] = fp8_round(v * s, format);
  }
  if (amax) fp8_block_amax(bits, amax);
}

// The element a fused cast makes at (row, col) of its [rows, cols] output (Fp8Producer): x itself,
// T(gelu(x)), T(x gelu'(pre)), SwiGLU of x = [gate | up] [rows, 2 cols], or SwiGLU's backward into
// [d gate | d up] from x = the activation's gradient [rows, cols / 2] and pre [rows, cols]; in A, each
// computed by the op (or the expression) gelu_forward / gelu_backward / swiglu_forward /
// swiglu_backward compute and rounded to T as they store.
template <class T, class A = accumulate_t<T>>
__device__ __forceinline__ A fp8_swiglu_gradient(bool gate_half, A d, A gate, A up) {
  return gate_half ? swiglu_gate_gradient(d, gate, up) : swiglu_up_gradient(d, gate);
}
template <class T, Fp8Producer P, class A = accumulate_t<T>>
__device__ __forceinline__ A fp8_produce_at(const storage_t<T>* x, const storage_t<T>* pre, index_t row, index_t col,
                                            index_t cols) {
  if constexpr (P == Fp8Producer::copy) {
    return unpack<T>(x[row * cols + col]);
  } else if constexpr (P == Fp8Producer::gelu) {
    return unpack<T>(pack<T>(gelu_forward_op<A>{}(unpack<T>(x[row * cols + col]), A(0), 0)));
  } else if constexpr (P == Fp8Producer::gelu_backward) {
    const index_t i = row * cols + col;
    return unpack<T>(pack<T>(gelu_backward_op<A>{}(unpack<T>(x[i]), unpack<T>(pre[i]), 0)));
  } else if constexpr (P == Fp8Producer::swiglu) {
    const A gate = unpack<T>(x[row * 2 * cols + col]), up = unpack<T>(x[row * 2 * cols + cols + col]);
    return unpack<T>(pack<T>(swiglu_value(gate, up)));
  } else {  // swiglu_backward
    const index_t f = cols / 2, j = col < f ? col : col - f;
    const A gate = unpack<T>(pre[row * cols + j]), up = unpack<T>(pre[row * cols + f + j]), d = unpack<T>(x[row * f + j]);
    return unpack<T>(pack<T>(fp8_swiglu_gradient<T>(col < f, d, gate, up)));
  }
}
// Eight produced elements from (row, col) on, 16-byte loads (fp8_cast_transpose_fused checks the
// alignments). swiglu_backward makes its two halves together (fp8_swiglu_backward8).
template <class T, Fp8Producer P, class A = accumulate_t<T>>
__device__ __forceinline__ void fp8_produce8(const T* x, const T* pre, index_t row, index_t col, index_t cols, A (&v)[8]) {
  constexpr int width = packed<T>::width;  // 8 bf16, 4 float, 2 double
  static_assert(P != Fp8Producer::swiglu_backward, "swiglu_backward: fp8_swiglu_backward8");
  if constexpr (P == Fp8Producer::copy || P == Fp8Producer::gelu || P == Fp8Producer::gelu_backward) {
    const index_t i = row * cols + col;
    const packed<T>* px = reinterpret_cast<const packed<T>*>(x + i);
    const packed<T>* pp = reinterpret_cast<const packed<T>*>(pre + i);
#pragma unroll
    for (int k = 0; k < 8 / width; ++k) {
      const packed<T> chunk = px[k];
      packed<T> chunk_pre{};
      if constexpr (P == Fp8Producer::gelu_backward) chunk_pre = pp[k];
#pragma unroll
      for (int j = 0; j < width; ++j)
        v[k * width + j] = fp8_produce_at<T, P>(chunk.raw, chunk_pre.raw, 0, j, 0);
    }
  } else {  // swiglu: gate and up as runs of eight; the elements as fp8_produce_at makes them
    const packed<T>* pg = reinterpret_cast<const packed<T>*>(x + row * 2 * cols + col);
    const packed<T>* pu = reinterpret_cast<const packed<T>*>(x + row * 2 * cols + cols + col);
#pragma unroll
    for (int k = 0; k < 8 / width; ++k) {
      const packed<T> g = pg[k], u = pu[k];
#pragma unroll
      for (int j = 0; j < width; ++j) {
        const A gate = unpack<T>(g.raw[j]), up = unpack<T>(u.raw[j]);
        v[k * width + j] = unpack<T>(pack<T>(swiglu_value(gate, up)));
      }
    }
  }
}
// SwiGLU's backward at eight neighbouring j of one row, both halves from one read of d, gate and up
// (16-byte loads; j and f multiples of 8): dg[i] is the element at (row, j + i), du[i] the one at
// (row, f + j + i), each as fp8_produce_at makes it. With Act, also act[i] = the forward's SwiGLU at
// (row, j + i), as fp8_produce_at<swiglu> makes it.
template <class T, class A, bool Act = false>
__device__ __forceinline__ void fp8_swiglu_backward8(const T* x, const T* pre, index_t row, index_t j, index_t f, A (&dg)[8],
                                                     A (&du)[8], A (&act)[8]) {
  constexpr int width = packed<T>::width;
  const packed<T>* pg = reinterpret_cast<const packed<T>*>(pre + row * 2 * f + j);
  const packed<T>* pu = reinterpret_cast<const packed<T>*>(pre + row * 2 * f + f + j);
  const packed<T>* pd = reinterpret_cast<const packed<T>*>(x + row * f + j);
#pragma unroll
  for (int k = 0; k < 8 / width; ++k) {
    const packed<T> g = pg[k], u = pu[k], d = pd[k];
#pragma unroll
    for (int i = 0; i < width; ++i) {
      const A gate = unpack<T>(g.raw[i]), up = unpack<T>(u.raw[i]), dy = unpack<T>(d.raw[i]);
      dg[k * width + i] = unpack<T>(pack<T>(fp8_swiglu_gradient<T>(true, dy, gate, up)));
      du[k * width + i] = unpack<T>(pack<T>(fp8_swiglu_gradient<T>(false, dy, gate, up)));
      if constexpr (Act) act[k * width + i] = unpack<T>(pack<T>(swiglu_value(gate, up)));
    }
  }
}
// GELU's backward at eight neighbouring elements from index i (16-byte loads of x and pre), as
// fp8_produce8<gelu_backward> makes them, and act[j] = T(gelu(pre)) there, as fp8_produce8<gelu> of
// pre makes it: one read of pre for both.
template <class T, class A>
__device__ __forceinline__ void fp8_gelu_backward8(const T* x, const T* pre, index_t i, A (&v)[8], A (&act)[8]) {
  constexpr int width = packed<T>::width;
  const packed<T>* px = reinterpret_cast<const packed<T>*>(x + i);
  const packed<T>* pp = reinterpret_cast<const packed<T>*>(pre + i);
#pragma unroll
  for (int k = 0; k < 8 / width; ++k) {
    const packed<T> chunk = px[k], chunk_pre = pp[k];
#pragma unroll
    for (int j = 0; j < width; ++j) {
      v[k * width + j] = fp8_produce_at<T, Fp8Producer::gelu_backward>(chunk.raw, chunk_pre.raw, 0, j, 0);
      act[k * width + j] = fp8_produce_at<T, Fp8Producer::gelu>(chunk_pre.raw, chunk_pre.raw, 0, j, 0);
    }
  }
}

// The 64 x 64 byte tiles of fp8_cast_transpose_kernel, its SwiGLU-backward twin and
// fp8_transpose_kernel, in shared memory with rows of 65 bytes (so the eight rows a thread gathers
// fall in different banks), 256 threads a block.
inline constexpr int kFp8Tile = 64;
template <class Byte>
using Fp8TileRow = Byte[kFp8Tile + 1];

// Eight codes packed in `codes` (byte i of the word pair is element i) into row[0..7].
template <class Byte>
__device__ __forceinline__ void fp8_tile_put8(Byte* row, uint2 codes) {
#pragma unroll
  for (int i = 0; i < 8; ++i) row[i] = static_cast<Byte>((i < 4 ? codes.x : codes.y) >> (8 * (i % 4)));
}
// The codes of eight activation values into a shared-memory tile row (no amax: the forward folded it).
template <class A>
__device__ __forceinline__ void fp8_act_put8(std::uint8_t* row, const A (&act)[8], float s, Fp8Format format) {
  float e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = static_cast<float>(act[i]);
  unsigned ignored = 0;
  fp8_tile_put8(row, fp8_round8(e, s, format, ignored));
}

// Thread (line, eighth)'s part of writing a tile transposed: the tile's columns c = line and line + 32
// become rows out_row0 + c of out_t [.., rows] (those with c < valid), each from the eight bytes of
// tile rows eighth..eighth + 7, at columns row0 + eighth.. of out_t. A whole tile (vectorized, inside
// the tensor) stores each as one 8-byte word; an edge tile byte by byte, up to `rows`.
template <class Byte>
__device__ __forceinline__ void fp8_store_tile_transposed(const Fp8TileRow<Byte>* tile, bool whole, index_t out_row0,
                                                          index_t valid, index_t row0, index_t rows, Byte* out_t,
                                                          int line, int eighth) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int c = line + 32 * half;
    const index_t col = out_row0 + c, row = row0 + eighth;  // out_t (cols, rows)
    if (whole) {
      unsigned word[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 8; ++j) word[j / 4] |= static_cast<unsigned>(tile[eighth + j][c]) << (8 * (j % 4));
      *reinterpret_cast<uint2*>(out_t + col * rows + row) = make_uint2(word[0], word[1]);
    } else if (c < valid) {
      for (int j = 0; j < 8 && row + j < rows; ++j) out_t[col * rows + row + j] = tile[eighth + j][c];
    }
  }
}

// Tiles of 64 x 64 elements, 256 threads, a grid-stride loop over the tiles. Reading, thread t takes
// eight neighbouring columns (8 (t % 8) ...) of rows t / 8 and t / 8 + 32; writing x^T, eight
// neighbouring rows of the tile's columns t / 8 and t / 8 + 32 from shared memory (rows of 65
// bytes, so the eight rows a thread gathers fall in different banks). Whole tiles with `vectorized`
// (x and pre 16-byte aligned, out and out_t 8-byte aligned, rows and cols multiples of 8) move
// 16-byte loads and 8-byte stores; tiles at the edges element by element.
// The elements are x's or what P produces from x and pre (fp8_produce; swiglu_backward has a kernel
// of its own, fp8_cast_transpose_swiglu_backward_kernel, below). With `Sums`, the column sums
// of the produced elements: each thread adds its two rows, the 32 lines of a column are added in line
// order through shared memory, and the tile's sums go to partials[tile row, column], which
// sum_partials then adds over the tile rows in order (deterministic: no atomics). Without out_t, no
// x^T is written. With Act (P gelu_backward), also act_t [cols, rows] = the codes of T(gelu(pre))^T
// with act_format and act_scale, through a second tile, from the same loads of pre.
template <class T, Fp8Producer P = Fp8Producer::copy, bool Sums = false, class A = accumulate_t<T>, bool Act = false>
__global__ void __launch_bounds__(256) fp8_cast_transpose_kernel(const T* x, const T* pre, index_t rows, index_t cols,
                                                                 Fp8Format format, const float* scale, std::uint8_t* out,
                                                                 std::uint8_t* out_t, float* amax, A* partials, bool vectorized,
                                                                 Fp8Format act_format, const float* act_scale,
                                                                 std::uint8_t* act_t) {
  static_assert(!Act || P == Fp8Producer::gelu_backward, "fp8_cast_transpose_kernel: activation codes with gelu_backward");
  __shared__ std::uint8_t tile[kFp8Tile][kFp8Tile + 1];
  __shared__ std::uint8_t act_tile[Act ? kFp8Tile : 1][kFp8Tile + 1];
  __shared__ A line_sums[Sums ? 32 : 1][Sums ? kFp8Tile : 1];
  const float s = *scale;
  float act_s = 0.0f;
  if constexpr (Act) act_s = *act_scale;
  unsigned bits = 0;
  const index_t tiles_c = (cols + kFp8Tile - 1) / kFp8Tile, tiles = ((rows + kFp8Tile - 1) / kFp8Tile) * tiles_c;
  const int eighth = (threadIdx.x % 8) * 8, line = threadIdx.x / 8;  // 0, 8, ..., 56 and 0..31
  const auto* xs = reinterpret_cast<const storage_t<T>*>(x);
  const auto* ps = reinterpret_cast<const storage_t<T>*>(pre);
  for (index_t id = blockIdx.x; id < tiles; id += gridDim.x) {
    const index_t row0 = (id / tiles_c) * kFp8Tile, col0 = (id % tiles_c) * kFp8Tile;
    const bool whole = vectorized && row0 + kFp8Tile <= rows && col0 + kFp8Tile <= cols;
    A column[8] = {};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = line + 32 * half;
      const index_t row = row0 + r, col = col0 + eighth;
      A v[8];
      if constexpr (Act) {
        A act[8];
        if (whole) {
          fp8_gelu_backward8<T>(x, pre, row * cols + col, v, act);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const bool in = row < rows && col + j < cols;
            v[j] = in ? fp8_produce_at<T, P>(xs, ps, row, col + j, cols) : A(0);  // 0: no amax, no sum
            act[j] = in ? fp8_produce_at<T, Fp8Producer::gelu>(ps, ps, row, col + j, cols) : A(0);
          }
        }
        fp8_act_put8(act_tile[r] + eighth, act, act_s, act_format);
      } else if (whole) {
        fp8_produce8<T, P>(x, pre, row, col, cols, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          v[j] = row < rows && col + j < cols ? fp8_produce_at<T, P>(xs, ps, row, col + j, cols) : A(0);  // 0: no amax, no sum
      }
      float e[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        e[j] = static_cast<float>(v[j]);
        if constexpr (Sums) column[j] += v[j];
      }
      const uint2 codes = fp8_round8(e, s, format, bits);
      fp8_tile_put8(tile[r] + eighth, codes);
      if (out) {
        if (whole) {
          *reinterpret_cast<uint2*>(out + row * cols + col) = codes;
        } else if (row < rows) {
          for (int j = 0; j < 8 && col + j < cols; ++j) out[row * cols + col + j] = tile[r][eighth + j];
        }
      }
    }
    if constexpr (Sums) {
#pragma unroll
      for (int j = 0; j < 8; ++j) line_sums[line][eighth + j] = column[j];
    }
    __syncthreads();
    if constexpr (Sums) {
      if (threadIdx.x < kFp8Tile && col0 + threadIdx.x < cols) {
        A total = line_sums[0][threadIdx.x];
        for (int l = 1; l < 32; ++l) total += line_sums[l][threadIdx.x];
        partials[(row0 / kFp8Tile) * cols + col0 + threadIdx.x] = total;  // partials (tile rows, cols)
      }
    }
    if (out_t) fp8_store_tile_transposed<std::uint8_t>(tile, whole, col0, cols - col0, row0, rows, out_t, line, eighth);
    if constexpr (Act) fp8_store_tile_transposed<std::uint8_t>(act_tile, whole, col0, cols - col0, row0, rows, act_t, line, eighth);
    __syncthreads();
  }
  if (amax) fp8_block_amax(bits, amax);
}

// SwiGLU's backward cast, [rows, cols] = [d gate | d up] with f = cols / 2: a block takes the 64 x 64
// tile of the gate half at (row0, j0) and its twin of the up half at (row0, f + j0) together, so d,
// gate and up are read once for both (fp8_cast_transpose_kernel's way would read each twice, once a
// tile). Threads, shared-memory tiles (one for each half), edges and column sums as in
// fp8_cast_transpose_kernel, whose codes, amax and partials this kernel's are bit for bit (the
// elements, their tile rows and the order of each column's sum are the same). With Act, also act_t
// [f, rows] = the codes of the forward's SwiGLU of pre, transposed, with act_format and act_scale
// (a third tile; from the same loads of gate and up).
template <class T, bool Sums = false, class A = accumulate_t<T>, bool Edges = true, bool Act = false>
__global__ void __launch_bounds__(256, 1) fp8_cast_transpose_swiglu_backward_kernel(const T* x, const T* pre, index_t rows,
                                                                                 index_t cols, Fp8Format format,
                                                                                 const float* scale, std::uint8_t* out,
                                                                                 std::uint8_t* out_t, float* amax, A* partials,
                                                                                 bool vectorized, Fp8Format act_format,
                                                                                 const float* act_scale, std::uint8_t* act_t) {
  constexpr Fp8Producer P = Fp8Producer::swiglu_backward;
  __shared__ std::uint8_t tile[Act ? 3 : 2][kFp8Tile][kFp8Tile + 1];  // d gate's, d up's (and the activation's)
  __shared__ A line_sums[Sums ? 32 : 1][Sums ? 2 * kFp8Tile : 1];
  const float s = *scale;
  float act_s = 0.0f;
  if constexpr (Act) act_s = *act_scale;
  unsigned bits = 0;
  const index_t f = cols / 2, tiles_c = (f + kFp8Tile - 1) / kFp8Tile, tiles = ((rows + kFp8Tile - 1) / kFp8Tile) * tiles_c;
  const int eighth = (threadIdx.x % 8) * 8, line = threadIdx.x / 8;  // 0, 8, ..., 56 and 0..31
  const auto* xs = reinterpret_cast<const storage_t<T>*>(x);
  const auto* ps = reinterpret_cast<const storage_t<T>*>(pre);
  for (index_t id = blockIdx.x; id < tiles; id += gridDim.x) {
    const index_t row0 = (id / tiles_c) * kFp8Tile, j0 = (id % tiles_c) * kFp8Tile;
    const bool whole = !Edges || (vectorized && row0 + kFp8Tile <= rows && j0 + kFp8Tile <= f);
    A column[2][8] = {};
    // half g's eight elements of tile row r: their codes into the shared tile (returned), their
    // column sums, their amax
    const auto put_codes = [&](int g, int r, const A (&v)[8]) {
      float e[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        e[i] = static_cast<float>(v[i]);
        if constexpr (Sums) column[g][i] += v[i];
      }
      const uint2 codes = fp8_round8(e, s, format, bits);
      fp8_tile_put8(tile[g][r] + eighth, codes);
      return codes;
    };
    // The two row halves of the tile pair one at a time (tile rows r = line and line + 32), whole
    // tiles by 16-byte loads and 8-byte stores, edge tiles element by element. The launch bounds
    // name one block a multiprocessor, so the compiler keeps what it needs (71 registers without
    // Edges, 3 blocks resident) rather than aiming at more blocks: 246 us against 265 us for the
    // halves unrolled at 64 registers (4 blocks), the Llama's [8192, 16384] on an H100. Capping the
    // registers for more resident blocks (40 or 32: 6 or 8 blocks) was slower still. Without Edges
    // (every tile whole: the launcher's choice where the shape and the alignments allow) the kernel
    // holds no edge code.
    if (whole) {
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const int r = line + 32 * half;
        const index_t row = row0 + r, j = j0 + eighth;
        A v[2][8];  // (row, j..) of d gate, of d up
        A act[Act ? 8 : 1][8];
        fp8_swiglu_backward8<T, A, Act>(x, pre, row, j, f, v[0], v[1], act[0]);
        if constexpr (Act) fp8_act_put8(tile[2][r] + eighth, act[0], act_s, act_format);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          const uint2 codes = put_codes(g, r, v[g]);
          if (out) *reinterpret_cast<uint2*>(out + row * cols + g * f + j) = codes;
        }
      }
    } else if constexpr (Edges) {
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const int r = line + 32 * half;
        const index_t row = row0 + r, j = j0 + eighth;
        A v[2][8];
        A act[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const bool in = row < rows && j + i < f;
          v[0][i] = in ? fp8_produce_at<T, P>(xs, ps, row, j + i, cols) : A(0);  // 0: no amax, no sum
          v[1][i] = in ? fp8_produce_at<T, P>(xs, ps, row, f + j + i, cols) : A(0);
          if constexpr (Act) act[i] = in ? fp8_produce_at<T, Fp8Producer::swiglu>(ps, ps, row, j + i, f) : A(0);
        }
        if constexpr (Act) fp8_act_put8(tile[2][r] + eighth, act, act_s, act_format);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          (void)put_codes(g, r, v[g]);
          if (out && row < rows)
            for (int i = 0; i < 8 && j + i < f; ++i) out[row * cols + g * f + j + i] = tile[g][r][eighth + i];
        }
      }
    }
    if constexpr (Sums) {
#pragma unroll
      for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) line_sums[line][g * kFp8Tile + eighth + i] = column[g][i];
    }
    __syncthreads();
    if constexpr (Sums) {
      const int g = threadIdx.x / kFp8Tile, c = threadIdx.x % kFp8Tile;
      if (g < 2 && j0 + c < f) {
        A total = line_sums[0][threadIdx.x];
        for (int l = 1; l < 32; ++l) total += line_sums[l][threadIdx.x];
        partials[(row0 / kFp8Tile) * cols + g * f + j0 + c] = total;  // partials (tile rows, cols)
      }
    }
#pragma unroll
    for (int g = 0; g < 2; ++g)
      if (out_t) fp8_store_tile_transposed<std::uint8_t>(tile[g], whole, g * f + j0, f - j0, row0, rows, out_t, line, eighth);
    if constexpr (Act) fp8_store_tile_transposed<std::uint8_t>(tile[2], whole, j0, f - j0, row0, rows, act_t, line, eighth);
    __syncthreads();
  }
  if (amax) fp8_block_amax(bits, amax);
}

// codes [rows, cols] -> [cols, rows]. A block moves 64 x 64 tiles through shared memory as
// fp8_cast_transpose_kernel moves its codes: thread t reads eight bytes of rows t / 8 and t / 8 + 32
// (one 8-byte load each) and writes eight bytes of two rows of the output (one 8-byte store each);
// tiles at the edges, and every tile where rows or cols is not a multiple of 8 or a pointer is not
// 8-byte aligned (vectorized false), a byte at a time. (A 32 x 32 tile of byte loads and stores ran
// at a quarter of the copy bandwidth.) Kernels are templates, so a header-defined kernel has one
// definition in every translation unit.
template <class Byte = std::uint8_t>
__global__ void __launch_bounds__(256) fp8_transpose_kernel(const Byte* in, index_t rows, index_t cols, Byte* out,
                                                            bool vectorized) {
  __shared__ Byte tile[kFp8Tile][kFp8Tile + 1];
  const index_t tiles_c = (cols + kFp8Tile - 1) / kFp8Tile, tiles = ((rows + kFp8Tile - 1) / kFp8Tile) * tiles_c;
  const int eighth = (threadIdx.x % 8) * 8, line = threadIdx.x / 8;  // 0, 8, ..., 56 and 0..31
  for (index_t id = blockIdx.x; id < tiles; id += gridDim.x) {
    const index_t row0 = (id / tiles_c) * kFp8Tile, col0 = (id % tiles_c) * kFp8Tile;
    const bool whole = vectorized && row0 + kFp8Tile <= rows && col0 + kFp8Tile <= cols;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = line + 32 * half;
      const index_t row = row0 + r, col = col0 + eighth;
      if (whole) {
        fp8_tile_put8(tile[r] + eighth, *reinterpret_cast<const uint2*>(in + row * cols + col));
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) tile[r][eighth + i] = row < rows && col + i < cols ? in[row * cols + col + i] : Byte{0};
      }
    }
    __syncthreads();
    fp8_store_tile_transposed<Byte>(tile, whole, col0, cols - col0, row0, rows, out, line, eighth);
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
// A thread per row: row j = 3 i + r of the count states' rows [count, 3, stride], with role r's max;
// its new 1 / scale also at aligned[4 j] (when set).
template <class Args = Fp8UpdateArgs>
__global__ void fp8_update_scales_kernel(float* rows, index_t count, index_t stride, Fp8RoleMaxes maxes, Args args,
                                         float* aligned) {
  for (index_t j = blockIdx.x * index_t(blockDim.x) + threadIdx.x; j < count * kFp8Roles; j += index_t(gridDim.x) * blockDim.x) {
    float* row = rows + j * stride;
    fp8_update_row(row, maxes.value[j % kFp8Roles], args);
    if (aligned) aligned[4 * j] = row[args.history + 1];
  }
}

// ---- the blockwise recipe (core/fp8_recipe.hpp; the twins are cpu::fp8_cast_blocks / _tiles) ----

__device__ __forceinline__ index_t fp8_min(index_t a, index_t b) { return a < b ? a : b; }

// One warp per run of B along a row: the lanes' maxima by shuffles, the scale from the run's amax.
template <class T>
__global__ void fp8_cast_runs_kernel(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block,
                                     std::uint8_t* q, float* q_scale_inv) {
  const index_t runs = (cols + block - 1) / block, warps = index_t(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  const float limit = fp8_max(format);
  for (index_t id = (blockIdx.x * index_t(blockDim.x) + threadIdx.x) / 32; id < rows * runs; id += warps) {
    const index_t r = id / runs, kb = id % runs, c0 = kb * block, c1 = fp8_min(cols, c0 + block);
    unsigned bits = 0;
    for (index_t c = c0 + lane; c < c1; c += 32) bits = max(bits, fp8_abs_bits(fp8_load(x, r * cols + c)));
    for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
    const float scale = fp8_block_scale(__uint_as_float(bits), limit);
    for (index_t c = c0 + lane; c < c1; c += 32) q[r * cols + c] = fp8_round(fp8_load(x, r * cols + c) * scale, format);
    if (lane == 0) q_scale_inv[kb * rows + r] = 1.0f / scale;
  }
}

// One thread per run of B along a column (x^T's rows): neighbouring threads read neighbouring columns.
template <class T>
__global__ void fp8_cast_column_runs_kernel(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block,
                                            std::uint8_t* qt, float* qt_scale_inv) {
  const index_t runs = (rows + block - 1) / block;
  const float limit = fp8_max(format);
  for (index_t id = blockIdx.x * index_t(blockDim.x) + threadIdx.x; id < runs * cols; id += index_t(gridDim.x) * blockDim.x) {
    const index_t c = id % cols, rb = id / cols, r0 = rb * block, r1 = fp8_min(rows, r0 + block);
    unsigned bits = 0;
    for (index_t r = r0; r < r1; ++r) bits = max(bits, fp8_abs_bits(fp8_load(x, r * cols + c)));
    const float scale = fp8_block_scale(__uint_as_float(bits), limit);
    for (index_t r = r0; r < r1; ++r) qt[c * rows + r] = fp8_round(fp8_load(x, r * cols + c) * scale, format);
    qt_scale_inv[rb * cols + c] = 1.0f / scale;
  }
}

// Runs of 128 along rows (the blockwise recipe's length on a GPU), with cols a multiple of 128, x
// 16-byte and q 8-byte aligned: a half-warp per run, each lane eight elements read once (16-byte
// loads) and their codes written with one 8-byte store; the same codes and scales as
// fp8_cast_runs_kernel.
inline constexpr int kFp8Run = 128;
template <class T>
__global__ void fp8_cast_runs128_kernel(const T* x, index_t rows, index_t cols, Fp8Format format, std::uint8_t* q,
                                        float* q_scale_inv) {
  const index_t runs = cols / kFp8Run, halves = index_t(gridDim.x) * (blockDim.x / 16);
  const int lane = threadIdx.x % 16;
  const unsigned mask = 0xffffu << (threadIdx.x % 32 / 16 * 16);  // this half-warp's lanes
  const float limit = fp8_max(format);
  for (index_t id = (blockIdx.x * index_t(blockDim.x) + threadIdx.x) / 16; id < rows * runs; id += halves) {
    const index_t r = id / runs, kb = id % runs, at = r * cols + kb * kFp8Run + lane * 8;
    float v[8];
    fp8_load8(x, at, v);
    unsigned bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) bits = max(bits, fp8_abs_bits(v[j]));
    for (int offset = 8; offset > 0; offset /= 2) bits = max(bits, __shfl_xor_sync(mask, bits, offset));
    const float scale = fp8_block_scale(__uint_as_float(bits), limit);
    unsigned folded = 0;
    *reinterpret_cast<uint2*>(q + at) = fp8_round8(v, scale, format, folded);
    if (lane == 0) q_scale_inv[kb * rows + r] = 1.0f / scale;
  }
}

// Runs of 128 along columns into x^T [cols, rows] (block 128): one block per tile of 128 rows x 64
// columns, read once into shared memory (a warp reads 32 neighbouring columns of a row), each
// column's amax from four threads; then thread (column c, quarter p) writes the codes of rows
// 32 p .. 32 p + 31 of column c: 32 neighbouring bytes of x^T, two 16-byte stores where
// `vector_stores` (rows a multiple of 16, qt 16-byte aligned) and the quarter is whole. The same
// codes and scales as fp8_cast_column_runs_kernel, which wrote x^T a byte at a time, 32 rows apart.
inline constexpr int kFp8ColumnTile = 64;
template <class T>
__global__ void __launch_bounds__(256) fp8_cast_column_runs128_kernel(const T* x, index_t rows, index_t cols, Fp8Format format,
                                                                     std::uint8_t* qt, float* qt_scale_inv, bool vector_stores) {
  constexpr int B = kFp8Run, W = kFp8ColumnTile;
  __shared__ float tile[B][W + 1];  // + 1: a warp's 32 columns of one row fall in 32 banks
  __shared__ unsigned quarter_bits[4][W];
  const index_t col_tiles = (cols + W - 1) / W, tiles = (rows + B - 1) / B * col_tiles;
  const int c = threadIdx.x % W, quarter = threadIdx.x / W;
  const float limit = fp8_max(format);
  for (index_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const index_t rb = t / col_tiles, r0 = rb * B, c0 = t % col_tiles * W;
    const int nr = static_cast<int>(fp8_min(B, rows - r0)), nc = static_cast<int>(fp8_min(W, cols - c0));
    unsigned bits = 0;
    if (c < nc)
      for (int i = quarter; i < nr; i += 4) {
        const float v = fp8_load(x, (r0 + i) * cols + c0 + c);
        tile[i][c] = v;
        bits = max(bits, fp8_abs_bits(v));
      }
    quarter_bits[quarter][c] = bits;
    __syncthreads();
    bits = max(max(quarter_bits[0][c], quarter_bits[1][c]), max(quarter_bits[2][c], quarter_bits[3][c]));
    const float scale = fp8_block_scale(__uint_as_float(bits), limit);
    if (c < nc) {
      const int i0 = quarter * 32, i1 = i0 + 32 < nr ? i0 + 32 : nr;
      std::uint8_t* out = qt + (c0 + c) * rows + r0;
      if (vector_stores && i1 - i0 == 32) {
        unsigned folded = 0;
        uint2 codes[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          float v[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = tile[i0 + 8 * g + k][c];
          codes[g] = fp8_round8(v, scale, format, folded);
        }
        uint4* to = reinterpret_cast<uint4*>(out + i0);
        to[0] = make_uint4(codes[0].x, codes[0].y, codes[1].x, codes[1].y);
        to[1] = make_uint4(codes[2].x, codes[2].y, codes[3].x, codes[3].y);
      } else {
        for (int i = i0; i < i1; ++i) out[i] = fp8_round(tile[i][c] * scale, format);
      }
      if (quarter == 0) qt_scale_inv[rb * cols + c0 + c] = 1.0f / scale;
    }
    __syncthreads();
  }
}

// One block per B x B tile: the block's max of the bits through shared memory, then the codes.
template <class T>
__global__ void fp8_cast_tiles_kernel(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block,
                                      std::uint8_t* q, std::uint8_t* qt, float* scale_inv, float* scale_inv_t) {
  __shared__ unsigned warp_max[32];
  const index_t tile_rows = (rows + block - 1) / block, tile_cols = (cols + block - 1) / block;
  const index_t tr = blockIdx.y, tc = blockIdx.x;
  const index_t r0 = tr * block, c0 = tc * block, nr = fp8_min(rows - r0, block), nc = fp8_min(cols - c0, block);
  unsigned bits = 0;
  for (index_t i = threadIdx.x; i < nr * nc; i += blockDim.x) bits = max(bits, fp8_abs_bits(fp8_load(x, (r0 + i / nc) * cols + c0 + i % nc)));
  for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  if (lane == 0) warp_max[warp] = bits;
  __syncthreads();
  bits = 0;
  for (int w = 0; w < warps; ++w) bits = max(bits, warp_max[w]);
  const float scale = fp8_block_scale(__uint_as_float(bits), fp8_max(format));
  for (index_t i = threadIdx.x; i < nr * nc; i += blockDim.x) {
    const index_t r = r0 + i / nc, c = c0 + i % nc;
    const std::uint8_t code = fp8_round(fp8_load(x, r * cols + c) * scale, format);
    if (q) q[r * cols + c] = code;
    if (qt) qt[c * rows + r] = code;
  }
  if (threadIdx.x == 0) {
    if (scale_inv) scale_inv[tr * tile_cols + tc] = 1.0f / scale;
    if (scale_inv_t) scale_inv_t[tc * tile_rows + tr] = 1.0f / scale;
  }
}

// 128 x 128 tiles (block 128): one block a tile, 256 threads. The tile is read twice (the second time
// from L2), eight elements a thread with 16-byte loads where `vectorized` (x 16-byte aligned, cols a
// multiple of 8, q 8-byte aligned): first for the tile's amax, then for the codes, which go to q as
// 8-byte stores and into shared memory, from which each thread writes 64 neighbouring codes of one
// column of the tile into qt (16-byte stores where rows is a multiple of 16 and qt 16-byte aligned).
// Tiles at the edges take the same steps an element at a time. The codes and scales of
// fp8_cast_tiles_kernel, which took each element's row and column by 64-bit division and wrote qt a
// byte at a time, rows apart.
template <class T>
__global__ void __launch_bounds__(256) fp8_cast_tiles128_kernel(const T* x, index_t rows, index_t cols, Fp8Format format,
                                                               std::uint8_t* q, std::uint8_t* qt, float* scale_inv,
                                                               float* scale_inv_t, bool vectorized, bool vector_stores) {
  constexpr int B = kFp8Run, G = B / 8;  // G groups of eight columns a tile row
  __shared__ __align__(16) std::uint8_t codes[B][B + 8];  // + 8: rows stay 8-byte aligned
  __shared__ unsigned warp_bits[8];
  const index_t tile_rows = (rows + B - 1) / B, tile_cols = (cols + B - 1) / B;
  const index_t tr = blockIdx.y, tc = blockIdx.x, r0 = tr * B, c0 = tc * B;
  const int nr = static_cast<int>(fp8_min(B, rows - r0)), nc = static_cast<int>(fp8_min(B, cols - c0));
  const bool whole = vectorized && nc == B;
  unsigned bits = 0;
  if (whole) {
    for (int v = threadIdx.x; v < nr * G; v += 256) {
      float e[8];
      fp8_load8(x, (r0 + v / G) * cols + c0 + v % G * 8, e);
#pragma unroll
      for (int k = 0; k < 8; ++k) bits = max(bits, fp8_abs_bits(e[k]));
    }
  } else {
    for (int i = threadIdx.x; i < nr * nc; i += 256) bits = max(bits, fp8_abs_bits(fp8_load(x, (r0 + i / nc) * cols + c0 + i % nc)));
  }
  for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
  if (threadIdx.x % 32 == 0) warp_bits[threadIdx.x / 32] = bits;
  __syncthreads();
  bits = 0;
#pragma unroll
  for (int w = 0; w < 8; ++w) bits = max(bits, warp_bits[w]);
  const float scale = fp8_block_scale(__uint_as_float(bits), fp8_max(format));
  if (whole) {
    for (int v = threadIdx.x; v < nr * G; v += 256) {
      const int r = v / G, g = v % G;
      float e[8];
      fp8_load8(x, (r0 + r) * cols + c0 + g * 8, e);
      unsigned folded = 0;
      const uint2 word = fp8_round8(e, scale, format, folded);
      if (q) *reinterpret_cast<uint2*>(q + (r0 + r) * cols + c0 + g * 8) = word;
      *reinterpret_cast<uint2*>(&codes[r][g * 8]) = word;
    }
  } else {
    for (int i = threadIdx.x; i < nr * nc; i += 256) {
      const int r = i / nc, c = i % nc;
      const std::uint8_t code = fp8_round(fp8_load(x, (r0 + r) * cols + c0 + c) * scale, format);
      if (q) q[(r0 + r) * cols + c0 + c] = code;
      codes[r][c] = code;
    }
  }
  __syncthreads();
  if (qt) {  // thread t: column t / 2 of the tile, rows 64 (t % 2) .. + 63
    const int c = threadIdx.x / 2, i0 = threadIdx.x % 2 * 64, i1 = i0 + 64 < nr ? i0 + 64 : nr;
    if (c < nc && i0 < i1) {
      std::uint8_t* out = qt + (c0 + c) * rows + r0;
      if (vector_stores && i1 - i0 == 64) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          unsigned word[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int i = i0 + 16 * w + 4 * k;
            word[k] = unsigned(codes[i][c]) | unsigned(codes[i + 1][c]) << 8 | unsigned(codes[i + 2][c]) << 16 |
                      unsigned(codes[i + 3][c]) << 24;
          }
          reinterpret_cast<uint4*>(out + i0)[w] = make_uint4(word[0], word[1], word[2], word[3]);
        }
      } else {
        for (int i = i0; i < i1; ++i) out[i] = codes[i][c];
      }
    }
  }
  if (threadIdx.x == 0) {
    if (scale_inv) scale_inv[tr * tile_cols + tc] = 1.0f / scale;
    if (scale_inv_t) scale_inv_t[tc * tile_rows + tr] = 1.0f / scale;
  }
}

template <class T>
__global__ void fp8_decode_blocks_kernel(const std::uint8_t* q, index_t rows, index_t k, Fp8Format format,
                                         const float* scale_inv, bool tiles, index_t block, T* out) {
  const index_t k_blocks = (k + block - 1) / block;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < rows * k; i += index_t(gridDim.x) * blockDim.x) {
    const index_t r = i / k, p = i % k;
    const float inverse = tiles ? scale_inv[(r / block) * k_blocks + p / block] : scale_inv[(p / block) * rows + r];
    out[i] = T(fp8_decode(q[i], format) * inverse);
  }
}

// The grids. A kernel that folds an amax ends each block with one atomicMax on the same word, and
// those serialize in L2: a grid of one block per 256 elements (65,536 blocks for a 4096 x 4096
// tensor) spent about 80 us per cast on an H100 in atomics alone. So those kernels run at most
// 8 blocks per multiprocessor (grid-stride loops; about a thousand atomics), the cast-transpose too
// (over its 64 x 64 tiles), and the transpose of codes as it (no more blocks than are resident).
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
  const bool vectorized = aligned_16(x) && reinterpret_cast<std::uintptr_t>(out) % 8 == 0;
  const index_t work = vectorized ? (n + 7) / 8 : n;
  fp8_cast_kernel<T><<<amax ? fp8_amax_grid(work) : grid_for(work), kThreads, 0, stream>>>(x, n, format, scale, out, amax,
                                                                                           vectorized);
  check_launch("fp8_cast");
}
// The tile rows of a cast-transpose: the rows of the column-sum partials fp8_cast_transpose_fused writes.
STRATA_CUDA_INLINE index_t fp8_tile_rows(index_t rows) { return (rows + kFp8Tile - 1) / kFp8Tile; }

// fp8_cast_transpose of what `producer` makes from x and pre; with column_sums (then `partials`, a
// workspace of fp8_tile_rows(rows) * cols elements), also their column sums, written. Without out_t,
// no x^T. With activation.codes (gelu_backward, swiglu_backward), also the codes of the forward's
// activation^T from pre (backend/cpu/fp8.hpp; activation.amax must be null: the forward folded it).
template <class T, class A>
void fp8_cast_transpose_fused(Fp8Producer producer, const T* x, const T* pre, index_t rows, index_t cols, Fp8Format format,
                              const float* scale, std::uint8_t* out, std::uint8_t* out_t, float* amax, A* column_sums,
                              A* partials, Fp8Output activation, cudaStream_t stream) {
  const bool reads_pre = producer == Fp8Producer::gelu_backward || producer == Fp8Producer::swiglu_backward;
  if (activation.codes && (!reads_pre || activation.amax))
    throw std::invalid_argument("fp8_cast_transpose_fused: activation codes come with gelu_backward or swiglu_backward "
                                "alone, and fold no amax");
  if (rows <= 0 || cols <= 0) {
    if (column_sums && cols > 0) STRATA_CUDA_CHECK(cudaMemsetAsync(column_sums, 0, cols * sizeof(A), stream));
    return;
  }
  const bool vectorized = aligned_16(x) && (!reads_pre || aligned_16(pre)) && (!out || aligned_8(out)) && aligned_8(out_t) &&
                          aligned_8(activation.codes) && rows % 8 == 0 && cols % 8 == 0 &&
                          (producer != Fp8Producer::swiglu_backward || cols % 16 == 0);
  // swiglu_backward's blocks take a tile of each half (fp8_cast_transpose_swiglu_backward_kernel)
  const index_t tile_cols = producer == Fp8Producer::swiglu_backward ? cols / 2 : cols;
  const index_t tiles = fp8_tile_rows(rows) * ((tile_cols + kFp8Tile - 1) / kFp8Tile);
  // every tile whole and vectorized: the kernels without edge code serve (swiglu_backward's)
  const bool all_whole = vectorized && rows % kFp8Tile == 0 && tile_cols % kFp8Tile == 0;
  const auto launch = [&](auto p, auto sums, auto act) {
    auto* kernel = [&] {
      constexpr bool S = decltype(sums)::value, Act = decltype(act)::value;
      if constexpr (decltype(p)::value == Fp8Producer::swiglu_backward)
        return all_whole ? &fp8_cast_transpose_swiglu_backward_kernel<T, S, A, false, Act>
                         : &fp8_cast_transpose_swiglu_backward_kernel<T, S, A, true, Act>;
      else
        return &fp8_cast_transpose_kernel<T, decltype(p)::value, S, A, Act>;
    }();
    // No more blocks than run at once (at most 8 a multiprocessor, for the amax atomics): a second,
    // partial wave of blocks that each loop over as many tiles would double the time of the first.
    const unsigned grid = static_cast<unsigned>(
        std::min<index_t>(tiles, index_t(resident_blocks(kernel, kThreads, 8)) * multiprocessor_count()));
    kernel<<<grid, kThreads, 0, stream>>>(x, pre, rows, cols, format, scale, out, out_t, amax, partials, vectorized,
                                          activation.format, activation.scale, activation.codes);
  };
  using copy = std::integral_constant<Fp8Producer, Fp8Producer::copy>;
  using gelu = std::integral_constant<Fp8Producer, Fp8Producer::gelu>;
  using gelu_backward = std::integral_constant<Fp8Producer, Fp8Producer::gelu_backward>;
  using swiglu = std::integral_constant<Fp8Producer, Fp8Producer::swiglu>;
  using swiglu_backward = std::integral_constant<Fp8Producer, Fp8Producer::swiglu_backward>;
  const auto with_sums = [&](auto p) {
    if (column_sums) launch(p, std::true_type{}, std::false_type{});
    else launch(p, std::false_type{}, std::false_type{});
  };
  // the backward producers with the activation's codes
  const auto with_act = [&](auto p) {
    if (!activation.codes) with_sums(p);
    else if (column_sums) launch(p, std::true_type{}, std::true_type{});
    else launch(p, std::false_type{}, std::true_type{});
  };
  switch (producer) {
    case Fp8Producer::copy: with_sums(copy{}); break;
    case Fp8Producer::gelu: with_sums(gelu{}); break;
    case Fp8Producer::gelu_backward: with_act(gelu_backward{}); break;
    case Fp8Producer::swiglu: with_sums(swiglu{}); break;
    case Fp8Producer::swiglu_backward: with_act(swiglu_backward{}); break;
  }
  check_launch("fp8_cast_transpose");
  if (column_sums) sum_partials<A, A>(partials, fp8_tile_rows(rows), cols, column_sums, false, stream);
}
template <class T>
void fp8_cast_transpose(const T* x, index_t rows, index_t cols, Fp8Format format, const float* scale, std::uint8_t* out,
                        std::uint8_t* out_t, float* amax, cudaStream_t stream) {
  fp8_cast_transpose_fused<T, accumulate_t<T>>(Fp8Producer::copy, x, nullptr, rows, cols, format, scale, out, out_t, amax,
                                               nullptr, nullptr, Fp8Output{}, stream);
}
STRATA_CUDA_INLINE void fp8_transpose(const std::uint8_t* in, index_t rows, index_t cols, std::uint8_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const bool vectorized = aligned_8(in) && aligned_8(out) && rows % 8 == 0 && cols % 8 == 0;
  const index_t tiles = fp8_tile_rows(rows) * ((cols + kFp8Tile - 1) / kFp8Tile);
  auto* kernel = &fp8_transpose_kernel<std::uint8_t>;
  // no more blocks than run at once, as in fp8_cast_transpose_fused
  const unsigned grid = static_cast<unsigned>(
      std::min<index_t>(tiles, index_t(resident_blocks(kernel, kThreads, 8)) * multiprocessor_count()));
  kernel<<<grid, kThreads, 0, stream>>>(in, rows, cols, out, vectorized);
  check_launch("fp8_transpose");
}
STRATA_CUDA_INLINE void fp8_align_scales(const float* a, const float* b, float* out, cudaStream_t stream) {
  fp8_align_scales_kernel<float><<<1, 1, 0, stream>>>(a, b, out);
  check_launch("fp8_align_scales");
}
template <class T>
void fp8_cast_blocks(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                     float* q_scale_inv, std::uint8_t* qt, float* qt_scale_inv, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (q && block == kFp8Run && cols % kFp8Run == 0 && aligned_16(x) && aligned_8(q)) {
    const index_t runs = rows * (cols / kFp8Run);
    fp8_cast_runs128_kernel<T><<<grid_for(runs * 16), kThreads, 0, stream>>>(x, rows, cols, format, q, q_scale_inv);
    check_launch("fp8_cast_blocks");
  } else if (q) {
    const index_t runs = rows * ((cols + block - 1) / block);
    fp8_cast_runs_kernel<T><<<grid_for(runs * 32), kThreads, 0, stream>>>(x, rows, cols, format, block, q, q_scale_inv);
    check_launch("fp8_cast_blocks");
  }
  if (qt && block == kFp8Run) {
    const index_t tiles = (rows + kFp8Run - 1) / kFp8Run * ((cols + kFp8ColumnTile - 1) / kFp8ColumnTile);
    const bool vector_stores = rows % 16 == 0 && aligned_16(qt);
    fp8_cast_column_runs128_kernel<T><<<static_cast<unsigned>(std::min<index_t>(tiles, 0x7fffffff)), 256, 0, stream>>>(
        x, rows, cols, format, qt, qt_scale_inv, vector_stores);
    check_launch("fp8_cast_blocks (columns)");
  } else if (qt) {
    const index_t runs = cols * ((rows + block - 1) / block);
    fp8_cast_column_runs_kernel<T><<<grid_for(runs), kThreads, 0, stream>>>(x, rows, cols, format, block, qt, qt_scale_inv);
    check_launch("fp8_cast_blocks (columns)");
  }
}
template <class T>
void fp8_cast_tiles(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                    std::uint8_t* qt, float* scale_inv, float* scale_inv_t, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned>((cols + block - 1) / block), static_cast<unsigned>((rows + block - 1) / block));
  if (block == kFp8Run) {
    const bool vectorized = aligned_16(x) && cols % 8 == 0 && (!q || aligned_8(q));
    const bool vector_stores = rows % 16 == 0 && (!qt || aligned_16(qt));
    fp8_cast_tiles128_kernel<T><<<grid, 256, 0, stream>>>(x, rows, cols, format, q, qt, scale_inv, scale_inv_t, vectorized,
                                                          vector_stores);
  } else {
    fp8_cast_tiles_kernel<T><<<grid, kThreads, 0, stream>>>(x, rows, cols, format, block, q, qt, scale_inv, scale_inv_t);
  }
  check_launch("fp8_cast_tiles");
}
template <class T>
void fp8_decode_blocks(const std::uint8_t* q, index_t rows, index_t k, Fp8Format format, const float* scale_inv, bool tiles,
                       index_t block, T* out, cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  fp8_decode_blocks_kernel<T><<<grid_for(rows * k), kThreads, 0, stream>>>(q, rows, k, format, scale_inv, tiles, block, out);
  check_launch("fp8_decode_blocks");
}

static_assert(std::is_trivially_copyable_v<Fp8UpdateArgs>, "kernel arguments are trivially copyable");
STRATA_CUDA_INLINE void fp8_update_scale(float* row, float max, const Fp8UpdateArgs& args, cudaStream_t stream) {
  fp8_update_scale_kernel<Fp8UpdateArgs><<<1, 1, 0, stream>>>(row, max, args);
  check_launch("fp8_update_scale");
}
STRATA_CUDA_INLINE void fp8_update_scales(float* rows, index_t count, index_t stride, const Fp8RoleMaxes& maxes,
                                          const Fp8UpdateArgs& args, float* aligned, cudaStream_t stream) {
  if (count <= 0) return;
  fp8_update_scales_kernel<Fp8UpdateArgs><<<grid_for(count * kFp8Roles, 128), 128, 0, stream>>>(rows, count, stride, maxes,
                                                                                                args, aligned);
  check_launch("fp8_update_scales");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
