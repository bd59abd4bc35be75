// strata/backend/cuda/kernels/norm.cuh: LayerNorm and RMSNorm over the last dimension, forward and
// backward, statistics and sums in A = accumulate_t<T>.
//
//   LayerNorm: y = (x - mean) * rstd * g + b,   rstd = 1 / sqrt(mean((x - mean)^2) + eps)
//   RMSNorm:   y = x * rstd * g,                rstd = 1 / sqrt(mean(x^2) + eps)
//   backward:  xhat = (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm),  gy = dy * g
//              dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))   (RMSNorm: no mean(gy) term)
//              dg = sum_r dy * xhat,  db = sum_r dy   (written, or added with `accumulate`)
//
// Fused with the residual add (CPU twin: cpu/norm.hpp): the forward with `residual` writes
// sum = T(x + residual) (sum may be x or residual) and normalizes sum; the backward with `dresidual`
// writes dx = T(dresidual + the norm's dx) (dx may be dresidual). Each element is read and written by
// the same thread, so the aliases are safe.
//
// With `fp8` (Fp8Output, codes set) the forward writes its output as FP8 codes instead of y: each
// element rounded to T as y would hold it, then cast as fp8_cast casts it (fp8.cuh: the same codes;
// |element| folded into the block's amax, one atomicMax a block). y is not written (may be null).
//
// weight_offset (zero-centred weights, Megatron's --apply-layernorm-1p): every kernel scales by
// g + weight_offset, added in A; dg stays the gradient of g.
//
// x, y, dy, dx [rows, h]; g, b [h]; mean, rstd [rows]. Two kernel shapes, chosen by the sizes and
// the pointers only (never by the device), each deterministic:
//   - a team of W warps per row (the fast path): when h * sizeof(T) % 16 == 0 and every row pointer
//     is 16-byte aligned, each thread holds G 16-byte vectors of the row in registers (thread t of
//     the team owns elements [(j * W * 32 + t) * V, + V) for j < G, V = 16 / sizeof(T)), so x and dy
//     are read from memory once. One warp (W = 1, four rows a block) while h <= 32 * kNormMaxPerLane;
//     wider rows take W = 2, 4, 8 or 16 warps (one row a block, h up to 16384 elements; 8192 in
//     double for the backward; the backward prefers 8 warps: with_norm_backward_team). The row sums are warp butterflies, then the warps' sums added in warp
//     order (every thread gets the same bits); the mean and the variance two passes over registers.
//   - a 256-thread block per row (wider rows, any alignment): block_sum gives the row sums.
// Weight gradients never use atomics: block k of the backward (norm_backward_blocks(rows) blocks)
// writes partials[k, c] for every column c, from the rows it owns in a fixed order (warp path: warp w
// of block k owns rows (k * kNormWarps + w) + i * blocks * kNormWarps, a team of several warps rows
// k + i * blocks, and keeps its running sums in its own slice of shared memory; the block then adds
// its teams' sums in team order); one
// sum_partials then adds the partials of dg and db over k in a fixed order. Workspace: 2 * blocks * h.
// gy is rounded on its own (mul_rn) in both passes, so gy - mean(gy) is exactly 0 where the host
// gets 0 (h = 1), instead of the rounding error an FMA would leave.
#pragma once

#include <type_traits>

#include "../../../core/fp8_recipe.hpp"
#include "common.cuh"
#include "fp8_codes.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

inline constexpr int kNormThreads = 256;   // threads of the block-per-row kernels
inline constexpr int kNormWarps = 4;       // warps (rows in flight) per block of the warp-per-row kernels
inline constexpr int kNormMaxPerLane = 32; // elements of a row one lane may hold: the warp path takes h <= 1024

STRATA_CUDA_INLINE index_t norm_backward_blocks(index_t rows) { return rows < 1 ? 1 : (rows > 512 ? 512 : rows); }

