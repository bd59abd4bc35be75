// strata/layers/mlp.hpp: `Mlp<Policy, Activation>`, the feed-forward block: column-parallel fc1,
// an element-wise activation on the sharded hidden features, row-parallel fc2.
//
//   gelu:   fc1 hidden -> ffn,            y = fc2(gelu_tanh(fc1 x))          (GPT-2; fc1 and the GELU
//           are one backend gemm_gelu, fc2's dX and the GELU backward one gemm_gelu_backward)
//   swiglu: fc1 hidden -> [gate; up] 2ffn, y = fc2(silu(gate) * up)          (Llama)
// For swiglu fc1 is one weight of two stacked blocks, each split over tp, so every rank holds the
// matching slices of gate and up. Input and output: the residual stream layout.
#pragma once

#include <string>
#include <utility>

#include "column_parallel_linear.hpp"
#include "row_parallel_linear.hpp"

STRATA_NAMESPACE_BEGIN

struct gelu {};
struct swiglu {};

struct MlpConfig {
  index_t hidden_size = 0;
  index_t ffn_hidden_size = 0;
  bool bias = true;
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
  static constexpr bool gated = std::is_same_v<Act, swiglu>;
  static_assert(std::is_same_v<Act, gelu> || gated, "Mlp: the activation must be strata::gelu or strata::swiglu.");

  struct Saved {
    typename ColumnParallelLinear<Policy>::Saved fc1;
    typename RowParallelLinear<Policy>::Saved fc2;
    Tensor<T, Space> pre_activation;  // fc1 output, sharded on features
  };

  Mlp(const Context& ctx, std::string name, MlpConfig c)
      : fc1_(ctx, name + ".fc1", c.hidden_size, (gated ? 2 : 1) * checked_ffn(c, ctx.tp.size()), c.bias, gated ? 2 : 1),
        fc2_(ctx, name + ".fc2", c.ffn_hidden_size, c.hidden_size, c.bias) {}

  // With `residual` (x's layout and shape): returns mlp(x) + residual, the add in fc2's GEMM where it
  // can (RowParallelLinear::forward).
  std::pair<Edge<Layout>, Saved> forward(Context& ctx, const Edge<Layout>& x, const Edge<Layout>* residual = nullptr) const {
    Saved saved;
    if constexpr (!gated) {  // fc1 and the GELU in one GEMM where the backend fuses them
      auto [act, pre, fc1_saved] = fc1_.forward_gelu(ctx, x);  // (s, b, ffn / tp) twice
      saved.fc1 = std::move(fc1_saved);
      saved.pre_activation = std::move(pre);
      auto [y, fc2_saved] = fc2_.forward(ctx, act, residual);
      saved.fc2 = std::move(fc2_saved);
      return {std::move(y), std::move(saved)};
    }
    auto [h, fc1_saved] = fc1_.forward(ctx, x);  // (s, b, 2 ffn / tp)
    saved.fc1 = std::move(fc1_saved);
    const index_t rows = h.shape().rows(), width = h.shape().cols(), ffn_local = gated ? width / 2 : width;
    Edge<layout::sharded<-1>> act(Tensor<T, Space>::empty(h.shape().with(-1, ffn_local)));
    ctx.device.template swiglu_forward<T>(h.data(), rows, ffn_local, act.data());
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
    if constexpr (!gated) {  // the GELU backward fused into fc2's dX GEMM where the backend can
      return fc1_.backward(ctx, saved.fc1, fc2_.backward_through_gelu(ctx, saved.fc2, dy, h, deferred, output_bias_gradient),
                           deferred);
    }
    auto dact = fc2_.backward(ctx, saved.fc2, dy, deferred, output_bias_gradient);
    Edge<layout::sharded<-1>> dh{Tensor<T, Space>::empty(h.shape())};
    ctx.device.template swiglu_backward<T>(dact.data(), h.data(), h.shape().rows(), h.shape().cols() / 2, dh.data());
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
  static index_t checked_ffn(const MlpConfig& c, int tp) {
    if (c.hidden_size <= 0 || c.ffn_hidden_size <= 0)
      fail<ConfigError>("Mlp: hidden_size=", c.hidden_size, " and ffn_hidden_size=", c.ffn_hidden_size, " must be positive");
    if (c.ffn_hidden_size % tp != 0)
      fail<ConfigError>("Mlp: tp=", tp, " does not divide ffn_hidden_size=", c.ffn_hidden_size);
    return c.ffn_hidden_size;
  }

  ColumnParallelLinear<Policy> fc1_;
  RowParallelLinear<Policy> fc2_;
};

STRATA_NAMESPACE_END
