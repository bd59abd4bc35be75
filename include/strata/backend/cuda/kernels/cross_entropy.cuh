// strata/backend/cuda/kernels/cross_entropy.cuh: the pieces of vocabulary-parallel cross-entropy and
// the masked loss sum. Logits stay in T: no fp32 copy of the [rows, local] logits is ever made.
//
//   cross_entropy_max       row_max[r] = max_{j < used} z[r, j]              (-inf when used = 0)
//   cross_entropy_sums      sums[r] = (sum_{j<used} e^(z_j - m_r), z_label or 0, sum_{j<used} z_j)
//                           z_label when begin <= label < begin + used (the label's column is held here)
//   (the caller all-reduces max and sums over the tensor-parallel group between the steps)
//   cross_entropy_loss      lse = m + log S;  loss = lse - z_t;  with the smoothing factor s (K = vocab):
//                           loss = (1 - s) loss - s (Z / K - lse)
//   cross_entropy_backward  dz[r, j] = (e^(z_j - lse_r) - s / K - (1 - s) [j = label - begin]) dloss[r]
//                           for j < used; padded columns j >= used get 0; a thread reads the element
//                           it writes and no other, so dlogits may be logits (in place)
//   cross_entropy_forward_backward
//                           all of the above in one kernel when this rank holds every column
//                           (begin = 0, no all-reduce between the steps): per row, one pass for a
//                           running max and sum of e^(z - max), then the loss, then the gradient
//                           written over the logits; the second pass finds the row in L2 (few rows
//                           in flight), so the logits cross DRAM once in and once out
//   masked_loss_sum         out[0] = sum_i mask[i] loss[i] in double
//
// `smoothing` is the factor s = a K / (K - 1) the layer computes from the user's label smoothing a
// (0: none), as in the CPU twin. logits, dlogits [rows, local]; labels, row_max, lse, loss, dloss
// [rows]; sums [rows, 3].
//
// The row kernels (max, sums, backward) each move the whole [rows, local] logits once, so they are
// bound by memory bandwidth: one 256-thread block per row, each thread keeping four 16-byte loads in
// flight. A row is read as a scalar head up to its first 16-byte boundary, 16-byte vectors, and a
// scalar tail, so any row start and any `used` take the vector loads; the backward writes dlogits
// in 16-byte stores when its rows sit at the same offset from a 16-byte boundary as the logits' rows
// (else one element at a time). In float, e^x is exp2f of a pre-scaled argument (one fused
// multiply-add and the hardware exp2). Each thread adds its columns in a fixed order and the block
// sum is fixed (common.cuh), so the order depends on sizes and alignment only: same bits every run,
// no atomics. masked_loss_sum is one block striding over n, so its order is fixed too.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

// Tuning (never changes what is computed, only how fast; the order of the sums depends on these and
// on the sizes and alignment, so it is fixed for a given call): threads per row and 16-byte vectors
// each thread loads before it uses them.
inline constexpr int kCrossEntropyThreads = 256;
inline constexpr int kCrossEntropyUnroll = 4;
// kCrossEntropyFusedBlocksPerSm (launchers.hpp): blocks per multiprocessor of the fused kernel.

// e^(z - shift) for many z of one row. float: exp2f of z log2(e) - shift log2(e) (one fused
// multiply-add and the hardware exp2, within a few ulp of expf for the arguments of a softmax);
// double: exp.
template <class A>
struct shifted_exp {
  A shift;  // float: shift log2(e)
  __device__ explicit shifted_exp(A shift_by) {
    if constexpr (std::is_same_v<A, float>) shift = shift_by * 1.4426950408889634f; else shift = shift_by;
  }
  __device__ __forceinline__ A operator()(A z) const {
    if constexpr (std::is_same_v<A, float>) return exp2f(fmaf(z, 1.4426950408889634f, -shift));
    else return exp(z - shift);
  }
};

// The columns [0, n) of one row, split for 16-byte loads: `head` (< width) scalar columns up to the
// first 16-byte boundary of the row, then `vectors` whole 16-byte vectors, then the scalar tail from
// column `tail`. Not vectorized: no head and no vectors, every column in the tail.
template <class T>
struct row_split {
  index_t head = 0, vectors = 0, tail = 0;
  __device__ row_split(const T* row, index_t n, bool vectorized) {
    constexpr index_t width = packed<T>::width;
    if (!vectorized) return;
    const auto misaligned = static_cast<index_t>((reinterpret_cast<std::uintptr_t>(row) % 16) / sizeof(T));
    head = misaligned == 0 ? 0 : (width - misaligned < n ? width - misaligned : n);
    vectors = (n - head) / width;
    tail = head + vectors * width;
  }
};

