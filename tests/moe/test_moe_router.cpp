// TopKRouter on the CPU backend, in double: gradients against central finite differences of
// L = sum(g * weights) + aux + z (softmax after and before top-k, sigmoid with scaling, expert bias,
// the per-sequence aux loss); the aux, per-sequence aux and z losses against a computation by hand;
// the losses and the gate's gradient unchanged when the tokens are split over tp = 2 and 4; the
// capacity respected and the dropped assignments exactly those of the policy (by probability, by
// position); the expert bias steering the choice but not the weights, and its update.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <strata/layers/moe/router.hpp>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_router_cases {

namespace {

using namespace strata;
using P = strata_test::TestPolicy<double, false>;
using Context = ParallelContext<inprocess::communicator>;
using Router = TopKRouter<P>;
using strata_test::random_tensor;

constexpr index_t kSeq = 4, kBatch = 3, kHidden = 5, kExperts = 6, kTopk = 2;

RouterConfig base_config() {
  RouterConfig c;
  c.hidden_size = kHidden;
  c.num_experts = kExperts;
  c.topk = kTopk;
  return c;
}

// L = sum(g * weights) + aux + z for the router's current weight and input x.
double loss_of(Context& ctx, const Router& router, const Tensor<double>& x, const Tensor<double>& g, index_t sequences) {
  Router& mutable_router = const_cast<Router&>(router);
  mutable_router.reset_losses(ctx);
  auto [out, saved] = router.forward(ctx, x, sequences);
  double sum = 0;
  for (index_t i = 0; i < g.numel(); ++i) sum += g[i] * out.weights[i];
  const Tensor<double> losses = to_host(router.losses());
  return sum + losses[0] + losses[1];
}

void check_gradients(RouterConfig config, const char* what) {
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::single(world);
    Router router(ctx, "router", config);
    router.init(ctx, 7, 0.8);
    Tensor<double> x = random_tensor<double>(Shape{kSeq * kBatch, kHidden}, 1);
    Tensor<double> g = random_tensor<double>(Shape{kSeq * kBatch, kTopk}, 2);
    if (config.expert_bias) {
      Tensor<double> bias = random_tensor<double>(Shape{kExperts}, 3);
      std::copy(bias.begin(), bias.end(), router.expert_bias().begin());
    }
    router.reset_losses(ctx);
    auto [out, saved] = router.forward(ctx, x, kBatch);
    const Tensor<double> dx = router.backward(ctx, saved, g);
    const Tensor<double> dw = router.weight().grad.clone();
    constexpr double eps = 1e-6;
    auto numeric = [&](Tensor<double>& target, index_t i) {
      const double keep = target[i];
      target[i] = keep + eps;
      const double up = loss_of(ctx, router, x, g, kBatch);
      target[i] = keep - eps;
      const double down = loss_of(ctx, router, x, g, kBatch);
      target[i] = keep;
      return (up - down) / (2 * eps);
    };
    strata_test::Values analytic, finite;
    for (index_t i = 0; i < dw.numel(); ++i) analytic.push_back(dw[i]), finite.push_back(numeric(router.weight().value, i));
    for (index_t i = 0; i < dx.numel(); ++i) analytic.push_back(dx[i]), finite.push_back(numeric(x, i));
    EXPECT_GT(strata_test::norm(analytic), 1e-3) << what;
    EXPECT_LE(strata_test::relative_error(analytic, finite), 1e-7) << what;
  });
}

TEST(TopKRouter, GradientsMatchFiniteDifferencesSoftmaxAfterTopk) {
  RouterConfig c = base_config();
  c.aux_loss_coeff = 0.1;
  c.z_loss_coeff = 0.01;
  check_gradients(c, "softmax after top-k, aux and z losses");
}
TEST(TopKRouter, GradientsMatchFiniteDifferencesSoftmaxBeforeTopk) {
  RouterConfig c = base_config();
  c.routing.pre_softmax = true;
  c.routing.scaling_factor = 1.5;
  c.load_balancing = MoeLoadBalancing::seq_aux_loss;
  c.aux_loss_coeff = 0.2;
  check_gradients(c, "softmax before top-k, per-sequence aux loss");
}
TEST(TopKRouter, GradientsMatchFiniteDifferencesSigmoidWithExpertBias) {
  RouterConfig c = base_config();
  c.routing.score = MoeScore::sigmoid;
  c.routing.scaling_factor = 2.5;
  c.expert_bias = true;
  c.aux_loss_coeff = 0.1;
  c.z_loss_coeff = 0.02;
  check_gradients(c, "sigmoid, expert bias, aux and z losses");
}

