// One optimizer step of models::MoeLlama through the trainers' DataParallelOptimizer (examples/
// trainer/data_parallel.hpp) equals the single rank's on every layout: the expert weights in a
// gradient buffer of their own reduced over expert dp, the dense ones over dp; the gradient norm
// (dense squares over tp x pp plus the experts' over etp x ep x pp) the same on every rank and equal
// to the single rank's; clipping by it; AdamW, or the distributed optimizer sharding the dense state
// over dp and the experts' over expert dp. Compared: the norm and every parameter after the step
// (with the losses and gradients before it), DESIGN.md's double bound.
#include <gtest/gtest.h>

#include "moe_model_harness.hpp"
#include "trainer/data_parallel.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_model_optimizer_cases {

namespace {

using namespace moe_model_test;
template <class P>
using Model = strata::models::MoeLlama<P>;

template <class M>
Step<M> optimizer_step(bool distributed) {
  return [distributed](strata::ParallelContext<strata::inprocess::communicator>& ctx, M& model) {
    trainer::DataParallelOptions o;
    o.distributed_optimizer = distributed;
    o.bucket_size = 700;   // several buckets, each rank's share cutting through parameters
    o.adam.eps = 1e-2;     // the first step's update then depends on the gradient's size, not its sign alone
    o.adam.weight_decay = 0.1;
    trainer::DataParallelOptimizer<double, strata::space::host> optimizer(ctx, model, o);  // takes the gradients as they are
    EXPECT_NE(optimizer.expert_buffer(), nullptr) << "no buffer of its own for the expert weights";
    optimizer.reduce_gradients(ctx);
    const auto norm = optimizer.unscale_and_clip(ctx, model, 0.05);  // below the norm: clipping scales
    optimizer.step(ctx, model, 1e-2, nullptr);
    optimizer.wait_parameters(ctx);
    return strata::to_host(norm)[0];
  };
}

struct Case {
  strata::ParallelConfig config;
  bool sp;
};

void check_step(bool distributed) {
  const auto config = tiny_config(8);
  std::map<int, Snapshot> reference;
  for (int dp : {2, 4}) {
    reference[dp] = run_moe_model<Model, false>(strata::ParallelConfig{}, dp, config, optimizer_step<Model<strata_test::TestPolicy<double, false>>>(distributed));
    ASSERT_GT(reference[dp].outputs.at(2)[0], 0.05) << "the norm must be above the clipping threshold";
  }
  for (const Case& c : {Case{{.dp = 2, .ep = 2}, false}, Case{{.dp = 4, .ep = 4}, false}, Case{{.dp = 4, .ep = 2, .etp = 2}, false},
                        Case{{.tp = 2, .dp = 2, .ep = 4}, true}, Case{{.tp = 2, .dp = 2, .ep = 2, .etp = 2}, true}}) {
    const Snapshot got = c.sp ? run_moe_model<Model, true>(c.config, 0, config, optimizer_step<Model<strata_test::TestPolicy<double, true>>>(distributed))
                              : run_moe_model<Model, false>(c.config, 0, config, optimizer_step<Model<strata_test::TestPolicy<double, false>>>(distributed));
    strata_test::expect_equivalent(got, reference.at(c.config.dp), 1e-12,
                                   describe(c.config, c.sp) + (distributed ? ", distributed optimizer" : ", AdamW"));
  }
}

TEST(MoeModelOptimizer, AdamWStepWithExpertBuffersEqualsSingleRank) { check_step(false); }
TEST(MoeModelOptimizer, DistributedOptimizerStepShardingExpertsOverExpertDpEqualsSingleRank) { check_step(true); }

}  // namespace
}  // namespace test_moe_model_optimizer_cases
