// Token dispatchers (all-gather and all-to-all) on in-process ranks, in double, for ep in {1, 2, 4}
// and etp in {1, 2}: with identity experts (each etp rank returns its input times 1/etp, so the
// partial sums over etp add up to the input), dispatch then combine gives back every token times
// the sum of its kept weights, exactly (bitwise); the backward gives dy times the same sum and the
// weights' gradient dy . x, exactly; dropped choices contribute zero; padding to capacity gives
// every expert its capacity from every rank; the counts handed on the host are the device's. Padded
// and compacted (the all-to-all dispatcher): the experts' rows are the real ones alone, in front,
// their counts on the device only, the rest zero. Both dispatchers therefore agree
// bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <vector>

#include <strata/layers/moe/token_dispatcher.hpp>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_dispatcher_cases {

namespace {

using namespace strata;
using P = strata_test::TestPolicy<double, false>;
using Context = ParallelContext<inprocess::communicator>;

constexpr index_t kTokens = 10, kHidden = 6, kExperts = 8, kTopk = 2;

enum class Drops { none, some, padded, compacted };

template <class Dispatcher>
void check_round_trip(int ep, int etp, Drops drops, MoeDispatcherType type = MoeDispatcherType::alltoall) {
  const std::string what = "ep=" + std::to_string(ep) + " etp=" + std::to_string(etp) + " drops=" +
                           std::to_string(static_cast<int>(drops));
  const index_t capacity = 3;
  inprocess::run(ep * etp, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{.dp = ep * etp, .ep = ep, .etp = etp});
    Dispatcher dispatcher(ctx, DispatcherConfig{kHidden, kExperts, kTopk, type});
    if constexpr (std::is_same_v<Dispatcher, ConfiguredDispatcher<P>>) {
      EXPECT_EQ(dispatcher.type(), type) << what;
    }
    EXPECT_EQ(dispatcher.local_experts(), kExperts / ep) << what;
    const auto key = static_cast<std::uint64_t>(world.rank());
    Tensor<double> x = strata_test::random_tensor<double>(Shape{kTokens, kHidden}, 100 + key);
    Tensor<double> dy = strata_test::random_tensor<double>(Shape{kTokens, kHidden}, 200 + key);
    Tensor<std::int32_t> routed(Shape{kTokens, kTopk});
    Tensor<double> weights(Shape{kTokens, kTopk}, 0.5);
    std::vector<int> per_expert(kExperts, 0);
    for (index_t t = 0; t < kTokens; ++t) {
      const auto first = static_cast<std::int32_t>(rng::uniform(7 + key, static_cast<std::uint64_t>(t)) * kExperts);
      const auto step = 1 + static_cast<std::int32_t>(rng::uniform(8 + key, static_cast<std::uint64_t>(t)) * (kExperts - 1));
      routed[t * kTopk] = first;
      routed[t * kTopk + 1] = (first + step) % kExperts;
      for (index_t j = 0; j < kTopk; ++j) {
        const std::int32_t e = routed[t * kTopk + j];
        const bool padded = drops == Drops::padded || drops == Drops::compacted;
        const bool drop = (drops == Drops::some && (t + j) % 3 == 0) || (padded && per_expert[e] >= capacity);
        if (drop) routed[t * kTopk + j] = -1;
        else ++per_expert[e];
      }
    }
    const index_t pad = drops == Drops::padded || drops == Drops::compacted ? capacity : 0;
    // compacted: the all-to-all dispatcher over several ranks (the others keep the padding)
    constexpr bool configured = std::is_same_v<Dispatcher, ConfiguredDispatcher<P>>;
    const bool all_to_all = std::is_same_v<Dispatcher, AllToAllDispatcher<P>> || (configured && type == MoeDispatcherType::alltoall);
    const bool compacted = drops == Drops::compacted && all_to_all;
    auto [dispatched, state] = dispatcher.dispatch(ctx, x, routed, weights, pad, drops == Drops::compacted);
    index_t rows = 0;
    std::vector<std::int32_t> counts(static_cast<std::size_t>(dispatched.counts.numel()));
    ctx.device.template copy_to_host<std::int32_t>(dispatched.counts.data(), dispatched.counts.numel(), counts.data());
    for (index_t n : counts) {
      rows += n;
      if (compacted) {
        EXPECT_LE(n, capacity * ep * etp) << what;  // the real rows alone
      } else if (pad) {
        EXPECT_EQ(n, capacity * ep * etp) << what;  // from every rank of the etp x ep group
      }
    }
    if (compacted) {  // the real rows (random, so nonzero) in front, the rest zero; the counts on the device alone
      EXPECT_TRUE(dispatched.host_counts.empty()) << what;
      // several ranks: the fixed-size exchange's rows; one rank: the kept rows packed in the upper bound
      EXPECT_EQ(dispatched.tokens.shape().rows(), ep * etp > 1 ? capacity * ep * etp * (kExperts / ep) : kTokens * kTopk) << what;
      const Tensor<double> tokens = dispatched.tokens.clone();
      for (index_t r = 0; r < tokens.shape().rows(); ++r) {
        bool zero = true;
        for (index_t h = 0; h < kHidden; ++h) zero = zero && tokens[r * kHidden + h] == 0.0;
        EXPECT_EQ(zero, r >= rows) << what << " row " << r;
      }
    } else {  // without device counts the dispatch hands them over on the host: the same
      ASSERT_EQ(dispatched.host_counts.size(), counts.size()) << what;
      for (std::size_t l = 0; l < counts.size(); ++l) EXPECT_EQ(dispatched.host_counts[l], counts[l]) << what << " expert " << l;
    }
    if (ep * etp == 1 && !pad) {  // one rank, dropless, device counts: nothing read on the host, the same rows
      auto [on_device, unused] = dispatcher.dispatch(ctx, x, routed, weights, 0, true);
      EXPECT_TRUE(on_device.host_counts.empty()) << what << ": one rank with device counts reads nothing on the host";
      EXPECT_EQ(strata_test::to_values(on_device.tokens), strata_test::to_values(dispatched.tokens)) << what;
    }
    if (ep * etp == 1 && !pad && !compacted) {  // one rank: the upper bound, the rows past the routed ones zero
      EXPECT_EQ(dispatched.tokens.shape().rows(), kTokens * kTopk) << what;
      const Tensor<double> tokens = dispatched.tokens.clone();
      for (index_t i = rows * kHidden; i < tokens.numel(); ++i) ASSERT_EQ(tokens.data()[i], 0.0) << what;
    } else if (!compacted) {  // (compacted: checked above)
      EXPECT_EQ(rows, dispatched.tokens.shape().rows()) << what;
    }
    Tensor<double> output = dispatched.tokens.clone();  // identity experts, partial over etp
    ctx.device.scale<double>(output.data(), output.numel(), 1.0 / etp);
    const Tensor<double> y = dispatcher.combine(ctx, state, output);
    auto [d_output, dweights] = dispatcher.combine_backward(ctx, state, dy);
    ctx.device.scale<double>(d_output.data(), d_output.numel(), 1.0 / etp);
    const Tensor<double> dx = dispatcher.dispatch_backward(ctx, state, d_output);
    ASSERT_EQ(y.numel(), x.numel()) << what;
    int kept_total = 0;
    for (index_t t = 0; t < kTokens; ++t) {
      double kept = 0, dot = 0;
      for (index_t j = 0; j < kTopk; ++j) kept += routed[t * kTopk + j] >= 0 ? 0.5 : 0.0;
      kept_total += kept > 0;
      for (index_t h = 0; h < kHidden; ++h) dot += dy[t * kHidden + h] * x[t * kHidden + h];
      for (index_t h = 0; h < kHidden; ++h) {
        EXPECT_EQ(y[t * kHidden + h], kept * x[t * kHidden + h]) << what << " token " << t;
        EXPECT_EQ(dx[t * kHidden + h], kept * dy[t * kHidden + h]) << what << " token " << t;
      }
      for (index_t j = 0; j < kTopk; ++j)
        EXPECT_EQ(dweights[t * kTopk + j], routed[t * kTopk + j] >= 0 ? dot : 0.0) << what << " token " << t;
    }
    EXPECT_GT(kept_total, 0);
  });
}

template <class Dispatcher>
void check_all(MoeDispatcherType type = MoeDispatcherType::alltoall) {
  for (int ep : {1, 2, 4})
    for (int etp : {1, 2})
      for (Drops drops : {Drops::none, Drops::some, Drops::padded, Drops::compacted})
        check_round_trip<Dispatcher>(ep, etp, drops, type);
}

TEST(AllGatherDispatcher, DispatchThenCombineRestoresTokensAndGradients) { check_all<AllGatherDispatcher<P>>(); }
TEST(AllToAllDispatcher, DispatchThenCombineRestoresTokensAndGradients) { check_all<AllToAllDispatcher<P>>(); }
// The run-time choice (--moe-token-dispatcher-type) holds the one it names and keeps its exactness.
TEST(ConfiguredDispatcher, EachTypeRestoresTokensAndGradients) {
  check_all<ConfiguredDispatcher<P>>(MoeDispatcherType::alltoall);
  check_all<ConfiguredDispatcher<P>>(MoeDispatcherType::allgather);
}

}  // namespace
}  // namespace test_moe_dispatcher_cases