// By hand: softmax scores, top-k of the logits, counts before dropping.
struct HandLosses {
  double aux = 0, seq_aux = 0, z = 0;
};
HandLosses by_hand(const Tensor<double>& x, const Tensor<double>& w, double coeff, double z_coeff) {
  const index_t tokens = kSeq * kBatch;
  std::vector<std::vector<double>> p(tokens, std::vector<double>(kExperts)), counts_seq(kBatch, std::vector<double>(kExperts, 0));
  std::vector<double> counts(kExperts, 0);
  HandLosses out;
  for (index_t t = 0; t < tokens; ++t) {
    std::vector<double> z(kExperts);
    for (index_t e = 0; e < kExperts; ++e)
      for (index_t h = 0; h < kHidden; ++h) z[e] += x[t * kHidden + h] * w[e * kHidden + h];
    const double m = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (double v : z) s += std::exp(v - m);
    for (index_t e = 0; e < kExperts; ++e) p[t][e] = std::exp(z[e] - m) / s;
    out.z += std::pow(m + std::log(s), 2);
    std::vector<index_t> order(kExperts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return z[a] > z[b]; });
    for (index_t j = 0; j < kTopk; ++j) counts[order[j]] += 1, counts_seq[t % kBatch][order[j]] += 1;
  }
  const double n = tokens;
  for (index_t e = 0; e < kExperts; ++e) {
    double sum = 0;
    for (index_t t = 0; t < tokens; ++t) sum += p[t][e];
    out.aux += sum * counts[e];
    for (index_t b = 0; b < kBatch; ++b) {
      double seq_sum = 0;
      for (index_t t = b; t < tokens; t += kBatch) seq_sum += p[t][e];
      out.seq_aux += seq_sum * counts_seq[b][e];
    }
  }
  out.aux *= kExperts * coeff / (kTopk * n * n);
  out.seq_aux *= kExperts * coeff / (kTopk * double(kSeq) * kSeq * kBatch);
  out.z *= z_coeff / n;
  return out;
}

// Tokens split over tp ranks as under sequence parallelism: rank r holds rows of the sequence.
// Returns the losses summed over ranks and the gate's gradient.
std::pair<std::vector<double>, std::vector<double>> split_run(int tp, RouterConfig config) {
  std::vector<double> losses(2, 0.0), grad;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = tp});
    Router router(ctx, "router", config);
    router.init(ctx, 7, 0.8);
    const Tensor<double> all = random_tensor<double>(Shape{kSeq * 4, kBatch, kHidden}, 1);
    const index_t rows = kSeq * 4 / tp * kBatch;
    Tensor<double> x = Tensor<double>::empty(Shape{rows, kHidden});
    std::copy_n(all.data() + world.rank() * rows * kHidden, rows * kHidden, x.data());
    Tensor<double> g = random_tensor<double>(Shape{kSeq * 4 * kBatch, kTopk}, 2);
    Tensor<double> g_local = Tensor<double>::empty(Shape{rows, kTopk});
    std::copy_n(g.data() + world.rank() * rows * kTopk, rows * kTopk, g_local.data());
    auto [out, saved] = router.forward(ctx, x, kBatch);
    router.backward(ctx, saved, g_local);
    const Tensor<double> mine = to_host(router.losses());
    std::lock_guard lock(mutex);
    losses[0] += mine[0], losses[1] += mine[1];
    if (world.rank() == 0) grad.assign(router.weight().grad.begin(), router.weight().grad.end());
  });
  return {losses, grad};
}

