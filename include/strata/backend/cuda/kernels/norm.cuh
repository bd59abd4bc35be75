// strata/backend/cuda/kernels/norm.cuh: LayerNorm and RMSNorm over the last dimension, forward and
// backward, statistics and sums in A = accumulate_t<T>.
//
//   LayerNorm: y = (x - mean) * rstd * g + b,   rstd = 1 / sqrt(mean((x - mean)^2) + eps)
//   RMSNorm:   y = x * rstd * g,                rstd = 1 / sqrt(mean(x^2) + eps)
//   backward:  xhat = (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm),  gy = dy * g
//              dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))   (RMSNorm: no mean(gy) term)
//              dg = sum_r dy * xhat,  db = sum_r dy   (written, not accumulated)
//
// x, y, dy, dx [rows, h]; g, b [h]; mean, rstd [rows]. A 256-thread block normalizes one row at a
// time (block_sum gives the row sums in a fixed order). The weight gradients are deterministic:
// block k of the backward handles rows k, k + blocks, ... and its thread owning column c adds that
// row's dy * xhat into partials[k, c] (one writer per element, rows in order); a second kernel sums
// the partials over k in order. The block count depends on `rows` only. Workspace: 2 * blocks * h.
// gy is rounded on its own (mul_rn) in both passes, so gy - mean(gy) is exactly 0 where the host
// gets 0 (h = 1), instead of the rounding error an FMA would leave.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

inline constexpr int kNormThreads = 256;

inline index_t norm_backward_blocks(index_t rows) { return rows < 1 ? 1 : (rows > 512 ? 512 : rows); }

template <class T, bool layer, class A = accumulate_t<T>>
__global__ void norm_forward_kernel(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean,
                                    A* rstd) {
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * h;  // x (rows, h)
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
    T* yr = y + r * h;
    for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
      A out = (load(xr, i) - mu) * rs * load(g, i);
      if (layer && b) out += load(b, i);
      store(yr, i, out);
    }
  }
}

template <class T, bool layer, class A = accumulate_t<T>>
__global__ void norm_backward_kernel(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows,
                                     index_t h, T* dx, A* dg_partials, A* db_partials) {
  A* dg_part = dg_partials + blockIdx.x * h;  // partials (blocks, h)
  A* db_part = db_partials ? db_partials + blockIdx.x * h : nullptr;
  for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
    dg_part[i] = 0;
    if (db_part) db_part[i] = 0;
  }
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    const A mu = layer ? mean[r] : A(0), rs = rstd[r];
    A sum_gy = 0, sum_gy_xhat = 0;
    for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
      const A d = load(dyr, i), xhat = (load(xr, i) - mu) * rs, gy = mul_rn(d, load(g, i));
      if constexpr (layer) sum_gy += gy;
      sum_gy_xhat += gy * xhat;
      dg_part[i] += d * xhat;
      if (db_part) db_part[i] += d;
    }
    const A mean_gy = layer ? block_sum(sum_gy) / A(h) : A(0);
    const A mean_gy_xhat = block_sum(sum_gy_xhat) / A(h);
    T* dxr = dx + r * h;
    for (index_t i = threadIdx.x; i < h; i += blockDim.x) {
      const A xhat = (load(xr, i) - mu) * rs, gy = mul_rn(load(dyr, i), load(g, i));
      store(dxr, i, rs * (gy - mean_gy - xhat * mean_gy_xhat));
    }
  }
}

template <class T, class A = accumulate_t<T>>
void layernorm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean, A* rstd,
                       cudaStream_t stream) {
  if (rows <= 0 || h <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<index_t>(rows, 65535));
  norm_forward_kernel<T, true, A><<<blocks, kNormThreads, 0, stream>>>(x, g, b, rows, h, eps, y, mean, rstd);
  check_launch("layernorm_forward");
}

// workspace: 2 * norm_backward_blocks(rows) * h elements of A.
template <class T, class A = accumulate_t<T>>
void layernorm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows, index_t h,
                        T* dx, A* dg, A* db, A* workspace, cudaStream_t stream) {
  if (h <= 0) return;
  if (rows <= 0) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(dg, 0, h * sizeof(A), stream));
    if (db) STRATA_CUDA_CHECK(cudaMemsetAsync(db, 0, h * sizeof(A), stream));
    return;
  }
  const index_t blocks = norm_backward_blocks(rows);
  A* dg_partials = workspace;
  A* db_partials = db ? workspace + blocks * h : nullptr;
  norm_backward_kernel<T, true, A><<<static_cast<unsigned>(blocks), kNormThreads, 0, stream>>>(
      dy, x, g, mean, rstd, rows, h, dx, dg_partials, db_partials);
  check_launch("layernorm_backward");
  sum_partials<A, A>(dg_partials, blocks, h, dg, false, stream);
  if (db) sum_partials<A, A>(db_partials, blocks, h, db, false, stream);
}

template <class T, class A = accumulate_t<T>>
void rmsnorm_forward(const T* x, const T* g, index_t rows, index_t h, A eps, T* y, A* rstd, cudaStream_t stream) {
  if (rows <= 0 || h <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<index_t>(rows, 65535));
  norm_forward_kernel<T, false, A><<<blocks, kNormThreads, 0, stream>>>(x, g, nullptr, rows, h, eps, y, nullptr, rstd);
  check_launch("rmsnorm_forward");
}

// workspace: norm_backward_blocks(rows) * h elements of A.
template <class T, class A = accumulate_t<T>>
void rmsnorm_backward(const T* dy, const T* x, const T* g, const A* rstd, index_t rows, index_t h, T* dx, A* dg,
                      A* workspace, cudaStream_t stream) {
  if (h <= 0) return;
  if (rows <= 0) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(dg, 0, h * sizeof(A), stream));
    return;
  }
  const index_t blocks = norm_backward_blocks(rows);
  norm_backward_kernel<T, false, A><<<static_cast<unsigned>(blocks), kNormThreads, 0, stream>>>(
      dy, x, g, nullptr, rstd, rows, h, dx, workspace, nullptr);
  check_launch("rmsnorm_backward");
  sum_partials<A, A>(workspace, blocks, h, dg, false, stream);
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
