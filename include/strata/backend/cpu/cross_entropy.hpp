// strata/backend/cpu/cross_entropy.hpp: the pieces of vocabulary-parallel cross-entropy, on logits
// [rows, local] of which the first `used` columns are real vocabulary entries (the rest padding).
//
//   cross_entropy_max:   m_r = max_{j < used} z_rj                      (-inf when used = 0)
//   cross_entropy_sums:  sums_r = (sum_j e^(z_rj - m_r), z_r,label if held here else 0, sum_j z_rj)
//   (the layer all-reduces max and sums over the tensor-parallel group between these calls)
//   cross_entropy_loss:  lse_r = m_r + log S_r;  loss_r = lse_r - z_t, and with the smoothing
//                        factor s = a K / (K - 1) (computed by the layer; K = vocab):
//                        loss_r = (1 - s) loss_r - s (Z_r / K - lse_r)
//   cross_entropy_backward: dz_rj = (e^(z_rj - lse_r) - s / K - (1 - s) [j = label]) dloss_r,
//                        padded columns 0 (the softmax is recomputed: no copy of it is kept);
//                        each element is read before it is written, so dlogits may be logits
//                        (the chunked classifier writes the gradient over its block of logits)
//   cross_entropy_forward_backward: the four above on a rank that holds every column (begin 0, no
//                        all-reduce between them): the losses, and dlogits written over the logits
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max) {
  for (index_t r = 0; r < rows; ++r) {
    A m = -std::numeric_limits<A>::infinity();
    for (index_t j = 0; j < used; ++j) m = std::max(m, A(logits[r * local + j]));
    row_max[r] = m;
  }
}

template <class T, class A = accumulate_t<T>>
void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                        const std::int32_t* labels, index_t begin, A* sums) {
  for (index_t r = 0; r < rows; ++r) {
    A sum_exp = 0, sum_logits = 0;
    for (index_t j = 0; j < used; ++j) {
      const A z = A(logits[r * local + j]);
      sum_exp += std::exp(z - row_max[r]);
      sum_logits += z;
    }
    const index_t label = labels[r];
    sums[3 * r] = sum_exp;
    sums[3 * r + 1] = (label >= begin && label < begin + used) ? A(logits[r * local + label - begin]) : A(0);
    sums[3 * r + 2] = sum_logits;
  }
}

template <class A>
void cross_entropy_loss(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing, A* loss, A* lse) {
  for (index_t r = 0; r < rows; ++r) {
    const A log_sum = std::log(sums[3 * r]);
    A value = log_sum + row_max[r] - sums[3 * r + 1];
    if (smoothing > 0) {
      const A mean_log_prob = sums[3 * r + 2] / A(vocab) - row_max[r] - log_sum;
      value = (A(1) - smoothing) * value - smoothing * mean_log_prob;
    }
    loss[r] = value;
    lse[r] = log_sum + row_max[r];
  }
}

template <class T, class A = accumulate_t<T>>
void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin, index_t rows,
                            index_t local, index_t used, index_t vocab, A smoothing, const A* dloss, T* dlogits) {
  for (index_t r = 0; r < rows; ++r) {
    const index_t label = index_t(labels[r]) - begin;
    for (index_t j = 0; j < used; ++j) {
      A g = std::exp(A(logits[r * local + j]) - lse[r]) - smoothing / A(vocab);
      if (j == label) g -= A(1) - smoothing;
      dlogits[r * local + j] = T(g * dloss[r]);
    }
    for (index_t j = used; j < local; ++j) dlogits[r * local + j] = T(0);
  }
}

template <class T, class A = accumulate_t<T>>
void cross_entropy_forward_backward(T* logits, const std::int32_t* labels, index_t rows, index_t local, index_t used,
                                    index_t vocab, A smoothing, const A* dloss, A* loss) {
  std::vector<A> row_max(static_cast<std::size_t>(rows)), sums(3 * static_cast<std::size_t>(rows)),
      lse(static_cast<std::size_t>(rows));
  cross_entropy_max<T, A>(logits, rows, local, used, row_max.data());
  cross_entropy_sums<T, A>(logits, rows, local, used, row_max.data(), labels, 0, sums.data());
  cross_entropy_loss<A>(sums.data(), row_max.data(), rows, vocab, smoothing, loss, lse.data());
  cross_entropy_backward<T, A>(logits, lse.data(), labels, 0, rows, local, used, vocab, smoothing, dloss, logits);
}

}  // namespace cpu
STRATA_NAMESPACE_END
