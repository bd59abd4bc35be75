// Layer by layer: TransformerLayer (GPT-style: LayerNorm, MHA, GELU; Llama-style: RmsNorm, RoPE +
// GQA, SwiGLU), VocabParallelEmbedding and vocab-parallel cross-entropy, each at tp in {1, 2, 4}
// with and without sequence parallelism, against the single-rank run: outputs, input gradients and
// every gathered parameter gradient. SelfAttention alone where its two ways to q, k, v (views of
// the packed projection, split copies) meet across tp sizes.
#include <gtest/gtest.h>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_blocks_cases {

namespace {

using namespace strata;
using strata_test::Snapshot;

template <class T, bool SP>
using Policy = strata_test::TestPolicy<T, SP>;
using strata_test::random_tensor;

constexpr index_t kSeq = 8, kBatch = 2, kHidden = 32;

// The residual-stream layout of a policy, from and to the full tensor.
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

}  // namespace

// LayerNorm without the residual-gradient sums (its backward takes no dresidual_sums): a GPT-style
// TransformerLayer built with it has fc2 and the attention's projection take their own bias
// gradients, by a pass of their own over dy.
template <class P>
struct LayerNormWithoutSums : strata::LayerNorm<P> {
  using Base = strata::LayerNorm<P>;
  using Base::Base;
  template <class Layout>
  auto backward(typename Base::Context& ctx, const typename Base::Saved& saved, const typename Base::template Act<Layout>& dy,
                const typename Base::template Act<Layout>* dresidual = nullptr) {
    return Base::backward(ctx, saved, dy, dresidual);
  }
};
// LayerNorm that reduces its own parameter gradients (no backward_partial): under sequence
// parallelism a TransformerLayer built with it makes one all-reduce per norm instead of one per layer.
template <class P>
struct LayerNormReducingItself : strata::LayerNorm<P> {
  using Base = strata::LayerNorm<P>;
  using Base::Base;
  void backward_partial() = delete;  // hides LayerNorm::backward_partial
};
}  // namespace test_blocks_cases
STRATA_NAMESPACE_BEGIN
template <>
inline constexpr bool is_norm_v<test_blocks_cases::LayerNormWithoutSums> = true;
template <>
inline constexpr bool is_norm_v<test_blocks_cases::LayerNormReducingItself> = true;
STRATA_NAMESPACE_END
namespace test_blocks_cases {

namespace {

template <class T, bool SP, bool Llama, template <class> class GptNorm = LayerNorm>
Snapshot run_layer(int tp, double dropout = 0.0) {
  using P = Policy<T, SP>;
  using Layer = std::conditional_t<Llama, TransformerLayer<P, RmsNorm, SelfAttention<P, rope, gqa>, Mlp<P, swiglu>>,
                                   TransformerLayer<P, GptNorm, SelfAttention<P, no_rope, mha>, Mlp<P, gelu>>>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    Layer layer(ctx, "layer", TransformerLayerConfig{kHidden, 1e-5, dropout},
                AttentionConfig{kHidden, 8, Llama ? 4 : 0, 1000.0, !Llama}, MlpConfig{kHidden, 64, !Llama});
    layer.init(ctx, 11, 0.3, 0.2);
    for (int step = 0; step < 2; ++step) {
      auto x = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 300 + step));
      auto dy = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 400 + step));
      auto [y, saved] = layer.forward(ctx, x, 500 + static_cast<std::uint64_t>(step));  // dropout key
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

template <class T, bool Llama>
void check_layer(double dropout = 0.0) {
  const Snapshot reference = run_layer<T, false, Llama>(1, dropout);
  for (int tp : {1, 2, 4}) {
    strata_test::expect_equivalent(run_layer<T, false, Llama>(tp, dropout), reference, strata_test::tolerance<T>(),
                                   "tp=" + std::to_string(tp));
    strata_test::expect_equivalent(run_layer<T, true, Llama>(tp, dropout), reference, strata_test::tolerance<T>(),
                                   "tp=" + std::to_string(tp) + " SP");
  }
  if (dropout > 0) {  // the masks changed the result: dropout ran, the match above is not vacuous
    const Snapshot without = run_layer<T, false, Llama>(1, 0.0);
    EXPECT_GT(strata_test::relative_error(reference.outputs[0], without.outputs[0]), 1e-3) << "dropout had no effect";
  }
}

