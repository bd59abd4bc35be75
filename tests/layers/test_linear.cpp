// ColumnParallelLinear -> RowParallelLinear (a two-layer MLP without activation) against the
// unsharded run: outputs and every gathered gradient; finite differences; init slices.
#include <gtest/gtest.h>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_linear_cases {

namespace {

using namespace strata;
using strata_test::Snapshot;

template <class T, bool SP>
using Policy = strata_test::TestPolicy<T, SP>;
using strata_test::random_tensor;

constexpr index_t kSeq = 12, kBatch = 2, kIn = 24, kHidden = 48, kOut = 20;

// Runs column -> row on `tp` ranks twice (gradients accumulate), returns the gathered snapshot.
// `overlap`: ctx.tp_comm_overlap, with the backward chained through an at_collectives list (the
// row layer's weight gradients run during the column layer's reduction), as TransformerLayer does.
// `rings`: ctx.tp_comm_overlap_ag and _rs (with `overlap`; off, the forward's collectives run whole).
// `gather`: ctx.tp_comm_overlap_gather (collective and copy_engines: one all-gather beside the own
// block; the in-process communicator has no copy engines, so copy_engines runs as collective).
using Gather = ParallelContext<inprocess::communicator>::OverlapGather;
template <class T, bool SP>
Snapshot run_mlp(int tp, bool overlap = false, bool ag_ring = true, bool rs_ring = true, Gather gather = Gather::ring) {
  using P = Policy<T, SP>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    ctx.tp_comm_overlap = overlap;
    ctx.tp_comm_overlap_ag = ag_ring;
    ctx.tp_comm_overlap_rs = rs_ring;
    ctx.tp_comm_overlap_gather = gather;
    if (gather == Gather::copy_engines) {
      EXPECT_FALSE(use_copy_engines_for_overlapped_gathers(ctx.tp, 1 << 20)) << "the in-process communicator has no copy engines";
    }
    ColumnParallelLinear<P> fc1(ctx, "fc1", kIn, kHidden);
    RowParallelLinear<P> fc2(ctx, "fc2", kHidden, kOut);
    fc1.init(ctx, 7, 0.5);
    fc2.init(ctx, 7, 0.5);
    init_normal(ctx.device, *fc1.bias(), 8, 0.1);
    init_normal(ctx.device, *fc2.bias(), 9, 0.1);
    for (int step = 0; step < 2; ++step) {
      Tensor<T> x_full = random_tensor<T>(Shape{kSeq, kBatch, kIn}, 100 + step);
      Tensor<T> dy_full = random_tensor<T>(Shape{kSeq, kBatch, kOut}, 200 + step);
      using In = typename ColumnParallelLinear<P>::input_layout;
      Activation<T, layout::replicated> x_rep(x_full), dy_rep(dy_full);
      Activation<T, In> x;
      Activation<T, typename RowParallelLinear<P>::output_layout> dy;
      if constexpr (SP) {
        x = scatter_to_sequence_parallel(ctx.tp, x_rep);
        dy = scatter_to_sequence_parallel(ctx.tp, dy_rep);
      } else {
        x = x_rep;
        dy = dy_rep;
      }
      auto [h, s1] = fc1.forward(ctx, x);
      auto [y, s2] = fc2.forward(ctx, h);
      DeferredWeightGradients chain(DeferredWeightGradients::mode::at_collectives);
      auto dx = overlap ? fc1.backward(ctx, s1, fc2.backward(ctx, s2, dy, &chain), &chain)
                        : fc1.backward(ctx, s1, fc2.backward(ctx, s2, dy));
      EXPECT_EQ(chain.size(), overlap && tp > 1 ? 1u : 0u) << "the column layer's weight gradients wait for the next collective";
      chain.run();
      Tensor<T> y_full, dx_full;
      if constexpr (SP) {
        y_full = gather_from_sequence_parallel(ctx.tp, y).tensor;
        dx_full = gather_from_sequence_parallel(ctx.tp, dx).tensor;
      } else {
        y_full = y.tensor;
        dx_full = dx.tensor;
      }
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back(strata_test::to_values(y_full));
        snapshot.outputs.push_back(strata_test::to_values(dx_full));
      }
    }
    strata_test::gather_parameters(ctx, fc1, snapshot, mutex);
    strata_test::gather_parameters(ctx, fc2, snapshot, mutex);
  });
  return snapshot;
}

