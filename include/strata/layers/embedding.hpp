// strata/layers/embedding.hpp: `VocabParallelEmbedding` and `PositionEmbedding`.
//
// VocabParallelEmbedding: weight [V_padded / tp, h], rank r holds rows vocab_range(V_padded, tp, r).
//   forward:  tokens [s, b] -> rows looked up where the id is in range, zeros elsewhere (partial)
//             -> all-reduce to replicated, or reduce-scatter on the sequence to sharded<0> under
//             sequence parallelism (the residual stream's layout)
//   backward: dY (all-gathered on seq under SP) scatter-added into the local rows.
// PositionEmbedding (learned absolute positions, GPT-2): weight [max_seq, h] replicated, added to
//   the residual stream; under SP each rank adds the rows of its sequence slice, and the gradient
//   is summed over the group (add_replicated_gradient).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../comm/parallel_context.hpp"
#include "../shard/partition.hpp"
#include "conversions.hpp"
#include "parameter.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

template <class Policy>
class VocabParallelEmbedding {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using output_layout = residual_layout_t<Policy>;

  struct Saved {
    Tensor<std::int32_t> tokens;  // [s, b]
  };

  // padded_vocab: already padded to a multiple of tp (see padded_vocab_size).
  VocabParallelEmbedding(const Context& ctx, std::string name, index_t padded_vocab, index_t hidden)
      : weight_(name + ".weight", Shape{padded_vocab, hidden}, ShardSpec::split(0, ctx.tp.rank(), ctx.tp.size())),
        begin_(weight_.value.size(0) * ctx.tp.rank()) {}

  std::pair<Activation<T, output_layout>, Saved> forward(Context& ctx, const Tensor<std::int32_t>& tokens) const {
    const index_t n = tokens.numel(), h = weight_.value.size(1), local = weight_.value.size(0);
    const index_t vocab = weight_.global_shape[0];
    Activation<T, layout::partial> partial(Tensor<T>(Shape{tokens.size(0), tokens.size(1), h}));  // (s, b, h)
    for (index_t i = 0; i < n; ++i) {
      const index_t id = tokens[i];
      if (id < 0 || id >= vocab)
        fail<ConfigError>("VocabParallelEmbedding ", weight_.name, ": token id ", id, " at position ", i,
                          " is outside the vocabulary of ", vocab, " entries");
      const index_t row = id - begin_;
      if (row >= 0 && row < local)
        for (index_t c = 0; c < h; ++c) partial.tensor[i * h + c] = weight_.value[row * h + c];
    }
    Saved saved{tokens};
    if constexpr (Policy::sequence_parallel) return {reduce_scatter_to_sequence_parallel(ctx.tp, partial), std::move(saved)};
    else return {reduce_from_tensor_parallel(ctx.tp, std::move(partial)), std::move(saved)};
  }

  void backward(Context& ctx, const Saved& saved, const Activation<T, output_layout>& dy) {
    Tensor<T> full;
    if constexpr (Policy::sequence_parallel) full = reduce_scatter_to_sequence_parallel_backward(ctx.tp, dy).tensor;
    else full = dy.tensor;
    const index_t n = saved.tokens.numel(), h = weight_.value.size(1), local = weight_.value.size(0);
    for (index_t i = 0; i < n; ++i) {
      const index_t row = saved.tokens[i] - begin_;
      if (row >= 0 && row < local)
        for (index_t c = 0; c < h; ++c) weight_.grad[row * h + c] += static_cast<A>(full[i * h + c]);
    }
  }

  void init(std::uint64_t seed, double stddev) { init_normal(weight_, seed, stddev); }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
  }
  Parameter<T>& weight() { return weight_; }

 private:
  Parameter<T> weight_;
  index_t begin_;
};

template <class Policy>
class PositionEmbedding {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Layout = residual_layout_t<Policy>;

  PositionEmbedding(const Context&, std::string name, index_t max_positions, index_t hidden)
      : weight_(name + ".weight", Shape{max_positions, hidden}, ShardSpec::replicated()) {}

  // x: [s_local, b, h]; adds position rows of this rank's sequence slice, in place.
  void forward(Context& ctx, Activation<T, Layout>& x) const {
    const index_t s = x.shape()[0], b = x.shape()[1], h = x.shape()[2], first = sequence_offset(ctx, s);
    if (first + s > weight_.value.size(0))
      fail<ConfigError>("PositionEmbedding: sequence of ", first + s, " positions exceeds max_position_embeddings=",
                        weight_.value.size(0));
    for (index_t t = 0; t < s; ++t)
      for (index_t j = 0; j < b; ++j)
        for (index_t c = 0; c < h; ++c) {
          T& v = x.tensor[(t * b + j) * h + c];
          v = static_cast<T>(static_cast<A>(v) + static_cast<A>(weight_.value[(first + t) * h + c]));
        }
  }

  void backward(Context& ctx, const Activation<T, Layout>& dy) {
    const index_t s = dy.shape()[0], b = dy.shape()[1], h = dy.shape()[2], first = sequence_offset(ctx, s);
    Tensor<A> increment(weight_.grad.shape());
    for (index_t t = 0; t < s; ++t)
      for (index_t j = 0; j < b; ++j)
        for (index_t c = 0; c < h; ++c) increment[(first + t) * h + c] += static_cast<A>(dy.tensor[(t * b + j) * h + c]);
    add_replicated_gradient<Layout>(ctx.tp, weight_.grad, increment);
  }

  void init(std::uint64_t seed, double stddev) { init_normal(weight_, seed, stddev); }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
  }

 private:
  static index_t sequence_offset(const Context& ctx, index_t local_s) {
    if constexpr (Policy::sequence_parallel) return local_s * ctx.tp.rank();
    else return 0;
  }
  Parameter<T> weight_;
};

STRATA_NAMESPACE_END
