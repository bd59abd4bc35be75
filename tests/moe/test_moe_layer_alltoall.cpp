// MoeMlp with the all-to-all dispatcher: every parallel layout (ep 2 and 4, etp 1 and 2, with tp and
// sequence parallelism, with dp) equals the single rank: outputs, input gradients, the aux and z
// losses (so the losses do not depend on the TP/EP partition), every parameter and gradient.
#include <gtest/gtest.h>

#include "moe_layer_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_layer_alltoall_cases {

namespace {
using namespace moe_test;

TEST(MoeMlp, AllToAllGeluShardedEqualsUnshardedDouble) { check_layouts<double, gelu, moe_alltoall>(false); }
TEST(MoeMlp, AllToAllSwigluSharedExpertsShardedEqualsUnshardedDouble) { check_layouts<double, swiglu, moe_alltoall>(true); }
TEST(MoeMlp, AllToAllSwigluSigmoidShardedEqualsUnshardedFloat) {
  check_layouts<float, swiglu, moe_alltoall>(false, MoeScore::sigmoid);
}
}  // namespace
}  // namespace test_moe_layer_alltoall_cases