template <class T, bool SP>
void check_all_tp() {
  const Snapshot reference = run_mlp<T, false>(1);
  for (int tp : {1, 2, 3, 4}) {
    if (kSeq % tp != 0 && SP) continue;
    strata_test::expect_equivalent(run_mlp<T, SP>(tp), reference, strata_test::tolerance<T>(),
                                   "tp=" + std::to_string(tp) + (SP ? " sequence parallel" : ""));
  }
}

// Tensor-parallel communication beside the GEMMs (ring gather in the column layer's forward, the
// chained backward) against the same layout without, to a tenth of the usual tolerance (a GEMM on
// a block of rows may round differently from the GEMM on all of them: float at tp = 4 differs by
// about 6e-8), and against one rank.
template <class T>
void check_tp_comm_overlap() {
  const Snapshot reference = run_mlp<T, false>(1);
  for (int tp : {2, 3, 4}) {
    const Snapshot overlapped = run_mlp<T, true>(tp, true);
    strata_test::expect_equivalent(overlapped, run_mlp<T, true>(tp), strata_test::tolerance<T>() / 10,
                                   "tp=" + std::to_string(tp) + " overlap vs plain");
    strata_test::expect_equivalent(overlapped, reference, strata_test::tolerance<T>(), "tp=" + std::to_string(tp) + " overlap");
    // --tp-comm-overlap-gather collective: the same blocks through the same GEMMs, so the same bits as the ring
    const Snapshot whole = run_mlp<T, true>(tp, true, true, true, Gather::collective);
    strata_test::expect_equivalent(whole, overlapped, 0.0, "tp=" + std::to_string(tp) + " overlap, gathers whole vs ring");
    strata_test::expect_equivalent(whole, reference, strata_test::tolerance<T>(), "tp=" + std::to_string(tp) + " overlap, gathers whole");
    // --tp-comm-overlap-gather copy-engines: the layers gather whole, as collective
    strata_test::expect_equivalent(run_mlp<T, true>(tp, true, true, true, Gather::copy_engines), whole, 0.0,
                                   "tp=" + std::to_string(tp) + " overlap, copy-engine gathers vs whole");
    // --disable-tp-comm-overlap-ag / -rs: the forward's gather or reduce-scatter whole, the backward still overlapped
    for (const auto& [ag, rs] : {std::pair{false, true}, std::pair{true, false}, std::pair{false, false}})
      strata_test::expect_equivalent(run_mlp<T, true>(tp, true, ag, rs), reference, strata_test::tolerance<T>(),
                                     "tp=" + std::to_string(tp) + " overlap, ag ring " + (ag ? "on" : "off") + ", rs ring " +
                                         (rs ? "on" : "off"));
  }
}

TEST(ColumnRowParallelLinear, ShardedEqualsUnshardedDouble) { check_all_tp<double, false>(); }
TEST(ColumnRowParallelLinear, TpCommOverlapEqualsPlainDouble) { check_tp_comm_overlap<double>(); }
TEST(ColumnRowParallelLinear, TpCommOverlapEqualsPlainFloat) { check_tp_comm_overlap<float>(); }
TEST(ColumnRowParallelLinear, ShardedEqualsUnshardedFloat) { check_all_tp<float, false>(); }
TEST(ColumnRowParallelLinear, SequenceParallelEqualsUnshardedDouble) { check_all_tp<double, true>(); }
TEST(ColumnRowParallelLinear, SequenceParallelEqualsUnshardedFloat) { check_all_tp<float, true>(); }

