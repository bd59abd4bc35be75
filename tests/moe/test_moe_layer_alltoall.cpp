// MoeMlp with the all-to-all dispatcher: every parallel layout (ep 2 and 4, etp 1 and 2, with tp and
// sequence parallelism, with dp) equals the single rank: outputs, input gradients, the aux and z
// losses (so the losses do not depend on the TP/EP partition), every parameter and gradient; with
// the shared experts' gate too, whose gradients match central differences.
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
// The shared experts' gate (Qwen2-MoE): its weight's gradient summed over tp under SP, not without.
TEST(MoeMlp, AllToAllSharedExpertGateShardedEqualsUnshardedDouble) {
  check_layouts<double, swiglu, moe_alltoall>(true, MoeScore::softmax, /*gate=*/true);
}

// The gate's gradients against central differences of L = sum(y * w) on one rank (double): the
// gate weight's and the input's; and the gate changes the output (sigmoid(x . w) is not 1).
TEST(MoeMlp, SharedExpertGateGradientsMatchCentralDifferences) {
  using P = strata_test::TestPolicy<double, false>;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = context_t<P>::create(world, ParallelConfig{});
    MoeMlp<P, swiglu, moe_alltoall> gated(ctx, "moe", layer_config(true, MoeScore::softmax, true));
    MoeMlp<P, swiglu, moe_alltoall> plain(ctx, "moe", layer_config(true, MoeScore::softmax, false));
    gated.init(ctx, 11, 0.3, 0.2);
    plain.init(ctx, 11, 0.3, 0.2);
    Parameter<double, space::host>* gate = nullptr;
    gated.for_each_parameter([&](auto& p) {
      if (p.name == "moe.shared_experts.gate_weight") gate = &p;
    });
    ASSERT_NE(gate, nullptr);
    using Edge = Activation<double, layout::replicated>;
    Edge x(strata_test::random_tensor<double>(Shape{kSeq, kBatch, kHidden}, 5));
    const Tensor<double> weights = strata_test::random_tensor<double>(Shape{kSeq, kBatch, kHidden}, 6);
    auto loss = [&](const Edge& in) {
      auto [y, saved] = gated.forward(ctx, in);
      double sum = 0;
      for (index_t i = 0; i < y.tensor.numel(); ++i) sum += y.tensor[i] * weights[i];
      return sum;
    };
    auto [y, saved] = gated.forward(ctx, x);
    const auto [y_plain, saved_plain] = plain.forward(ctx, x);
    EXPECT_GT(strata_test::relative_error(strata_test::to_values(y.tensor), strata_test::to_values(y_plain.tensor)), 1e-3);
    gated.router().set_loss_scale(0.0);  // the aux and z losses' gradients aside
    const Edge dx = gated.backward(ctx, saved, Edge(weights.clone()));
    const double h = 1e-6;
    double worst = 0;
    for (index_t i = 0; i < kHidden; ++i) {
      const double keep = gate->value[i];
      gate->value[i] = keep + h;
      const double up = loss(x);
      gate->value[i] = keep - h;
      const double down = loss(x);
      gate->value[i] = keep;
      worst = std::max(worst, std::fabs((up - down) / (2 * h) - gate->grad[i]) / (std::fabs(gate->grad[i]) + 1e-6));
    }
    EXPECT_LT(worst, 1e-6) << "the gate weight's gradient";
    worst = 0;
    for (index_t i = 0; i < x.tensor.numel(); i += 7) {
      Edge moved(x.tensor.clone());
      moved.tensor[i] += h;
      const double up = loss(moved);
      moved.tensor[i] -= 2 * h;
      const double down = loss(moved);
      worst = std::max(worst, std::fabs((up - down) / (2 * h) - dx.tensor[i]) / (std::fabs(dx.tensor[i]) + 1e-6));
    }
    EXPECT_LT(worst, 1e-5) << "the input's gradient";
  });
}
}  // namespace
}  // namespace test_moe_layer_alltoall_cases
