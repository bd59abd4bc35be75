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
// Only the logits (shared with the caller, in T) and the per-row log-sum-exp are saved: the softmax
// is recomputed in the backward, never kept in fp32. Per-token losses are returned in the
// accumulate type; how they are averaged (over non-masked tokens of the whole global batch) is the
// caller's choice, expressed through dloss. When dloss is known before the forward (training),
// forward_backward_rows runs both on a block of rows and writes d logits over the logits, so the
// chunked classifier (chunked_classifier.hpp) never holds the whole [rows, V/tp] logits;
// forward_rows is its forward-only form (evaluation).
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
  using Space = space_t<Policy>;

  struct Saved {
    Tensor<T, Space> logits;              // [rows, V_local], shared with the caller's logits (read only)
    Tensor<A, Space> lse;                 // [rows]: log sum_j e^(z_j) over the whole vocabulary
    Tensor<std::int32_t, Space> labels;   // [rows]
  };

  // vocab_size: the real (unpadded) vocabulary; 0 means every column is a real entry.
  explicit VocabParallelCrossEntropy(double label_smoothing = 0.0, index_t vocab_size = 0)
      : smoothing_(label_smoothing), vocab_size_(vocab_size) {
    if (label_smoothing < 0.0 || label_smoothing >= 1.0)
      fail<ConfigError>("label_smoothing=", label_smoothing, " must be in [0, 1)");
  }

  // logits [s, b, V/tp]; labels [s, b] with ids in [0, V), in the backend's space (host labels
  // are checked here; device labels must have been checked on the host before their upload).
  // Returns per-token losses [s, b] in the backend's space.
  std::pair<Tensor<A, Space>, Saved> forward(Context& ctx, const Activation<T, layout::sharded<-1>, Space>& logits,
                                             const Tensor<std::int32_t, Space>& labels) const {
    const index_t rows = logits.shape().rows(), local = logits.shape().cols();
    if (labels.numel() != rows)
      fail<ShapeError>("VocabParallelCrossEntropy: ", labels.numel(), " labels for ", rows, " rows of logits ",
                       logits.shape().str());
    if constexpr (std::is_same_v<Space, space::host>) check_labels(labels, vocabulary(ctx, local));
    Saved saved;
    saved.logits = logits.tensor;
    saved.labels = labels.reshaped(Shape{rows});
    auto losses = Tensor<A, Space>::empty(labels.shape());
    saved.lse = Tensor<A, Space>::empty(Shape{rows});
    loss_rows(ctx, logits.data(), rows, local, saved.labels.data(), losses.data(), saved.lse.data());
    return {std::move(losses), std::move(saved)};
  }

  // dloss [s, b] (e.g. loss_mask / number of tokens), in the backend's space. Returns d logits,
  // sharded like the logits; padded columns are 0.
  Activation<T, layout::sharded<-1>, Space> backward(Context& ctx, const Saved& saved, const Tensor<A, Space>& dloss,
                                                     const Shape& logits_shape) const {
    const index_t rows = saved.logits.shape().rows(), local = saved.logits.shape().cols();
    Activation<T, layout::sharded<-1>, Space> dz{Tensor<T, Space>::empty(logits_shape)};
    gradient_rows(ctx, saved.logits.data(), saved.lse.data(), saved.labels.data(), rows, local, dloss.data(), dz.data());
    return dz;
  }

  // Forward only on `rows` rows of logits [rows, local]: the per-row losses (evaluation over blocks
  // of rows). Collective like forward; labels are the caller's to check (check_labels).
  void forward_rows(Context& ctx, const T* logits, index_t rows, index_t local, const std::int32_t* labels,
                    A* losses) const {
    auto lse = Tensor<A, Space>::empty(Shape{rows});
    loss_rows(ctx, logits, rows, local, labels, losses, lse.data());
  }

  // Forward and backward at once on `rows` rows of logits [rows, local] whose loss gradient dloss
  // [rows] is known ahead (training: mask / tokens): writes the per-row losses and overwrites the
  // logits with d logits (the chunked classifier's block, reused in place; padded columns get 0).
  // Collective over the tensor-parallel group (two all-reduces), like forward. Labels are not
  // checked here: the caller checks them once for all its blocks (check_labels). A rank that holds
  // the whole vocabulary (tp = 1) takes one fused backend call (cross_entropy_forward_backward: on
  // GPUs the logits are read once and written once).
  void forward_backward_rows(Context& ctx, T* logits, index_t rows, index_t local, const std::int32_t* labels,
                             const A* dloss, A* losses) const {
    if (ctx.tp.size() == 1) {
      const Columns all = columns(ctx, local);  // begin = 0
      ctx.device.template cross_entropy_forward_backward<T>(logits, labels, rows, local, all.used, all.vocab,
                                                            smoothing_factor(all.vocab), dloss, losses);
      return;
    }
    auto lse = Tensor<A, Space>::empty(Shape{rows});
    loss_rows(ctx, logits, rows, local, labels, losses, lse.data());
    gradient_rows(ctx, logits, lse.data(), labels, rows, local, dloss, logits);  // in place (docs/DEVICE.md)
  }

  // Labels on the host checked against the real vocabulary; the error names the label and its row.
  static void check_labels(const Tensor<std::int32_t>& labels, index_t vocab) {
    for (index_t r = 0; r < labels.numel(); ++r) {
      const index_t label = labels[r];
      if (label < 0 || label >= vocab)
        fail<ConfigError>("VocabParallelCrossEntropy: label ", label, " at row ", r, " is outside the vocabulary of ",
                          vocab, " entries");
    }
  }
  // The real vocabulary for logits of `local` columns per rank.
  index_t vocabulary(const Context& ctx, index_t local) const { return real_vocab(local * ctx.tp.size()); }

 private:
  // Global column of this rank's first logit, the real vocabulary, and the real columns held here.
  struct Columns {
    index_t begin, vocab, used;
  };
  Columns columns(const Context& ctx, index_t local) const {
    const index_t begin = local * ctx.tp.rank(), vocab = real_vocab(local * ctx.tp.size());
    return {begin, vocab, std::clamp<index_t>(vocab - begin, 0, local)};
  }

  // losses[rows] and lse[rows] of logits [rows, local]: the local max, all-reduced (max); the
  // three sums per row, all-reduced (sum); then the loss per row.
  void loss_rows(Context& ctx, const T* logits, index_t rows, index_t local, const std::int32_t* labels, A* losses,
                 A* lse) const {
    const auto [begin, vocab, used] = columns(ctx, local);
    auto maxes = Tensor<A, Space>::empty(Shape{rows});
    ctx.device.template cross_entropy_max<T>(logits, rows, local, used, maxes.data());
    if (ctx.tp.size() > 1) ctx.tp.all_reduce(maxes.buffer(), ReduceOp::max);
    auto sums = Tensor<A, Space>::empty(Shape{rows, 3});  // per row: sum exp, target logit, sum logits
    ctx.device.template cross_entropy_sums<T>(logits, rows, local, used, maxes.data(), labels, begin, sums.data());
    if (ctx.tp.size() > 1) ctx.tp.all_reduce(sums.buffer(), ReduceOp::sum);
    ctx.device.template cross_entropy_loss<A>(sums.data(), maxes.data(), rows, vocab, smoothing_factor(vocab), losses, lse);
  }

  // dlogits [rows, local] = (softmax - targets) * dloss per row; dlogits may be logits.
  void gradient_rows(Context& ctx, const T* logits, const A* lse, const std::int32_t* labels, index_t rows,
                     index_t local, const A* dloss, T* dlogits) const {
    const auto [begin, vocab, used] = columns(ctx, local);
    ctx.device.template cross_entropy_backward<T>(logits, lse, labels, begin, rows, local, used, vocab,
                                                  smoothing_factor(vocab), dloss, dlogits);
  }

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