// The sum of `value` over the warp, the same bits in every lane (an xor butterfly adds the same two
// values in each pair of lanes).
template <class A>
__device__ __forceinline__ A warp_sum(A value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Calls f(std::integral_constant<int, G>{}) for the smallest G in {1, 2, 4, ...} with G >= vectors
// (16-byte vectors per lane) and G * V <= kNormMaxPerLane; false when h is too large for the warp path.
template <int V, int G = 1, class F>
bool with_vectors_per_lane(index_t vectors, F&& f) {
  if constexpr (G * V > kNormMaxPerLane) {
    return false;
  } else {
    if (vectors <= G) {
      f(std::integral_constant<int, G>{});
      return true;
    }
    return with_vectors_per_lane<V, 2 * G>(vectors, f);
  }
}

// --- a team of warps per row ----------------------------------------------------------------------

// Warps per block of the team kernels: kNormWarps teams of one warp, or one team of W warps.
template <int W>
inline constexpr int kNormTeamsPerBlock = W == 1 ? kNormWarps : 1;

// The sums of a and b over the team (W warps), the same bits in every thread: each warp's butterfly,
// then (W > 1) the warps' sums added in warp order through shared memory. W > 1 only with one team
// per block, so every thread of the block reaches the barrier the same number of times. `round`
// alternates the two slots, so one barrier per call suffices: a slot is written again only after the
// next call's barrier, which every thread reaches after reading it.
template <int W, class A>
__device__ __forceinline__ void team_sums(A& a, A& b, int& round) {
  a = warp_sum(a);
  b = warp_sum(b);
  if constexpr (W > 1) {
    __shared__ A slots[2][2][W];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, s = round++ & 1;
    if (lane == 0) {
      slots[s][0][warp] = a;
      slots[s][1][warp] = b;
    }
    __syncthreads();
    a = slots[s][0][0];
    b = slots[s][1][0];
#pragma unroll
    for (int w = 1; w < W; ++w) {
      a += slots[s][0][w];
      b += slots[s][1][w];
    }
  }
}

// The backward's team for rows wider than a warp holds: 8 warps with the fewest vectors a lane that
// hold the row (up to kNormMaxPerLane elements), else 16 warps of kNormMaxPerLane. Measured on an
// H100 (bf16, 8192 rows of 2048): 8 warps of one vector 64 us, 4 of two 71 us, 2 of four 93 us, 16
// of one (half idle) 97 us; the forward is fastest with the fewest warps (2 of four, 4 of two: 27 us).
template <int V, int MaxW = 16, class F>
bool with_norm_backward_team(index_t h, F&& f) {
  const index_t vectors = (h + V - 1) / V;
  if (with_vectors_per_lane<V>((vectors + 31) / 32, [&](auto g) { f(std::integral_constant<int, 1>{}, g); })) return true;
  if (with_vectors_per_lane<V>((vectors + 8 * 32 - 1) / (8 * 32), [&](auto g) { f(std::integral_constant<int, 8>{}, g); }))
    return true;
  if constexpr (MaxW >= 16) {
    constexpr int G = kNormMaxPerLane / V;
    if (vectors <= index_t(16) * 32 * G) {
      f(std::integral_constant<int, 16>{}, std::integral_constant<int, G>{});
      return true;
    }
  }
  return false;
}

// Calls f(std::integral_constant<int, W>{}, std::integral_constant<int, G>{}) with the team size W
// (warps per row) and the 16-byte vectors per lane G for a row of h elements: one warp (W = 1, the
// smallest G with G >= the vectors a lane needs) while the row fits a warp's registers, else the
// smallest W in {2, 4, 8, 16} that holds it with kNormMaxPerLane elements a lane. False when h is too
// large for every team up to MaxW warps (the block-per-row kernels take it).
template <int V, int MaxW = 16, class F>
bool with_norm_team(index_t h, F&& f) {
  const index_t vectors = (h + V - 1) / V;  // 16-byte vectors of the row
  if (with_vectors_per_lane<V>((vectors + 31) / 32, [&](auto g) { f(std::integral_constant<int, 1>{}, g); })) return true;
  constexpr int G = kNormMaxPerLane / V;
  const auto fits = [&](int w) { return vectors <= index_t(w) * 32 * G; };
  const std::integral_constant<int, G> g{};
  if (fits(2)) f(std::integral_constant<int, 2>{}, g);
  else if (fits(4)) f(std::integral_constant<int, 4>{}, g);
  else if (fits(8)) f(std::integral_constant<int, 8>{}, g);
  else if constexpr (MaxW >= 16) {
    if (fits(16)) f(std::integral_constant<int, 16>{}, g);
    else return false;
  }
  else return false;
  return true;
}

// Thread t of a team (t < W * 32) holds vectors j * W * 32 + t of its row, j < G.
template <class T, bool layer, int W, int G, class A = accumulate_t<T>>
__global__ void __launch_bounds__(kNormTeamsPerBlock<W> * W * 32) norm_forward_team_kernel(
    const T* x, const T* __restrict__ g, const T* __restrict__ b, index_t rows, int h, A eps, T* __restrict__ y, A* mean,
    A* rstd, const T* residual, T* sum_out, A weight_offset, Fp8Output fp8) {
  constexpr int V = packed<T>::width, N = W * 32;
  const int t = threadIdx.x % N;  // thread within the team
  const index_t teams = index_t(gridDim.x) * kNormTeamsPerBlock<W>;
  const float s = fp8.codes ? *fp8.scale : 0.0f;
  unsigned bits = 0;
  int round = 0;
  for (index_t r = blockIdx.x * index_t(kNormTeamsPerBlock<W>) + threadIdx.x / N; r < rows; r += teams) {
    const packed<T>* xr = reinterpret_cast<const packed<T>*>(x + r * h);  // x (rows, h), as (rows, h / V) vectors
    packed<T> raw[G];
#pragma unroll
    for (int j = 0; j < G; ++j)
      if ((j * N + t) * V < h) raw[j] = xr[j * N + t];
    if (residual) {  // raw := T(x + residual), written to sum (rows, h)
      const packed<T>* rr = reinterpret_cast<const packed<T>*>(residual + r * h);
      packed<T>* sr = reinterpret_cast<packed<T>*>(sum_out + r * h);
#pragma unroll
      for (int j = 0; j < G; ++j)
        if ((j * N + t) * V < h) {
          const packed<T> add = rr[j * N + t];
#pragma unroll
          for (int k = 0; k < V; ++k) raw[j].raw[k] = pack<T>(unpack<T>(raw[j].raw[k]) + unpack<T>(add.raw[k]));
          sr[j * N + t] = raw[j];
        }
    }
    A mu = 0;
    if constexpr (layer) {
      A sum = 0, unused = 0;
#pragma unroll
      for (int j = 0; j < G; ++j)
        if ((j * N + t) * V < h)
#pragma unroll
          for (int k = 0; k < V; ++k) sum += unpack<T>(raw[j].raw[k]);
      team_sums<W>(sum, unused, round);
      mu = sum / A(h);
    }
    A squares = 0, unused = 0;
#pragma unroll
    for (int j = 0; j < G; ++j)
      if ((j * N + t) * V < h)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A centered = unpack<T>(raw[j].raw[k]) - mu;
          squares += centered * centered;
        }
    team_sums<W>(squares, unused, round);
    const A rs = A(1) / sqrt_(squares / A(h) + eps);
    if (t == 0) {
      if constexpr (layer) mean[r] = mu;
      rstd[r] = rs;
    }
    packed<T>* yr = reinterpret_cast<packed<T>*>(y + r * h);
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int v = j * N + t;  // vector index within the row
      if (v * V >= h) continue;
      const packed<T> gv = reinterpret_cast<const packed<T>*>(g)[v];
      packed<T> bv{};
      if (layer && b) bv = reinterpret_cast<const packed<T>*>(b)[v];
      packed<T> result;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        A o = (unpack<T>(raw[j].raw[k]) - mu) * rs * (unpack<T>(gv.raw[k]) + weight_offset);
        if (layer && b) o += unpack<T>(bv.raw[k]);
        result.raw[k] = pack<T>(o);
      }
      if (fp8.codes) fp8_store_vector<T>(fp8.codes + r * h + index_t(v) * V, result, s, fp8.format, bits);
      else yr[v] = result;
    }
  }
  if (fp8.amax) fp8_block_amax(bits, fp8.amax);
}

