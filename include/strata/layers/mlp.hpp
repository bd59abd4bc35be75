// strata/layers/mlp.hpp: `Mlp<Policy, Activation>`, the feed-forward block: column-parallel fc1,
// an element-wise activation on the sharded hidden features, row-parallel fc2.
//
//   gelu:         fc1 hidden -> ffn,            y = fc2(gelu_tanh(fc1 x))    (GPT-2; fc1 and the GELU
//                 are one backend gemm_gelu, fc2's dX and the GELU backward one gemm_gelu_backward;
//                 under FP8's delayed recipe the GELU and its backward run inside the FP8 casts of
//                 fc2's input and fc1's output gradient instead)
//   squared_relu: fc1 hidden -> ffn,            y = fc2(max(fc1 x, 0)^2)     (Nemotron, --squared-relu)
//   swiglu:       fc1 hidden -> [gate; up] 2ffn, y = fc2(silu(gate) * up)    (Llama; under FP8's delayed
//                 recipe inside the casts as GELU is, without a clamp or offset)
//   quick_geglu:  fc1 hidden -> [gate; up] 2ffn, y = fc2(quick_gelu(gate) * up), quick_gelu(g) =
//                 g sigmoid(1.702 g)                                          (gpt-oss, --quick-geglu)
// The gated ones take MlpConfig::glu_clamp and glu_linear_offset (gpt-oss: 7 and 1;
// backend/activation_options.hpp). For gated activations fc1 is one weight of two stacked blocks,
// each split over tp, so every rank holds the matching slices of gate and up. Input and output: the
// residual stream layout.
//
// The activation is a tag (static, the other branches are not compiled), or
// configured_activation<Default>: the one MlpConfig::activation names, chosen at construction
// (Default where it names MlpActivation::preset). A trainer compiles one model for all of them;
// the run-time choice costs a branch per call of the block, nothing per element.
#pragma once

#include <cmath>
#include <string>
#include <utility>

#include "../backend/activation_options.hpp"
#include "column_parallel_linear.hpp"
#include "row_parallel_linear.hpp"

STRATA_NAMESPACE_BEGIN

struct gelu {};
struct swiglu {};
struct squared_relu {};
struct quick_geglu {};
template <class Default>
struct configured_activation {};  // MlpConfig::activation at run time (Default for MlpActivation::preset)

namespace detail {
template <class Act>
struct mlp_activation_of {
  static_assert(sizeof(Act) == 0,
                "Mlp: the activation must be strata::gelu, strata::swiglu, strata::squared_relu, strata::quick_geglu "
                "or strata::configured_activation<one of them>.");
};
template <> struct mlp_activation_of<gelu> { static constexpr MlpActivation value = MlpActivation::gelu; };
template <> struct mlp_activation_of<swiglu> { static constexpr MlpActivation value = MlpActivation::swiglu; };
template <> struct mlp_activation_of<squared_relu> { static constexpr MlpActivation value = MlpActivation::squared_relu; };
template <> struct mlp_activation_of<quick_geglu> { static constexpr MlpActivation value = MlpActivation::quick_geglu; };
template <class Act> inline constexpr bool is_configured_activation_v = false;
template <class Default> inline constexpr bool is_configured_activation_v<configured_activation<Default>> = true;
}  // namespace detail

struct MlpConfig {
  index_t hidden_size = 0;
  index_t ffn_hidden_size = 0;
  bool bias = true;
  MlpActivation activation = MlpActivation::preset;  // read with configured_activation only
  double glu_clamp = 0.0;          // gated activations: --activation-func-clamp-value (0: none)
  double glu_linear_offset = 0.0;  // gated activations: --glu-linear-offset
};

template <class Policy, class Act = gelu>
class Mlp {
 public:
  using T = typename Policy::element;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  template <class L>
  using Edge = Activation<T, L, Space>;
  using Layout = residual_layout_t<Policy>;
  static constexpr bool configured = detail::is_configured_activation_v<Act>;

