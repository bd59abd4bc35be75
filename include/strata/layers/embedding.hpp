// strata/layers/embedding.hpp: `VocabParallelEmbedding` and `PositionEmbedding`.
//
// VocabParallelEmbedding: weight [V_padded / tp, h], rank r holds rows vocab_range(V_padded, tp, r).
//   forward:  tokens [s, b] (host ids, validated, then uploaded) -> rows looked up where the id is in range, zeros elsewhere (partial)
//             -> all-reduce to replicated, or reduce-scatter on the sequence to sharded<0> under
//             sequence parallelism (the residual stream's layout)
//   backward: dY (all-gathered on seq under SP) scatter-added into the local rows.
// PositionEmbedding (learned absolute positions, GPT-2): weight [max_seq, h] replicated, added to
//   the residual stream; under SP each rank adds the rows of its sequence slice, and the gradient
//   is summed over the group (add_replicated_gradient). Under context parallelism the rows are those
//   of the global positions of this rank's two chunks (shard/context_parallel.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../comm/parallel_context.hpp"
#include "../shard/context_parallel.hpp"
#include "../shard/partition.hpp"
#include "conversions.hpp"
#include "parameter.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

// Token ids [s, b] on the host checked against the vocabulary; the error names the id and its
// position. Device ids are checked by whoever holds them on the host before the upload (the model).
inline void check_token_ids(const Tensor<std::int32_t>& tokens, index_t vocab, const std::string& who) {
  for (index_t i = 0; i < tokens.numel(); ++i) {
    const index_t id = tokens[i];
    if (id < 0 || id >= vocab)
      fail<ConfigError>(who, ": token id ", id, " at position ", i, " is outside the vocabulary of ", vocab, " entries");
  }
}

template <class Policy>
class VocabParallelEmbedding {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using output_layout = residual_layout_t<Policy>;

  struct Saved {
    Tensor<std::int32_t, Space> tokens;  // [s, b]
  };

  // padded_vocab: already padded to a multiple of tp (see padded_vocab_size); vocab: the real
  // vocabulary (ids at or above it name padding rows and are refused), padded_vocab when omitted.
  VocabParallelEmbedding(const Context& ctx, std::string name, index_t padded_vocab, index_t hidden, index_t vocab = -1)
      : weight_(name + ".weight", Shape{padded_vocab, hidden}, ShardSpec::split(0, ctx.tp.rank(), ctx.tp.size())),
        begin_(weight_.value.size(0) * ctx.tp.rank()),
        vocab_(vocab < 0 ? padded_vocab : vocab) {
    if (vocab_ > padded_vocab)
      fail<ConfigError>("VocabParallelEmbedding ", weight_.name, ": vocabulary of ", vocab_, " entries exceeds its ", padded_vocab,
                        " padded rows");
  }

  // tokens: ids [s, b] in the backend's space (host ids are checked here; device ids must have
  // been checked on the host before their upload, see check_token_ids).
  std::pair<Activation<T, output_layout, Space>, Saved> forward(Context& ctx, const Tensor<std::int32_t, Space>& tokens) const {
    const index_t n = tokens.numel(), h = weight_.value.size(1), local = weight_.value.size(0);
    if constexpr (std::is_same_v<Space, space::host>) check_token_ids(tokens, vocab_, "VocabParallelEmbedding " + weight_.name);
    Saved saved{tokens};
    Activation<T, layout::partial, Space> partial(Tensor<T, Space>::empty(Shape{tokens.size(0), tokens.size(1), h}));  // (s, b, h)
    ctx.device.template embedding_forward<T>(saved.tokens.data(), n, weight_.value.data(), begin_, local, h, partial.data());
    if constexpr (Policy::sequence_parallel)
      return {reduce_scatter_to_sequence_parallel(ctx.device, ctx.tp, partial), std::move(saved)};
    else return {reduce_from_tensor_parallel(ctx.tp, std::move(partial)), std::move(saved)};
  }

