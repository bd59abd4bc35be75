// strata/layers/norm.hpp: `LayerNorm` and `RmsNorm` over the hidden dimension.
//
// A norm acts on the residual stream, replicated or (under sequence parallelism) sharded<0>; it
// keeps the layout. Its weights are replicated on the tensor-parallel group; when the input is a
// sequence shard their gradients are summed over the group inside backward (chosen from the input
// layout's type), so a sequence-parallel norm cannot silently train on a partial gradient.
//
// Both norms fuse the residual add of a transformer layer (one pass over the activations instead
// of two): forward_add(ctx, x, residual) adds residual into x in place and normalizes the sum;
// backward(ctx, saved, dy, &dresidual) returns dresidual + the norm's input gradient.
//
// forward_codes / forward_add_codes write the output as FP8 codes for a caller whose only reader of
// it is an FP8 GEMM (the delayed recipe, whose scale is known before the output exists): the codes
// a cast of the output in T would make, without the output in T or the cast's pass over it.
//
// zero_centered (Megatron's --apply-layernorm-1p): the weight w is stored as gamma - 1 and
// initialized to 0; the kernels scale by w + 1, added in the accumulate type (their weight_offset),
// so a bf16 weight keeps its precision near zero. The gradient of w is that of gamma.
#pragma once

#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "../comm/parallel_context.hpp"
#include "../core/fp8_recipe.hpp"
#include "conversions.hpp"
#include "parameter.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

namespace detail {
// Whether the backend's norms can write their output as FP8 codes (optional entry points
// layernorm_forward_fp8 and rmsnorm_forward_fp8, docs/DEVICE.md).
template <class Device, class T>
concept norms_write_fp8 = requires(Device& d, const T* ct, T* t, accumulate_t<T>* a, index_t n, accumulate_t<T> e,
                                   const Fp8Output& out) {
  d.template layernorm_forward_fp8<T>(ct, ct, ct, n, n, e, a, a, ct, t, e, out);
  d.template rmsnorm_forward_fp8<T>(ct, ct, n, n, e, a, ct, t, e, out);
};

// The forward entry points LayerNorm and RmsNorm share. Derived: the norm, with a private
// run(ctx, x, residual, sum, y, out) that runs its kernel (`y`: the output in T; `out.codes`: the
// output as FP8 codes instead; `sum`: x + residual, in place of x) and a `residual_name` for errors.
template <class Derived, class Policy>
class NormForwards {
  using T = typename Policy::element;
  using Context = context_t<Policy>;
  template <class L>
  using Act = Activation<T, L, space_t<Policy>>;
  const Derived& self() const { return static_cast<const Derived&>(*this); }

 public:
  template <class Layout>
  auto forward(Context& ctx, const Act<Layout>& x) const {
    Act<Layout> y{Tensor<T, space_t<Policy>>::empty(x.shape())};
    auto saved = self().run(ctx, x, nullptr, nullptr, y.data(), {});
    return std::pair{std::move(y), std::move(saved)};
  }
  // x := x + residual (x is the caller's own tensor), then the norm of x: forward(x + residual).
  template <class Layout>
  auto forward_add(Context& ctx, Act<Layout>& x, const Act<Layout>& residual) const {
    check_same_shape(x.shape(), residual.shape(), Derived::residual_name);
    Act<Layout> y{Tensor<T, space_t<Policy>>::empty(x.shape())};
    auto saved = self().run(ctx, x, residual.data(), x.data(), y.data(), {});
    return std::pair{std::move(y), std::move(saved)};
  }
  // forward() and forward_add() with the output written as FP8 codes (`out`) instead of returned in
  // T, for a caller whose only reader of the output is an FP8 GEMM (TransformerLayer); needs the
  // backend's layernorm_forward_fp8 / rmsnorm_forward_fp8 (norms_write_fp8).
  template <class Layout>
  auto forward_codes(Context& ctx, const Act<Layout>& x, const Fp8Output& out) const {
    return self().run(ctx, x, nullptr, nullptr, nullptr, out);
  }
  template <class Layout>
  auto forward_add_codes(Context& ctx, Act<Layout>& x, const Act<Layout>& residual, const Fp8Output& out) const {
    check_same_shape(x.shape(), residual.shape(), Derived::residual_name);
    return self().run(ctx, x, residual.data(), x.data(), nullptr, out);
  }
};

template <class Layout>
constexpr void expect_full_hidden() {
  static_assert(std::is_same_v<Layout, layout::replicated> || std::is_same_v<Layout, layout::sharded<0>>,
                "strata: a norm needs the whole hidden dimension: give it a replicated or sequence-sharded "
                "(sharded<0>) activation, not a hidden-sharded or partial one.");
}
}  // namespace detail