// Dynamic shared memory: 2 (3 with ds_partials) * kNormTeamsPerBlock<W> * (G * V * W * 32) elements
// of A, each team's running dg and db sums (thread t only ever touches its own elements until the
// block adds the teams' sums together). Element k of thread t's vector j sits at
// (j * V + k) * W * 32 + t, so a warp's accesses hit 32 different banks.
template <class T, bool layer, int W, int G, class A = accumulate_t<T>>
__global__ void __launch_bounds__(kNormTeamsPerBlock<W> * W * 32) norm_backward_team_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ g, const A* mean, const A* rstd, index_t rows,
    int h, T* dx, A* dg_partials, A* db_partials, index_t stride, const T* dresidual, A* ds_partials, A weight_offset) {
  constexpr int V = packed<T>::width, N = W * 32, teams_here = kNormTeamsPerBlock<W>;
  extern __shared__ unsigned char norm_shared[];
  const int t = threadIdx.x % N, team = threadIdx.x / N;
  constexpr int P = G * V * N;                     // elements of a team's slice
  A* dg_sums = reinterpret_cast<A*>(norm_shared);  // dg_sums, db_sums[, ds_sums] (teams, G, V, N)
  A* db_sums = dg_sums + teams_here * P;
  A* ds_sums = db_sums + teams_here * P;           // allocated with ds_partials only
  A* dg_sum = dg_sums + team * P + t;              // this thread's element (j, k) at [(j * V + k) * N]
  A* db_sum = db_sums + team * P + t;
  A* ds_sum = ds_sums + team * P + t;
  packed<T> gv[G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int e = (j * N + t) * V;  // first element of vector j of this thread
    if (e >= h) continue;
    gv[j] = reinterpret_cast<const packed<T>*>(g)[j * N + t];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      dg_sum[(j * V + k) * N] = db_sum[(j * V + k) * N] = A(0);
      if (ds_partials) ds_sum[(j * V + k) * N] = A(0);
    }
  }

  const index_t teams = index_t(gridDim.x) * teams_here;
  int round = 0;
  for (index_t r = blockIdx.x * index_t(teams_here) + team; r < rows; r += teams) {
    const packed<T>* xr = reinterpret_cast<const packed<T>*>(x + r * h);  // x, dy (rows, h) as vectors
    const packed<T>* dyr = reinterpret_cast<const packed<T>*>(dy + r * h);
    packed<T> xv[G], dv[G];
#pragma unroll
    for (int j = 0; j < G; ++j)
      if ((j * N + t) * V < h) {
        xv[j] = xr[j * N + t];
        dv[j] = dyr[j * N + t];
      }
    const A mu = layer ? mean[r] : A(0), rs = rstd[r];
    A sum_gy = 0, sum_gy_xhat = 0;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int e = (j * N + t) * V;
      if (e >= h) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A d = unpack<T>(dv[j].raw[k]), xhat = (unpack<T>(xv[j].raw[k]) - mu) * rs;
        const A gy = mul_rn(d, unpack<T>(gv[j].raw[k]) + weight_offset);
        if constexpr (layer) sum_gy += gy;
        sum_gy_xhat += gy * xhat;
        dg_sum[(j * V + k) * N] += d * xhat;
        if constexpr (layer) db_sum[(j * V + k) * N] += d;
      }
    }
    team_sums<W>(sum_gy, sum_gy_xhat, round);
    const A mean_gy = layer ? sum_gy / A(h) : A(0);
    const A mean_gy_xhat = sum_gy_xhat / A(h);
    packed<T>* dxr = reinterpret_cast<packed<T>*>(dx + r * h);
    const packed<T>* drr = dresidual ? reinterpret_cast<const packed<T>*>(dresidual + r * h) : nullptr;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      if ((j * N + t) * V >= h) continue;
      packed<T> result, add{};
      if (drr) add = drr[j * N + t];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A xhat = (unpack<T>(xv[j].raw[k]) - mu) * rs, gy = mul_rn(unpack<T>(dv[j].raw[k]), unpack<T>(gv[j].raw[k]) + weight_offset);
        const A grad = rs * (gy - mean_gy - xhat * mean_gy_xhat);
        result.raw[k] = pack<T>(drr ? unpack<T>(add.raw[k]) + grad : grad);
        if (ds_partials) ds_sum[(j * V + k) * N] += unpack<T>(add.raw[k]);  // dresidual's column sums
      }
      dxr[j * N + t] = result;
    }
  }

  // The block's partial of each column: its teams' sums added in team order.
  __syncthreads();
  for (int c = threadIdx.x; c < h; c += blockDim.x) {
    const int at = ((c / (N * V)) * V + c % V) * N + (c / V) % N;  // c = (j * N + t) * V + k
    A dg_total = dg_sums[at], db_total = db_sums[at], ds_total = ds_partials ? ds_sums[at] : A(0);
    for (int w = 1; w < teams_here; ++w) {
      dg_total += dg_sums[w * P + at];
      db_total += db_sums[w * P + at];
      if (ds_partials) ds_total += ds_sums[w * P + at];
    }
    dg_partials[blockIdx.x * stride + c] = dg_total;  // partials (blocks, stride)
    if (db_partials) db_partials[blockIdx.x * stride + c] = db_total;
    if (ds_partials) ds_partials[blockIdx.x * stride + c] = ds_total;
  }
}