// SelfAttention alone, without RoPE: 8 heads in `groups` query groups. Per rank, attention reads
// q, k, v as views of the packed projection when each group has one query head or the rank holds
// one group, and splits copies otherwise: 2 groups run the copies at tp = 1 and views at tp = 2,
// so the sharded run checks one path against the other.
template <class T, bool SP>
Snapshot run_attention(int tp, int groups, bool expect_views) {
  using P = Policy<T, SP>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    SelfAttention<P, no_rope, gqa> layer(ctx, "attention", AttentionConfig{kHidden, 8, groups, 1000.0, true});
    EXPECT_EQ(layer.reads_packed_qkv(), expect_views) << "tp=" << tp << " groups=" << groups;
    layer.init(ctx, 11, 0.3, 0.2);
    for (int step = 0; step < 2; ++step) {
      auto x = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 300 + step));
      auto dy = to_residual<P>(ctx, random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 400 + step));
      auto [y, saved] = layer.forward(ctx, x);
      // views save the projection instead of q, k, v: the same number of elements
      const index_t qkv_local = kSeq * kBatch * (8 + 2 * groups) / tp * (kHidden / 8);
      auto held = [](const Tensor<T>& t) { return t.empty() ? index_t{0} : t.numel(); };
      EXPECT_EQ(held(saved.packed) + held(saved.q) + held(saved.k) + held(saved.v), qkv_local);
      EXPECT_EQ(!saved.packed.empty(), expect_views);
      EXPECT_EQ(saved.q.empty(), expect_views);
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

template <class T>
void check_attention_paths() {
  // 2 groups of 4: copies at tp = 1, one group per rank (views) at tp = 2
  const Snapshot copies = run_attention<T, false>(1, 2, false);
  strata_test::expect_equivalent(run_attention<T, false>(2, 2, true), copies, strata_test::tolerance<T>(), "groups=2 tp=2");
  strata_test::expect_equivalent(run_attention<T, true>(2, 2, true), copies, strata_test::tolerance<T>(), "groups=2 tp=2 SP");
  // 8 groups of 1 (multi-head): views at every tp
  const Snapshot heads = run_attention<T, false>(1, 8, true);
  for (int tp : {2, 4}) {
    strata_test::expect_equivalent(run_attention<T, false>(tp, 8, true), heads, strata_test::tolerance<T>(),
                                   "groups=8 tp=" + std::to_string(tp));
    strata_test::expect_equivalent(run_attention<T, true>(tp, 8, true), heads, strata_test::tolerance<T>(),
                                   "groups=8 tp=" + std::to_string(tp) + " SP");
  }
  // one group (multi-query): views
  (void)run_attention<T, false>(1, 1, true);
}

TEST(SelfAttention, PackedViewsEqualSplitCopiesDouble) { check_attention_paths<double>(); }
TEST(SelfAttention, PackedViewsEqualSplitCopiesFloat) { check_attention_paths<float>(); }

TEST(TransformerLayer, GptStyleShardedEqualsUnshardedDouble) { check_layer<double, false>(); }
TEST(TransformerLayer, GptStyleShardedEqualsUnshardedFloat) { check_layer<float, false>(); }
TEST(TransformerLayer, LlamaStyleShardedEqualsUnshardedDouble) { check_layer<double, true>(); }
TEST(TransformerLayer, LlamaStyleShardedEqualsUnshardedFloat) { check_layer<float, true>(); }
// Dropout masks are drawn per global element, so sharded runs with dropout match the single rank.
TEST(TransformerLayer, GptStyleWithDropoutShardedEqualsUnsharded) { check_layer<double, false>(0.25); }

// Without dropout and where a rank's rows are all the rows (tp = 1, or replicated activations),
// the norms add the bias gradients of fc2 and of the attention's projection as they read the
// residual gradient; the CPU backend adds the rows in the order bias_grad does, so every output,
// value and gradient is the bits of the layer whose linear layers take their own.
TEST(TransformerLayer, BiasGradientsTakenByTheNormsAreTheBitsOfTheirOwnPass) {
  static_assert(TransformerLayer<Policy<float, false>, LayerNorm, SelfAttention<Policy<float, false>, no_rope, mha>,
                                 Mlp<Policy<float, false>, gelu>>::residual_sums_fused);
  static_assert(!TransformerLayer<Policy<float, false>, LayerNormWithoutSums, SelfAttention<Policy<float, false>, no_rope, mha>,
                                  Mlp<Policy<float, false>, gelu>>::residual_sums_fused);
  for (int tp : {1, 2}) {
    const Snapshot fused = run_layer<float, false, false>(tp), own = run_layer<float, false, false, LayerNormWithoutSums>(tp);
    strata_test::expect_equivalent(fused, own, 0.0, "tp=" + std::to_string(tp));
  }
}
TEST(TransformerLayer, LlamaStyleWithDropoutShardedEqualsUnsharded) { check_layer<double, true>(0.25); }

// Under sequence parallelism the layer reduces both norms' parameter gradients in one all-reduce
// (add_replicated_gradients); the in-process reduction adds each element in rank order whatever the
// buffer, so every output, value and gradient is the bits of the norms reducing their own.
TEST(TransformerLayer, SequenceParallelNormGradientsReducedOnceAreTheBitsOfOneReductionPerNorm) {
  using SP = Policy<float, true>;
  static_assert(detail::norm_writes_partials<LayerNorm<SP>, context_t<SP>, typename LayerNorm<SP>::Saved,
                                             Activation<float, residual_layout_t<SP>>>);
  static_assert(!detail::norm_writes_partials<LayerNormReducingItself<SP>, context_t<SP>,
                                              typename LayerNormReducingItself<SP>::Saved, Activation<float, residual_layout_t<SP>>>);
  for (int tp : {2, 4})
    for (double dropout : {0.0, 0.25}) {
      const Snapshot once = run_layer<float, true, false>(tp, dropout),
                     per_norm = run_layer<float, true, false, LayerNormReducingItself>(tp, dropout);
      strata_test::expect_equivalent(once, per_norm, 0.0, "tp=" + std::to_string(tp) + " dropout=" + std::to_string(dropout));
    }
}

