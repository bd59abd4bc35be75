// strata/layers/transformer_layer.hpp: `TransformerLayer<Policy, Norm, Attention, Mlp>`, a pre-norm
// block on the residual stream (replicated, or sharded<0> under sequence parallelism):
//
//   h = x + dropout(attention(norm1(x)));   y = h + dropout(mlp(norm2(h)))
//
// The first residual add runs inside norm2 (forward_add), the second (without hidden dropout) in the
// epilogue of the MLP's last GEMM where the backend fuses it (on one tensor-parallel rank; Mlp::
// forward with a residual), and the backward hands each norm the residual branch's gradient to add
// into its own (one pass over the activations each). Under FP8's delayed recipe, where the block
// after a norm takes its first linear layer's input as FP8 codes (SelfAttention's qkv, Mlp's fc1:
// their fp8_input_state), the norm writes those codes instead of its output in T
// (forward_codes; Fp8Options::norm_writes_codes).
//
// Dropout keys, all from the forward's dropout_key (distinct per layer and micro-batch): the
// attention block's output rng::mix(key, 1), the MLP's output rng::mix(key, 2) (hidden dropout),
// the attention probabilities rng::mix(key, 3) (the attention block's own dropout, a training
// forward only: ForwardMode::evaluation runs without any dropout, as Megatron evaluates).
//
// Norm is a template (strata::LayerNorm or strata::RmsNorm); Attention and Mlp are complete types
// (e.g. SelfAttention<Policy, rope, gqa>, Mlp<Policy, swiglu>) whose layouts must agree with the
// residual stream, checked at compile time.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/rng.hpp"
#include "deferred_weight_gradients.hpp"
#include "dropout.hpp"
#include "fp8_linear.hpp"
#include "norm.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

// What a forward is for. training: the attention block draws its dropout (its Saved feeds a
// backward or a recompute, which draw the same mask). evaluation (validation loss, inference): the
// layer runs without dropout (attention and hidden), as Megatron's model.eval().
enum class ForwardMode { training, evaluation };

struct TransformerLayerConfig {
  index_t hidden_size = 0;
  double norm_epsilon = 1e-5;
  double hidden_dropout = 0.0;
  bool zero_centered_norm = false;  // --apply-layernorm-1p: the norms store gamma - 1 (layers/norm.hpp)
};

namespace detail {
// A block whose last layer's bias gradient its caller may take (backward with output_bias_gradient
// = false, output_bias()), and a norm whose backward adds the column sums of its residual gradient
// (LayerNorm::backward's dresidual_sums). Namespace-scope concepts: nvcc evaluates a requires-
// expression naming a function parameter inside a function body as false.
template <class Block, class Context, class Saved, class Act>
concept output_bias_left_to_caller = requires(Block& block, Context& ctx, const Saved& saved, const Act& dy) {
  { block.output_bias() };
  block.backward(ctx, saved, dy, static_cast<DeferredWeightGradients*>(nullptr), false);
};
template <class N, class Context, class Saved, class Act>
concept norm_sums_residual_gradient = requires(N& norm, Context& ctx, const Saved& saved, const Act& dy,
                                               accumulate_t<typename Act::element_type>* sums) {
  norm.backward(ctx, saved, dy, &dy, sums);
};
// Blocks whose first linear layer a norm can hand its input as FP8 codes (fp8_input_state,
// fp8_input_of, forward with the codes: SelfAttention, Mlp), and a norm that writes them.
template <class Block, class Context, class Act, class Space>
concept attention_takes_fp8_input = requires(const Block& block, Context& ctx, const Act& x, Fp8Pair<Space>* given) {
  { block.fp8_input_state(ctx) } -> std::convertible_to<Fp8State<Space>*>;
  block.forward(ctx, x, std::optional<std::uint64_t>{}, given);
};
template <class Block, class Context, class Act, class Space>
concept mlp_takes_fp8_input = requires(const Block& block, Context& ctx, const Act& x, Fp8Pair<Space>* given) {
  { block.fp8_input_state(ctx) } -> std::convertible_to<Fp8State<Space>*>;
  block.forward(ctx, x, &x, given);
};
template <class N, class Context, class Act>
concept norm_writes_codes = requires(const N& norm, Context& ctx, Act& x, const Act& residual, const Fp8Output& out) {
  norm.forward_codes(ctx, x, out);
  norm.forward_add_codes(ctx, x, residual, out);
};
// A norm that can leave the reduction of its parameter gradients to its caller (backward_partial,
// partial_size; the increments in for_each_parameter's order).
template <class N, class Context, class Saved, class Act>
concept norm_writes_partials = requires(N& norm, Context& ctx, const Saved& saved, const Act& dy,
                                        accumulate_t<typename Act::element_type>* partials) {
  { norm.partial_size() } -> std::convertible_to<index_t>;
  norm.backward_partial(ctx, saved, dy, &dy, partials);
};
}  // namespace detail