// --- a block per row (any h, any alignment) -------------------------------------------------------

template <class T, bool layer, class A = accumulate_t<T>>
__global__ void norm_forward_kernel(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean,
                                    A* rstd, const T* residual, T* sum_out, A weight_offset, Fp8Output fp8) {
  const float s = fp8.codes ? *fp8.scale : 0.0f;
  unsigned bits = 0;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * h;  // x (rows, h)
    if (residual) {  // sum (rows, h) = T(x + residual); each thread reads back only its own elements
      T* sr = sum_out + r * h;
      for (index_t i = threadIdx.x; i < h; i += blockDim.x) store(sr, i, load(xr, i) + load(residual + r * h, i));
      xr = sr;
    }
    A mu = 0;
    if constexpr (layer) {
      A sum = 0;
      for (index_t i = threadIdx.x; i < h; i += blockDim.x) sum += load(xr, i);
      mu = block_sum(sum) / A(h);
    }
    A squares = 0;
    for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
      const A centered = load(xr, i) - mu;
      squares += centered * centered;
    }
    const A rs = A(1) / sqrt_(block_sum(squares) / A(h) + eps);
    if (threadIdx.x == 0) {
      if constexpr (layer) mean[r] = mu;
      rstd[r] = rs;
    }
    for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
      A out = (load(xr, i) - mu) * rs * (load(g, i) + weight_offset);
      if (layer && b) out += load(b, i);
      if (fp8.codes) {  // the element as y would hold it, cast as fp8_cast casts it
        const float e = static_cast<float>(unpack<T>(pack<T>(out)));
        bits = max(bits, fp8_abs_bits(e));
        fp8.codes[r * h + i] = fp8_round(e * s, fp8.format);
      } else {
        store(y + r * h, i, out);
      }
    }
  }
  if (fp8.amax) fp8_block_amax(bits, fp8.amax);
}

