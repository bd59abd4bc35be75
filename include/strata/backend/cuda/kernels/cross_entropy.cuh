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
//   masked_loss_sum         out[0] = sum_i mask[i] loss[i] in double
//
// `smoothing` is the factor s = a K / (K - 1) the layer computes from the user's label smoothing a
// (0: none), as in the CPU twin. Row kernels give one 256-thread block to a row (block sums in a
// fixed order); masked_loss_sum is one block striding over n, so its order is fixed too.
// logits, dlogits [rows, local]; labels, row_max, lse, loss, dloss [rows]; sums [rows, 3].
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T, class A = accumulate_t<T>>
__global__ void cross_entropy_max_kernel(const T* logits, index_t rows, index_t local, index_t used, A* row_max) {
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    A m = -INFINITY;
    for (index_t j = threadIdx.x; j < used; j += blockDim.x) m = max_(m, load(logits, r * local + j));
    m = block_max(m);
    if (threadIdx.x == 0) row_max[r] = m;
  }
}
template <class T, class A = accumulate_t<T>>
void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max, cudaStream_t stream) {
  if (rows <= 0) return;
  cross_entropy_max_kernel<T, A><<<static_cast<unsigned>(std::min<index_t>(rows, 65535)), kThreads, 0, stream>>>(
      logits, rows, local, used, row_max);
  check_launch("cross_entropy_max");
}

template <class T, class A = accumulate_t<T>>
__global__ void cross_entropy_sums_kernel(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                                          const std::int32_t* labels, index_t begin, A* sums) {
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const A m = row_max[r];
    A sum_exp = 0, sum_logits = 0;
    for (index_t j = threadIdx.x; j < used; j += blockDim.x) {
      const A z = load(logits, r * local + j);
      sum_exp += exp_(z - m);
      sum_logits += z;
    }
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
template <class T, class A = accumulate_t<T>>
void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                        const std::int32_t* labels, index_t begin, A* sums, cudaStream_t stream) {
  if (rows <= 0) return;
  cross_entropy_sums_kernel<T, A><<<static_cast<unsigned>(std::min<index_t>(rows, 65535)), kThreads, 0, stream>>>(
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

template <class T, class A = accumulate_t<T>>
__global__ void cross_entropy_backward_kernel(const T* logits, const A* lse, const std::int32_t* labels, index_t begin,
                                              index_t rows, index_t local, index_t used, index_t vocab, A smoothing,
                                              const A* dloss, T* dlogits) {
  const A s = smoothing;
  const index_t n = rows * local;
  for (index_t e = blockIdx.x * index_t(blockDim.x) + threadIdx.x; e < n; e += index_t(gridDim.x) * blockDim.x) {
    const index_t r = e / local, j = e % local;  // logits (rows, local)
    if (j >= used) {
      store(dlogits, e, A(0));
      continue;
    }
    A g = exp_(load(logits, e) - lse[r]) - s / A(vocab);
    if (j == static_cast<index_t>(labels[r]) - begin) g -= A(1) - s;
    store(dlogits, e, g * dloss[r]);
  }
}
template <class T, class A = accumulate_t<T>>
void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin, index_t rows,
                            index_t local, index_t used, index_t vocab, A smoothing, const A* dloss, T* dlogits,
                            cudaStream_t stream) {
  if (rows <= 0 || local <= 0) return;
  cross_entropy_backward_kernel<T, A><<<grid_for(rows * local), kThreads, 0, stream>>>(
      logits, lse, labels, begin, rows, local, used, vocab, smoothing, dloss, dlogits);
  check_launch("cross_entropy_backward");
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
