// strata/layers/moe/moe_mlp.hpp: `MoeMlp<Policy, Activation, Dispatch>`, a mixture-of-experts
// feed-forward block usable as TransformerLayer's MLP (Megatron-Core's MoELayer): TopKRouter, a
// token dispatcher over the expert-parallel group, GroupedExperts, and optional shared experts (a
// dense Mlp every token goes through, added to the routed output).
//
// Input and output: the residual-stream layout. The experts work on this rank's tokens: under
// sequence parallelism the rank's sequence shard; otherwise (replicated input, tp > 1) the rank
// takes its 1/tp of the sequence (a slice; backward all-gathers) and all-gathers the output, so the
// tensor-parallel ranks never route the same token twice.
//
//   forward   tokens -> router (choices, weights; aux and z losses) -> dispatch -> experts ->
//             combine -> (+ shared experts on the whole input, optionally gated)
//
// The shared experts' gate (Megatron's --moe-shared-expert-gate, Qwen2-MoE's shared_expert_gate):
// the shared output of token t is scaled by sigmoid(x_t . w), w [1, hidden] a replicated
// parameter `<layer>.shared_experts.gate_weight`. Its gradient is summed over tp under sequence
// parallelism (each rank saw its shard of the tokens), as a norm's is.
//   backward  combine backward (d expert output, d weights) -> experts backward -> dispatch
//             backward -> + router backward (d weights and the losses, scaled by loss_scale)
//
// A dense layer of a model that mixes dense and MoE layers (Megatron's --moe-layer-freq): with
// MoeMlpConfig::dense set the block is an ordinary tensor-parallel Mlp of that configuration, named
// as a dense model's MLP (`<layer>.mlp.fc1`), with no router, dispatcher or experts; one compiled
// layer type then serves every layer of the model, each choosing its kind at construction.
//
// Dispatch is a tag: moe_alltoall (AllToAllDispatcher, the default), moe_allgather, or
// moe_configured (ConfiguredDispatcher: the one MoeMlpConfig::dispatcher names, at run time).
//
// Gradients: the router's weight is replicated and already summed over tp; shared experts are
// tensor-parallel like the dense MLP; both are reduced over dp like every dense parameter. Expert
// weights (Parameter::expert) are complete for the tokens of their whole ep group and must be
// summed over ctx.expert_dp only.
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../conversions.hpp"
#include "../mlp.hpp"
#include "experts.hpp"
#include "router.hpp"
#include "token_dispatcher.hpp"

STRATA_NAMESPACE_BEGIN

struct moe_alltoall {};
struct moe_allgather {};
struct moe_configured {};  // the dispatcher MoeMlpConfig::dispatcher names, chosen at construction

namespace detail {
template <class Policy, class Dispatch>
struct moe_dispatcher {
  static_assert(!std::is_same_v<Dispatch, Dispatch>,
                "MoeMlp: the Dispatch argument must be strata::moe_alltoall, strata::moe_allgather or strata::moe_configured.");
};
template <class Policy>
struct moe_dispatcher<Policy, moe_alltoall> {
  using type = AllToAllDispatcher<Policy>;
};
template <class Policy>
struct moe_dispatcher<Policy, moe_allgather> {
  using type = AllGatherDispatcher<Policy>;
};
template <class Policy>
struct moe_dispatcher<Policy, moe_configured> {
  using type = ConfiguredDispatcher<Policy>;
};
}  // namespace detail

struct MoeMlpConfig {
  index_t hidden_size = 0;
  index_t num_experts = 0;
  index_t topk = 1;
  index_t expert_ffn_hidden_size = 0;
  index_t shared_expert_ffn_hidden_size = 0;  // 0: no shared experts
  MoeDispatcherType dispatcher = MoeDispatcherType::alltoall;  // read with the moe_configured tag only
  RouterConfig router{};                      // hidden_size, num_experts and topk are taken from above
  // The experts' and shared experts' activation (MlpConfig's meaning): preset is Activation itself;
  // a gated Activation (swiglu) also runs quick_geglu, each with gpt-oss's clamp and linear offset.
  MlpActivation activation = MlpActivation::preset;
  double glu_clamp = 0.0;
  double glu_linear_offset = 0.0;
  bool bias = false;  // Megatron's add_bias_linear: the router's logits, each expert's fc1 / fc2, the shared experts
  bool shared_expert_gate = false;  // the shared experts' output times sigmoid(x . w) (Qwen2-MoE; needs shared experts)
  std::optional<MlpConfig> dense;             // set: a dense layer (an Mlp of this config); the rest is not read
};

