// MoeMlp with the all-gather dispatcher: every parallel layout equals the single rank (as for the
// all-to-all dispatcher), and the two dispatchers give the same results; the experts' GEMMs give the
// same results whether their counts are read on the host or left in the backend's memory.
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
// A backend whose grouped GEMMs would read the counts on the host (as CUDA without the Hopper
// kernel): the experts read them once per layer and call grouped_gemm with host sizes instead.
struct HostCountsBackend : cpu::backend {
  template <class T>
  static constexpr bool grouped_gemm_counts_on_device(index_t, index_t) {
    return false;
  }
};
struct HostCountsPolicy : strata_test::TestPolicy<double, false> {
  using backend = HostCountsBackend;
};

TEST(MoeMlp, CountsReadOnTheHostEqualCountsLeftOnTheDevice) {
  for (ParallelConfig c : {ParallelConfig{}, ParallelConfig{.dp = 2, .ep = 2}, ParallelConfig{.tp = 2, .dp = 2, .ep = 2, .etp = 2}}) {
    const auto on_device = run_moe<double, false, swiglu, moe_alltoall>(c, c.world_size() == 1 ? 2 : 0, true);
    const auto on_host = run_moe<double, false, swiglu, moe_alltoall, HostCountsPolicy>(c, c.world_size() == 1 ? 2 : 0, true);
    // 1e-15: the harness sums the ranks' router losses in the order the threads finish
    strata_test::expect_equivalent(on_host, on_device, 1e-15, describe(c, false));
    const auto gathered = run_moe<double, false, swiglu, moe_allgather, HostCountsPolicy>(c, c.world_size() == 1 ? 2 : 0, true);
    strata_test::expect_equivalent(gathered, on_device, 1e-12, describe(c, false) + " all-gather");
  }
}
}  // namespace
}  // namespace test_moe_layer_allgather_cases
