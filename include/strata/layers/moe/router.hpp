// strata/layers/moe/router.hpp: `TopKRouter<Policy>`, the mixture-of-experts gate: which k of E
// experts each token goes to, with which weights (Megatron-Core's TopKRouter).
//
//   logits z = x W^T (+ b)       W [E, hidden], replicated (b [E] with RouterConfig::bias:
//                                Megatron's add_bias_linear, gpt-oss); x this rank's tokens [T, hidden]; z in
//                                A = accumulate_t<T> (fp32 for bf16 / fp16: Megatron's
//                                --moe-router-dtype fp32), as everything below
//   choice and weights           backend moe_router_forward (backend/moe_routing.hpp has the math:
//                                softmax after or before top-k, or sigmoid; the optional expert bias
//                                steers the choice only)
//   capacity                     ceil(T * k / E * capacity_factor) per expert when capacity_factor
//                                > 0; the rest dropped by weight (largest kept) or by position
//                                (earliest kept); optionally every expert padded to its capacity
//
// Load-balancing losses, added to the model's loss (their gradients enter the backward multiplied
// by loss_scale, the factor the main loss's gradient carries: Megatron's MoEAuxLossAutoScaler):
//   aux (Switch)   E * coeff / (k * N^2) * sum_i (sum_x p_xi) * c_i, where p are the scores over all
//                  experts, c_i the tokens routed to expert i (before dropping) summed over the
//                  tp x cp group (the ranks that split one sequence) and N the tokens of that group;
//                  each rank adds its own tokens' share, so the sum over ranks is the loss of the
//                  whole sequence and does not depend on how it is split
//   seq_aux        the same per sequence: sequences are the batch columns of the [s, b] tokens,
//                  E * coeff / (k * S^2 * B) * sum_b sum_i (sum_{x in b} p_xi) * c_bi, S the full
//                  sequence length, B the sequences
//   z-loss         coeff / N * sum_x logsumexp(z_x)^2 over the group (Megatron's mean of the squares
//                  divided by the tp x cp size)
// The losses accumulate as device scalars (losses(): [aux, z]) until reset_losses().
//
// Backward: dz from the weights' gradient and the two losses (moe_router_backward), dx = dz W (this
// rank's tokens), dW += dz^T x summed over the tensor-parallel group (each rank routes different
// tokens; over cp and dp the gradient reduction sums it like any replicated parameter's).
//
// Forced balance (Megatron's --moe-router-force-load-balancing, for benchmarks): the logits are
// replaced by standard normal values after the GEMM, different on each rank and each forward
// (keyed by the weight's name, the forward's count and the rank in tp x cp x dp), so the experts
// get about equal loads whatever the weights; the backward passes the gradient of those logits
// to the weight unchanged (a straight-through estimate), as Megatron's RandomSTE.
//
// Expert bias (aux-loss-free balancing, DeepSeek-V3): tokens per expert after dropping accumulate
// over the micro-batches; update_expert_bias sums them over tp x cp x dp and moves each bias by
// rate * sign(mean - load), once per step after the backward.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../../backend/backend.hpp"
#include "../conversions.hpp"
#include "../parameter.hpp"
#include "../policy.hpp"

STRATA_NAMESPACE_BEGIN

struct RouterConfig {
  index_t hidden_size = 0;
  index_t num_experts = 0;
  index_t topk = 1;
  MoeRouting routing{};  // score function, pre-softmax, scaling factor
  MoeLoadBalancing load_balancing = MoeLoadBalancing::aux_loss;
  double aux_loss_coeff = 0.0;
  double z_loss_coeff = 0.0;
  bool expert_bias = false;  // aux-loss-free balancing
  double expert_bias_update_rate = 1e-3;
  double capacity_factor = 0.0;  // 0: no capacity, nothing dropped
  MoeDropPolicy drop_policy = MoeDropPolicy::probability;
  bool pad_to_capacity = false;  // every expert gets exactly `capacity` slots (needs capacity_factor > 0)
  bool force_load_balancing = false;  // random logits (benchmarks only; see above)
  bool bias = false;                  // a bias on the logits, `<name>.bias` [E]
};

