// MoeMlp with the all-gather dispatcher: every parallel layout equals the single rank (as for the
// all-to-all dispatcher), and the two dispatchers give the same results; the experts' GEMMs give the
// same results whether their counts are read on the host or left in the backend's memory.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <type_traits>

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

// A backend whose copies to the host are started and waited for apart, as on a GPU, recording the
// dense GEMMs enqueued in between on each rank (the routed experts' GEMMs are grouped ones, so the
// dense GEMMs there are the shared experts'), and the token counts read at once (synchronously).
std::atomic<int> counts_read_started{0}, counts_read_waited{0}, gemms_while_counts_travel{0}, counts_read_at_once{0};
thread_local bool counts_in_flight = false;
struct AsyncCountsBackend : cpu::backend {
  template <class X>
  static void copy_to_host_start(const X* src, index_t n, X* host) {
    cpu::backend::copy_to_host_start<X>(src, n, host);
    ++counts_read_started;
    counts_in_flight = true;
  }
  static void wait_host_copies() {
    if (counts_in_flight) ++counts_read_waited;
    counts_in_flight = false;
  }
  template <class X>
  static void copy_to_host(const X* src, index_t n, X* host) {
    if constexpr (std::is_same_v<X, std::int32_t>) ++counts_read_at_once;
    cpu::backend::copy_to_host<X>(src, n, host);
  }
  template <class T, class C = T>
  static void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, C* c, bool accumulate,
                   const T* bias = nullptr) {
    if (counts_in_flight) ++gemms_while_counts_travel;
    cpu::backend::gemm<T, C>(ta, tb, m, n, k, a, b, c, accumulate, bias);
  }
};
struct AsyncCountsPolicy : strata_test::TestPolicy<double, false> {
  using backend = AsyncCountsBackend;
};
// The same with grouped GEMMs that need their counts on the host (FP8 experts, expert biases, CUDA
// without the Hopper kernel).
struct AsyncHostCountsBackend : AsyncCountsBackend {
  template <class T>
  static constexpr bool grouped_gemm_counts_on_device(index_t, index_t) {
    return false;
  }
};
struct AsyncHostCountsPolicy : strata_test::TestPolicy<double, false> {
  using backend = AsyncHostCountsBackend;
};

// At layout c, with and without shared experts, both dispatchers: one read of the counts per rank
// and forward, started and waited for, none at once; the shared experts' fc1 and fc2 (2 GEMMs on each
// of the 2 ranks) enqueued between the two, nothing there without them; results those of the plain
// backend (1e-15: the harness sums the router losses in thread order).
template <class Policy>
void check_counts_read_beside_shared_experts(const ParallelConfig& c) {
  for (const bool shared : {true, false})
    for (const bool all_gather : {false, true}) {
      counts_read_started = counts_read_waited = gemms_while_counts_travel = counts_read_at_once = 0;
      const auto traced = all_gather ? run_moe<double, false, swiglu, moe_allgather, Policy>(c, 0, shared)
                                     : run_moe<double, false, swiglu, moe_alltoall, Policy>(c, 0, shared);
      const auto plain = all_gather ? run_moe<double, false, swiglu, moe_allgather>(c, 0, shared)
                                    : run_moe<double, false, swiglu, moe_alltoall>(c, 0, shared);
      const std::string what = describe(c, false) + (all_gather ? " all-gather" : " all-to-all") + (shared ? ", shared experts" : "");
      EXPECT_EQ(counts_read_started.load(), 2) << what << ": one read of the counts per rank and forward";
      EXPECT_EQ(counts_read_waited.load(), counts_read_started.load()) << what;
      EXPECT_EQ(counts_read_at_once.load(), 0) << what << ": counts read at once (the experts' own read)";
      EXPECT_EQ(gemms_while_counts_travel.load(), shared ? 4 : 0) << what;
      strata_test::expect_equivalent(traced, plain, 1e-15, what);
    }
}

// Over several expert ranks (dropless) each dispatcher reads the experts' counts on the host once per
// forward; the shared experts, which need no count, are enqueued after that read starts and before
// its wait (the dispatcher's `beside`), so a GPU computes them while the host waits.
TEST(MoeMlp, SharedExpertsRunWhileTheCountsTravel) {
  check_counts_read_beside_shared_experts<AsyncCountsPolicy>(ParallelConfig{.dp = 2, .ep = 2});
}

// Grouped GEMMs that need the counts on the host, on one rank of the etp x ep group (dropless): the
// dispatch reads them for the experts, started once they are counted and waited for after the
// shared experts are enqueued; the experts' forward reads nothing more.
TEST(MoeMlp, OneRankReadsTheExpertsHostCountsBesideTheSharedExperts) {
  check_counts_read_beside_shared_experts<AsyncHostCountsPolicy>(ParallelConfig{.dp = 2});  // two groups of one
}
}  // namespace
}  // namespace test_moe_layer_allgather_cases
