// models::MoeLlama with the all-gather dispatcher on expert-parallel layouts against the all-to-all
// dispatcher on one rank (so the two dispatchers agree), and the router losses' place in the
// objective: the gradient of the whole model is that of
//   loss_scale * (sum of mask * token loss + b * s * (aux + z))
// (finite differences, double), the router losses weighing a micro-batch like its mean token loss.
#include <gtest/gtest.h>

#include <cmath>

#include "moe_model_harness.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_model_allgather_cases {

namespace {

using namespace moe_model_test;
template <class P>
using AllGather = strata::models::MoeLlama<P, strata::moe_allgather>;
template <class P>
using AllToAll = strata::models::MoeLlama<P, strata::moe_alltoall>;

TEST(MoeModel, AllGatherDispatcherEqualsAllToAllOnOneRank) {
  const auto config = tiny_config(4);
  const Snapshot reference = run_moe_model<AllToAll, false>(strata::ParallelConfig{}, 2, config);
  EXPECT_EQ(reference.grads.size(), 3u + 2u * (2 + 2 + 1 + 8 + 2));
  strata_test::expect_equivalent(run_moe_model<AllGather, false>(strata::ParallelConfig{}, 2, config), reference, 1e-12,
                                 "all-gather, one rank");
  for (const strata::ParallelConfig& c : {strata::ParallelConfig{.dp = 2, .ep = 2}, strata::ParallelConfig{.tp = 2, .dp = 2, .ep = 4},
                                          strata::ParallelConfig{.tp = 2, .dp = 2, .ep = 2, .etp = 2}}) {
    const Snapshot got = c.tp > 1 ? run_moe_model<AllGather, true>(c, 0, config) : run_moe_model<AllGather, false>(c, 0, config);
    const Snapshot& want = c.dp == 2 ? reference : reference;
    strata_test::expect_equivalent(got, want, 1e-12, "all-gather " + describe(c, c.tp > 1));
  }
}

TEST(MoeModel, RouterLossesEnterTheGradientWeighedLikeTheMicroBatchMeanLoss) {
  using namespace strata;
  using P = strata_test::TestPolicy<double, false>;
  auto config = tiny_config(4, /*shared=*/false);
  config.moe.aux_loss_coeff = 0.5;  // large, so that their share of the gradient is visible
  config.moe.z_loss_coeff = 0.2;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::MoeLlama<P> model(ctx, config);
    model.init(ctx, 4321);
    const auto batch = strata_test::random_batch(config.vocab_size, kMicroBatch, config.seq_length, 5);
    const double loss_scale = 1.0 / 40.0, tokens = static_cast<double>(kMicroBatch * config.seq_length);
    auto objective = [&](double* router_share) {
      model.reset_router_losses(ctx);
      const double lm = model.forward(ctx, batch.tokens, batch.labels, batch.mask).first.loss_sum();
      const Tensor<double> router = to_host(model.router_losses(ctx));
      if (router_share) *router_share = loss_scale * tokens * (router[0] + router[1]);
      return loss_scale * (lm + tokens * (router[0] + router[1]));
    };
    model.reset_router_losses(ctx);
    auto [loss, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask);
    model.backward(ctx, saved, loss_scale);
    double share = 0;
    const double total = objective(&share);
    EXPECT_GT(share, 1e-3 * total) << "the router losses are too small for this check to see them";
    int checked = 0;
    model.for_each_parameter([&](Parameter<double>& p) {
      const bool router = p.name.find("router") != std::string::npos;
      const index_t n = p.value.numel(), stride = std::max<index_t>(1, n / (router ? 16 : 3));
      for (index_t i = (p.name.size() * 7) % stride; i < n; i += stride) {
        const double kept = p.value[i], eps = 1e-6;
        p.value[i] = kept + eps;
        const double plus = objective(nullptr);
        p.value[i] = kept - eps;
        const double minus = objective(nullptr);
        p.value[i] = kept;
        const double numeric = (plus - minus) / (2 * eps);
        EXPECT_NEAR(p.grad[i], numeric, 1e-7 * std::max(1e-2, std::abs(numeric))) << p.name << "[" << i << "]";
        ++checked;
      }
    });
    EXPECT_GT(checked, 100);
  });
}

}  // namespace
}  // namespace test_moe_model_allgather_cases