template <class Policy, template <class> class Norm, class Attention, class MlpBlock>
class TransformerLayer {
 public:
  using T = typename Policy::element;
  using Context = context_t<Policy>;
  using Layout = residual_layout_t<Policy>;
  using Space = space_t<Policy>;
  using Act = Activation<T, Layout, Space>;
  static_assert(is_norm_v<Norm>,
                "TransformerLayer: the Norm argument must be strata::LayerNorm or strata::RmsNorm (or a norm "
                "declared with strata::is_norm_v).");
  static_assert(std::is_same_v<typename Attention::Layout, Layout> && std::is_same_v<typename MlpBlock::Layout, Layout>,
                "TransformerLayer: the attention and MLP blocks must be built with the layer's Policy (their "
                "residual-stream layouts differ: one is sequence parallel and the other is not).");

  struct Saved {
    typename Norm<Policy>::Saved norm1, norm2;
    typename Attention::Saved attention;
    typename MlpBlock::Saved mlp;
    std::uint64_t dropout_key = 0;  // the masks are recomputed from it
    double hidden_dropout = 0.0;    // the probability the forward used (0 in evaluation)
  };

  template <class AttentionConfig, class MlpConfig>
  TransformerLayer(Context& ctx, std::string name, TransformerLayerConfig c, AttentionConfig ac, MlpConfig mc)
      : config_(c),
        norm1_(ctx, name + ".norm1", c.hidden_size, c.norm_epsilon, c.zero_centered_norm),
        attention_(ctx, name + ".attention", ac),
        norm2_(ctx, name + ".norm2", c.hidden_size, c.norm_epsilon, c.zero_centered_norm),
        mlp_(ctx, name + ".mlp", mc) {}

  // Plans what a [s, b] input needs in advance (the attention's plans; see SelfAttention::prepare).
  void prepare(Context& ctx, index_t s, index_t b, bool backward) const { attention_.prepare(ctx, s, b, backward); }

  // dropout_key: distinct per layer and micro-batch when hidden or attention dropout is on.
  std::pair<Act, Saved> forward(Context& ctx, const Act& x, std::uint64_t dropout_key = 0,
                                ForwardMode mode = ForwardMode::training) const {
    Saved saved;
    saved.dropout_key = dropout_key;
    // a is ours: dropout and the residual add go in place
    auto [a, at] = attention_of_norm(ctx, x, saved.norm1, mode == ForwardMode::training, dropout_key);
    const double hidden_dropout = mode == ForwardMode::training ? config_.hidden_dropout : 0.0;
    saved.hidden_dropout = hidden_dropout;
    dropout_forward(ctx, a, hidden_dropout, rng::mix(dropout_key, 1));
    auto [m, ml] = mlp_of_norm(ctx, a, x, saved.norm2, hidden_dropout, dropout_key);  // a := x + attention; y := a + dropout(mlp)
    saved.attention = std::move(at);
    saved.mlp = std::move(ml);
    return {std::move(m), std::move(saved)};
  }

  // With `deferred`, the linear layers' weight gradients are appended to it (a split backward:
  // DeferredWeightGradients); the norms' gradients are taken now. Without, with ctx.tp_comm_overlap
  // over more than one tensor-parallel rank, the linear layers chain their weight gradients through an
  // `at_collectives` list so that each collective of the backward but the first runs beside the
  // previous layer's weight gradients (the first, the row layer's all-gather of dy, is a ring beside
  // the input gradients of its arrived blocks); what is left runs before this returns, so every gradient of
  // the layer is complete when it does (a data-parallel hook may read them).
  Act backward(Context& ctx, const Saved& saved, const Act& dy, DeferredWeightGradients* deferred = nullptr) {
    if (deferred == nullptr && ctx.tp.size() > 1 && ctx.tp_comm_overlap) {
      DeferredWeightGradients chain(DeferredWeightGradients::mode::at_collectives);
      Act dx = backward_with(ctx, saved, dy, &chain);
      chain.run();
      return dx;
    }
    return backward_with(ctx, saved, dy, deferred);
  }

  // Selective recompute of the attention core (SelfAttention::set_recompute_core).
  void set_recompute_attention_core(bool on) {
    static_assert(requires { attention_.set_recompute_core(on); },
                  "TransformerLayer: selective recompute needs an attention block with set_recompute_core(bool).");
    attention_.set_recompute_core(on);
  }
  // Selective recompute of a MoE block's expert activation (MoeMlp::set_recompute_activation); a
  // dense MLP keeps what it keeps.
  void set_recompute_moe_activation(bool on) {
    if constexpr (requires { mlp_.set_recompute_activation(on); }) mlp_.set_recompute_activation(on);
  }
  // Selective recompute of a whole MoE block (MoeMlp::set_recompute_block); a dense MLP keeps what it keeps.
  void set_recompute_moe_block(bool on) {
    if constexpr (requires { mlp_.set_recompute_block(on); }) mlp_.set_recompute_block(on);
  }