// Calls visit(z) with the values (in the accumulate type) of the columns j < n of `row` that this
// thread holds, a group at a time (z is an array: one column, one 16-byte vector, or
// kCrossEntropyUnroll vectors loaded together), in a fixed order: its head column, its 16-byte
// vectors, its tail columns. Any row start (aligned to its element) reads 16 bytes at a time between
// its head and its tail.
template <class T, class Visit>
__device__ __forceinline__ void visit_row(const T* __restrict__ row, index_t n, Visit&& visit) {
  using A = accumulate_t<T>;
  constexpr int width = packed<T>::width, unroll = kCrossEntropyUnroll;
  const row_split<T> split(row, n, true);
  const index_t threads = blockDim.x;
  if (threadIdx.x < split.head) {
    const A z[1] = {load(row, threadIdx.x)};
    visit(z);
  }
  const packed<T>* body = reinterpret_cast<const packed<T>*>(row + split.head);  // (vectors, width)
  index_t v = threadIdx.x;
  for (; v + (unroll - 1) * threads < split.vectors; v += unroll * threads) {
    packed<T> in[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u) in[u] = body[v + u * threads];
    A z[unroll * width];
#pragma unroll
    for (int u = 0; u < unroll; ++u)
#pragma unroll
      for (int k = 0; k < width; ++k) z[u * width + k] = unpack<T>(in[u].raw[k]);
    visit(z);
  }
  for (; v < split.vectors; v += threads) {
    const packed<T> in = body[v];
    A z[width];
#pragma unroll
    for (int k = 0; k < width; ++k) z[k] = unpack<T>(in.raw[k]);
    visit(z);
  }
  for (index_t j = split.tail + threadIdx.x; j < n; j += threads) {
    const A z[1] = {load(row, j)};
    visit(z);
  }
}

template <class A>
__device__ __forceinline__ A fmax_(A a, A b) {
  if constexpr (std::is_same_v<A, float>) return fmaxf(a, b); else return fmax(a, b);
}

// One block per row.
template <class T, class A = accumulate_t<T>>
__global__ void __launch_bounds__(kCrossEntropyThreads) cross_entropy_max_kernel(const T* __restrict__ logits, index_t rows,
                                                                                 index_t local, index_t used, A* row_max) {
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    A m = -INFINITY;
    visit_row(logits + r * local, used, [&](const auto& z) {  // logits (rows, local)
      for (const A value : z) m = fmax_(m, value);
    });
    m = block_max(m);
    if (threadIdx.x == 0) row_max[r] = m;
  }
}
template <class T, class A>
void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max, cudaStream_t stream) {
  if (rows <= 0) return;
  cross_entropy_max_kernel<T, A><<<static_cast<unsigned>(std::min<index_t>(rows, 65535)), kCrossEntropyThreads, 0, stream>>>(
      logits, rows, local, used, row_max);
  check_launch("cross_entropy_max");
}

template <class T, class A = accumulate_t<T>>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_sums_kernel(const T* __restrict__ logits, index_t rows, index_t local, index_t used, const A* row_max,
                              const std::int32_t* labels, index_t begin, A* sums) {
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const shifted_exp<A> exp_minus_max(row_max[r]);
    A sum_exp = 0, sum_logits = 0;
    visit_row(logits + r * local, used, [&](const auto& z) {  // logits (rows, local)
      for (const A value : z) {
        sum_exp += exp_minus_max(value);
        sum_logits += value;
      }
    });
    sum_exp = block_sum(sum_exp);
    sum_logits = block_sum(sum_logits);
    if (threadIdx.x == 0) {
      const index_t column = static_cast<index_t>(labels[r]) - begin;
      sums[3 * r] = sum_exp;
      sums[3 * r + 1] = column >= 0 && column < used ? load(logits, r * local + column) : A(0);
      sums[3 * r + 2] = sum_logits;
    }
  }
}
template <class T, class A>
void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                        const std::int32_t* labels, index_t begin, A* sums, cudaStream_t stream) {
  if (rows <= 0) return;
  cross_entropy_sums_kernel<T, A><<<static_cast<unsigned>(std::min<index_t>(rows, 65535)), kCrossEntropyThreads, 0, stream>>>(
      logits, rows, local, used, row_max, labels, begin, sums);
  check_launch("cross_entropy_sums");
}

