// strata/backend/cuda/flash_attention.hpp: grouped-query attention, own flash-style kernels.
//
//   S = scale * Q K^T (causal: key j > query i masked),  P = softmax(S),  O = P V,  lse_i = log sum_j e^(S_ij)
//   backward: D_i = rowsum(dO_i * O_i),  P_ij = e^(S_ij - lse_i),  dP = dO V^T,  dS = P * (dP - D)
//             dV = P^T dO,  dK = scale dS^T Q,  dQ = scale dS K
//
// Layouts are the backend contract's (docs/DEVICE.md): q, out, dout, dq [s, b, heads, d]; k, v, dk,
// dv [s, b, groups, d]; lse and D [b, heads, s]; query head h reads key/value head
// h / (heads / groups). No s x s matrix is ever stored: probabilities live one tile at a time.
// q, dq and k, v, dk, dv may be strided views (backend/attention_strides.hpp): only their addresses
// change, never the order of any sum, so a view gives the bits of the contiguous layout.
//
// Work split (plain, deterministic, no atomics; every sum has one fixed order):
//   forward   one warp per query row, kRows rows per block; keys stream through shared memory in
//             tiles of 32 (lane l scores key t0 + l), online softmax (running max m, sum l)
//   delta     one warp per (batch, head, query): D = dO . O
//   dK, dV    one warp per key row; loops over the group's query heads, then query tiles of 32
//             (lane l takes query t0 + l) in ascending order
//   dQ        one warp per query row; loops over key tiles of 32 in ascending order
// Each lane owns output columns lane + 32 t (t < kChunks = ceil(d / 32)); warp sums are xor
// butterflies, whose result is the same bits on every lane and in every run.
//
// Dropout on the probabilities (backend/attention_options.hpp): each kernel has a second
// instantiation (kDropout) that multiplies P_ij by Z_ij = kept / (1 - p) where the math above
// says so (O = (P Z) V; dP = Z (dO V^T); dV = (P Z)^T dO; D = rowsum(dO * O) with the dropped O;
// lse undropped), each lane drawing the mask of its own (query, key) pair from the counter-based
// generator, so the kernels draw the CPU twin's mask bit for bit. Without dropout the plain
// instantiation runs: no draw, the same instructions and bits as before dropout existed.
//
// Context parallelism (AttentionOptions::causal, query_offset, key_offset): a block with causal =
// false lets every query see all s keys (the key chunk lies wholly in the past); the offsets are
// the global positions the dropout mask is drawn at, so a ring's blocks draw the whole sequence's
// mask. The causal kernels stop at the diagonal tile; non-causal ones run every key tile. A sliding
// window (AttentionOptions::window) masks keys before i - window and skips the tiles wholly before.
//
// Element types: float, double, bf16, fp16; tiles and sums are in accumulate_t<T> (float for the
// 16-bit types). Head size d <= 256. Written for correctness and clarity first (CUDA cores, no
// tensor cores): for bf16/fp16 training the cuDNN path in attention.hpp is the fast one.
//
// Needs nvcc (the header holds kernels); flash_launchers.hpp declares the two launchers for the host
// compiler (strata::cuda_kernels compiles them once: backend/cuda/library/flash_attention.cu).
#pragma once

#if !defined(__CUDACC__)
#error "strata/backend/cuda/flash_attention.hpp holds CUDA kernels: include it from a .cu file compiled by nvcc."
#endif

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/shape.hpp"
#include "../attention_options.hpp"
#include "runtime.hpp"
#include "flash_launchers.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {
namespace flash {

inline constexpr int kWarpSize = 32;
inline constexpr int kRows = 8;           // query (or key) rows per block, one per warp
inline constexpr int kTile = kWarpSize;   // keys (or queries) per shared-memory tile, one per lane
inline constexpr int kThreads = kRows * kWarpSize;
// kMaxHeadSize (256): flash_launchers.hpp.

// Loads and stores of T in accumulate precision. The 16-bit types move as their bit patterns
// (round to nearest even on the way back, NaN kept a NaN), so no host-only member is called.
template <class T>
struct element_io {
  static __device__ T load(const T* p, index_t i) { return p[i]; }
  static __device__ void store(T* p, index_t i, T value) { p[i] = value; }
};
template <>
struct element_io<bf16> {
  static __device__ float load(const bf16* p, index_t i) {
    const std::uint16_t bits = reinterpret_cast<const std::uint16_t*>(p)[i];
    return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
  }
  static __device__ void store(bf16* p, index_t i, float value) {
    const std::uint32_t u = __float_as_uint(value);
    std::uint16_t bits;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) bits = 0x7fc0;
    else bits = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    reinterpret_cast<std::uint16_t*>(p)[i] = bits;
  }
};
template <>
struct element_io<fp16> {
  static __device__ float load(const fp16* p, index_t i) {
    return __half2float(__ushort_as_half(reinterpret_cast<const std::uint16_t*>(p)[i]));
  }
  static __device__ void store(fp16* p, index_t i, float value) {
    reinterpret_cast<std::uint16_t*>(p)[i] = __half_as_ushort(__float2half_rn(value));
  }
};