  struct Saved {
    typename ColumnParallelLinear<Policy>::Saved fc1;
    typename RowParallelLinear<Policy>::Saved fc2;
    Tensor<T, Space> pre_activation;  // fc1 output, sharded on features
  };

  Mlp(const Context& ctx, std::string name, MlpConfig c)
      : activation_(chosen(c)),
        glu_(glu_of(activation_, c)),
        fc1_(ctx, name + ".fc1", c.hidden_size, (gated() ? 2 : 1) * checked_ffn(c, ctx.tp.size()), c.bias, gated() ? 2 : 1),
        fc2_(ctx, name + ".fc2", c.ffn_hidden_size, c.hidden_size, c.bias) {}

  MlpActivation activation() const { return activation_; }
  // Whether fc1 makes [gate; up] (swiglu, quick_geglu).
  bool gated() const { return activation_ == MlpActivation::swiglu || activation_ == MlpActivation::quick_geglu; }
  // The FP8 state for which a norm before this MLP may write fc1's input codes (see
  // ColumnParallelLinear::fp8_input_state; not where fc1 runs with its GELU), or null; and those
  // codes (fp8_input_of), for forward(ctx, x, residual, &given).
  Fp8State<Space>* fp8_input_state(const Context& ctx) const {
    return activation_ == MlpActivation::gelu && !fuses_activation_casts(ctx) ? nullptr : fc1_.fp8_input_state(ctx);
  }
  template <class Write>
  detail::Fp8Pair<Space> fp8_input_of(Context& ctx, const Shape& x, Write&& write) const {
    return fc1_.fp8_input_of(ctx, x, std::forward<Write>(write));
  }

  // With `residual` (x's layout and shape): returns mlp(x) + residual, the add in fc2's GEMM where it
  // can (RowParallelLinear::forward). With `given`: fc1's input codes (fp8_input_state, fp8_input_of),
  // x for its layout alone.
  std::pair<Edge<Layout>, Saved> forward(Context& ctx, const Edge<Layout>& x, const Edge<Layout>* residual = nullptr,
                                         detail::Fp8Pair<Space>* given = nullptr) const {
    Saved saved;
    if (activation_ == MlpActivation::gelu && fuses_activation_casts(ctx)) {  // the GELU inside fc2's input cast
      auto [pre, fc1_saved] = fc1_.forward(ctx, x, given);  // (s, b, ffn / tp)
      saved.fc1 = std::move(fc1_saved);
      auto [y, fc2_saved] = fc2_.forward_gelu_of(ctx, pre, residual, activation_codes_later(ctx));
      saved.fc2 = std::move(fc2_saved);
      saved.pre_activation = std::move(pre.tensor);
      return {std::move(y), std::move(saved)};
    }
    if (activation_ == MlpActivation::gelu) {  // fc1 and the GELU in one GEMM where the backend fuses them
      if (given) fail<Error>("Mlp: fc1's input codes given where fc1 runs with its GELU (fp8_input_state says no)");
      auto [act, pre, fc1_saved] = fc1_.forward_gelu(ctx, x);  // (s, b, ffn / tp) twice
      saved.fc1 = std::move(fc1_saved);
      saved.pre_activation = std::move(pre);
      auto [y, fc2_saved] = fc2_.forward(ctx, act, residual);
      saved.fc2 = std::move(fc2_saved);
      return {std::move(y), std::move(saved)};
    }
    auto [h, fc1_saved] = fc1_.forward(ctx, x, given);  // (s, b, 2 ffn / tp) gated, else (s, b, ffn / tp)
    saved.fc1 = std::move(fc1_saved);
    if (plain_swiglu() && fuses_activation_casts(ctx)) {  // SwiGLU inside fc2's input cast
      auto [y, fc2_saved] = fc2_.forward_swiglu_of(ctx, h, residual, activation_codes_later(ctx));
      saved.fc2 = std::move(fc2_saved);
      saved.pre_activation = std::move(h.tensor);
      return {std::move(y), std::move(saved)};
    }
    const index_t rows = h.shape().rows(), width = h.shape().cols(), ffn_local = gated() ? width / 2 : width;
    Edge<layout::sharded<-1>> act(Tensor<T, Space>::empty(h.shape().with(-1, ffn_local)));
    if (activation_ == MlpActivation::squared_relu)
      ctx.device.template squared_relu_forward<T>(h.data(), rows * width, act.data());
    else if (plain_swiglu())
      ctx.device.template swiglu_forward<T>(h.data(), rows, ffn_local, act.data());
    else
      ctx.device.template glu_forward<T>(h.data(), rows, ffn_local, glu_, act.data());
    saved.pre_activation = std::move(h.tensor);
    auto [y, fc2_saved] = fc2_.forward(ctx, act, residual);
    saved.fc2 = std::move(fc2_saved);
    return {std::move(y), std::move(saved)};
  }