TEST(ColumnRowParallelLinear, GatherOutputAndScatteredInput) {
  // Column(gather_output) -> Row(!input_is_parallel) must equal the plain pairing.
  using P = Policy<double, false>;
  Snapshot plain = run_mlp<double, false>(1);
  for (int tp : {2, 4}) {
    Snapshot snapshot;
    std::mutex mutex;
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      ColumnParallelLinear<P, ColumnOptions{.gather_output = true}> fc1(ctx, "fc1", kIn, kHidden);
      RowParallelLinear<P, RowOptions{.input_is_parallel = false}> fc2(ctx, "fc2", kHidden, kOut);
      fc1.init(ctx, 7, 0.5);
      fc2.init(ctx, 7, 0.5);
      init_normal(ctx.device, *fc1.bias(), 8, 0.1);
      init_normal(ctx.device, *fc2.bias(), 9, 0.1);
      for (int step = 0; step < 2; ++step) {
        Activation<double, layout::replicated> x(random_tensor<double>(Shape{kSeq, kBatch, kIn}, 100 + step));
        Activation<double, layout::replicated> dy(random_tensor<double>(Shape{kSeq, kBatch, kOut}, 200 + step));
        auto [h, s1] = fc1.forward(ctx, x);
        auto [y, s2] = fc2.forward(ctx, h);
        auto dx = fc1.backward(ctx, s1, fc2.backward(ctx, s2, dy));
        if (world.rank() == 0) {
          std::lock_guard lock(mutex);
          snapshot.outputs.push_back(strata_test::to_values(y.tensor));
          snapshot.outputs.push_back(strata_test::to_values(dx.tensor));
        }
      }
      strata_test::gather_parameters(ctx, fc1, snapshot, mutex);
      strata_test::gather_parameters(ctx, fc2, snapshot, mutex);
    });
    strata_test::expect_equivalent(snapshot, plain, 1e-12, "gather/scatter tp=" + std::to_string(tp));
  }
}

TEST(ColumnRowParallelLinear, FiniteDifferenceGradient) {
  // loss = <dy, row(column(x))>: its gradient with respect to every parameter is what backward
  // accumulates when fed dy. Central differences in double at tp=2.
  using P = Policy<double, false>;
  inprocess::run(2, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2});
    ColumnParallelLinear<P> fc1(ctx, "fc1", 6, 8);
    RowParallelLinear<P> fc2(ctx, "fc2", 8, 5);
    fc1.init(ctx, 3, 0.5);
    fc2.init(ctx, 3, 0.5);
    Activation<double, layout::replicated> x(random_tensor<double>(Shape{4, 1, 6}, 11));
    Tensor<double> w = random_tensor<double>(Shape{4, 1, 5}, 12);
    auto loss = [&] {
      auto [h, s1] = fc1.forward(ctx, x);
      auto [y, s2] = fc2.forward(ctx, h);
      double l = 0;
      for (index_t i = 0; i < y.tensor.numel(); ++i) l += y.tensor[i] * w[i];
      return l;
    };
    auto [h, s1] = fc1.forward(ctx, x);
    auto [y, s2] = fc2.forward(ctx, h);
    fc1.backward(ctx, s1, fc2.backward(ctx, s2, Activation<double, layout::replicated>(w)));
    // Perturb one rank at a time so the finite difference isolates one shard element.
    for (int owner = 0; owner < 2; ++owner) {
      auto probe = [&](Parameter<double>& p) {
        for (index_t i = 0; i < p.value.numel(); ++i) {
          const double saved = p.value[i], eps = 1e-6;
          if (ctx.tp.rank() == owner || !p.tensor_parallel()) p.value[i] = saved + eps;
          const double plus = loss();
          if (ctx.tp.rank() == owner || !p.tensor_parallel()) p.value[i] = saved - eps;
          const double minus = loss();
          p.value[i] = saved;
          if (ctx.tp.rank() == owner || !p.tensor_parallel()) {
            const double numeric = (plus - minus) / (2 * eps);
            EXPECT_NEAR(p.grad[i], numeric, 1e-7 * std::max(1.0, std::abs(numeric))) << p.name << "[" << i << "]";
          }
        }
      };
      fc1.for_each_parameter(probe);
      fc2.for_each_parameter(probe);
    }
  });
}