  void backward(Context& ctx, const Saved& saved, const Activation<T, output_layout, Space>& dy) {
    Tensor<T, Space> full;
    if constexpr (Policy::sequence_parallel)
      full = reduce_scatter_to_sequence_parallel_backward(ctx.device, ctx.tp, dy).tensor;
    else full = dy.tensor;  // shared, read only
    const index_t n = saved.tokens.numel(), h = weight_.value.size(1), local = weight_.value.size(0);
    ctx.device.template embedding_backward<T>(saved.tokens.data(), n, full.data(), begin_, local, h, weight_.grad.data());
  }

  void init(Context& ctx, std::uint64_t seed, double stddev) { init_normal(ctx.device, weight_, seed, stddev); }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
  }
  Parameter<T, Space>& weight() { return weight_; }
  index_t vocab_size() const { return weight_.global_shape[0]; }  // padded
  index_t real_vocab_size() const { return vocab_; }              // ids below it are tokens
  const std::string& name() const { return weight_.name; }

 private:
  Parameter<T, Space> weight_;
  index_t begin_;
  index_t vocab_;
};

template <class Policy>
class PositionEmbedding {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Layout = residual_layout_t<Policy>;

  PositionEmbedding(const Context&, std::string name, index_t max_positions, index_t hidden)
      : weight_(name + ".weight", Shape{max_positions, hidden}, ShardSpec::replicated()) {}

  // x: [s_local, b, h], the caller's own tensor; adds position rows of this rank's sequence slice, in place.
  void forward(Context& ctx, Activation<T, Layout, Space>& x) const {
    const index_t s = x.shape()[0], b = x.shape()[1], h = x.shape()[2];
    for_each_run(ctx, s, [&](index_t row, index_t rows, index_t first) {
      if (first + rows > weight_.value.size(0))
        fail<ConfigError>("PositionEmbedding: sequence of ", first + rows, " positions exceeds max_position_embeddings=",
                          weight_.value.size(0));
      ctx.device.template position_add<T>(x.data() + row * b * h, weight_.value.data(), rows, b, h, first);
    });
  }

  void backward(Context& ctx, const Activation<T, Layout, Space>& dy) {
    const index_t s = dy.shape()[0], b = dy.shape()[1], h = dy.shape()[2];
    auto increment = Tensor<A, Space>::zeros(weight_.grad.shape());
    for_each_run(ctx, s, [&](index_t row, index_t rows, index_t first) {
      ctx.device.template position_grad<T>(dy.data() + row * b * h, rows, b, h, first, increment.data());
    });
    add_replicated_gradient<Layout>(ctx.device, ctx.tp, weight_.grad, increment);
  }

  void init(Context& ctx, std::uint64_t seed, double stddev) { init_normal(ctx.device, weight_, seed, stddev); }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
  }

 private:
  static index_t sequence_offset(const Context& ctx, index_t local_s) {
    if constexpr (Policy::sequence_parallel) return local_s * ctx.tp.rank();
    else return 0;
  }
  // run(first local row, rows, global position of that row) for each run of consecutive global
  // positions among the s_local rows this rank holds: one without context parallelism; under it the
  // rank's local sequence is two chunks (shard/context_parallel.hpp), and its sequence-parallel
  // slice of them may hold parts of both.
  template <class Run>
  static void for_each_run(const Context& ctx, index_t local_s, Run&& run) {
    const index_t begin = sequence_offset(ctx, local_s);  // in the cp rank's local sequence
    if (ctx.cp.size() <= 1) {
      run(0, local_s, begin);
      return;
    }
    const index_t cp_local = local_s * (Policy::sequence_parallel ? ctx.tp.size() : 1);  // 2c
    const ContextParallelSplit split = context_parallel_split(cp_local * ctx.cp.size(), ctx.cp.size(), ctx.cp.rank(),
                                                              "PositionEmbedding");
    const index_t end = begin + local_s;
    for (int chunk = 0; chunk < 2; ++chunk) {
      const index_t lo = std::max(begin, chunk * split.chunk), hi = std::min(end, (chunk + 1) * split.chunk);
      if (lo < hi) run(lo - begin, hi - lo, split.global_position(lo));
    }
  }
  Parameter<T, Space> weight_;
};

STRATA_NAMESPACE_END