// Group-limited routing (DeepSeek-V3) against a reference written with sorts: group scores are the
// sums of each group's top (k / group_topk) choice values, the best group_topk groups are kept, and
// the top-k comes from their experts alone; ties to the lower index. Softmax after and before the
// choice, sigmoid with an expert bias; the weights are those of the chosen experts as without
// groups.
namespace group_reference {
std::vector<int> choose(const std::vector<double>& value, int groups, int group_topk, int k) {
  const int experts = static_cast<int>(value.size()), size = experts / groups;
  auto by_value = [&](int a, int b) { return value[a] > value[b] || (value[a] == value[b] && a < b); };
  std::vector<std::pair<double, int>> group_score;
  for (int g = 0; g < groups; ++g) {
    std::vector<int> members(size);
    std::iota(members.begin(), members.end(), g * size);
    std::sort(members.begin(), members.end(), by_value);
    double sum = 0;
    for (int j = 0; j < k / group_topk; ++j) sum += value[members[j]];
    group_score.push_back({sum, g});
  }
  std::stable_sort(group_score.begin(), group_score.end(), [](auto a, auto b) { return a.first > b.first; });
  std::vector<int> candidates;
  for (int j = 0; j < group_topk; ++j)
    for (int m = 0; m < size; ++m) candidates.push_back(group_score[j].second * size + m);
  std::sort(candidates.begin(), candidates.end(), by_value);
  candidates.resize(k);
  return candidates;
}
}  // namespace group_reference

TEST(TopKRouter, GroupLimitedRoutingChoosesAsTheReference) {
  constexpr index_t experts = 12, k = 4;
  std::mt19937_64 gen(11);
  std::normal_distribution<double> normal(0.0, 1.5);
  int differs_from_ungrouped = 0;
  for (const MoeScore score : {MoeScore::softmax, MoeScore::sigmoid})
    for (const bool pre : {false, true}) {
      if (pre && score == MoeScore::sigmoid) continue;
      for (int row = 0; row < 200; ++row) {
        std::vector<double> z(experts), bias(experts);
        for (auto& x : z) x = normal(gen);
        for (auto& x : bias) x = score == MoeScore::sigmoid ? 0.1 * normal(gen) : 0.0;
        if (row % 7 == 0) z[3] = z[5];  // ties
        MoeRouting r{score, pre, 1.0, 4, 2};
        const moe_math::RowStats<double> stats(z.data(), experts);
        std::vector<double> value(experts);
        for (index_t e = 0; e < experts; ++e) value[e] = moe_math::choice_value(z.data(), stats, r, bias.data(), e);
        std::vector<std::int32_t> idx(k), plain_idx(k);
        std::vector<double> w(k), plain_w(k);
        moe_math::route_row(z.data(), experts, k, r, bias.data(), idx.data(), w.data(), static_cast<double*>(nullptr),
                            static_cast<double*>(nullptr));
        const std::vector<int> expected = group_reference::choose(value, 4, 2, static_cast<int>(k));
        ASSERT_EQ(std::vector<int>(idx.begin(), idx.end()), expected) << "row " << row;
        std::set<int> groups_used;
        for (auto e : idx) groups_used.insert(e / 3);
        EXPECT_LE(groups_used.size(), 2u);
        MoeRouting plain = r;
        plain.num_groups = plain.group_topk = 0;
        moe_math::route_row(z.data(), experts, k, plain, bias.data(), plain_idx.data(), plain_w.data(),
                            static_cast<double*>(nullptr), static_cast<double*>(nullptr));
        differs_from_ungrouped += idx != plain_idx;
        if (idx == plain_idx) {
          for (index_t j = 0; j < k; ++j) EXPECT_EQ(w[j], plain_w[j]) << "the same choice weighs the same";
        }
      }
    }
  EXPECT_GT(differs_from_ungrouped, 50) << "the groups should change many choices";
}

TEST(TopKRouter, GradientsMatchFiniteDifferencesWithGroupLimitedRouting) {
  RouterConfig c = base_config();
  c.routing.score = MoeScore::sigmoid;
  c.routing.num_groups = 3;
  c.routing.group_topk = 2;
  c.aux_loss_coeff = 0.1;
  check_gradients(c, "sigmoid, 3 groups, 2 kept");
}

