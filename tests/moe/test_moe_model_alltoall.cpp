// models::MoeLlama (2 layers, 8 or 4 experts, top-2, a shared expert, aux and z losses) with the
// all-to-all dispatcher on every layout against the single rank running the same micro-batches:
// ep 2 and 4, etp 1 and 2, tp 2 with and without sequence parallelism, dp. Compared: each
// micro-batch's loss, the router losses summed over the ranks (the aux loss does not depend on the
// partition), every parameter and gradient (DESIGN.md's double bound); also with group-limited
// routing.
#include <gtest/gtest.h>

#include "moe_model_harness.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_model_alltoall_cases {

namespace {

using namespace moe_model_test;
template <class P>
using Model = strata::models::MoeLlama<P, strata::moe_alltoall>;

struct Case {
  strata::ParallelConfig config;
  bool sp;
};

void check(const Case& c, const std::map<int, Snapshot>& reference, int experts) {
  const auto config = tiny_config(experts);
  const Snapshot got = c.sp ? run_moe_model<Model, true>(c.config, 0, config) : run_moe_model<Model, false>(c.config, 0, config);
  strata_test::expect_equivalent(got, reference.at(c.config.dp), 1e-12, describe(c.config, c.sp));
}

std::map<int, Snapshot> references(std::initializer_list<int> dps, int experts) {
  std::map<int, Snapshot> out;
  for (int dp : dps) {
    out[dp] = run_moe_model<Model, false>(strata::ParallelConfig{}, dp, tiny_config(experts));
    // embedding, output, final norm; per layer two norms, qkv and out projections, the router,
    // the experts' fc1 and fc2, the shared expert's fc1 and fc2
    EXPECT_EQ(out[dp].grads.size(), 3u + 2u * (2 + 2 + 1 + 2 * experts + 2));
    EXPECT_GT(out[dp].outputs.at(1)[0], 0.0) << "no aux loss";
    EXPECT_GT(out[dp].outputs.at(1)[1], 0.0) << "no z loss";
  }
  return out;
}

TEST(MoeModel, AllToAllExpertParallelEqualsSingleRank) {
  const auto reference = references({2, 4}, 8);
  for (const Case& c : {Case{{.dp = 2, .ep = 2}, false}, Case{{.dp = 4, .ep = 4}, false}, Case{{.dp = 4, .ep = 2, .etp = 2}, false}})
    check(c, reference, 8);
}

TEST(MoeModel, AllToAllTensorAndExpertParallelEqualsSingleRank) {
  const auto reference = references({1, 2}, 4);  // 4 experts: each gets tokens of one micro-batch
  for (const Case& c : {Case{{.tp = 2, .ep = 2}, true}, Case{{.tp = 2, .ep = 2}, false}, Case{{.tp = 2, .ep = 1, .etp = 2}, true},
                        Case{{.tp = 2, .dp = 2, .ep = 4}, true}, Case{{.tp = 2, .dp = 2, .ep = 2, .etp = 2}, true}})
    check(c, reference, 4);
}

// DeepSeek-V3's group-limited routing (2 groups of 4 experts scored by their top 2, the top-2 from
// the kept group, sigmoid scores): every layout equals the single rank, and the groups change the
// choice (the gradients differ from the run without them).
TEST(MoeModel, GroupLimitedRoutingExpertParallelEqualsSingleRank) {
  auto grouped = tiny_config(8);
  grouped.moe.routing.score = strata::MoeScore::sigmoid;
  grouped.moe.routing.num_groups = 2;
  grouped.moe.routing.group_topk = 1;
  const Snapshot reference = run_moe_model<Model, false>(strata::ParallelConfig{}, 2, grouped);
  for (const Case& c : {Case{{.dp = 2, .ep = 2}, false}, Case{{.tp = 2, .dp = 2, .ep = 2}, true}}) {
    const Snapshot got = c.sp ? run_moe_model<Model, true>(c.config, 0, grouped) : run_moe_model<Model, false>(c.config, 0, grouped);
    strata_test::expect_equivalent(got, reference, 1e-12, describe(c.config, c.sp) + " group-limited");
  }
  auto plain = grouped;
  plain.moe.routing.num_groups = plain.moe.routing.group_topk = 0;
  const Snapshot ungrouped = run_moe_model<Model, false>(strata::ParallelConfig{}, 2, plain);
  bool differs = false;
  for (const auto& [name, g] : reference.grads) differs = differs || g != ungrouped.grads.at(name);
  EXPECT_TRUE(differs) << "the groups changed no choice";
}

}  // namespace
}  // namespace test_moe_model_alltoall_cases