template <class Policy>
class LayerNorm : public detail::NormForwards<LayerNorm<Policy>, Policy> {
  friend class detail::NormForwards<LayerNorm<Policy>, Policy>;

 public:
  static constexpr const char* residual_name = "LayerNorm residual";
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  template <class L>
  using Act = Activation<T, L, Space>;

  struct Saved {
    Tensor<T, Space> input;  // shared with the caller's x, read only
    Tensor<A, Space> mean, rstd;
  };

  LayerNorm(Context& ctx, std::string name, index_t hidden, double eps = 1e-5, bool zero_centered = false)
      : weight_(name + ".weight", Shape{hidden}, ShardSpec::replicated(), false),
        bias_(name + ".bias", Shape{hidden}, ShardSpec::replicated(), false), eps_(eps), zero_centered_(zero_centered) {
    init_constant(ctx.device, weight_, zero_centered_ ? 0.0 : 1.0);
    init_constant(ctx.device, bias_, 0.0);
  }

  // d input; plus *dresidual when given (the gradient the residual branch brings to the same input).
  // With dresidual_sums too, the column sums of *dresidual over this rank's rows are added into it as
  // the kernel reads them (TransformerLayer: the bias gradient of the layer whose output gradient
  // *dresidual is).
  template <class Layout>
  Act<Layout> backward(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Act<Layout>* dresidual = nullptr,
                       A* dresidual_sums = nullptr) {
    detail::expect_full_hidden<Layout>();
    const index_t h = weight_.value.numel();
    if (dresidual) check_same_shape(dresidual->shape(), dy.shape(), "LayerNorm residual gradient");
    // Added straight into the gradients when no reduction is needed, else written and reduced (weight
    // and bias in one collective).
    if (replicated_gradient_is_local<Layout>(ctx.tp))
      return backward_into(ctx, saved, dy, dresidual, dresidual_sums, weight_.grad.data(), bias_.grad.data(), true);
    auto partials = Tensor<A, Space>::empty(Shape{partial_size()});
    auto dx = backward_into(ctx, saved, dy, dresidual, dresidual_sums, partials.data(), partials.data() + h, false);
    add_partials<Layout>(ctx, partials);
    return dx;
  }

  // backward() for a caller that reduces the parameter gradients itself: the increments of this rank's
  // rows, [weight | bias] (partial_size() elements), are written into `partials` and the gradients are
  // left alone; add_partials (or add_replicated_gradients over several norms at once) completes them.
  template <class Layout>
  Act<Layout> backward_partial(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Act<Layout>* dresidual,
                               A* partials) {
    detail::expect_full_hidden<Layout>();
    if (dresidual) check_same_shape(dresidual->shape(), dy.shape(), "LayerNorm residual gradient");
    return backward_into(ctx, saved, dy, dresidual, nullptr, partials, partials + weight_.value.numel(), false);
  }
  index_t partial_size() const { return 2 * weight_.value.numel(); }
  template <class Layout>
  void add_partials(Context& ctx, Tensor<A, Space>& partials) {
    Parameter<T, Space>* params[] = {&weight_, &bias_};
    add_replicated_gradients<Layout>(ctx.device, ctx.tp, partials, std::span<Parameter<T, Space>* const>(params));
  }