 private:
  Act backward_with(Context& ctx, const Saved& saved, const Act& dy, DeferredWeightGradients* deferred) {
    const bool dropout = saved.hidden_dropout > 0;
    if constexpr (residual_sums_fused) {
      // The output gradient of the MLP's fc2 is dy, and that of the attention's projection is dh: the
      // residual gradients norm2 and norm1 read. Their bias gradients (the column sums) are added by
      // those norms as they read them, instead of by a pass of their own over dy and dh; only where
      // the sums over this rank's rows are the whole gradient and no dropout lies between.
      if (!dropout && replicated_gradient_is_local<Layout>(ctx.tp)) {
        A* fc2_bias = bias_gradient_of(ctx, mlp_.output_bias());
        auto dh = norm2_.backward(ctx, saved.norm2, mlp_.backward(ctx, saved.mlp, dy, deferred, fc2_bias == nullptr), &dy,
                                  fc2_bias);
        A* proj_bias = bias_gradient_of(ctx, attention_.output_bias());
        return norm1_.backward(ctx, saved.norm1,
                               attention_.backward(ctx, saved.attention, dh, deferred, proj_bias == nullptr), &dh, proj_bias);
      }
    }
    if constexpr (detail::norm_writes_partials<Norm<Policy>, Context, typename Norm<Policy>::Saved, Act>)
      if (!replicated_gradient_is_local<Layout>(ctx.tp)) return backward_sequence_parallel(ctx, saved, dy, deferred);
    // dropout_backward works in place: on a copy, never on the tensor we were given
    Act dm = dropout ? Act(dy.tensor.clone()) : dy;
    dropout_backward(ctx, dm, saved.hidden_dropout, rng::mix(saved.dropout_key, 2));
    auto dh = norm2_.backward(ctx, saved.norm2, mlp_.backward(ctx, saved.mlp, dm, deferred), &dy);  // dy + d(norm2 path)
    Act da = dropout ? Act(dh.tensor.clone()) : dh;
    dropout_backward(ctx, da, saved.hidden_dropout, rng::mix(saved.dropout_key, 1));
    return norm1_.backward(ctx, saved.norm1, attention_.backward(ctx, saved.attention, da, deferred), &dh);  // dh + d(norm1 path)
  }

  // Under sequence parallelism over tp > 1 each rank's norms see only its rows, so their parameter
  // gradients are summed over tp: both norms write their increments into one buffer, reduced in one
  // all-reduce at the end of the layer (one collective per layer instead of one per norm parameter).
  Act backward_sequence_parallel(Context& ctx, const Saved& saved, const Act& dy, DeferredWeightGradients* deferred) {
    const bool dropout = saved.hidden_dropout > 0;
    const index_t first = norm2_.partial_size();
    auto partials = Tensor<A, Space>::empty(Shape{first + norm1_.partial_size()});
    Act dm = dropout ? Act(dy.tensor.clone()) : dy;
    dropout_backward(ctx, dm, saved.hidden_dropout, rng::mix(saved.dropout_key, 2));
    auto dh = norm2_.backward_partial(ctx, saved.norm2, mlp_.backward(ctx, saved.mlp, dm, deferred), &dy, partials.data());
    Act da = dropout ? Act(dh.tensor.clone()) : dh;
    dropout_backward(ctx, da, saved.hidden_dropout, rng::mix(saved.dropout_key, 1));
    auto dx = norm1_.backward_partial(ctx, saved.norm1, attention_.backward(ctx, saved.attention, da, deferred), &dh,
                                      partials.data() + first);
    std::vector<Parameter<T, Space>*> params;
    norm2_.for_each_parameter([&](Parameter<T, Space>& p) { params.push_back(&p); });
    norm1_.for_each_parameter([&](Parameter<T, Space>& p) { params.push_back(&p); });
    add_replicated_gradients<Layout>(ctx.device, ctx.tp, partials, std::span<Parameter<T, Space>* const>(params));
    return dx;
  }

 public:
  using A = accumulate_t<T>;
  // Whether the blocks let the norms take fc2's and the projection's bias gradients (backward_with).
  static constexpr bool residual_sums_fused =
      detail::output_bias_left_to_caller<MlpBlock, Context, typename MlpBlock::Saved, Act> &&
      detail::output_bias_left_to_caller<Attention, Context, typename Attention::Saved, Act> &&
      detail::norm_sums_residual_gradient<Norm<Policy>, Context, typename Norm<Policy>::Saved, Act>;
 private:
  // The gradient a norm adds a bias gradient into (a stale one made zero first), or null without a bias.
  static A* bias_gradient_of(Context& ctx, Parameter<T, Space>* bias) {
    if (!bias) return nullptr;
    settle_gradient(ctx.device, *bias);
    return bias->grad.data();
  }