template <class T, bool layer, class A = accumulate_t<T>>
__global__ void norm_backward_kernel(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows,
                                     index_t h, T* dx, A* dg_partials, A* db_partials, index_t stride,
                                     const T* dresidual, A* ds_partials, A weight_offset) {
  A* dg_part = dg_partials + blockIdx.x * stride;  // partials (blocks, stride)
  A* db_part = db_partials ? db_partials + blockIdx.x * stride : nullptr;
  A* ds_part = ds_partials ? ds_partials + blockIdx.x * stride : nullptr;
  for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
    dg_part[i] = 0;
    if (db_part) db_part[i] = 0;
    if (ds_part) ds_part[i] = 0;
  }
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    const A mu = layer ? mean[r] : A(0), rs = rstd[r];
    A sum_gy = 0, sum_gy_xhat = 0;
    for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
      const A d = load(dyr, i), xhat = (load(xr, i) - mu) * rs, gy = mul_rn(d, load(g, i) + weight_offset);
      if constexpr (layer) sum_gy += gy;
      sum_gy_xhat += gy * xhat;
      dg_part[i] += d * xhat;
      if (db_part) db_part[i] += d;
    }
    const A mean_gy = layer ? block_sum(sum_gy) / A(h) : A(0);
    const A mean_gy_xhat = block_sum(sum_gy_xhat) / A(h);
    T* dxr = dx + r * h;
    for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
      const A xhat = (load(xr, i) - mu) * rs, gy = mul_rn(load(dyr, i), load(g, i) + weight_offset);
      const A grad = rs * (gy - mean_gy - xhat * mean_gy_xhat);
      const A add = dresidual ? load(dresidual + r * h, i) : A(0);  // read before dx (which may be dresidual) is written
      store(dxr, i, dresidual ? add + grad : grad);
      if (ds_part) ds_part[i] += add;  // dresidual's column sums
    }
  }
}