TEST(ColumnRowParallelLinear, ShardedInitIsSliceOfUnshardedInit) {
  using P = Policy<double, false>;
  Snapshot reference;
  std::mutex mutex;
  for (int tp : {1, 2, 4}) {
    Snapshot snapshot;
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      ColumnParallelLinear<P> fc1(ctx, "fc1", kIn, kHidden, true, /*stacks=*/2);
      RowParallelLinear<P> fc2(ctx, "fc2", kHidden, kOut);
      fc1.init(ctx, 5, 1.0);
      fc2.init(ctx, 5, 1.0);
      // Every local element equals the unsharded init at its global index.
      auto expect_slice = [&](Parameter<double>& p) {
        const auto key = rng::parameter_key(5, p.name);
        for (index_t i = 0; i < p.value.numel(); ++i) {
          const auto g = global_index(p.global_shape, p.shard, i, ctx.tp.rank());
          EXPECT_EQ(p.value[i], p.name.ends_with("bias") ? 0.0 : rng::normal(key, static_cast<std::uint64_t>(g)));
        }
      };
      fc1.for_each_parameter(expect_slice);
      fc2.for_each_parameter(expect_slice);
      strata_test::gather_parameters(ctx, fc1, snapshot, mutex);
      strata_test::gather_parameters(ctx, fc2, snapshot, mutex);
    });
    if (tp == 1) reference = snapshot;
    for (const auto& [name, v] : reference.values) EXPECT_EQ(snapshot.values.at(name), v) << name << " tp=" << tp;
  }
}

// ---------------------------------------------------------------------------------------------
// The chunked classifier against the output layer followed by the cross-entropy, on the same ranks:
// losses, input gradient and the (biased) output layer's gradients, for blocks of every size.

template <class T, bool SP>
void expect_chunked_classifier_equals_unfused(int tp) {
  using P = Policy<T, SP>;
  using A = accumulate_t<T>;
  constexpr index_t seq = 6, batch = 2, rows = seq * batch, hidden = 10, padded_vocab = 24, vocab = 23;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    using In = typename ColumnParallelLinear<P>::input_layout;
    const VocabParallelCrossEntropy<P> loss(0.1, vocab);  // label smoothing, one padded column
    Tensor<std::int32_t> labels(Shape{seq, batch});
    Tensor<A> dloss(Shape{seq, batch});
    for (index_t i = 0; i < rows; ++i) {
      labels[i] = static_cast<std::int32_t>((7 * i + 3) % vocab);
      dloss[i] = i % 5 == 2 ? A(0) : A(0.1 + 0.05 * i);  // masked tokens weigh 0
    }
    Activation<T, layout::replicated> x_full(random_tensor<T>(Shape{seq, batch, hidden}, 31));
    Activation<T, In> x;
    if constexpr (SP) x = scatter_to_sequence_parallel(ctx.tp, x_full);
    else x = x_full;
    auto make_output = [&] {
      ColumnParallelLinear<P> output(ctx, "output", hidden, padded_vocab);
      output.init(ctx, 5, 0.5);
      init_normal(ctx.device, *output.bias(), 6, 0.2);
      return output;
    };
    ColumnParallelLinear<P> reference_layer = make_output();
    auto [logits, out_saved] = reference_layer.forward(ctx, x);
    auto [losses, loss_saved] = loss.forward(ctx, logits, labels);
    auto dx = reference_layer.backward(ctx, out_saved, loss.backward(ctx, loss_saved, dloss, logits.shape()));
    for (index_t chunk : {index_t{0}, index_t{1}, index_t{5}, index_t{rows}}) {
      const std::string what = "tp=" + std::to_string(tp) + (SP ? " SP" : "") + " chunk_rows=" + std::to_string(chunk);
      ColumnParallelLinear<P> layer = make_output();
      auto fused = chunked_classifier(ctx, layer, loss, x, labels, dloss, ClassifierChunks{chunk});
      const auto evaluated = chunked_classifier_loss(ctx, layer, loss, x, labels, ClassifierChunks{chunk});
      const double tol = strata_test::tolerance<T>();
      EXPECT_LE(strata_test::relative_error(strata_test::to_values(fused.losses), strata_test::to_values(losses)), tol) << what;
      EXPECT_LE(strata_test::relative_error(strata_test::to_values(evaluated), strata_test::to_values(losses)), tol) << what;
      EXPECT_EQ(fused.input_gradient.shape(), dx.shape()) << what;
      EXPECT_LE(strata_test::relative_error(strata_test::to_values(fused.input_gradient.tensor), strata_test::to_values(dx.tensor)), tol)
          << what;
      EXPECT_LE(strata_test::relative_error(strata_test::to_values(layer.weight().grad),
                                            strata_test::to_values(reference_layer.weight().grad)), tol) << what;
      EXPECT_LE(strata_test::relative_error(strata_test::to_values(layer.bias()->grad),
                                            strata_test::to_values(reference_layer.bias()->grad)), tol) << what;
      EXPECT_GT(strata_test::norm(strata_test::to_values(layer.bias()->grad)), 0.0) << what;
    }
  });
}