  // With `deferred`, fc1's and fc2's weight gradients are appended to it (a split backward). Without
  // `output_bias_gradient`, fc2's bias gradient is left to the caller (RowParallelLinear::backward).
  Edge<Layout> backward(Context& ctx, const Saved& saved, const Edge<Layout>& dy, DeferredWeightGradients* deferred = nullptr,
                        bool output_bias_gradient = true) {
    const Tensor<T, Space>& h = saved.pre_activation;
    const bool fused_gelu = activation_ == MlpActivation::gelu && fuses_activation_casts(ctx);
    if (fused_gelu || (plain_swiglu() && fuses_activation_casts(ctx))) {  // the activation's backward inside fc1's gradient cast
      // Fp8Options::activation_codes_in_backward: that cast also writes fc2's input^T codes, which
      // fc2's forward left for later; fc2's weight gradient waits for them (after fc1's backward).
      auto fc2_saved = saved.fc2;  // handles
      const Fp8Output codes = fc2_.fp8_input_codes_later(fc2_saved);
      DeferredWeightGradients later;
      auto dact = fc2_.backward(ctx, fc2_saved, dy, codes.codes ? &later : deferred, output_bias_gradient);
      auto dx = fused_gelu ? fc1_.backward_gelu_of(ctx, saved.fc1, dact, h, deferred, codes)
                           : fc1_.backward_swiglu_of(ctx, saved.fc1, dact, h, deferred, codes);
      if (deferred) deferred->append(std::move(later));
      else later.run();
      return dx;
    }
    if (activation_ == MlpActivation::gelu) {  // the GELU backward fused into fc2's dX GEMM where the backend can
      return fc1_.backward(ctx, saved.fc1, fc2_.backward_through_gelu(ctx, saved.fc2, dy, h, deferred, output_bias_gradient),
                           deferred);
    }
    auto dact = fc2_.backward(ctx, saved.fc2, dy, deferred, output_bias_gradient);
    Edge<layout::sharded<-1>> dh{Tensor<T, Space>::empty(h.shape())};
    if (activation_ == MlpActivation::squared_relu)
      ctx.device.template squared_relu_backward<T>(dact.data(), h.data(), h.numel(), dh.data());
    else if (plain_swiglu())
      ctx.device.template swiglu_backward<T>(dact.data(), h.data(), h.shape().rows(), h.shape().cols() / 2, dh.data());
    else
      ctx.device.template glu_backward<T>(dact.data(), h.data(), h.shape().rows(), h.shape().cols() / 2, glu_, dh.data());
    return fc1_.backward(ctx, saved.fc1, dh, deferred);
  }