// --- launchers ------------------------------------------------------------------------------------

// Whether the rows of [rows, h] at every pointer can be read as 16-byte vectors.
template <class T>
bool norm_vectorized(index_t h, std::initializer_list<const void*> pointers) {
  if ((h * index_t(sizeof(T))) % 16 != 0) return false;
  for (const void* p : pointers)
    if (p && !aligned_16(p)) return false;
  return true;
}

template <class T, bool layer, class A>
void norm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean, A* rstd,
                  const T* residual, T* sum, cudaStream_t stream, const char* name, A weight_offset, Fp8Output fp8) {
  if (rows <= 0 || h <= 0) return;
  constexpr int V = packed<T>::width;
  if (fp8.codes) y = nullptr;  // the codes instead
  const bool warp_path = norm_vectorized<T>(h, {x, g, b, y, residual, sum, fp8.codes}) &&
                         with_norm_team<V>(h, [&](auto team, auto vectors) {
                           constexpr int W = decltype(team)::value, teams = kNormTeamsPerBlock<W>;
                           const auto blocks = static_cast<unsigned>(std::min<index_t>((rows + teams - 1) / teams, 65535));
                           norm_forward_team_kernel<T, layer, W, decltype(vectors)::value, A><<<blocks, teams * W * 32, 0, stream>>>(
                               x, g, b, rows, static_cast<int>(h), eps, y, mean, rstd, residual, sum, weight_offset, fp8);
                         });
  if (!warp_path) {
    const unsigned blocks = static_cast<unsigned>(std::min<index_t>(rows, 65535));
    norm_forward_kernel<T, layer, A><<<blocks, kNormThreads, 0, stream>>>(x, g, b, rows, h, eps, y, mean, rstd, residual, sum,
                                                                          weight_offset, fp8);
  }
  check_launch(name);
}

