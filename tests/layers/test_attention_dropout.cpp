// Attention dropout through the layers: SelfAttention and TransformerLayer with dropout on the
// attention probabilities at tp in {1, 2, 4}, with and without sequence parallelism, against the
// single-rank run (the mask is drawn per global head, so the sharded run draws the same one):
// outputs, input gradients and every gathered parameter gradient within DESIGN.md's tolerances.
// Multi-head (q, k, v read as views of the packed projection), grouped-query (split copies at
// tp = 1, views at tp = 2) and grouped-query with RoPE (copies everywhere). Selective recompute of
// the attention core gives the bits of the stored forward. A forward without a key, and a
// TransformerLayer forward in ForwardMode::evaluation, run without attention dropout.
#include <gtest/gtest.h>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_attention_dropout_cases {

namespace {

using namespace strata;
using strata_test::Snapshot;

template <class T, bool SP>
using Policy = strata_test::TestPolicy<T, SP>;
using strata_test::random_tensor;

constexpr index_t kSeq = 8, kBatch = 2, kHidden = 32;
constexpr double kDropout = 0.3;

template <class P, class T, class Context>
Activation<T, residual_layout_t<P>> to_residual(Context& ctx, Tensor<T> full) {
  Activation<T, layout::replicated> x(std::move(full));
  if constexpr (P::sequence_parallel) return scatter_to_sequence_parallel(ctx.tp, x);
  else return x;
}
template <class P, class T, class Context>
Tensor<T> from_residual(Context& ctx, const Activation<T, residual_layout_t<P>>& x) {
  if constexpr (P::sequence_parallel) return gather_from_sequence_parallel(ctx.tp, x).tensor;
  else return x.tensor;
}

struct AttentionRun {
  int groups = 8;         // query groups of the 8 heads
  double dropout = kDropout;
  bool with_key = true;   // the forward is given a dropout key
  bool recompute = false; // selective recompute of the core
};

// SelfAttention alone, two micro-batches with their own keys.
template <class T, bool SP, class Position>
Snapshot run_attention(int tp, const AttentionRun& run) {
  using P = Policy<T, SP>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    SelfAttention<P, Position, gqa> layer(ctx, "attention", AttentionConfig{kHidden, 8, run.groups, 1000.0, true, run.dropout});
    layer.set_recompute_core(run.recompute);
    layer.init(ctx, 11, 0.3, 0.2);
    for (int step = 0; step < 2; ++step) {
      auto x = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 300 + step));
      auto dy = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 400 + step));
      const std::uint64_t key = 0xa77e0 + static_cast<std::uint64_t>(step);
      auto [y, saved] = run.with_key ? layer.forward(ctx, x, key) : layer.forward(ctx, x);
      EXPECT_EQ(saved.dropout.active(), run.with_key && run.dropout > 0);
      if (saved.dropout.active()) {
        EXPECT_EQ(saved.dropout.key, key);
        EXPECT_EQ(saved.dropout.head_offset, static_cast<index_t>(world.rank()) * (8 / tp)) << "the rank's first global head";
      }
      EXPECT_EQ(saved.qkv_output.empty(), !run.recompute);
      auto dx = layer.backward(ctx, saved, dy);
      Tensor<T> y_full = from_residual<P>(ctx, y), dx_full = from_residual<P>(ctx, dx);
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back(strata_test::to_values(y_full));
        snapshot.outputs.push_back(strata_test::to_values(dx_full));
      }
    }
    strata_test::gather_parameters(ctx, layer, snapshot, mutex);
  });
  return snapshot;
}

template <class T, class Position>
void check_attention_sharded(int groups) {
  const AttentionRun run{groups};
  const Snapshot reference = run_attention<T, false, Position>(1, run);
  for (int tp : {1, 2, 4}) {
    if (groups % tp != 0) continue;
    const std::string what = "groups=" + std::to_string(groups) + " tp=" + std::to_string(tp);
    strata_test::expect_equivalent(run_attention<T, false, Position>(tp, run), reference, strata_test::tolerance<T>(), what);
    strata_test::expect_equivalent(run_attention<T, true, Position>(tp, run), reference, strata_test::tolerance<T>(),
                                   what + " SP");
  }
  // the masks changed the result: the matches above are not those of attention without dropout
  AttentionRun without = run;
  without.dropout = 0;
  const Snapshot plain = run_attention<T, false, Position>(1, without);
  EXPECT_GT(strata_test::relative_error(reference.outputs[0], plain.outputs[0]), 1e-3) << "dropout had no effect";
  EXPECT_GT(strata_test::relative_error(reference.grads.at("attention.qkv.weight"), plain.grads.at("attention.qkv.weight")), 1e-3);
}

TEST(SelfAttentionDropout, MultiHeadShardedEqualsUnshardedDouble) { check_attention_sharded<double, no_rope>(8); }
TEST(SelfAttentionDropout, MultiHeadShardedEqualsUnshardedFloat) { check_attention_sharded<float, no_rope>(8); }
// 2 groups of 4: split copies at tp = 1, views of the packed projection at tp = 2
TEST(SelfAttentionDropout, GroupedQueryShardedEqualsUnshardedDouble) { check_attention_sharded<double, no_rope>(2); }
TEST(SelfAttentionDropout, GroupedQueryWithRopeShardedEqualsUnshardedDouble) { check_attention_sharded<double, rope>(4); }
TEST(SelfAttentionDropout, GroupedQueryWithRopeShardedEqualsUnshardedFloat) { check_attention_sharded<float, rope>(4); }

