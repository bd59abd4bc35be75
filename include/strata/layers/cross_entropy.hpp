// strata/layers/cross_entropy.hpp: vocab-parallel cross-entropy (Megatron's math), on logits
// sharded over the vocabulary (sharded<-1>), never gathered.
//
//   m   = all-reduce-max( max_j z_j )                       (local max first)
//   [S, z_t, Z] = all-reduce-sum( sum_j e^{z_j - m}, z_target (owning rank only), sum_j z_j )
//                                                           (one fused collective of 3 numbers per row)
//   loss = log S + m - z_t;  with label smoothing a (K = padded vocab):
//   loss = (1 - s) loss - s * mean_j log p_j,  s = a K / (K - 1),  mean_j log p_j = Z/K - m - log S
//   backward: dz = (softmax - (1 - s) onehot - s / K) * dloss
//
// Entries of the padded vocabulary (global index >= vocab_size) are left out of the softmax: their
// logits count as -inf, so the loss and every gradient do not depend on how much padding the
// tensor-parallel size asked for (Megatron lets padded logits into the softmax; here a tp=2 run
// follows the tp=1 trajectory even when their padded vocabularies differ).
//
// Per-token losses are returned in the accumulate type; how they are averaged (over non-masked
// tokens of the whole global batch) is the caller's choice, expressed through dloss.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "../comm/parallel_context.hpp"
#include "layout.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

template <class Policy>
class VocabParallelCrossEntropy {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;

  struct Saved {
    Tensor<A> softmax;           // [rows, V_local]
    Tensor<std::int32_t> labels;  // [rows]
  };

  // vocab_size: the real (unpadded) vocabulary; 0 means every column is a real entry.
  explicit VocabParallelCrossEntropy(double label_smoothing = 0.0, index_t vocab_size = 0)
      : smoothing_(label_smoothing), vocab_size_(vocab_size) {
    if (label_smoothing < 0.0 || label_smoothing >= 1.0)
      fail<ConfigError>("label_smoothing=", label_smoothing, " must be in [0, 1)");
  }

  // logits [s, b, V/tp]; labels [s, b] with ids in [0, V). Returns per-token losses [s, b].
  std::pair<Tensor<A>, Saved> forward(Context& ctx, const Activation<T, layout::sharded<-1>>& logits,
                                      const Tensor<std::int32_t>& labels) const {
    const index_t rows = logits.shape().rows(), local = logits.shape().cols();
    if (labels.numel() != rows)
      fail<ShapeError>("VocabParallelCrossEntropy: ", labels.numel(), " labels for ", rows, " rows of logits ",
                       logits.shape().str());
    const index_t begin = local * ctx.tp.rank(), vocab = real_vocab(local * ctx.tp.size());
    const index_t used = std::clamp<index_t>(vocab - begin, 0, local);  // real columns held here
    std::vector<A> maxes(static_cast<std::size_t>(rows));
    for (index_t r = 0; r < rows; ++r) {
      A m = -std::numeric_limits<A>::infinity();
      for (index_t j = 0; j < used; ++j) m = std::max(m, static_cast<A>(logits.tensor[r * local + j]));
      maxes[r] = m;
    }
    if (ctx.tp.size() > 1) ctx.tp.all_reduce(std::span<A>(maxes), ReduceOp::max);
    std::vector<A> sums(static_cast<std::size_t>(3 * rows));  // per row: sum exp, target logit, sum logits
    for (index_t r = 0; r < rows; ++r) {
      const index_t label = labels[r];
      if (label < 0 || label >= vocab)
        fail<ConfigError>("VocabParallelCrossEntropy: label ", label, " at row ", r, " is outside the vocabulary of ",
                          vocab, " entries");
      A sum_exp = 0, sum_logits = 0;
      for (index_t j = 0; j < used; ++j) {
        A z = static_cast<A>(logits.tensor[r * local + j]);
        sum_exp += std::exp(z - maxes[r]);
        sum_logits += z;
      }
      sums[3 * r] = sum_exp;
      sums[3 * r + 1] = (label >= begin && label < begin + local) ? static_cast<A>(logits.tensor[r * local + label - begin]) : A(0);
      sums[3 * r + 2] = sum_logits;
    }
    if (ctx.tp.size() > 1) ctx.tp.all_reduce(std::span<A>(sums), ReduceOp::sum);

    const A s = smoothing_factor(vocab);
    Tensor<A> losses(labels.shape());
    Saved saved{Tensor<A>(Shape{rows, local}), Tensor<std::int32_t>(Shape{rows}, std::vector<std::int32_t>(labels.data(), labels.data() + rows))};
    for (index_t r = 0; r < rows; ++r) {
      const A log_sum = std::log(sums[3 * r]);
      A loss = log_sum + maxes[r] - sums[3 * r + 1];
      if (s > 0) {
        const A mean_log_prob = sums[3 * r + 2] / A(vocab) - maxes[r] - log_sum;
        loss = (A(1) - s) * loss - s * mean_log_prob;
      }
      losses[r] = loss;
      for (index_t j = 0; j < used; ++j)
        saved.softmax[r * local + j] = std::exp(static_cast<A>(logits.tensor[r * local + j]) - maxes[r]) / sums[3 * r];
    }
    return {std::move(losses), std::move(saved)};
  }

  // dloss [s, b] (e.g. loss_mask / number of tokens). Returns d logits, sharded like the logits.
  Activation<T, layout::sharded<-1>> backward(Context& ctx, const Saved& saved, const Tensor<A>& dloss,
                                              const Shape& logits_shape) const {
    const index_t rows = saved.softmax.size(0), local = saved.softmax.size(1);
    const index_t begin = local * ctx.tp.rank(), vocab = real_vocab(local * ctx.tp.size());
    const index_t used = std::clamp<index_t>(vocab - begin, 0, local);
    const A s = smoothing_factor(vocab);
    Activation<T, layout::sharded<-1>> dz{Tensor<T>(logits_shape)};  // padded columns stay 0
    for (index_t r = 0; r < rows; ++r) {
      const index_t label = saved.labels[r] - begin;
      for (index_t j = 0; j < used; ++j) {
        A g = saved.softmax[r * local + j] - s / A(vocab);
        if (j == label) g -= A(1) - s;
        dz.tensor[r * local + j] = static_cast<T>(g * dloss[r]);
      }
    }
    return dz;
  }

 private:
  index_t real_vocab(index_t padded) const {
    if (vocab_size_ > padded)
      fail<ConfigError>("VocabParallelCrossEntropy: vocab_size=", vocab_size_, " exceeds the ", padded, " logit columns");
    return vocab_size_ > 0 ? vocab_size_ : padded;
  }
  A smoothing_factor(index_t vocab) const { return smoothing_ > 0 ? A(smoothing_ * vocab / (vocab - 1.0)) : A(0); }
  double smoothing_;
  index_t vocab_size_;
};

STRATA_NAMESPACE_END