template <class A>
__global__ void cross_entropy_loss_kernel(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing,
                                          A* loss, A* lse) {
  const A s = smoothing;
  for (index_t r = blockIdx.x * index_t(blockDim.x) + threadIdx.x; r < rows; r += index_t(gridDim.x) * blockDim.x) {
    const A log_sum = log_(sums[3 * r]);
    const A row_lse = row_max[r] + log_sum;
    A value = log_sum + row_max[r] - sums[3 * r + 1];
    if (s > A(0)) {
      const A mean_log_prob = sums[3 * r + 2] / A(vocab) - row_max[r] - log_sum;
      value = (A(1) - s) * value - s * mean_log_prob;
    }
    loss[r] = value;
    lse[r] = row_lse;
  }
}
template <class A>
void cross_entropy_loss(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing, A* loss, A* lse,
                        cudaStream_t stream) {
  if (rows <= 0) return;
  cross_entropy_loss_kernel<A><<<grid_for(rows), kThreads, 0, stream>>>(sums, row_max, rows, vocab, smoothing, loss, lse);
  check_launch("cross_entropy_loss");
}

// The gradient of one row, written by the whole block: dz_j = (e^(z_j - lse) - uniform - hit [j =
// label]) scale for j < used, 0 for the padded columns j < local. Every column of the row written,
// in 16-byte vectors where the logits and dlogits rows start at the same offset from a 16-byte
// boundary (vectorized), else one element at a time. A thread reads each element it writes, and no
// other, so `out` may be `in`.
template <class T, class A>
__device__ __forceinline__ void write_gradient_row(const T* in, T* out, A lse, index_t label, A scale, index_t local,
                                                   index_t used, A uniform, A hit, bool vectorized) {
  constexpr int width = packed<T>::width, unroll = kCrossEntropyUnroll;
  const index_t threads = blockDim.x;
  const shifted_exp<A> softmax(lse);
  // Column j's gradient from its logit z (the CPU twin's order of operations).
  const auto gradient = [&](A z, index_t j) -> A {
    if (j >= used) return A(0);
    A g = softmax(z) - uniform;
    if (j == label) g -= hit;
    return g * scale;
  };
  const row_split<T> split(in, local, vectorized);
  if (threadIdx.x < split.head) store(out, threadIdx.x, gradient(load(in, threadIdx.x), threadIdx.x));
  const packed<T>* body_in = reinterpret_cast<const packed<T>*>(in + split.head);  // (vectors, width)
  packed<T>* body_out = reinterpret_cast<packed<T>*>(out + split.head);
  // One vector whose first column is j: the plain formula unless it holds the label or padding.
  const auto vector_gradient = [&](const packed<T>& z, index_t j) {
    packed<T> g;
    if (j + width <= used && (label < j || label >= j + width)) {
#pragma unroll
      for (int k = 0; k < width; ++k) g.raw[k] = pack<T>((softmax(unpack<T>(z.raw[k])) - uniform) * scale);
    } else {
#pragma unroll
      for (int k = 0; k < width; ++k) g.raw[k] = pack<T>(gradient(unpack<T>(z.raw[k]), j + k));
    }
    return g;
  };
  index_t v = threadIdx.x;
  for (; v + (unroll - 1) * threads < split.vectors; v += unroll * threads) {
    packed<T> z[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u) z[u] = body_in[v + u * threads];
#pragma unroll
    for (int u = 0; u < unroll; ++u)
      body_out[v + u * threads] = vector_gradient(z[u], split.head + (v + u * threads) * width);
  }
  for (; v < split.vectors; v += threads) body_out[v] = vector_gradient(body_in[v], split.head + v * width);
  for (index_t j = split.tail + threadIdx.x; j < local; j += threads) store(out, j, gradient(load(in, j), j));
}

// One block per row.
template <class T, class A = accumulate_t<T>>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_backward_kernel(const T* logits, const A* lse, const std::int32_t* labels, index_t begin,
                                  index_t rows, index_t local, index_t used, index_t vocab, A smoothing, const A* dloss,
                                  T* dlogits, bool vectorized) {
  const A uniform = smoothing / A(vocab), hit = A(1) - smoothing;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x)  // logits, dlogits (rows, local)
    write_gradient_row(logits + r * local, dlogits + r * local, lse[r], static_cast<index_t>(labels[r]) - begin,
                       dloss[r], local, used, uniform, hit, vectorized);
}
template <class T, class A>
void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin, index_t rows,
                            index_t local, index_t used, index_t vocab, A smoothing, const A* dloss, T* dlogits,
                            cudaStream_t stream) {
  if (rows <= 0 || local <= 0) return;
  const bool vectorized = reinterpret_cast<std::uintptr_t>(logits) % 16 == reinterpret_cast<std::uintptr_t>(dlogits) % 16;
  cross_entropy_backward_kernel<T, A><<<static_cast<unsigned>(std::min<index_t>(rows, 65535)), kCrossEntropyThreads, 0, stream>>>(
      logits, lse, labels, begin, rows, local, used, vocab, smoothing, dloss, dlogits, vectorized);
  check_launch("cross_entropy_backward");
}