TEST(ChunkedClassifier, EqualsOutputLayerThenCrossEntropyDouble) {
  for (int tp : {1, 2, 3}) {
    expect_chunked_classifier_equals_unfused<double, false>(tp);
    expect_chunked_classifier_equals_unfused<double, true>(tp);
  }
}
TEST(ChunkedClassifier, EqualsOutputLayerThenCrossEntropyFloat) {
  for (int tp : {1, 3}) {
    expect_chunked_classifier_equals_unfused<float, false>(tp);
    expect_chunked_classifier_equals_unfused<float, true>(tp);
  }
}
TEST(ChunkedClassifier, BlockRowsFromTheByteBudget) {
  EXPECT_EQ((ClassifierChunks{0, 1000}.rows_for(10, 4)), 25);  // 40 bytes a row
  EXPECT_EQ((ClassifierChunks{0, 10}.rows_for(10, 4)), 1);     // at least one row
  EXPECT_EQ((ClassifierChunks{7, 10}.rows_for(10, 4)), 7);     // a row count wins
  // GPT-2's vocabulary in bf16: 2668 rows fit 256 MiB, rounded down to whole 256-row tiles
  EXPECT_EQ(ClassifierChunks{}.rows_for(50304, 2), 2560);
  EXPECT_EQ(ClassifierChunks{}.rows_for(25152, 2), 5120);      // tp = 2: 5336 fit
  EXPECT_EQ((ClassifierChunks{0, 300 * 40}.rows_for(10, 4)), 256);  // 300 fit
  EXPECT_EQ((ClassifierChunks{0, 255 * 40}.rows_for(10, 4)), 255);  // fewer than 256: as many as fit
  for (std::size_t budget : {std::size_t{1} << 20, std::size_t{3} << 20, std::size_t{256} << 20}) {
    const index_t r = ClassifierChunks{0, budget}.rows_for(1000, 2);
    EXPECT_EQ(r % ClassifierChunks::kRowGranule, 0) << budget;
    EXPECT_LE(static_cast<std::size_t>(r) * 1000 * 2, budget);
    EXPECT_GT(static_cast<std::size_t>(r + ClassifierChunks::kRowGranule) * 1000 * 2, budget);
  }
  EXPECT_THROW(ClassifierChunks{-1}.rows_for(10, 4), ConfigError);
}

}  // namespace
}  // namespace test_linear_cases