// A MoeMlpConfig and a list the MoeMlp adds its router's address to when it is built: how a model
// reaches the router of every layer (the loss scale, the aux and z losses, the expert bias) through
// TransformerLayer, which builds the MLP from one config argument. The MoeMlp must then stay where
// it was built (a model reserves its layers and is not copied or moved).
template <class Policy>
struct MoeMlpConfigWithRouters {
  MoeMlpConfig config;
  std::vector<TopKRouter<Policy>*>* routers = nullptr;
};

template <class Policy, class Act = gelu, class Dispatch = moe_alltoall>
class MoeMlp {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  template <class L>
  using Edge = Activation<T, L, Space>;
  using Layout = residual_layout_t<Policy>;
  using Dispatcher = typename detail::moe_dispatcher<Policy, Dispatch>::type;
  static constexpr bool sequence_parallel = Policy::sequence_parallel;
  // The shared experts and a dense layer's MLP: Act unless MoeMlpConfig::activation (or the dense
  // MlpConfig) names another at run time.
  using DenseMlp = Mlp<Policy, configured_activation<Act>>;

  struct Saved {
    typename TopKRouter<Policy>::Saved router;
    typename Dispatcher::State dispatch;
    typename GroupedExperts<Policy, Act>::Saved experts;
    typename DenseMlp::Saved shared;
    Tensor<T, Space> shared_input, shared_output, gate_logits;  // with the shared experts' gate
    typename DenseMlp::Saved dense;  // a dense layer's MLP
    Shape local_shape{};  // this rank's tokens [s, b, hidden]
    // set_recompute_block: the block's input alone (everything above is empty), the rest made again
    // by the backward
    std::optional<Edge<Layout>> recompute_input;
    std::uint64_t router_forward_count = 0;  // the router's forward count at this forward (forced balance)
  };

  MoeMlp(const Context& ctx, std::string name, MoeMlpConfig c) : config_(c) {
    if (c.dense) {
      dense_.emplace(ctx, name, *c.dense);
      return;
    }
    router_.emplace(ctx, name + ".router", router_config(c));
    dispatcher_.emplace(ctx, DispatcherConfig{c.hidden_size, c.num_experts, c.topk, c.dispatcher});
    experts_.emplace(ctx, name + ".experts",
                     ExpertsConfig{c.hidden_size, c.expert_ffn_hidden_size, c.num_experts, experts_glu(c), c.bias});
    if (c.shared_expert_ffn_hidden_size > 0)
      shared_.emplace(ctx, name + ".shared_experts",
                      MlpConfig{c.hidden_size, c.shared_expert_ffn_hidden_size, c.bias, c.activation, c.glu_clamp,
                                c.glu_linear_offset});
    if (c.shared_expert_gate) {
      if (!shared_)
        fail<ConfigError>("MoeMlp ", name, ": the shared experts' gate (--moe-shared-expert-gate) needs shared experts "
                          "(--moe-shared-expert-intermediate-size)");
      shared_gate_.emplace(name + ".shared_experts.gate_weight", Shape{1, c.hidden_size}, ShardSpec::replicated());
    }
  }
  MoeMlp(const Context& ctx, std::string name, const MoeMlpConfigWithRouters<Policy>& c) : MoeMlp(ctx, std::move(name), c.config) {
    if (c.routers != nullptr && router_) c.routers->push_back(&*router_);
  }

  // Whether this layer routes its tokens to experts (false: a dense layer, MoeMlpConfig::dense).
  bool is_moe() const { return router_.has_value(); }