template <class Policy>
class TopKRouter {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Param = Parameter<T, Space>;
  static_assert(check_moe_backend<typename Policy::backend>());
  // The logits, softmax, top-k, losses and weights are computed in A (Megatron's --moe-router-dtype
  // fp32 with bf16 / fp16 parameters, always on).
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>,
                "TopKRouter computes its logits, scores and weights in fp32 or wider: accumulate_t<element> must be float or double.");

  struct Output {
    Tensor<std::int32_t, Space> indices;  // [T, k] the chosen experts
    Tensor<std::int32_t, Space> routed;   // [T, k] within capacity, -1 where dropped
    Tensor<A, Space> weights;             // [T, k]
    index_t capacity = 0;                 // slots per expert when padding to capacity, else 0
  };
  struct Saved {
    Tensor<T, Space> input;             // [T, hidden]
    Tensor<A, Space> logits;            // [T, E]
    Tensor<std::int32_t, Space> indices;
    Tensor<A, Space> aux_coefficients;  // [groups, E] (empty without the aux loss)
    index_t groups = 1;
    double group_tokens = 0;            // N: the tokens of the tp x cp group
  };

  TopKRouter(const Context& ctx, std::string name, RouterConfig c)
      : config_(checked(c)), weight_(name + ".weight", Shape{c.num_experts, c.hidden_size}, ShardSpec::replicated()),
        losses_(Tensor<double, Space>::zeros(Shape{2})) {
    (void)ctx;
    if (c.bias) bias_ = Param(name + ".bias", Shape{c.num_experts}, ShardSpec::replicated(), /*decay=*/false);
    if (c.expert_bias) {
      expert_bias_ = Tensor<A, Space>::zeros(Shape{c.num_experts});
      tokens_per_expert_ = Tensor<A, Space>::zeros(Shape{c.num_experts});
    }
  }

  const RouterConfig& config() const { return config_; }

  // x: this rank's tokens [T, hidden], T = s * b in [s, b] order; `sequences` = b (the per-sequence
  // aux loss groups tokens by x % b).
  std::pair<Output, Saved> forward(Context& ctx, const Tensor<T, Space>& x, index_t sequences = 1) const {
    const index_t tokens = x.shape().numel() / config_.hidden_size, experts = config_.num_experts, k = config_.topk;
    if (x.shape().cols() != config_.hidden_size)
      fail<ShapeError>("TopKRouter: input ", x.shape().str(), " does not have hidden_size=", config_.hidden_size, " columns");
    Saved saved;
    saved.input = x;
    saved.logits = Tensor<A, Space>::empty(Shape{tokens, experts});  // (T, E)
    ctx.device.template gemm<T, A>(false, true, tokens, experts, config_.hidden_size, x.data(), weight_.value.data(),
                                   saved.logits.data(), false);
    if (config_.bias) {
      if constexpr (std::is_same_v<T, A>) ctx.device.template bias_add<A>(saved.logits.data(), bias_.value.data(), tokens, experts);
      else {
        auto b = Tensor<A, Space>::empty(Shape{experts});
        ctx.device.template convert<T, A>(bias_.value.data(), experts, b.data());
        ctx.device.template bias_add<A>(saved.logits.data(), b.data(), tokens, experts);
      }
    }
    if (config_.force_load_balancing) {
      const std::uint64_t rank = static_cast<std::uint64_t>(ctx.tp_cp_dp.rank());
      const std::uint64_t key = rng::parameter_key(rng::mix(forward_calls_++, rank), weight_.name);
      ctx.device.template init_normal<A>(saved.logits.data(), saved.logits.numel(),
                                         ShardIndexMap(saved.logits.shape(), ShardSpec::replicated()), key, 1.0);
    }
    Output out;
    out.indices = Tensor<std::int32_t, Space>::empty(Shape{tokens, k});
    out.weights = Tensor<A, Space>::empty(Shape{tokens, k});
    const bool aux = config_.load_balancing != MoeLoadBalancing::none && config_.aux_loss_coeff > 0;
    const bool z = config_.z_loss_coeff > 0;
    Tensor<A, Space> scores = aux ? Tensor<A, Space>::empty(Shape{tokens, experts}) : Tensor<A, Space>{};
    Tensor<A, Space> lse = z ? Tensor<A, Space>::empty(Shape{tokens}) : Tensor<A, Space>{};
    ctx.device.template moe_router_forward<A>(saved.logits.data(), tokens, experts, k, config_.routing,
                                              config_.expert_bias ? expert_bias_.data() : nullptr, out.indices.data(),
                                              out.weights.data(), aux ? scores.data() : nullptr, z ? lse.data() : nullptr);
    saved.indices = out.indices;
    saved.group_tokens = static_cast<double>(tokens) * ctx.tp_cp.size();
    if (aux) {
      const index_t groups = config_.load_balancing == MoeLoadBalancing::seq_aux_loss ? sequences : 1;
      if (tokens % groups != 0)
        fail<ShapeError>("TopKRouter: ", tokens, " tokens are not ", groups, " whole sequences for the per-sequence aux loss");
      saved.groups = groups;
      auto counts = Tensor<A, Space>::empty(Shape{groups, experts});
      ctx.device.template moe_count<A>(out.indices.data(), tokens * k, k, groups, experts, counts.data(), false);
      if (ctx.tp_cp.size() > 1) ctx.tp_cp.all_reduce(counts.buffer(), ReduceOp::sum);
      auto sums = Tensor<A, Space>::zeros(Shape{groups, experts});  // sum over each group's tokens of p
      ctx.device.template bias_grad<A, A>(scores.data(), tokens / groups, groups * experts, sums.data());
      const double per_group = saved.group_tokens / static_cast<double>(groups);
      const double factor = static_cast<double>(experts) * config_.aux_loss_coeff /
                            (static_cast<double>(k) * saved.group_tokens * per_group);
      saved.aux_coefficients = Tensor<A, Space>::empty(Shape{groups, experts});
      ctx.device.template moe_aux_loss<A>(sums.data(), counts.data(), groups * experts, factor, losses_.data(),
                                          saved.aux_coefficients.data());
    }
    if (z) {
      auto sum = Tensor<double, Space>::zeros(Shape{1});
      ctx.device.template sum_of_squares<A>(lse.data(), tokens, sum.data());
      ctx.device.template scale<double>(sum.data(), 1, config_.z_loss_coeff / saved.group_tokens);
      ctx.device.template add<double>(losses_.data() + 1, sum.data(), 1, losses_.data() + 1);
    }
    if (config_.capacity_factor > 0) {
      const index_t capacity = expert_capacity(tokens);
      // A token picks an expert at most once, so no expert receives more than `tokens` assignments:
      // at that capacity (factor >= E / k) nothing can drop, and the drop's pass is skipped.
      if (capacity < tokens) {
        out.routed = Tensor<std::int32_t, Space>::empty(Shape{tokens, k});
        ctx.device.template moe_drop<A>(out.indices.data(), out.weights.data(), tokens * k, capacity,
                                        config_.drop_policy == MoeDropPolicy::position, out.routed.data());
      } else {
        out.routed = out.indices;
      }
      if (config_.pad_to_capacity) out.capacity = capacity;
    } else {
      out.routed = out.indices;
    }
    if (config_.expert_bias)
      ctx.device.template moe_count<A>(out.routed.data(), tokens * k, k, 1, experts, tokens_per_expert_.data(), true);
    return {std::move(out), std::move(saved)};
  }

  // dweights: [T, k], the gradient of the routing weights. Returns dx [T, hidden] for this rank's
  // tokens and accumulates the weight gradient.
  Tensor<T, Space> backward(Context& ctx, const Saved& saved, const Tensor<A, Space>& dweights) {
    const index_t tokens = saved.logits.shape().rows(), experts = config_.num_experts, hidden = config_.hidden_size;
    auto dlogits = Tensor<A, Space>::empty(Shape{tokens, experts});
    const double z_scale = config_.z_loss_coeff > 0 ? loss_scale_ * config_.z_loss_coeff / saved.group_tokens : 0.0;
    ctx.device.template moe_router_backward<A>(saved.logits.data(), tokens, experts, config_.topk, config_.routing,
                                               saved.indices.data(), dweights.data(),
                                               saved.aux_coefficients.empty() ? nullptr : saved.aux_coefficients.data(),
                                               saved.groups, loss_scale_, z_scale, dlogits.data());
    Tensor<T, Space> dz;
    if constexpr (std::is_same_v<T, A>) dz = dlogits;
    else {
      dz = Tensor<T, Space>::empty(dlogits.shape());
      ctx.device.template convert<A, T>(dlogits.data(), dlogits.numel(), dz.data());
    }
    auto increment = Tensor<A, Space>::empty(weight_.grad.shape());  // (E, hidden)
    ctx.device.template gemm<T, A>(true, false, experts, hidden, tokens, dz.data(), saved.input.data(), increment.data(), false);
    add_replicated_gradient<layout::sharded<0>>(ctx.device, ctx.tp, weight_.grad, increment);
    if (config_.bias) {
      auto bias_increment = Tensor<A, Space>::zeros(Shape{experts});
      ctx.device.template bias_grad<A, A>(dlogits.data(), tokens, experts, bias_increment.data());
      add_replicated_gradient<layout::sharded<0>>(ctx.device, ctx.tp, bias_.grad, bias_increment);
    }
    auto dx = Tensor<T, Space>::empty(saved.input.shape());  // (T, hidden)
    ctx.device.template gemm<T>(false, false, tokens, hidden, experts, dz.data(), weight_.value.data(), dx.data(), false);
    return dx;
  }

  // Slots per expert for T tokens: ceil(T * k / E * capacity_factor), at most T (moe_expert_capacity).
  index_t expert_capacity(index_t tokens) const { return moe_expert_capacity(tokens, config_.topk, config_.num_experts, config_.capacity_factor); }

  // The factor the main loss's gradient carries (1 / micro-batches, times the loss scale under
  // mixed precision); the aux and z losses' gradients are multiplied by it.
  void set_loss_scale(double scale) { loss_scale_ = scale; }
  double loss_scale() const { return loss_scale_; }
  // [aux, z] accumulated since the last reset, as device doubles (this rank's share).
  const Tensor<double, Space>& losses() const { return losses_; }
  void reset_losses(Context& ctx) { ctx.device.template fill<double>(losses_.data(), 2, 0.0); }

  // What the forward records besides its outputs (the losses, the load for the expert bias), taken
  // before a forward that must leave no trace (validation) and put back after it.
  struct Statistics {
    Tensor<double, Space> losses;
    Tensor<A, Space> tokens_per_expert;
  };
  Statistics statistics() const {
    return {losses_.clone(), tokens_per_expert_.empty() ? Tensor<A, Space>{} : tokens_per_expert_.clone()};
  }
  void restore(Context& ctx, const Statistics& s) const {
    ctx.device.template copy<double>(s.losses.data(), 2, losses_.data());
    if (!tokens_per_expert_.empty())
      ctx.device.template copy<A>(s.tokens_per_expert.data(), config_.num_experts, tokens_per_expert_.data());
  }

  // The forwards counted so far: forced balance keys each forward's random logits by it. A forward run
  // again (MoeMlp's block recompute) sets it back to its first run's value, then forward again.
  std::uint64_t forward_count() const { return forward_calls_; }
  void set_forward_count(std::uint64_t count) const { forward_calls_ = count; }

  // Once per step after the backward: collective over ctx.tp_cp_dp.
  void update_expert_bias(Context& ctx) {
    if (!config_.expert_bias) return;
    if (ctx.tp_cp_dp.size() > 1) ctx.tp_cp_dp.all_reduce(tokens_per_expert_.buffer(), ReduceOp::sum);
    ctx.device.template moe_expert_bias_update<A>(tokens_per_expert_.data(), config_.num_experts,
                                                  config_.expert_bias_update_rate, expert_bias_.data());
    ctx.device.template fill<A>(tokens_per_expert_.data(), config_.num_experts, 0.0);
  }
  const Tensor<A, Space>& expert_bias() const { return expert_bias_; }
  Tensor<A, Space>& expert_bias() { return expert_bias_; }
  const Tensor<A, Space>& tokens_per_expert() const { return tokens_per_expert_; }

  // The weight and the bias normal with `stddev` (Megatron's init_method on both).
  void init(Context& ctx, std::uint64_t seed, double stddev) {
    init_normal(ctx.device, weight_, seed, stddev);
    if (config_.bias) init_normal(ctx.device, bias_, seed, stddev);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
    if (config_.bias) visit(bias_);
  }
  Param& weight() { return weight_; }

 private:
  static RouterConfig checked(RouterConfig c) {
    if (c.hidden_size <= 0 || c.num_experts <= 0)
      fail<ConfigError>("TopKRouter: hidden_size=", c.hidden_size, " and num_experts=", c.num_experts,
                        " must be positive.");
    if (c.topk < 1 || c.topk > c.num_experts)
      fail<ConfigError>("TopKRouter: topk=", c.topk, " must be between 1 and num_experts=", c.num_experts,
                        "; each token goes to topk different experts.");
    if (c.routing.pre_softmax && c.routing.score != MoeScore::softmax)
      fail<ConfigError>("TopKRouter: pre_softmax applies to the softmax score function only; the sigmoid scores are "
                        "computed before the choice anyway.");
    check_moe_group_routing("TopKRouter", c.routing, c.num_experts, c.topk);
    if (c.pad_to_capacity && c.capacity_factor <= 0)
      fail<ConfigError>("TopKRouter: pad_to_capacity needs a capacity, but capacity_factor=", c.capacity_factor,
                        "; set capacity_factor > 0 (e.g. 1.0) or turn padding off.");
    if (c.aux_loss_coeff < 0 || c.z_loss_coeff < 0)
      fail<ConfigError>("TopKRouter: aux_loss_coeff=", c.aux_loss_coeff, " and z_loss_coeff=", c.z_loss_coeff,
                        " must not be negative.");
    return c;
  }

  RouterConfig config_;
  Param weight_;
  Param bias_;  // [E] with RouterConfig::bias
  // Written by the (const) forward, like the statistics a norm keeps: the losses and the load.
  mutable Tensor<double, Space> losses_;          // [aux, z]
  Tensor<A, Space> expert_bias_;                  // [E] (with expert_bias)
  mutable std::uint64_t forward_calls_ = 0;       // keys the random logits of force_load_balancing
  mutable Tensor<A, Space> tokens_per_expert_;    // [E] since the last update (with expert_bias)
  double loss_scale_ = 1.0;
};

STRATA_NAMESPACE_END