  void init(Context& ctx, std::uint64_t, double) {
    init_constant(ctx.device, weight_, zero_centered_ ? 0.0 : 1.0);
    init_constant(ctx.device, bias_, 0.0);
  }
  bool zero_centered() const { return zero_centered_; }

 private:
  // The forward kernel: sum := x + residual first with a residual; the output into y, or as codes
  // into `out` (out.codes set).
  template <class Layout>
  Saved run(Context& ctx, const Act<Layout>& x, const T* residual, T* sum, T* y, const Fp8Output& out) const {
    detail::expect_full_hidden<Layout>();
    const index_t rows = x.shape().rows(), h = weight_.value.numel();
    if (x.shape().cols() != h) fail<ShapeError>("LayerNorm ", weight_.name, ": input ", x.shape().str(), " is not of width ", h);
    Saved saved{x.tensor, Tensor<A, Space>::empty(Shape{rows}), Tensor<A, Space>::empty(Shape{rows})};
    const T *g = weight_.value.data(), *b = bias_.value.data();
    if (!out.codes) {
      ctx.device.template layernorm_forward<T>(x.data(), g, b, rows, h, A(eps_), y, saved.mean.data(), saved.rstd.data(),
                                               residual, sum, weight_offset());
    } else if constexpr (detail::norms_write_fp8<typename Context::device_type, T>) {
      ctx.device.template layernorm_forward_fp8<T>(x.data(), g, b, rows, h, A(eps_), saved.mean.data(), saved.rstd.data(),
                                                   residual, sum, weight_offset(), out);
    } else {
      fail<Error>("LayerNorm ", weight_.name, ": this backend's norms cannot write FP8 codes (layernorm_forward_fp8)");
    }
    return saved;
  }

  // The kernel: dg, db written into (or, with accumulate, added into) dweight, dbias.
  template <class Layout>
  Act<Layout> backward_into(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Act<Layout>* dresidual,
                            A* dresidual_sums, A* dweight, A* dbias, bool accumulate) {
    const index_t rows = dy.shape().rows(), h = weight_.value.numel();
    Act<Layout> dx{Tensor<T, Space>::empty(dy.shape())};
    ctx.device.template layernorm_backward<T>(dy.data(), saved.input.data(), weight_.value.data(), saved.mean.data(),
                                              saved.rstd.data(), rows, h, dx.data(), dweight, dbias,
                                              dresidual ? dresidual->data() : nullptr, accumulate, dresidual_sums,
                                              weight_offset());
    return dx;
  }

 public:
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
    visit(bias_);
  }

 private:
  A weight_offset() const { return zero_centered_ ? A(1) : A(0); }

  Parameter<T, Space> weight_, bias_;
  double eps_;
  bool zero_centered_ = false;
};

template <class Policy>
class RmsNorm : public detail::NormForwards<RmsNorm<Policy>, Policy> {
  friend class detail::NormForwards<RmsNorm<Policy>, Policy>;

 public:
  static constexpr const char* residual_name = "RmsNorm residual";
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  template <class L>
  using Act = Activation<T, L, Space>;

  struct Saved {
    Tensor<T, Space> input;  // shared with the caller's x, read only
    Tensor<A, Space> rstd;
  };

  RmsNorm(Context& ctx, std::string name, index_t hidden, double eps = 1e-5, bool zero_centered = false)
      : weight_(name + ".weight", Shape{hidden}, ShardSpec::replicated(), false), eps_(eps), zero_centered_(zero_centered) {
    init_constant(ctx.device, weight_, zero_centered_ ? 0.0 : 1.0);
  }