template <class A>
__device__ A exp_of(A x) {
  if constexpr (std::is_same_v<A, float>) return expf(x);
  else return exp(x);
}
template <class A>
__device__ A log_of(A x) {
  if constexpr (std::is_same_v<A, float>) return logf(x);
  else return log(x);
}
template <class A>
__device__ A negative_infinity() {
  return -A(INFINITY);
}
__device__ inline index_t min_index(index_t a, index_t b) { return a < b ? a : b; }
__device__ inline index_t max_index(index_t a, index_t b) { return a < b ? b : a; }
template <class A>
__device__ A warp_sum(A x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
template <class A>
__device__ A warp_max(A x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = max(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Everything a kernel reads, passed by value.
template <class T>
struct attention_params {
  using A = accumulate_t<T>;
  const T* q;
  const T* k;
  const T* v;
  const T* out;
  const T* dout;
  const A* lse;
  const A* delta;
  T* out_w;     // forward: out
  A* lse_w;     // forward: lse
  A* delta_w;   // delta kernel: D
  T* dq;
  T* dk;
  T* dv;
  index_t s, b, heads, groups, d;
  AttentionStrides strides;  // resolved: of q, dq and of k, v, dk, dv
  A scale;
  bool dropping;                 // dropout on the probabilities: the kDropout kernels run
  AttentionDropoutMask<A> mask;  // when dropping
  bool causal;                   // false: every query sees every key (a context-parallel block in the past)
  index_t window;                // query i sees keys i - window .. i in global positions (negative: no window)
  index_t query_offset;          // global positions of query 0 and key 0 (the dropout mask's counters,
  index_t key_offset;            // and the window's)
};
static_assert(std::is_trivially_copyable_v<attention_params<float>>,
              "attention_params is passed to kernels by value, so it must be trivially copyable.");

// Offsets of the contract's layouts.
template <class T>
__device__ inline index_t q_offset(const attention_params<T>& p, index_t i, index_t bi, index_t h) {
  return (i * p.b + bi) * p.strides.q_row + h * p.strides.q_head;  // q, dq: position (i, bi), head h
}
template <class T>
__device__ inline index_t out_offset(const attention_params<T>& p, index_t i, index_t bi, index_t h) {
  return ((i * p.b + bi) * p.heads + h) * p.d;  // out, dout [s, b, heads, d]
}
template <class T>
__device__ inline index_t kv_offset(const attention_params<T>& p, index_t j, index_t bi, index_t g) {
  return (j * p.b + bi) * p.strides.kv_row + g * p.strides.kv_head;  // k, v, dk, dv: position (j, bi), head g
}

// The keys query i (local, i < s) sees: attention_keys_of (backend/attention_options.hpp).
template <class T>
__device__ inline AttentionKeyRange keys_of(const attention_params<T>& p, index_t i) {
  return attention_keys_of(p.causal, p.window, p.query_offset - p.key_offset, p.s, i);
}
// Whether query i sees key j (both local, i < s).
template <class T>
__device__ inline bool sees(const attention_params<T>& p, index_t i, index_t j) {
  return attention_sees(p.causal, p.window, p.query_offset - p.key_offset, p.s, i, j);
}
// Whether query i sees no key of the tile at t0 (all in its future, or before its window; warp-uniform:
// one row per warp). Exact, so a tile that is not skipped holds a seen key.
template <class T>
__device__ inline bool tile_unseen(const attention_params<T>& p, index_t i, index_t t0) {
  const AttentionKeyRange keys = keys_of(p, i);
  return t0 > keys.last || t0 + kTile <= keys.first || keys.first > keys.last;
}
// Whether no query of the tile at t0 sees key j (warp-uniform: one key per warp): queries i see j for
// i >= j (causal) and i <= j + window - delta (window).
template <class T>
__device__ inline bool queries_unseen(const attention_params<T>& p, index_t j, index_t t0) {
  if (p.causal && t0 + kTile <= j) return true;
  return p.window >= 0 && t0 + (p.query_offset - p.key_offset) > j + p.window;
}
// The first key tile past every key the queries of a block ending at row `row_end` see.
template <class T>
__device__ inline index_t key_end_of(const attention_params<T>& p, index_t row_end) {
  return p.causal ? min_index(p.s, row_end) : p.s;
}
// Keys of the tile at t0 that query i sees: those before this count.
template <class T>
__device__ inline int keys_seen_in_tile(const attention_params<T>& p, index_t i, index_t t0) {
  return static_cast<int>(min_index(kTile, p.causal ? i - t0 + 1 : p.s - t0));
}
// Z_ij of local query i and key j: the mask of their global positions.
template <class T>
__device__ inline accumulate_t<T> dropout_factor(const attention_params<T>& p, index_t bi, index_t h, index_t i,
                                                 index_t j) {
  return p.mask.factor(bi, h, p.query_offset + i, p.key_offset + j);
}

// Loads keys and values t0 .. t0 + kTile - 1 of key/value head g into [kTile, d + 1] tiles
// (zeros past the end of the sequence; the padded row stride spreads lanes over the banks).
template <class T>
__device__ void load_kv_tile(const attention_params<T>& p, index_t t0, index_t bi, index_t g,
                             accumulate_t<T>* k_tile, accumulate_t<T>* v_tile) {
  using A = accumulate_t<T>;
  const index_t d = p.d, ld = d + 1;
  for (index_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
    const index_t r = e / d, c = e % d, j = t0 + r;
    A kx = 0, vx = 0;
    if (j < p.s) {
      const index_t off = kv_offset(p, j, bi, g) + c;
      kx = element_io<T>::load(p.k, off);
      vx = element_io<T>::load(p.v, off);
    }
    k_tile[r * ld + c] = kx;
    v_tile[r * ld + c] = vx;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward. grid (ceil(s / kRows), b * heads), kThreads threads.
// shared: k_tile, v_tile [kTile, d + 1]; q_rows [kRows, d]
template <class T, int kChunks, bool kDropout>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(attention_params<T> p) {
  using A = accumulate_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const index_t d = p.d, ld = d + 1;
  A* k_tile = reinterpret_cast<A*>(shared_bytes);
  A* v_tile = k_tile + kTile * ld;
  A* q_rows = v_tile + kTile * ld;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const index_t bi = blockIdx.y / p.heads, h = blockIdx.y % p.heads, g = h / (p.heads / p.groups);
  const index_t q_begin = static_cast<index_t>(blockIdx.x) * kRows, i = q_begin + warp;
  const bool active = i < p.s;
  A* q_row = q_rows + warp * d;
  if (active)
    for (index_t c = lane; c < d; c += kWarpSize) q_row[c] = element_io<T>::load(p.q, q_offset(p, i, bi, h) + c);

  A m = negative_infinity<A>(), l = 0;
  A o[kChunks];
#pragma unroll
  for (int t = 0; t < kChunks; ++t) o[t] = 0;

  const index_t key_end = key_end_of(p, q_begin + kRows);  // causal: the block's last query + 1
  for (index_t t0 = 0; t0 < key_end; t0 += kTile) {
    __syncthreads();
    load_kv_tile(p, t0, bi, g, k_tile, v_tile);
    __syncthreads();
    if (!active || tile_unseen(p, i, t0)) continue;  // warp-uniform

    const index_t j = t0 + lane;
    const bool seen = sees(p, i, j);
    A score = negative_infinity<A>();
    if (seen) {
      A dot = 0;
      for (index_t c = 0; c < d; ++c) dot += q_row[c] * k_tile[lane * ld + c];
      score = dot * p.scale;
    }
    const A m_new = max(m, warp_max(score));  // finite: the tile holds a seen key
    const A pj = seen ? exp_of(score - m_new) : A(0);
    const A alpha = exp_of(m - m_new);        // 0 on the first tile (m = -inf)
    l = l * alpha + warp_sum(pj);             // the undropped softmax's sum
    m = m_new;
    A weight = pj;                            // P_ij, times Z_ij under dropout
    if constexpr (kDropout)
      if (seen) weight = pj * dropout_factor(p, bi, h, i, j);
#pragma unroll
    for (int t = 0; t < kChunks; ++t) o[t] *= alpha;
    const int r_end = keys_seen_in_tile(p, i, t0);
    for (int r = 0; r < r_end; ++r) {
      const A pr = __shfl_sync(0xffffffffu, weight, r);
#pragma unroll
      for (int t = 0; t < kChunks; ++t) {
        const index_t c = lane + t * kWarpSize;
        if (c < d) o[t] += pr * v_tile[r * ld + c];
      }
    }
  }
  if (!active) return;
  const A inv_l = l > A(0) ? A(1) / l : A(0);  // a row that sees no key of the block: out 0, lse -inf
#pragma unroll
  for (int t = 0; t < kChunks; ++t) {
    const index_t c = lane + t * kWarpSize;
    if (c < d) element_io<T>::store(p.out_w, out_offset(p, i, bi, h) + c, o[t] * inv_l);
  }
  if (lane == 0) p.lse_w[(bi * p.heads + h) * p.s + i] = l > A(0) ? m + log_of(l) : negative_infinity<A>();  // [b, heads, s]
}

// ---------------------------------------------------------------------------------------------
// D[b, heads, s] = sum_c dO * O. One warp per row, kRows rows per block.
template <class T>
__global__ void __launch_bounds__(kThreads) attention_delta_kernel(attention_params<T> p) {
  using A = accumulate_t<T>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const index_t row = static_cast<index_t>(blockIdx.x) * kRows + warp;  // (bi * heads + h) * s + i
  if (row >= p.b * p.heads * p.s) return;
  const index_t i = row % p.s, bh = row / p.s, bi = bh / p.heads, h = bh % p.heads;
  const index_t off = out_offset(p, i, bi, h);
  A sum = 0;
  for (index_t c = lane; c < p.d; c += kWarpSize)
    sum += element_io<T>::load(p.dout, off + c) * element_io<T>::load(p.out, off + c);
  sum = warp_sum(sum);
  if (lane == 0) p.delta_w[row] = sum;
}

// ---------------------------------------------------------------------------------------------
// dK, dV. grid (ceil(s / kRows), b * groups), kThreads threads; warp w owns key j = block's
// first key + w and sums over the group's query heads and the queries i >= j.
// shared: q_tile, do_tile [kTile, d + 1]; lse_tile, delta_tile [kTile]; k_rows, v_rows [kRows, d]
template <class T, int kChunks, bool kDropout>
__global__ void __launch_bounds__(kThreads) attention_dkdv_kernel(attention_params<T> p) {
  using A = accumulate_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const index_t d = p.d, ld = d + 1;
  A* q_tile = reinterpret_cast<A*>(shared_bytes);
  A* do_tile = q_tile + kTile * ld;
  A* lse_tile = do_tile + kTile * ld;
  A* delta_tile = lse_tile + kTile;
  A* k_rows = delta_tile + kTile;
  A* v_rows = k_rows + kRows * d;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const index_t bi = blockIdx.y / p.groups, g = blockIdx.y % p.groups, per_group = p.heads / p.groups;
  const index_t k_begin = static_cast<index_t>(blockIdx.x) * kRows, j = k_begin + warp;
  const bool active = j < p.s;
  A* k_row = k_rows + warp * d;
  A* v_row = v_rows + warp * d;
  if (active)
    for (index_t c = lane; c < d; c += kWarpSize) {
      k_row[c] = element_io<T>::load(p.k, kv_offset(p, j, bi, g) + c);
      v_row[c] = element_io<T>::load(p.v, kv_offset(p, j, bi, g) + c);
    }

  A dk[kChunks], dv[kChunks];
#pragma unroll
  for (int t = 0; t < kChunks; ++t) dk[t] = dv[t] = 0;

  // causal: queries before the block's keys see none of them
  const index_t t_first = p.causal ? (k_begin / kTile) * kTile : 0;
  for (index_t hh = 0; hh < per_group; ++hh) {
    const index_t h = g * per_group + hh;
    const index_t stat = (bi * p.heads + h) * p.s;  // row of lse / D
    for (index_t t0 = t_first; t0 < p.s; t0 += kTile) {
      __syncthreads();
      for (index_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
        const index_t r = e / d, c = e % d, i = t0 + r;
        A qx = 0, dox = 0;
        if (i < p.s) {
          qx = element_io<T>::load(p.q, q_offset(p, i, bi, h) + c);
          dox = element_io<T>::load(p.dout, out_offset(p, i, bi, h) + c);
        }
        q_tile[r * ld + c] = qx;
        do_tile[r * ld + c] = dox;
      }
      for (index_t r = threadIdx.x; r < kTile; r += blockDim.x) {
        const index_t i = t0 + r;
        lse_tile[r] = i < p.s ? p.lse[stat + i] : A(0);
        delta_tile[r] = i < p.s ? p.delta[stat + i] : A(0);
      }
      __syncthreads();
      // warp-uniform: no query of the tile sees key j (all before it, or all past its window)
      if (!active || queries_unseen(p, j, t0)) continue;

      const index_t i = t0 + lane;
      A prob = 0, dscore = 0;
      if (i < p.s && sees(p, i, j)) {
        A qk = 0, dov = 0;
        for (index_t c = 0; c < d; ++c) {
          qk += q_tile[lane * ld + c] * k_row[c];
          dov += do_tile[lane * ld + c] * v_row[c];
        }
        prob = exp_of(qk * p.scale - lse_tile[lane]);
        if constexpr (kDropout) {
          const A factor = dropout_factor(p, bi, h, i, j);  // Z_ij
          dscore = prob * (factor * dov - delta_tile[lane]);
          prob = prob * factor;  // what dV sums
        } else {
          dscore = prob * (dov - delta_tile[lane]);
        }
      }
      const int r_begin = p.causal ? static_cast<int>(max_index(0, j - t0)) : 0;
      for (int r = r_begin; r < kTile; ++r) {
        const A pr = __shfl_sync(0xffffffffu, prob, r);
        const A dsr = __shfl_sync(0xffffffffu, dscore, r);
#pragma unroll
        for (int t = 0; t < kChunks; ++t) {
          const index_t c = lane + t * kWarpSize;
          if (c < d) {
            dv[t] += pr * do_tile[r * ld + c];
            dk[t] += dsr * q_tile[r * ld + c];
          }
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kChunks; ++t) {
    const index_t c = lane + t * kWarpSize;
    if (c < d) {
      element_io<T>::store(p.dk, kv_offset(p, j, bi, g) + c, dk[t] * p.scale);
      element_io<T>::store(p.dv, kv_offset(p, j, bi, g) + c, dv[t]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// dQ. grid (ceil(s / kRows), b * heads), kThreads threads; warp w owns query i.
// shared: k_tile, v_tile [kTile, d + 1]; q_rows, do_rows [kRows, d]
template <class T, int kChunks, bool kDropout>
__global__ void __launch_bounds__(kThreads) attention_dq_kernel(attention_params<T> p) {
  using A = accumulate_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const index_t d = p.d, ld = d + 1;
  A* k_tile = reinterpret_cast<A*>(shared_bytes);
  A* v_tile = k_tile + kTile * ld;
  A* q_rows = v_tile + kTile * ld;
  A* do_rows = q_rows + kRows * d;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const index_t bi = blockIdx.y / p.heads, h = blockIdx.y % p.heads, g = h / (p.heads / p.groups);
  const index_t q_begin = static_cast<index_t>(blockIdx.x) * kRows, i = q_begin + warp;
  const bool active = i < p.s;
  A* q_row = q_rows + warp * d;
  A* do_row = do_rows + warp * d;
  A lse_i = 0, delta_i = 0;
  if (active) {
    for (index_t c = lane; c < d; c += kWarpSize) {
      q_row[c] = element_io<T>::load(p.q, q_offset(p, i, bi, h) + c);
      do_row[c] = element_io<T>::load(p.dout, out_offset(p, i, bi, h) + c);
    }
    lse_i = p.lse[(bi * p.heads + h) * p.s + i];
    delta_i = p.delta[(bi * p.heads + h) * p.s + i];
  }

  A dq[kChunks];
#pragma unroll
  for (int t = 0; t < kChunks; ++t) dq[t] = 0;

  const index_t key_end = key_end_of(p, q_begin + kRows);
  for (index_t t0 = 0; t0 < key_end; t0 += kTile) {
    __syncthreads();
    load_kv_tile(p, t0, bi, g, k_tile, v_tile);
    __syncthreads();
    if (!active || tile_unseen(p, i, t0)) continue;  // warp-uniform

    const index_t j = t0 + lane;
    A dscore = 0;
    if (sees(p, i, j)) {
      A qk = 0, dov = 0;
      for (index_t c = 0; c < d; ++c) {
        qk += q_row[c] * k_tile[lane * ld + c];
        dov += do_row[c] * v_tile[lane * ld + c];
      }
      const A prob = exp_of(qk * p.scale - lse_i);
      if constexpr (kDropout) dscore = prob * (dropout_factor(p, bi, h, i, j) * dov - delta_i);
      else dscore = prob * (dov - delta_i);
    }
    const int r_end = keys_seen_in_tile(p, i, t0);
    for (int r = 0; r < r_end; ++r) {
      const A dsr = __shfl_sync(0xffffffffu, dscore, r);
#pragma unroll
      for (int t = 0; t < kChunks; ++t) {
        const index_t c = lane + t * kWarpSize;
        if (c < d) dq[t] += dsr * k_tile[r * ld + c];
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kChunks; ++t) {
    const index_t c = lane + t * kWarpSize;
    if (c < d) element_io<T>::store(p.dq, q_offset(p, i, bi, h) + c, dq[t] * p.scale);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// check_attention_shape: flash_launchers.hpp.

// Launches kernel<T, kChunks> with the chunk count ceil(d / 32) rounded up to 1, 2, 4 or 8.
template <template <class, int> class Launch, class T, class... Args>
void dispatch_chunks(index_t d, Args&&... args) {
  if (d <= 32) Launch<T, 1>::run(std::forward<Args>(args)...);
  else if (d <= 64) Launch<T, 2>::run(std::forward<Args>(args)...);
  else if (d <= 128) Launch<T, 4>::run(std::forward<Args>(args)...);
  else Launch<T, 8>::run(std::forward<Args>(args)...);
}

template <class Kernel>
void prepare_shared(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

inline unsigned grid_count(index_t n, index_t per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

template <class T, int kChunks>
struct launch_forward {
  static void run(const attention_params<T>& p, cudaStream_t stream) {
    using A = accumulate_t<T>;
    const std::size_t bytes = sizeof(A) * static_cast<std::size_t>(2 * kTile * (p.d + 1) + kRows * p.d);
    const dim3 grid(grid_count(p.s, kRows), static_cast<unsigned>(p.b * p.heads));
    if (p.dropping) {
      prepare_shared(attention_forward_kernel<T, kChunks, true>, bytes);
      attention_forward_kernel<T, kChunks, true><<<grid, kThreads, bytes, stream>>>(p);
    } else {
      prepare_shared(attention_forward_kernel<T, kChunks, false>, bytes);
      attention_forward_kernel<T, kChunks, false><<<grid, kThreads, bytes, stream>>>(p);
    }
    STRATA_CUDA_CHECK(cudaGetLastError());
  }
};
template <class T, int kChunks>
struct launch_dkdv {
  static void run(const attention_params<T>& p, cudaStream_t stream) {
    using A = accumulate_t<T>;
    const std::size_t bytes = sizeof(A) * static_cast<std::size_t>(2 * kTile * (p.d + 1) + 2 * kTile + 2 * kRows * p.d);
    const dim3 grid(grid_count(p.s, kRows), static_cast<unsigned>(p.b * p.groups));
    if (p.dropping) {
      prepare_shared(attention_dkdv_kernel<T, kChunks, true>, bytes);
      attention_dkdv_kernel<T, kChunks, true><<<grid, kThreads, bytes, stream>>>(p);
    } else {
      prepare_shared(attention_dkdv_kernel<T, kChunks, false>, bytes);
      attention_dkdv_kernel<T, kChunks, false><<<grid, kThreads, bytes, stream>>>(p);
    }
    STRATA_CUDA_CHECK(cudaGetLastError());
  }
};
template <class T, int kChunks>
struct launch_dq {
  static void run(const attention_params<T>& p, cudaStream_t stream) {
    using A = accumulate_t<T>;
    const std::size_t bytes = sizeof(A) * static_cast<std::size_t>(2 * kTile * (p.d + 1) + 2 * kRows * p.d);
    const dim3 grid(grid_count(p.s, kRows), static_cast<unsigned>(p.b * p.heads));
    if (p.dropping) {
      prepare_shared(attention_dq_kernel<T, kChunks, true>, bytes);
      attention_dq_kernel<T, kChunks, true><<<grid, kThreads, bytes, stream>>>(p);
    } else {
      prepare_shared(attention_dq_kernel<T, kChunks, false>, bytes);
      attention_dq_kernel<T, kChunks, false><<<grid, kThreads, bytes, stream>>>(p);
    }
    STRATA_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace flash

// flash_attention_forward: flash_launchers.hpp says what it computes.
template <class T>
void flash_attention_forward(cudaStream_t stream, const T* q, const T* k, const T* v, index_t s, index_t b,
                             index_t heads, index_t groups, index_t d, accumulate_t<T> scale, T* out,
                             accumulate_t<T>* lse, AttentionOptions options) {
  flash::check_attention_shape("flash_attention_forward", s, b, heads, groups, d);
  const AttentionStrides resolved =
      checked_attention_strides("flash_attention_forward", options.strides, heads, groups, d);
  const auto mask = attention_dropout_mask<accumulate_t<T>>("flash_attention_forward", options.dropout);
  check_attention_block("flash_attention_forward", options);
  if (s == 0 || b == 0) return;
  flash::attention_params<T> p{};
  p.q = q, p.k = k, p.v = v, p.out_w = out, p.lse_w = lse;
  p.s = s, p.b = b, p.heads = heads, p.groups = groups, p.d = d, p.strides = resolved, p.scale = scale;
  p.dropping = options.dropout.active(), p.mask = mask;
  p.causal = options.causal, p.query_offset = options.query_offset, p.key_offset = options.key_offset;
  p.window = options.window;
  flash::dispatch_chunks<flash::launch_forward, T>(d, p, stream);
}

// flash_attention_backward: flash_launchers.hpp says what it computes.
template <class T>
void flash_attention_backward(cudaStream_t stream, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const accumulate_t<T>* lse, index_t s, index_t b, index_t heads, index_t groups,
                              index_t d, accumulate_t<T> scale, T* dq, T* dk, T* dv, accumulate_t<T>* delta,
                              AttentionOptions options) {
  flash::check_attention_shape("flash_attention_backward", s, b, heads, groups, d);
  const AttentionStrides resolved =
      checked_attention_strides("flash_attention_backward", options.strides, heads, groups, d);
  const auto mask = attention_dropout_mask<accumulate_t<T>>("flash_attention_backward", options.dropout);
  check_attention_block("flash_attention_backward", options);
  if (s == 0 || b == 0) return;
  flash::attention_params<T> p{};
  p.q = q, p.k = k, p.v = v, p.out = out, p.dout = dout, p.lse = lse, p.delta = delta, p.delta_w = delta;
  p.dq = dq, p.dk = dk, p.dv = dv;
  p.s = s, p.b = b, p.heads = heads, p.groups = groups, p.d = d, p.strides = resolved, p.scale = scale;
  p.dropping = options.dropout.active(), p.mask = mask;
  p.causal = options.causal, p.query_offset = options.query_offset, p.key_offset = options.key_offset;
  p.window = options.window;
  flash::attention_delta_kernel<T><<<flash::grid_count(b * heads * s, flash::kRows), flash::kThreads, 0, stream>>>(p);
  STRATA_CUDA_CHECK(cudaGetLastError());
  flash::dispatch_chunks<flash::launch_dkdv, T>(d, p, stream);
  flash::dispatch_chunks<flash::launch_dq, T>(d, p, stream);
}

}  // namespace cuda
STRATA_NAMESPACE_END