template <class T, bool layer, class A>
void norm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows, index_t h, T* dx,
                   A* dg, A* db, const T* dresidual, A* workspace, bool accumulate, cudaStream_t stream,
                   const char* name, A* dresidual_sums = nullptr, A weight_offset = A(0)) {
  if (h <= 0) return;
  if (rows <= 0) {
    if (accumulate) return;  // adds nothing
    STRATA_CUDA_CHECK(cudaMemsetAsync(dg, 0, h * sizeof(A), stream));
    if (db) STRATA_CUDA_CHECK(cudaMemsetAsync(db, 0, h * sizeof(A), stream));
    return;
  }
  constexpr int V = packed<T>::width;
  const index_t blocks = norm_backward_blocks(rows);
  A* ds = dresidual ? dresidual_sums : nullptr;
  // Block k's partials: dg at [k, 0, h), db at [k, h, 2h) of a (blocks, stride) array, so one
  // sum_partials adds both; dresidual's column sums (ds) after them.
  const index_t stride = (1 + (db != nullptr) + (ds != nullptr)) * h;
  A* dg_partials = workspace;
  A* db_partials = db ? workspace + h : nullptr;
  A* ds_partials = ds ? workspace + stride - h : nullptr;
  const int shared_arrays = ds ? 3 : 2;
  const bool warp_path = norm_vectorized<T>(h, {dy, x, g, dx, dresidual}) &&
                         // (double rows stop at 8 warps: 16 would need 384 KiB of shared memory)
                         with_norm_backward_team<V, sizeof(A) == 8 ? 8 : 16>(h, [&](auto team, auto vectors) {
                           constexpr int W = decltype(team)::value, teams = kNormTeamsPerBlock<W>, G = decltype(vectors)::value;
                           const std::size_t shared = shared_arrays * std::size_t(teams) * G * V * W * 32 * sizeof(A);
                           auto* kernel = &norm_backward_team_kernel<T, layer, W, G, A>;
                           // above the default limit of 48 KiB a block (the dynamic part with the
                           // teams' static sums slots): ask for it
                           if (shared + 1024 > 48 * 1024)
                             STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                    static_cast<int>(shared)));
                           kernel<<<static_cast<unsigned>(blocks), teams * W * 32, shared, stream>>>(
                                   dy, x, g, mean, rstd, rows, static_cast<int>(h), dx, dg_partials, db_partials, stride,
                                   dresidual, ds_partials, weight_offset);
                         });
  if (!warp_path)
    norm_backward_kernel<T, layer, A><<<static_cast<unsigned>(blocks), kNormThreads, 0, stream>>>(
        dy, x, g, mean, rstd, rows, h, dx, dg_partials, db_partials, stride, dresidual, ds_partials, weight_offset);
  check_launch(name);
  sum_partials<A, A>(workspace, blocks, db ? 2 * h : h, dg, accumulate, stream, db, h, stride);
  if (ds) sum_partials<A, A>(ds_partials, blocks, h, ds, true, stream, static_cast<A*>(nullptr), -1, stride);
}

template <class T, class A>
void layernorm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean, A* rstd,
                       const T* residual, T* sum, cudaStream_t stream, A weight_offset, Fp8Output fp8) {
  norm_forward<T, true, A>(x, g, b, rows, h, eps, y, mean, rstd, residual, sum, stream, "layernorm_forward", weight_offset,
                           fp8);
}

// workspace: 3 * norm_backward_blocks(rows) * h elements of A. accumulate: dg, db += instead of =.
// dresidual_sums (with dresidual): the column sums of dresidual added into it (the bias gradient of
// the layer whose output gradient dresidual is).
template <class T, class A>
void layernorm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows, index_t h,
                        T* dx, A* dg, A* db, const T* dresidual, A* workspace, bool accumulate, cudaStream_t stream,
                        A* dresidual_sums, A weight_offset) {
  norm_backward<T, true, A>(dy, x, g, mean, rstd, rows, h, dx, dg, db, dresidual, workspace, accumulate, stream,
                            "layernorm_backward", dresidual_sums, weight_offset);
}

template <class T, class A>
void rmsnorm_forward(const T* x, const T* g, index_t rows, index_t h, A eps, T* y, A* rstd, const T* residual, T* sum,
                     cudaStream_t stream, A weight_offset, Fp8Output fp8) {
  norm_forward<T, false, A>(x, g, nullptr, rows, h, eps, y, nullptr, rstd, residual, sum, stream, "rmsnorm_forward",
                            weight_offset, fp8);
}

// workspace: norm_backward_blocks(rows) * h elements of A.
template <class T, class A>
void rmsnorm_backward(const T* dy, const T* x, const T* g, const A* rstd, index_t rows, index_t h, T* dx, A* dg,
                      const T* dresidual, A* workspace, bool accumulate, cudaStream_t stream, A weight_offset) {
  norm_backward<T, false, A>(dy, x, g, nullptr, rstd, rows, h, dx, dg, nullptr, dresidual, workspace, accumulate,
                             stream, "rmsnorm_backward", nullptr, weight_offset);
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
