// models::MoeLlama (2 layers, 8 or 4 experts, top-2, a shared expert, aux and z losses) with the
// all-to-all dispatcher on every layout against the single rank running the same micro-batches:
// ep 2 and 4, etp 1 and 2, tp 2 with and without sequence parallelism, dp. Compared: each
// micro-batch's loss, the router losses summed over the ranks (the aux loss does not depend on the
// partition), every parameter and gradient (DESIGN.md's double bound).
#include <gtest/gtest.h>

#include "moe_model_harness.hpp"

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

}  // namespace