// A thread's running softmax statistics over its columns of a row: the max m, the sum of e^(z - m)
// and the sum of z. Columns arrive in groups (a 16-byte vector or a few); the sum is rescaled once
// per group whose max exceeds m, so each column costs one exponential.
template <class A>
struct running_softmax {
  A m = -INFINITY, s = 0, z_sum = 0;
  template <int N>
  __device__ __forceinline__ void add(const A (&z)[N]) {
    A g = z[0];
#pragma unroll
    for (int k = 1; k < N; ++k) g = fmax_(g, z[k]);
    if (g > m) {
      s *= shifted_exp<A>(g)(m);  // e^(m - g); 0 while m is -inf
      m = g;
    }
    const shifted_exp<A> e(m);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      s += e(z[k]);
      z_sum += z[k];
    }
  }
};

// Rows [blockIdx.x, rows) by gridDim.x, one block per row at a time; the grid is a few blocks per
// multiprocessor so that the rows in flight fit in L2 between the two passes.
template <class T, class A = accumulate_t<T>>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_forward_backward_kernel(T* logits, const std::int32_t* labels, index_t rows, index_t local,
                                          index_t used, index_t vocab, A smoothing, const A* dloss, A* loss) {
  __shared__ A row_lse;
  const A uniform = smoothing / A(vocab), hit = A(1) - smoothing;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* row = logits + r * local;  // logits (rows, local), then their gradient
    running_softmax<A> acc;
    visit_row(static_cast<const T*>(row), used, [&](const auto& z) { acc.add(z); });
    const A row_max = block_max(acc.m);
    const A sum_exp = block_sum(acc.m == -INFINITY ? A(0) : acc.s * shifted_exp<A>(row_max)(acc.m));
    const A sum_logits = block_sum(acc.z_sum);
    const index_t label = static_cast<index_t>(labels[r]);
    if (threadIdx.x == 0) {  // the label's logit is read before any thread overwrites the row
      const A target = label >= 0 && label < used ? load(row, label) : A(0);
      const A log_sum = log_(sum_exp);
      A value = log_sum + row_max - target;
      if (smoothing > A(0)) value = (A(1) - smoothing) * value - smoothing * (sum_logits / A(vocab) - row_max - log_sum);
      loss[r] = value;
      row_lse = row_max + log_sum;
    }
    __syncthreads();
    write_gradient_row(row, row, row_lse, label, dloss[r], local, used, uniform, hit, true);
  }
}
template <class T, class A>
void cross_entropy_forward_backward(T* logits, const std::int32_t* labels, index_t rows, index_t local, index_t used,
                                    index_t vocab, A smoothing, const A* dloss, A* loss, cudaStream_t stream,
                                    int blocks_per_multiprocessor) {
  if (rows <= 0 || local <= 0) return;
  const index_t blocks = std::min<index_t>(rows, index_t(multiprocessor_count()) * blocks_per_multiprocessor);
  cross_entropy_forward_backward_kernel<T, A><<<static_cast<unsigned>(blocks), kCrossEntropyThreads, 0, stream>>>(
      logits, labels, rows, local, used, vocab, smoothing, dloss, loss);
  check_launch("cross_entropy_forward_backward");
}

template <class A>
__global__ void masked_loss_sum_kernel(const A* loss, const A* mask, index_t n, double* out) {
  double sum = 0;
  for (index_t i = threadIdx.x; i < n; i += blockDim.x) sum += double(mask[i]) * double(loss[i]);
  sum = block_sum(sum);
  if (threadIdx.x == 0) out[0] = sum;
}
template <class A>
void masked_loss_sum(const A* loss, const A* mask, index_t n, double* out, cudaStream_t stream) {
  masked_loss_sum_kernel<A><<<1, 1024, 0, stream>>>(loss, mask, n, out);
  check_launch("masked_loss_sum");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
