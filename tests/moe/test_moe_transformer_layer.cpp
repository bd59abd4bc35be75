// A Llama-style TransformerLayer (RmsNorm, RoPE + GQA attention, MoE MLP with SwiGLU experts and a
// shared expert) at tp=2 with sequence parallelism and ep=2, and at tp=2 ep=1 etp=2, equals the
// single rank: outputs, input gradients and every parameter gradient (dense ones gathered over tp,
// expert ones over etp); the MoE block slots into TransformerLayer unchanged.
#include <gtest/gtest.h>

#include <mutex>

#include <strata/layers/moe.hpp>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_transformer_layer_cases {

namespace {

using namespace strata;
using strata_test::Snapshot;
constexpr index_t kSeq = 8, kBatch = 2, kHidden = 32;

template <bool SP>
Snapshot run_layer(const ParallelConfig& config) {
  using P = strata_test::TestPolicy<double, SP>;
  using Layer = TransformerLayer<P, RmsNorm, SelfAttention<P, rope, gqa>, MoeMlp<P, swiglu>>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(config.world_size(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, config);
    MoeMlpConfig moe;
    moe.hidden_size = kHidden;
    moe.num_experts = 4;
    moe.topk = 2;
    moe.expert_ffn_hidden_size = 16;
    moe.shared_expert_ffn_hidden_size = 32;
    moe.router.aux_loss_coeff = 0.01;
    Layer layer(ctx, "layer", TransformerLayerConfig{kHidden, 1e-5, 0.0}, AttentionConfig{kHidden, 8, 4, 1000.0, false}, moe);
    layer.init(ctx, 11, 0.3, 0.2);
    Activation<double, layout::replicated> x(strata_test::random_tensor<double>(Shape{kSeq, kBatch, kHidden}, 300));
    Activation<double, layout::replicated> dy(strata_test::random_tensor<double>(Shape{kSeq, kBatch, kHidden}, 400));
    Activation<double, residual_layout_t<P>> x_in, dy_in;
    if constexpr (SP) x_in = scatter_to_sequence_parallel(ctx.tp, x), dy_in = scatter_to_sequence_parallel(ctx.tp, dy);
    else x_in = x, dy_in = dy;
    auto [y, saved] = layer.forward(ctx, x_in);
    auto dx = layer.backward(ctx, saved, dy_in);
    Tensor<double> y_full, dx_full;
    if constexpr (SP) y_full = gather_from_sequence_parallel(ctx.tp, y).tensor, dx_full = gather_from_sequence_parallel(ctx.tp, dx).tensor;
    else y_full = y.tensor, dx_full = dx.tensor;
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      snapshot.outputs.push_back(strata_test::to_values(y_full));
      snapshot.outputs.push_back(strata_test::to_values(dx_full));
    }
    layer.for_each_parameter([&](auto& p) {
      auto& split = p.expert ? ctx.expert_tp : ctx.tp;
      auto value = gather_global(split, p, p.value);
      auto grad = gather_global(split, p, p.grad);
      if (split.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.values[p.name] = strata_test::to_values(value);
        snapshot.grads[p.name] = strata_test::to_values(grad);
      }
    });
  });
  return snapshot;
}

TEST(MoeTransformerLayer, LlamaStyleWithMoeMlpShardedEqualsUnsharded) {
  const Snapshot reference = run_layer<false>(ParallelConfig{});
  strata_test::expect_equivalent(run_layer<true>(ParallelConfig{.tp = 2, .ep = 2}), reference, 1e-12, "tp=2 SP ep=2");
  strata_test::expect_equivalent(run_layer<false>(ParallelConfig{.tp = 2, .ep = 1, .etp = 2}), reference, 1e-12,
                                 "tp=2 ep=1 etp=2");
}

}  // namespace
}  // namespace test_moe_transformer_layer_cases