  // d input; plus *dresidual when given (the gradient the residual branch brings to the same input).
  template <class Layout>
  Act<Layout> backward(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Act<Layout>* dresidual = nullptr) {
    detail::expect_full_hidden<Layout>();
    const index_t h = weight_.value.numel();
    if (dresidual) check_same_shape(dresidual->shape(), dy.shape(), "RmsNorm residual gradient");
    if (replicated_gradient_is_local<Layout>(ctx.tp))  // as in LayerNorm
      return backward_into(ctx, saved, dy, dresidual, weight_.grad.data(), true);
    auto partials = Tensor<A, Space>::empty(Shape{h});
    auto dx = backward_into(ctx, saved, dy, dresidual, partials.data(), false);
    add_partials<Layout>(ctx, partials);
    return dx;
  }

  // As LayerNorm::backward_partial: the weight's increment (partial_size() elements) into `partials`.
  template <class Layout>
  Act<Layout> backward_partial(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Act<Layout>* dresidual,
                               A* partials) {
    detail::expect_full_hidden<Layout>();
    if (dresidual) check_same_shape(dresidual->shape(), dy.shape(), "RmsNorm residual gradient");
    return backward_into(ctx, saved, dy, dresidual, partials, false);
  }
  index_t partial_size() const { return weight_.value.numel(); }
  template <class Layout>
  void add_partials(Context& ctx, Tensor<A, Space>& partials) {
    Parameter<T, Space>* params[] = {&weight_};
    add_replicated_gradients<Layout>(ctx.device, ctx.tp, partials, std::span<Parameter<T, Space>* const>(params));
  }

  void init(Context& ctx, std::uint64_t, double) { init_constant(ctx.device, weight_, zero_centered_ ? 0.0 : 1.0); }
  bool zero_centered() const { return zero_centered_; }

 private:
  // As LayerNorm::run.
  template <class Layout>
  Saved run(Context& ctx, const Act<Layout>& x, const T* residual, T* sum, T* y, const Fp8Output& out) const {
    detail::expect_full_hidden<Layout>();
    const index_t rows = x.shape().rows(), h = weight_.value.numel();
    if (x.shape().cols() != h) fail<ShapeError>("RmsNorm ", weight_.name, ": input ", x.shape().str(), " is not of width ", h);
    Saved saved{x.tensor, Tensor<A, Space>::empty(Shape{rows})};
    if (!out.codes) {
      ctx.device.template rmsnorm_forward<T>(x.data(), weight_.value.data(), rows, h, A(eps_), y, saved.rstd.data(), residual,
                                             sum, weight_offset());
    } else if constexpr (detail::norms_write_fp8<typename Context::device_type, T>) {
      ctx.device.template rmsnorm_forward_fp8<T>(x.data(), weight_.value.data(), rows, h, A(eps_), saved.rstd.data(),
                                                 residual, sum, weight_offset(), out);
    } else {
      fail<Error>("RmsNorm ", weight_.name, ": this backend's norms cannot write FP8 codes (rmsnorm_forward_fp8)");
    }
    return saved;
  }

  template <class Layout>
  Act<Layout> backward_into(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Act<Layout>* dresidual,
                            A* dweight, bool accumulate) {
    const index_t rows = dy.shape().rows(), h = weight_.value.numel();
    Act<Layout> dx{Tensor<T, Space>::empty(dy.shape())};
    ctx.device.template rmsnorm_backward<T>(dy.data(), saved.input.data(), weight_.value.data(), saved.rstd.data(), rows, h,
                                            dx.data(), dweight, dresidual ? dresidual->data() : nullptr, accumulate,
                                            weight_offset());
    return dx;
  }

 public:
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
  }

 private:
  A weight_offset() const { return zero_centered_ ? A(1) : A(0); }

  Parameter<T, Space> weight_;
  double eps_;
  bool zero_centered_ = false;
};

// Which class templates are norms (TransformerLayer checks its Norm argument against this;
// specialize it for a norm of your own with the same forward / forward_add / backward (with the
// optional residual gradient) / init interface).
template <template <class> class Norm>
inline constexpr bool is_norm_v = false;
template <>
inline constexpr bool is_norm_v<LayerNorm> = true;
template <>
inline constexpr bool is_norm_v<RmsNorm> = true;

STRATA_NAMESPACE_END
