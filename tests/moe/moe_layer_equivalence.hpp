// The MoE layer's equivalence harness: MoeMlp run on a parallel layout against one rank. Every rank
// of the layout processes the micro-batch of its data-parallel index; the single rank processes
// those micro-batches one after another (its gradients accumulate, as the data-parallel reduction
// sums them). Compared: each micro-batch's output and input gradient, the aux and z losses summed
// over ranks, every parameter's value and gradient: dense ones (router, shared experts) summed over
// dp and gathered over tp; expert weights gathered over etp and summed over expert dp.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include <strata/layers/moe.hpp>

#include "../common/equivalence.hpp"

namespace moe_test {

using namespace strata;
using strata_test::Snapshot;

constexpr index_t kSeq = 8, kBatch = 2, kHidden = 16, kExperts = 8, kTopk = 2, kExpertFfn = 8;

inline MoeMlpConfig layer_config(bool shared, MoeScore score, bool gate = false) {
  MoeMlpConfig c;
  c.hidden_size = kHidden;
  c.num_experts = kExperts;
  c.topk = kTopk;
  c.expert_ffn_hidden_size = kExpertFfn;
  c.shared_expert_ffn_hidden_size = shared ? 16 : 0;
  c.shared_expert_gate = gate;
  c.router.routing.score = score;
  c.router.load_balancing = MoeLoadBalancing::aux_loss;
  c.router.aux_loss_coeff = 0.05;
  c.router.z_loss_coeff = 0.01;
  return c;
}

// micro_batches > 0: one rank runs that many micro-batches (the reference); else config's layout.
// P: the policy (its backend), TestPolicy by default.
template <class T, bool SP, class Act, class Dispatch, class P = strata_test::TestPolicy<T, SP>>
Snapshot run_moe(const ParallelConfig& config, int micro_batches, bool shared, MoeScore score = MoeScore::softmax,
                 bool gate = false) {
  using Context = context_t<P>;
  Snapshot snapshot;
  std::mutex mutex;
  std::map<int, strata_test::Values> outputs;
  strata_test::Values losses(2, 0.0);
  inprocess::run(config.world_size(), [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, config);
    MoeMlp<P, Act, Dispatch> layer(ctx, "moe", layer_config(shared, score, gate));
    layer.init(ctx, 11, 0.3, 0.2);
    layer.router().set_loss_scale(0.7);
    const int first = micro_batches > 0 ? 0 : ctx.coords.dp, last = micro_batches > 0 ? micro_batches : ctx.coords.dp + 1;
    for (int d = first; d < last; ++d) {
      const auto key = static_cast<std::uint64_t>(d);
      Activation<T, layout::replicated> x(strata_test::random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 300 + key));
      Activation<T, layout::replicated> dy(strata_test::random_tensor<T>(Shape{kSeq, kBatch, kHidden}, 400 + key));
      using Edge = Activation<T, residual_layout_t<P>>;
      Edge x_in, dy_in;
      if constexpr (SP) x_in = scatter_to_sequence_parallel(ctx.tp, x), dy_in = scatter_to_sequence_parallel(ctx.tp, dy);
      else x_in = x, dy_in = dy;
      auto [y, saved] = layer.forward(ctx, x_in);
      auto dx = layer.backward(ctx, saved, dy_in);
      Tensor<T> y_full, dx_full;
      if constexpr (SP) y_full = gather_from_sequence_parallel(ctx.tp, y).tensor, dx_full = gather_from_sequence_parallel(ctx.tp, dx).tensor;
      else y_full = y.tensor, dx_full = dx.tensor;
      if (ctx.tp.rank() == 0) {
        std::lock_guard lock(mutex);
        outputs[2 * d] = strata_test::to_values(y_full);
        outputs[2 * d + 1] = strata_test::to_values(dx_full);
      }
    }
    {
      const Tensor<double> mine = to_host(layer.router().losses());
      std::lock_guard lock(mutex);
      losses[0] += mine[0], losses[1] += mine[1];
    }
    layer.for_each_parameter([&](auto& p) {
      auto& split = p.expert ? ctx.expert_tp : ctx.tp;
      auto& replicas = p.expert ? ctx.expert_dp : ctx.dp;
      auto value = gather_global(split, p, p.value);
      auto grad = gather_global(split, p, p.grad);
      if (replicas.size() > 1) replicas.all_reduce(grad.buffer(), ReduceOp::sum);
      if (split.rank() == 0 && replicas.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.values[p.name] = strata_test::to_values(value);
        snapshot.grads[p.name] = strata_test::to_values(grad);
      }
    });
  });
  for (auto& [d, v] : outputs) snapshot.outputs.push_back(v);
  snapshot.outputs.push_back(losses);
  return snapshot;
}

inline std::string describe(const ParallelConfig& c, bool sp) {
  return "tp=" + std::to_string(c.tp) + (sp ? " SP" : "") + " dp=" + std::to_string(c.dp) + " ep=" + std::to_string(c.ep) +
         " etp=" + std::to_string(c.etp);
}

// Every layout against the single rank with as many micro-batches as the layout's dp. `gate`: the
// shared experts' gate (MoeMlpConfig::shared_expert_gate).
template <class T, class Act, class Dispatch>
void check_layouts(bool shared, MoeScore score = MoeScore::softmax, bool gate = false) {
  std::map<int, Snapshot> reference;
  for (int dp : {1, 2, 4}) {
    reference[dp] = run_moe<T, false, Act, Dispatch>(ParallelConfig{}, dp, shared, score, gate);
    // the router, fc1 and fc2 of every expert, the shared experts' fc1 and fc2 (and gate); y and dx
    // per micro-batch, then the losses
    EXPECT_EQ(reference[dp].grads.size(), static_cast<std::size_t>(1 + 2 * kExperts + (shared ? 2 : 0) + (gate ? 1 : 0)));
    ASSERT_EQ(reference[dp].outputs.size(), static_cast<std::size_t>(2 * dp + 1));
    EXPECT_GT(reference[dp].outputs.back()[0], 0.0) << "no aux loss";
    EXPECT_GT(reference[dp].outputs.back()[1], 0.0) << "no z loss";
  }
  struct Case {
    ParallelConfig config;
    bool sp;
  };
  const Case cases[] = {
      {{.tp = 1, .dp = 2, .ep = 2}, false},          {{.tp = 1, .dp = 4, .ep = 4}, false},
      {{.tp = 1, .dp = 4, .ep = 2, .etp = 2}, false}, {{.tp = 2, .ep = 2}, true},
      {{.tp = 2, .ep = 2}, false},                    {{.tp = 2, .ep = 1, .etp = 2}, true},
      {{.tp = 4, .ep = 4}, true},                     {{.tp = 4, .ep = 2, .etp = 2}, true},
      {{.tp = 2, .dp = 2, .ep = 4}, true},            {{.tp = 2, .dp = 2, .ep = 2, .etp = 2}, true},
  };
  for (const Case& c : cases) {
    const Snapshot got = c.sp ? run_moe<T, true, Act, Dispatch>(c.config, 0, shared, score, gate)
                              : run_moe<T, false, Act, Dispatch>(c.config, 0, shared, score, gate);
    strata_test::expect_equivalent(got, reference.at(c.config.dp), strata_test::tolerance<T>(), describe(c.config, c.sp));
  }
}

}  // namespace moe_test