  std::pair<Edge<Layout>, Saved> forward(Context& ctx, const Edge<Layout>& x) const {
    if (!recompute_block_ || dense_) return forward_block(ctx, x);
    Saved kept;
    kept.recompute_input = x;
    kept.router_forward_count = router_->forward_count();
    auto out = forward_block(ctx, x);
    return {std::move(out.first), std::move(kept)};
  }

  // Selective recompute of the whole MoE block (Megatron's --recompute-modules moe): the forward keeps
  // its input alone; the backward runs the block's forward again (router, dispatch and its exchanges,
  // experts, combine, shared experts) and then its backward. The router's second record of its aux and
  // z losses and expert-bias load is put back after, so they count once, and under forced balance the
  // second run draws the first's random logits (the router's forward count is set back to the
  // first's): the same bits as keeping everything (deterministic kernels, the same input; FP8 casts
  // within the step keep their scales). A dense layer keeps what it keeps.
  void set_recompute_block(bool on) { recompute_block_ = on; }

  // `deferred` (a split backward) is accepted for TransformerLayer's interface; the expert and
  // router weight gradients are taken at once, the shared experts' are deferred.
  Edge<Layout> backward(Context& ctx, const Saved& saved, const Edge<Layout>& dy, DeferredWeightGradients* deferred = nullptr) {
    if (saved.recompute_input) {
      const auto statistics = router_->statistics();
      const std::uint64_t count = router_->forward_count();
      router_->set_forward_count(saved.router_forward_count);
      const Saved again = forward_block(ctx, *saved.recompute_input).second;
      router_->set_forward_count(count);
      router_->restore(ctx, statistics);
      return backward_block(ctx, again, dy, deferred);
    }
    return backward_block(ctx, saved, dy, deferred);
  }

 private:
  std::pair<Edge<Layout>, Saved> forward_block(Context& ctx, const Edge<Layout>& x) const {
    Saved saved;
    if (dense_) {
      auto [y, dense_saved] = dense_->forward(ctx, x);
      saved.dense = std::move(dense_saved);
      return {std::move(y), std::move(saved)};
    }
    Tensor<T, Space> local = local_tokens(ctx, x);  // [s_local, b, hidden]
    saved.local_shape = local.shape();
    const index_t h = config_.hidden_size, tokens = local.numel() / h, sequences = local.rank() >= 3 ? local.size(1) : 1;
    const Tensor<T, Space> flat = local.reshaped(Shape{tokens, h});
    auto [routing, router_saved] = router_->forward(ctx, flat, sequences);
    saved.router = std::move(router_saved);
    // The shared experts depend on x alone: the dispatcher enqueues them while it waits for the
    // counts on the host (its `beside`), and their output is added after the combine as before.
    Tensor<T, Space> shared_out;
    const auto shared_forward = [&] {
      if (!shared_) return;
      auto [s, shared_saved] = shared_->forward(ctx, x);
      saved.shared = std::move(shared_saved);
      if (shared_gate_) {  // s times sigmoid(x . w), row by row
        const index_t rows = x.tensor.numel() / h;
        saved.gate_logits = Tensor<T, Space>::empty(Shape{rows});
        ctx.device.template gemm<T>(false, true, rows, 1, h, x.data(), shared_gate_->value.data(), saved.gate_logits.data(),
                                    false);
        shared_out = Tensor<T, Space>::empty(s.tensor.shape());
        ctx.device.template sigmoid_gate_forward<T>(s.data(), saved.gate_logits.data(), rows, h, shared_out.data());
        saved.shared_input = x.tensor;
        saved.shared_output = std::move(s.tensor);
      } else {
        shared_out = std::move(s.tensor);
      }
    };
    // padded to capacity over several ranks: the received rows compacted where the experts take
    // device counts (no padding row computed, no wait); experts that need the counts on the host get
    // them from the dispatch, read beside its permutation and the shared experts
    auto [dispatched, state] = dispatcher_->dispatch(ctx, flat, routing.routed, routing.weights, routing.capacity,
                                                     experts_->takes_device_counts(ctx), shared_forward);
    auto [expert_out, experts_saved] = experts_->forward(ctx, dispatched.tokens, dispatched.counts, dispatched.host_counts);
    saved.experts = std::move(experts_saved);
    Tensor<T, Space> y = dispatcher_->combine(ctx, state, expert_out).reshaped(saved.local_shape);
    saved.dispatch = std::move(state);
    Edge<Layout> out = to_residual(ctx, std::move(y));
    if (shared_) ctx.device.template add<T>(out.data(), shared_out.data(), out.tensor.numel(), out.data());
    return {std::move(out), std::move(saved)};
  }