  // fc2's bias (null without one).
  Parameter<T, Space>* output_bias() { return fc2_.bias(); }

  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    fc1_.init(ctx, seed, stddev);
    fc2_.init(ctx, seed, output_stddev);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    fc1_.for_each_parameter(visit);
    fc2_.for_each_parameter(visit);
  }

 private:
  static MlpActivation chosen(const MlpConfig& c) {
    if constexpr (configured) {
      if (c.activation != MlpActivation::preset) return c.activation;
      return detail::mlp_activation_of<typename default_of<Act>::type>::value;
    } else {
      if (c.activation != MlpActivation::preset && c.activation != detail::mlp_activation_of<Act>::value)
        fail<ConfigError>("Mlp: MlpConfig::activation=", mlp_activation_name(c.activation), " but this Mlp is built for ",
                          mlp_activation_name(detail::mlp_activation_of<Act>::value),
                          " (a static tag); use strata::configured_activation<...> to choose it at run time");
      return detail::mlp_activation_of<Act>::value;
    }
  }
  template <class X> struct default_of { using type = X; };
  template <class D> struct default_of<configured_activation<D>> { using type = D; };

  static GluActivation glu_of(MlpActivation a, const MlpConfig& c) {
    const bool gated = a == MlpActivation::swiglu || a == MlpActivation::quick_geglu;
    if (!(c.glu_clamp >= 0 && std::isfinite(c.glu_clamp)))
      fail<ConfigError>("Mlp: glu_clamp=", c.glu_clamp, " must be a finite number >= 0 (0: no clamp; gpt-oss uses 7)");
    if (!std::isfinite(c.glu_linear_offset))
      fail<ConfigError>("Mlp: glu_linear_offset=", c.glu_linear_offset, " must be finite (gpt-oss uses 1)");
    if (!gated && (c.glu_clamp != 0 || c.glu_linear_offset != 0))
      fail<ConfigError>("Mlp: the activation clamp (", c.glu_clamp, ") and the linear offset (", c.glu_linear_offset,
                        ") apply to gated activations (--swiglu, --quick-geglu), not to ", mlp_activation_name(a),
                        "; drop --activation-func-clamp-value / --glu-linear-offset or choose a gated activation");
    return GluActivation{a == MlpActivation::quick_geglu ? GluKind::quick_gelu : GluKind::silu, c.glu_clamp,
                         c.glu_linear_offset};
  }
  // GELU or plain SwiGLU under FP8's delayed recipe: fc2's input cast computes the activation from
  // fc1's output, and fc1's output-gradient cast computes its backward from fc2's input gradient, so
  // neither act(h) nor its gradient is ever written in T (Row/ColumnParallelLinear::fp8_fuses_casts).
  bool fuses_activation_casts(const Context& ctx) const { return fc1_.fp8_fuses_casts(ctx) && fc2_.fp8_fuses_casts(ctx); }
  // Where the activation runs inside the casts: whether fc2's input^T codes are made in the backward
  // (Fp8Options::activation_codes_in_backward) instead of kept from the forward.
  bool activation_codes_later(const Context& ctx) const { return ctx.fp8 && ctx.fp8->options.activation_codes_in_backward; }

  // SwiGLU without clamp or offset runs on the backend's own swiglu kernels.
  bool plain_swiglu() const { return activation_ == MlpActivation::swiglu && glu_.clamp == 0 && glu_.linear_offset == 0; }

  static index_t checked_ffn(const MlpConfig& c, int tp) {
    if (c.hidden_size <= 0 || c.ffn_hidden_size <= 0)
      fail<ConfigError>("Mlp: hidden_size=", c.hidden_size, " and ffn_hidden_size=", c.ffn_hidden_size, " must be positive");
    if (c.ffn_hidden_size % tp != 0)
      fail<ConfigError>("Mlp: tp=", tp, " does not divide ffn_hidden_size=", c.ffn_hidden_size);
    return c.ffn_hidden_size;
  }

  MlpActivation activation_;
  GluActivation glu_;
  ColumnParallelLinear<Policy> fc1_;
  RowParallelLinear<Policy> fc2_;
};

STRATA_NAMESPACE_END