// Selective recompute runs the core again from the kept qkv output, drawing the stored forward's
// mask: the same bits as keeping everything (tolerance 0), at tp = 1 and 2, on views and copies.
TEST(SelfAttentionDropout, RecomputeEqualsStoredForward) {
  for (int groups : {8, 2}) {
    for (int tp : {1, 2}) {
      AttentionRun stored{groups};
      AttentionRun recomputed = stored;
      recomputed.recompute = true;
      const std::string what = "groups=" + std::to_string(groups) + " tp=" + std::to_string(tp);
      strata_test::expect_equivalent(run_attention<double, false, no_rope>(tp, recomputed),
                                     run_attention<double, false, no_rope>(tp, stored), 0.0, what);
      strata_test::expect_equivalent(run_attention<double, false, rope>(tp, recomputed),
                                     run_attention<double, false, rope>(tp, stored), 0.0, what + " rope");
    }
  }
}

// No key: no dropout, whatever the configured probability (the bits of a layer built without it).
TEST(SelfAttentionDropout, ForwardWithoutKeyHasNoDropout) {
  AttentionRun no_key{2};
  no_key.with_key = false;
  AttentionRun plain{2};
  plain.dropout = 0;
  strata_test::expect_equivalent(run_attention<double, false, no_rope>(2, no_key), run_attention<double, false, no_rope>(2, plain),
                                 0.0, "no key");
}

// TransformerLayer: attention dropout keyed by the layer's dropout key, with hidden dropout too.
template <class T, bool SP, bool Llama>
Snapshot run_layer(int tp, double attention_dropout, double hidden_dropout, ForwardMode mode = ForwardMode::training) {
  using P = Policy<T, SP>;
  using Layer = std::conditional_t<Llama, TransformerLayer<P, RmsNorm, SelfAttention<P, rope, gqa>, Mlp<P, swiglu>>,
                                   TransformerLayer<P, LayerNorm, SelfAttention<P, no_rope, mha>, Mlp<P, gelu>>>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    Layer layer(ctx, "layer", TransformerLayerConfig{kHidden, 1e-5, hidden_dropout},
                AttentionConfig{kHidden, 8, Llama ? 4 : 0, 1000.0, !Llama, attention_dropout}, MlpConfig{kHidden, 64, !Llama});
    layer.init(ctx, 11, 0.3, 0.2);
    for (int step = 0; step < 2; ++step) {
      auto x = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 300 + step));
      auto dy = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 400 + step));
      auto [y, saved] = layer.forward(ctx, x, 500 + static_cast<std::uint64_t>(step), mode);
      EXPECT_EQ(saved.attention.dropout.active(), mode == ForwardMode::training && attention_dropout > 0);
      auto dx = layer.backward(ctx, saved, dy);
      Tensor<T> y_full = from_residual<P>(ctx, y), dx_full = from_residual<P>(ctx, dx);
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back(strata_test::to_values(y_full));
        snapshot.outputs.push_back(strata_test::to_values(dx_full));
      }
    }
    strata_test::gather_parameters(ctx, layer, snapshot, mutex);
  });
  return snapshot;
}

template <bool Llama>
void check_layer_sharded() {
  const Snapshot reference = run_layer<double, false, Llama>(1, kDropout, 0.1);
  for (int tp : {2, 4}) {
    strata_test::expect_equivalent(run_layer<double, false, Llama>(tp, kDropout, 0.1), reference, 1e-12,
                                   "tp=" + std::to_string(tp));
    strata_test::expect_equivalent(run_layer<double, true, Llama>(tp, kDropout, 0.1), reference, 1e-12,
                                   "tp=" + std::to_string(tp) + " SP");
  }
  const Snapshot hidden_only = run_layer<double, false, Llama>(1, 0.0, 0.1);
  EXPECT_GT(strata_test::relative_error(reference.outputs[0], hidden_only.outputs[0]), 1e-3) << "attention dropout had no effect";
}
TEST(TransformerLayerAttentionDropout, GptStyleShardedEqualsUnsharded) { check_layer_sharded<false>(); }
TEST(TransformerLayerAttentionDropout, LlamaStyleShardedEqualsUnsharded) { check_layer_sharded<true>(); }

// An evaluation forward has no dropout (Megatron's eval mode): the bits of the layer built without
// attention and hidden dropout.
TEST(TransformerLayerAttentionDropout, EvaluationForwardHasNoDropout) {
  const Snapshot evaluation = run_layer<double, false, true>(2, kDropout, 0.1, ForwardMode::evaluation);
  const Snapshot without = run_layer<double, false, true>(2, 0.0, 0.0, ForwardMode::training);
  strata_test::expect_equivalent(evaluation, without, 0.0, "evaluation forward");
}

TEST(SelfAttentionDropout, ProbabilityOfOneIsRejected) {
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 1});
    using P = Policy<double, false>;
    EXPECT_THROW((SelfAttention<P, no_rope, mha>(ctx, "attention", AttentionConfig{kHidden, 8, 0, 1000.0, true, 1.0})),
                 ConfigError);
    EXPECT_THROW((SelfAttention<P, no_rope, mha>(ctx, "attention", AttentionConfig{kHidden, 8, 0, 1000.0, true, -0.5})),
                 ConfigError);
  });
}

}  // namespace
}  // namespace test_attention_dropout_cases