  Edge<Layout> backward_block(Context& ctx, const Saved& saved, const Edge<Layout>& dy, DeferredWeightGradients* deferred) {
    if (dense_) return dense_->backward(ctx, saved.dense, dy, deferred);
    const index_t h = config_.hidden_size, tokens = saved.local_shape.numel() / h;
    const Tensor<T, Space> dy_flat = local_gradient(ctx, dy).reshaped(Shape{tokens, h});
    auto [d_output, dweights] = dispatcher_->combine_backward(ctx, saved.dispatch, dy_flat);
    const Tensor<T, Space> d_input = experts_->backward(ctx, saved.experts, d_output);
    Tensor<T, Space> dx = dispatcher_->dispatch_backward(ctx, saved.dispatch, d_input);
    const Tensor<T, Space> d_router = router_->backward(ctx, saved.router, dweights);
    ctx.device.template add<T>(dx.data(), d_router.data(), dx.numel(), dx.data());
    Edge<Layout> out = input_gradient(ctx, dx.reshaped(saved.local_shape));
    if (shared_) {
      Edge<Layout> d_shared = dy;
      if (shared_gate_) {  // through the gate: d s = g dy; d logit = g (1 - g) (dy . s); then dw and dx
        const index_t rows = dy.tensor.numel() / h;
        auto ds = Tensor<T, Space>::empty(dy.tensor.shape());
        auto dlogits = Tensor<T, Space>::empty(Shape{rows});
        ctx.device.template sigmoid_gate_backward<T>(dy.data(), saved.shared_output.data(), saved.gate_logits.data(), rows,
                                                     h, ds.data(), dlogits.data());
        auto increment = Tensor<A, Space>::empty(shared_gate_->grad.shape());
        ctx.device.template gemm<T, A>(true, false, 1, h, rows, dlogits.data(), saved.shared_input.data(), increment.data(),
                                       false);
        add_replicated_gradient<Layout>(ctx.device, ctx.tp, shared_gate_->grad, increment);
        ctx.device.template gemm<T>(false, false, rows, h, 1, dlogits.data(), shared_gate_->value.data(), out.data(), true);
        d_shared = Edge<Layout>(std::move(ds));
      }
      auto dshared = shared_->backward(ctx, saved.shared, d_shared, deferred);
      ctx.device.template add<T>(out.data(), dshared.data(), out.tensor.numel(), out.data());
    }
    return out;
  }