TEST(TopKRouter, GroupLimitedRoutingThatCannotHoldTheChoiceIsRefused) {
  auto refused = [](int groups, int group_topk, int topk, const char* expected) {
    RouterConfig c = base_config();
    c.topk = topk;
    c.routing.num_groups = groups;
    c.routing.group_topk = group_topk;
    try {
      inprocess::run(1, [&](inprocess::communicator& world) {
        auto ctx = Context::single(world);
        Router router(ctx, "router", c);
      });
      ADD_FAILURE() << "accepted groups=" << groups << " group_topk=" << group_topk << " topk=" << topk;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused(4, 2, 2, "--moe-router-num-groups=4 must divide num_experts=6");
  refused(3, 3, 2, "--moe-router-group-topk=3");
  refused(3, 0, 2, "--moe-router-group-topk=0");
  refused(3, 1, 3, "--moe-router-topk=3 is more than the 1 kept groups of 2 experts");
}

TEST(TopKRouter, LossesEqualHandComputation) {
  for (auto balancing : {MoeLoadBalancing::aux_loss, MoeLoadBalancing::seq_aux_loss}) {
    RouterConfig c = base_config();
    c.load_balancing = balancing;
    c.aux_loss_coeff = 0.3;
    c.z_loss_coeff = 0.05;
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = Context::single(world);
      Router router(ctx, "router", c);
      router.init(ctx, 7, 0.8);
      const Tensor<double> x = random_tensor<double>(Shape{kSeq * kBatch, kHidden}, 1);
      (void)router.forward(ctx, x, kBatch);
      const Tensor<double> losses = to_host(router.losses());
      const HandLosses hand = by_hand(x, router.weight().value, 0.3, 0.05);
      const double want = balancing == MoeLoadBalancing::aux_loss ? hand.aux : hand.seq_aux;
      EXPECT_NEAR(losses[0], want, 1e-13 * std::abs(want)) << (balancing == MoeLoadBalancing::aux_loss ? "aux" : "seq aux");
      EXPECT_NEAR(losses[1], hand.z, 1e-13 * hand.z);
      EXPECT_GT(want, 0.0);
    });
  }
}

TEST(TopKRouter, LossesAndGradientDoNotDependOnTheTensorParallelSplit) {
  for (auto balancing : {MoeLoadBalancing::aux_loss, MoeLoadBalancing::seq_aux_loss}) {
    RouterConfig c = base_config();
    c.load_balancing = balancing;
    c.aux_loss_coeff = 0.3;
    c.z_loss_coeff = 0.05;
    const auto [losses1, grad1] = split_run(1, c);
    for (int tp : {2, 4}) {
      const auto [losses, grad] = split_run(tp, c);
      EXPECT_LE(strata_test::relative_error(losses, losses1), 1e-13) << "tp=" << tp;
      EXPECT_LE(strata_test::relative_error(grad, grad1), 1e-12) << "tp=" << tp;
    }
  }
}

void check_capacity(MoeDropPolicy policy, bool pad) {
  RouterConfig c = base_config();
  c.capacity_factor = 0.75;
  c.drop_policy = policy;
  c.pad_to_capacity = pad;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::single(world);
    Router router(ctx, "router", c);
    router.init(ctx, 9, 1.0);
    const index_t tokens = 40;
    const Tensor<double> x = random_tensor<double>(Shape{tokens, kHidden}, 4);
    auto [out, saved] = router.forward(ctx, x);
    const index_t capacity = static_cast<index_t>(std::ceil(double(tokens * kTopk) / kExperts * 0.75));
    EXPECT_EQ(router.expert_capacity(tokens), capacity);
    EXPECT_EQ(out.capacity, pad ? capacity : 0);
    int dropped = 0;
    for (index_t e = 0; e < kExperts; ++e) {
      std::vector<index_t> chosen;  // assignments to e, in token order
      for (index_t a = 0; a < tokens * kTopk; ++a)
        if (out.indices[a] == e) chosen.push_back(a);
      std::vector<index_t> expected = chosen;
      if (policy == MoeDropPolicy::probability)
        std::stable_sort(expected.begin(), expected.end(), [&](index_t a, index_t b) { return out.weights[a] > out.weights[b]; });
      if (static_cast<index_t>(expected.size()) > capacity) expected.resize(static_cast<std::size_t>(capacity));
      index_t kept = 0;
      for (index_t a : chosen) {
        const bool should_keep = std::find(expected.begin(), expected.end(), a) != expected.end();
        EXPECT_EQ(out.routed[a], should_keep ? e : -1) << "assignment " << a << " of expert " << e;
        kept += out.routed[a] == e;
        dropped += out.routed[a] < 0;
      }
      EXPECT_LE(kept, capacity);
    }
    EXPECT_GT(dropped, 0) << "nothing was dropped, so the policy was not exercised";
  });
}

TEST(TopKRouter, CapacityRespectedDroppingByProbability) { check_capacity(MoeDropPolicy::probability, false); }
TEST(TopKRouter, CapacityRespectedDroppingByPosition) { check_capacity(MoeDropPolicy::position, false); }
TEST(TopKRouter, CapacityRespectedWithPadding) { check_capacity(MoeDropPolicy::probability, true); }