 public:
  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    attention_.init(ctx, seed, stddev, output_stddev);
    mlp_.init(ctx, seed, stddev, output_stddev);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    norm1_.for_each_parameter(visit);
    attention_.for_each_parameter(visit);
    norm2_.for_each_parameter(visit);
    mlp_.for_each_parameter(visit);
  }

 private:
  // The FP8 state for which a norm before `block` writes the block's input codes (the block's
  // fp8_input_state: its first linear layer runs FP8 under the delayed recipe), or null: then the
  // norm writes its output in T and the linear layer casts it.
  template <class Block>
  static Fp8State<Space>* codes_target(const Block& block, const Context& ctx) {
    if constexpr (detail::norm_writes_codes<Norm<Policy>, Context, Act> &&
                  detail::norms_write_fp8<typename Context::device_type, T>)
      return block.fp8_input_state(ctx);
    else
      return nullptr;
  }

  // attention(norm1(x)), norm1's Saved into n1; norm1 writes the qkv projection's input codes where
  // the attention takes them (codes_target), else its output in T.
  auto attention_of_norm(Context& ctx, const Act& x, typename Norm<Policy>::Saved& n1, bool training,
                         std::uint64_t dropout_key) const {
    if constexpr (detail::attention_takes_fp8_input<Attention, Context, Act, Space>) {
      if (codes_target(attention_, ctx)) {
        auto given = attention_.fp8_input_of(ctx, x.shape(), [&](const Fp8Output& out) { n1 = norm1_.forward_codes(ctx, x, out); });
        return training ? attention_.forward(ctx, x, rng::mix(dropout_key, 3), &given)
                        : attention_.forward(ctx, x, std::nullopt, &given);
      }
    }
    auto [h1, saved] = norm1_.forward(ctx, x);
    n1 = std::move(saved);
    return training ? attention_.forward(ctx, h1, rng::mix(dropout_key, 3)) : attention_.forward(ctx, h1);
  }

  // a := a + x, then a + dropout(mlp(norm2(a))), norm2's Saved into n2 (the add inside norm2's pass);
  // norm2 writes fc1's input codes where the MLP takes them (codes_target), else its output in T.
  auto mlp_of_norm(Context& ctx, Act& a, const Act& x, typename Norm<Policy>::Saved& n2, double hidden_dropout,
                   std::uint64_t dropout_key) const {
    if constexpr (detail::mlp_takes_fp8_input<MlpBlock, Context, Act, Space>) {
      if (codes_target(mlp_, ctx)) {
        auto given = mlp_.fp8_input_of(ctx, a.shape(), [&](const Fp8Output& out) { n2 = norm2_.forward_add_codes(ctx, a, x, out); });
        if (hidden_dropout == 0) return mlp_.forward(ctx, a, &a, &given);
        auto out = mlp_.forward(ctx, a, nullptr, &given);
        dropout_forward(ctx, out.first, hidden_dropout, rng::mix(dropout_key, 2));
        add_into(ctx, out.first, a);
        return out;
      }
    }
    auto [h2, saved] = norm2_.forward_add(ctx, a, x);
    n2 = std::move(saved);
    return mlp_residual(ctx, h2, a, hidden_dropout, dropout_key);
  }

  // h + dropout(mlp(h2)): without dropout, the add runs in the epilogue of the MLP's last GEMM where
  // the block takes a residual (Mlp::forward), else after the dropout.
  auto mlp_residual(Context& ctx, const Act& h2, const Act& h, double hidden_dropout, std::uint64_t dropout_key) const {
    if constexpr (requires { mlp_.forward(ctx, h2, &h); })
      if (hidden_dropout == 0) return mlp_.forward(ctx, h2, &h);
    auto out = mlp_.forward(ctx, h2);
    dropout_forward(ctx, out.first, hidden_dropout, rng::mix(dropout_key, 2));
    add_into(ctx, out.first, h);
    return out;
  }

  // acc += other (acc is the caller's own tensor)
  static void add_into(Context& ctx, Act& acc, const Act& other) {
    check_same_shape(acc.shape(), other.shape(), "TransformerLayer residual");
    ctx.device.template add<T>(acc.data(), other.data(), acc.tensor.numel(), acc.data());
  }

  TransformerLayerConfig config_;
  Norm<Policy> norm1_;
  Attention attention_;
  Norm<Policy> norm2_;
  MlpBlock mlp_;
};

STRATA_NAMESPACE_END