 public:
  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    if (dense_) dense_->init(ctx, seed, stddev, output_stddev);
    if (router_) router_->init(ctx, seed, stddev);
    if (experts_) experts_->init(ctx, seed, stddev, output_stddev);
    if (shared_) shared_->init(ctx, seed, stddev, output_stddev);
    if (shared_gate_) init_normal(ctx.device, *shared_gate_, seed, stddev);  // Megatron's init_method
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    if (dense_) dense_->for_each_parameter(visit);
    if (router_) router_->for_each_parameter(visit);
    if (experts_) experts_->for_each_parameter(visit);
    if (shared_) shared_->for_each_parameter(visit);
    if (shared_gate_) visit(*shared_gate_);
  }

  // Selective recompute of the routed experts' activation function (GroupedExperts::
  // set_recompute_activation; Megatron's moe_act). A dense layer has no experts: nothing changes.
  void set_recompute_activation(bool on) {
    if (experts_) experts_->set_recompute_activation(on);
  }

  // The router of a MoE layer (is_moe()).
  TopKRouter<Policy>& router() { return *router_; }
  const TopKRouter<Policy>& router() const { return *router_; }

 private:
  // The routed experts' gated activation: SwiGLU unless MoeMlpConfig::activation says quick_geglu
  // (Act swiglu), with the clamp and offset; experts of another Act take none of them.
  static GluActivation experts_glu(const MoeMlpConfig& c) {
    constexpr bool gated = std::is_same_v<Act, swiglu>;
    const bool other = c.activation != MlpActivation::preset && c.activation != MlpActivation::swiglu &&
                       c.activation != MlpActivation::quick_geglu;
    if ((gated && other) || (!gated && c.activation != MlpActivation::preset && c.activation != MlpActivation::gelu) ||
        (!gated && (c.glu_clamp != 0 || c.glu_linear_offset != 0)))
      fail<ConfigError>("MoeMlp: the experts are built for ", gated ? "a gated activation (swiglu)" : "gelu",
                        " and cannot run ", mlp_activation_name(c.activation),
                        c.glu_clamp != 0 || c.glu_linear_offset != 0 ? " with a clamp or linear offset" : "",
                        "; the routed experts run SwiGLU or quick GeGLU (with --activation-func-clamp-value and "
                        "--glu-linear-offset)");
    if (!gated) return GluActivation{};
    return GluActivation{c.activation == MlpActivation::quick_geglu ? GluKind::quick_gelu : GluKind::silu, c.glu_clamp,
                         c.glu_linear_offset};
  }

  static RouterConfig router_config(const MoeMlpConfig& c) {
    RouterConfig r = c.router;
    r.hidden_size = c.hidden_size;
    r.num_experts = c.num_experts;
    r.topk = c.topk;
    r.bias = c.bias;
    return r;
  }

  // This rank's tokens: the sequence shard under SP; else the rank's 1/tp of the sequence.
  static Tensor<T, Space> local_tokens(Context& ctx, const Edge<Layout>& x) {
    if constexpr (sequence_parallel) return x.tensor;
    else if (ctx.tp.size() == 1) return x.tensor;
    else return scatter_to_sequence_parallel(ctx.device, ctx.tp, x).tensor;
  }
  static Edge<Layout> to_residual(Context& ctx, Tensor<T, Space> y) {
    if constexpr (sequence_parallel) return Edge<Layout>(std::move(y));
    else if (ctx.tp.size() == 1) return Edge<Layout>(std::move(y));
    else return gather_from_sequence_parallel(ctx.device, ctx.tp, Edge<layout::sharded<0>>(std::move(y)));
  }
  static Tensor<T, Space> local_gradient(Context& ctx, const Edge<Layout>& dy) {
    if constexpr (sequence_parallel) return dy.tensor;
    else if (ctx.tp.size() == 1) return dy.tensor;
    else return gather_from_sequence_parallel_backward(ctx.device, ctx.tp, dy).tensor;
  }
  static Edge<Layout> input_gradient(Context& ctx, Tensor<T, Space> dx) {
    if constexpr (sequence_parallel) return Edge<Layout>(std::move(dx));
    else if (ctx.tp.size() == 1) return Edge<Layout>(std::move(dx));
    else return scatter_to_sequence_parallel_backward(ctx.device, ctx.tp, Edge<layout::sharded<0>>(std::move(dx)));
  }

  MoeMlpConfig config_;
  std::optional<TopKRouter<Policy>> router_;  // these three: a MoE layer
  std::optional<Dispatcher> dispatcher_;
  std::optional<GroupedExperts<Policy, Act>> experts_;
  std::optional<DenseMlp> shared_;
  bool recompute_block_ = false;  // set_recompute_block
  std::optional<Parameter<T, Space>> shared_gate_;  // [1, hidden], replicated (MoeMlpConfig::shared_expert_gate)
  std::optional<DenseMlp> dense_;  // a dense layer
};

// True for the MoeMlp types (a model that must reach its routers).
template <class Block>
inline constexpr bool is_moe_mlp_v = false;
template <class Policy, class Act, class Dispatch>
inline constexpr bool is_moe_mlp_v<MoeMlp<Policy, Act, Dispatch>> = true;

STRATA_NAMESPACE_END