// Embedding then (a fixed projection to) vocab-parallel cross-entropy: tokens -> residual -> loss.
template <class T, bool SP>
Snapshot run_embedding_and_loss(int tp, double smoothing) {
  using P = Policy<T, SP>;
  constexpr index_t kVocab = 64;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    VocabParallelEmbedding<P> embedding(ctx, "embedding", kVocab, kHidden);
    ColumnParallelLinear<P> output(embedding.weight());  // tied: logits = x E^T
    VocabParallelCrossEntropy<P> loss(smoothing, 60);      // 4 padded columns
    embedding.init(ctx, 21, 1.0);
    Tensor<std::int32_t> tokens(Shape{kSeq, kBatch}), labels(Shape{kSeq, kBatch});
    for (index_t i = 0; i < tokens.numel(); ++i) {
      tokens[i] = static_cast<std::int32_t>(rng::uniform(5, static_cast<std::uint64_t>(i)) * 60);
      labels[i] = static_cast<std::int32_t>(rng::uniform(6, static_cast<std::uint64_t>(i)) * 60);
    }
    auto [x, es] = embedding.forward(ctx, tokens);
    auto [logits, os] = output.forward(ctx, x);
    auto [losses, ls] = loss.forward(ctx, logits, labels);
    Tensor<accumulate_t<T>> dloss(losses.shape(), accumulate_t<T>(0.1));
    auto dx = output.backward(ctx, os, loss.backward(ctx, ls, dloss, logits.shape()));
    embedding.backward(ctx, es, dx);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      snapshot.outputs.push_back(strata_test::to_values(losses));
    }
    strata_test::gather_parameters(ctx, embedding, snapshot, mutex);
  });
  return snapshot;
}

template <class T>
void check_embedding_and_loss(double smoothing) {
  const Snapshot reference = run_embedding_and_loss<T, false>(1, smoothing);
  for (int tp : {1, 2, 4}) {
    strata_test::expect_equivalent(run_embedding_and_loss<T, false>(tp, smoothing), reference, strata_test::tolerance<T>(),
                                   "tp=" + std::to_string(tp));
    strata_test::expect_equivalent(run_embedding_and_loss<T, true>(tp, smoothing), reference, strata_test::tolerance<T>(),
                                   "tp=" + std::to_string(tp) + " SP");
  }
}

TEST(VocabParallelEmbeddingAndCrossEntropy, ShardedEqualsUnshardedDouble) { check_embedding_and_loss<double>(0.0); }
TEST(VocabParallelEmbeddingAndCrossEntropy, ShardedEqualsUnshardedFloat) { check_embedding_and_loss<float>(0.0); }
TEST(VocabParallelEmbeddingAndCrossEntropy, LabelSmoothingShardedEqualsUnsharded) { check_embedding_and_loss<double>(0.1); }

TEST(VocabParallelCrossEntropy, MatchesDirectComputation) {
  // One rank, double: loss = logsumexp(z over real vocabulary) - z_label; gradient = softmax - onehot.
  using P = Policy<double, false>;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    VocabParallelCrossEntropy<P> loss(0.0, 5);
    Tensor<double> z(Shape{1, 2, 6}, std::vector<double>{1, 2, 3, 4, 5, 100, -1, 0, 1, 0, -1, 100});
    Tensor<std::int32_t> labels(Shape{1, 2}, std::vector<std::int32_t>{4, 0});
    Activation<double, layout::sharded<-1>> logits(z);
    auto [losses, saved] = loss.forward(ctx, logits, labels);
    // Every row's loss and every gradient entry, computed directly (column 5, padding with logit
    // 100, is left out of the softmax and gets no gradient).
    const int labels_of[2] = {4, 0};
    ASSERT_EQ(losses.numel(), 2);
    auto dz = loss.backward(ctx, saved, Tensor<double>(Shape{1, 2}, 1.0), z.shape());
    ASSERT_EQ(dz.tensor.numel(), 12);
    for (int row = 0; row < 2; ++row) {
      double sum = 0;
      for (int j = 0; j < 5; ++j) sum += std::exp(z[row * 6 + j]);
      const double lse = std::log(sum);
      EXPECT_NEAR(losses[row], lse - z[row * 6 + labels_of[row]], 1e-12) << "row " << row;
      for (int j = 0; j < 5; ++j)  // (row, j): softmax - onehot
        EXPECT_NEAR(dz.tensor[row * 6 + j], std::exp(z[row * 6 + j] - lse) - (j == labels_of[row] ? 1.0 : 0.0), 1e-12)
            << "row " << row << ", column " << j;
      EXPECT_EQ(dz.tensor[row * 6 + 5], 0.0) << "row " << row << ", padding column";
    }
  });
}

}  // namespace
}  // namespace test_blocks_cases
