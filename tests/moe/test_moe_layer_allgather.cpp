// MoeMlp with the all-gather dispatcher: every parallel layout equals the single rank (as for the
// all-to-all dispatcher), and the two dispatchers give the same results.
#include <gtest/gtest.h>

#include "moe_layer_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_layer_allgather_cases {

namespace {
using namespace moe_test;

TEST(MoeMlp, AllGatherGeluShardedEqualsUnshardedDouble) { check_layouts<double, gelu, moe_allgather>(false); }
TEST(MoeMlp, AllGatherSwigluSharedExpertsShardedEqualsUnshardedDouble) { check_layouts<double, swiglu, moe_allgather>(true); }

TEST(MoeMlp, DispatchersAgree) {
  for (ParallelConfig c : {ParallelConfig{.tp = 2, .dp = 2, .ep = 2, .etp = 2}, ParallelConfig{.tp = 1, .dp = 4, .ep = 4}}) {
    const auto gathered = run_moe<double, true, swiglu, moe_allgather>(c, 0, true);
    const auto exchanged = run_moe<double, true, swiglu, moe_alltoall>(c, 0, true);
    strata_test::expect_equivalent(gathered, exchanged, 1e-12, describe(c, true));
  }
}
}  // namespace
}  // namespace test_moe_layer_allgather_cases