// A backend that counts the capacity drop's passes.
std::atomic<int> drops_run{0};
struct DropCountingBackend : cpu::backend {
  template <class A>
  static void moe_drop(const std::int32_t* indices, const A* weights, index_t assignments, index_t capacity, bool by_position,
                       std::int32_t* routed) {
    ++drops_run;
    cpu::backend::moe_drop<A>(indices, weights, assignments, capacity, by_position, routed);
  }
};
struct DropCountingPolicy : strata_test::TestPolicy<double, false> {
  using backend = DropCountingBackend;
};

// A token picks an expert at most once, so at a capacity of every token (factor E / k or more)
// nothing can drop: the router keeps every assignment without running the drop, padded or not; one
// token less of capacity (factor 2.9: 39 of 40) runs it.
TEST(TopKRouter, CapacityOfEveryTokenSkipsTheDrop) {
  for (const bool pad : {false, true})
    for (const double factor : {double(kExperts) / kTopk, 10.0, 2.9}) {
      RouterConfig c = base_config();
      c.capacity_factor = factor;
      c.pad_to_capacity = pad;
      inprocess::run(1, [&](inprocess::communicator& world) {
        auto ctx = ParallelContext<inprocess::communicator, DropCountingBackend>::single(world);
        TopKRouter<DropCountingPolicy> router(ctx, "router", c);
        router.init(ctx, 9, 1.0);
        const index_t tokens = 40;
        const Tensor<double> x = random_tensor<double>(Shape{tokens, kHidden}, 4);
        drops_run = 0;
        auto [out, saved] = router.forward(ctx, x);
        const bool every_token = factor >= double(kExperts) / kTopk;
        const std::string what = "factor " + std::to_string(factor) + (pad ? ", padded" : "");
        EXPECT_EQ(router.expert_capacity(tokens), every_token ? tokens : tokens - 1) << what;
        EXPECT_EQ(out.capacity, pad ? router.expert_capacity(tokens) : 0) << what;
        EXPECT_EQ(drops_run.load(), every_token ? 0 : 1) << what;
        if (every_token) {
          for (index_t a = 0; a < tokens * kTopk; ++a) EXPECT_EQ(out.routed[a], out.indices[a]) << what << ", assignment " << a;
        }
      });
    }
}

TEST(TopKRouter, ExpertBiasSteersTheChoiceNotTheWeightsAndFollowsTheLoad) {
  RouterConfig c = base_config();
  c.routing.score = MoeScore::sigmoid;
  c.expert_bias = true;
  c.expert_bias_update_rate = 0.125;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::single(world);
    Router router(ctx, "router", c);
    router.init(ctx, 9, 1.0);
    const index_t tokens = 12;
    const Tensor<double> x = random_tensor<double>(Shape{tokens, kHidden}, 4);
    router.expert_bias()[3] = 100.0;  // expert 3 is always chosen
    auto [out, saved] = router.forward(ctx, x);
    for (index_t t = 0; t < tokens; ++t) {
      EXPECT_EQ(out.indices[t * kTopk], 3);
      double z3 = 0, z_other = 0;
      const index_t other = out.indices[t * kTopk + 1];
      for (index_t h = 0; h < kHidden; ++h) {
        z3 += x[t * kHidden + h] * router.weight().value[3 * kHidden + h];
        z_other += x[t * kHidden + h] * router.weight().value[other * kHidden + h];
      }
      const double s3 = 1 / (1 + std::exp(-z3)), s_other = 1 / (1 + std::exp(-z_other));
      EXPECT_NEAR(out.weights[t * kTopk], s3 / (s3 + s_other + 1e-20), 1e-14);  // no bias in the weights
    }
    // Expert 3 is overloaded (every token), so its bias goes down by the rate; unused experts go up.
    const Tensor<double> load = router.tokens_per_expert().clone();
    EXPECT_EQ(load[3], double(tokens));
    const Tensor<double> before = router.expert_bias().clone();
    router.update_expert_bias(ctx);
    const double mean = double(tokens * kTopk) / kExperts;
    for (index_t e = 0; e < kExperts; ++e) {
      const double sign = load[e] < mean ? 1.0 : (load[e] > mean ? -1.0 : 0.0);
      EXPECT_EQ(router.expert_bias()[e], before[e] + 0.125 * sign) << "expert " << e;
      EXPECT_EQ(router.tokens_per_expert()[e], 0.0);
    }
  });
}

}  // namespace
}  // namespace test_moe_router_cases
