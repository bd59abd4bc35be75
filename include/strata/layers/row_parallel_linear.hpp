// strata/layers/row_parallel_linear.hpp: `RowParallelLinear`, Y = X A^T + b with A split by columns
// (input features) over the tensor-parallel group.
//
//   weight [out, in/tp], bias [out] (replicated, added after the reduction)
//
//   forward:  input sharded<-1> (or replicated, sliced here when !input_is_parallel)
//             -> local matmul gives partial -> all-reduce (g) to replicated, or reduce-scatter on
//             the sequence to sharded<0> under sequence parallelism -> + bias
//   backward: dY replicated (all-gathered on seq under SP) -> dX sharded<-1> (all-gathered on
//             hidden when !input_is_parallel). The bias gradient is taken from the full-sequence
//             dY, so it is complete on every rank without a further reduction.
//
// Built under ctx.fp8 inside a transformer layer that runs FP8, the three GEMMs run in FP8
// (layers/fp8_linear.hpp; the input and the weight sharded over tp, the output gradient the full
// sequence's); the --tp-comm-overlap rings are then not used.
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "../comm/parallel_context.hpp"
#include "conversions.hpp"
#include "fp8_linear.hpp"
#include "linear_common.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

struct RowOptions {
  bool input_is_parallel = true;  // input already sharded on its last dimension
  bool skip_bias_add = false;  // return Y without b; the caller adds bias() (db is still accumulated)
};

template <class Policy, RowOptions Options = RowOptions{}>
class RowParallelLinear {
 public:
  using T = typename Policy::element;
  using Comm = typename Policy::comm;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Param = Parameter<T, Space>;
  template <class L>
  using Act = Activation<T, L, Space>;
  static constexpr bool sequence_parallel = Policy::sequence_parallel;
  using input_layout = std::conditional_t<Options.input_is_parallel, layout::sharded<-1>, layout::replicated>;
  using output_layout = std::conditional_t<sequence_parallel, layout::sharded<0>, layout::replicated>;
  static_assert(!(sequence_parallel && !Options.input_is_parallel),
                "RowParallelLinear: sequence parallelism needs input_is_parallel = true (the input must come "
                "from a ColumnParallelLinear without gather_output).");

  struct Saved {
    Tensor<T, Space> input;  // local input shard [rows, in/tp]
    // FP8 with a per-tensor recipe: the codes of the input^T the forward's cast wrote for the weight
    // gradient, kept instead of the input (which is then dropped); empty otherwise.
    detail::Fp8Pair<Space> fp8_input;
  };

  RowParallelLinear(const Context& ctx, std::string name, index_t in, index_t out, bool bias = true)
      : weight_(name + ".weight", Shape{out, in}, ShardSpec::split(1, ctx.tp.rank(), ctx.tp.size())),
        fp8_(make_fp8_state(ctx, name)) {
    weight_.grad_first_write = true;  // only linear_weight_gradient_rows writes it
    weight_.fp8 = fp8_.get();  // (null without FP8)
    if (bias) bias_.emplace(name + ".bias", Shape{out}, ShardSpec::replicated(), false);
    if (fp8_) check_fp8_block_shard(ctx, name, "input features", in / ctx.tp.size());
  }

  // With `residual` (the output's layout and shape): returns y + residual. On one rank the residual
  // goes into the GEMM's epilogue with the bias where the backend can (linear_forward_add, or the FP8
  // GEMM's fp8_gemm_add: one rounding); otherwise it is added after the reduction and the bias, as a
  // caller's add would.
  template <class Layout>
  std::pair<Act<output_layout>, Saved> forward(Context& ctx, const Act<Layout>& x,
                                               const Act<output_layout>* residual = nullptr) const {
    return forward_impl(ctx, x, residual, Fp8Producer::copy);
  }
  // forward() of gelu(pre) (an MLP's fc2 after fc1 without its GELU). Where the input cast can make
  // the GELU itself (fp8_fuses_casts), gelu(pre) is never written: the cast reads pre; otherwise the
  // GELU runs first (backend gelu_forward). With `input_codes_later` (where the cast makes the GELU),
  // the forward keeps no codes of gelu(pre)^T: the caller has them written before this layer's weight
  // gradient (fp8_input_codes_later; Fp8Options::activation_codes_in_backward).
  template <class Layout>
  std::pair<Act<output_layout>, Saved> forward_gelu_of(Context& ctx, const Act<Layout>& pre,
                                                       const Act<output_layout>* residual = nullptr,
                                                       bool input_codes_later = false) const
    requires(Options.input_is_parallel)
  {
    if (fp8_fuses_casts(ctx)) return forward_impl(ctx, pre, residual, Fp8Producer::gelu, input_codes_later);
    Act<Layout> act(Tensor<T, Space>::empty(pre.shape()));
    ctx.device.template gelu_forward<T>(pre.data(), pre.tensor.numel(), act.data());
    return forward(ctx, act, residual);
  }
  // forward() of swiglu(pre), pre = [gate | up] (an MLP's fc2 after a gated fc1), as forward_gelu_of:
  // the input cast makes silu(gate) up itself where it can, else the backend's swiglu_forward runs first.
  template <class Layout>
  std::pair<Act<output_layout>, Saved> forward_swiglu_of(Context& ctx, const Act<Layout>& pre,
                                                         const Act<output_layout>* residual = nullptr,
                                                         bool input_codes_later = false) const
    requires(Options.input_is_parallel)
  {
    if (pre.shape().cols() % 2 != 0)
      fail<ShapeError>("RowParallelLinear::forward_swiglu_of: [gate | up] of ", pre.shape().str(), " has an odd width");
    if (fp8_fuses_casts(ctx)) return forward_impl(ctx, pre, residual, Fp8Producer::swiglu, input_codes_later);
    const index_t f = pre.shape().cols() / 2;
    Act<Layout> act(Tensor<T, Space>::empty(pre.shape().with(-1, f)));
    ctx.device.template swiglu_forward<T>(pre.data(), pre.shape().rows(), f, act.data());
    return forward(ctx, act, residual);
  }
  // Whether this layer's FP8 casts take what produces their tensor (a GELU or SwiGLU, or their
  // backward) into the same pass (fp8_casts_take_producers).
  bool fp8_fuses_casts(const Context& ctx) const { return fp8_casts_take_producers(ctx, fp8_); }
  // The forward's input^T codes left for later (forward_gelu_of / forward_swiglu_of with
  // input_codes_later): allocates them in `saved` (a copy of the forward's, which backward then takes)
  // and returns where the producer's backward cast writes them (ColumnParallelLinear::backward_gelu_of /
  // backward_swiglu_of with `activation`): this layer's input format and scale of the step, no amax
  // (the forward folded it). Empty (codes null) where the forward kept its codes.
  Fp8Output fp8_input_codes_later(Saved& saved) const {
    if (!fp8_ || !saved.fp8_input.codes_t_later) return {};
    const Shape& x = saved.fp8_input.shape;
    saved.fp8_input.codes_t = Tensor<std::uint8_t, Space>::empty(Shape{x.cols(), x.rows()});
    return Fp8Output{saved.fp8_input.format, fp8_->scale(Fp8Role::input), saved.fp8_input.codes_t.data(), nullptr};
  }
  // Fp8Options::recast_attention_output: where the forward kept its input^T's codes, `saved` holds
  // `input` instead (the forward's input, which the caller keeps anyway: a handle, no copy), and the
  // backward casts it again (detail::fp8_linear_backward without kept codes: the same codes).
  void fp8_hold_input_instead_of_codes(const Context& ctx, Saved& saved, const Tensor<T, Space>& input) const {
    if (!fp8_ || !ctx.fp8 || !ctx.fp8->options.recast_attention_output || saved.fp8_input.empty()) return;
    if (!(input.shape() == saved.fp8_input.shape))
      fail<ShapeError>("RowParallelLinear: the input held in place of its FP8 codes is ", input.shape().str(), ", not ",
                       saved.fp8_input.shape.str());
    saved.fp8_input = {};
    saved.input = input;
  }

 private:
  template <class Layout>
  std::pair<Act<output_layout>, Saved> forward_impl(Context& ctx, const Act<Layout>& x, const Act<output_layout>* residual,
                                                    Fp8Producer producer, bool input_codes_later = false) const {
    expect_layout<input_layout, Layout>();
    Saved saved;
    if constexpr (Options.input_is_parallel) saved.input = x.tensor;  // shared, read only
    else saved.input = scatter_to_tensor_parallel(ctx.device, ctx.tp, x).tensor;
    // On one rank the sum is complete at once: the bias goes into the GEMM's epilogue.
    const bool fused_bias = bias_ && !Options.skip_bias_add && ctx.tp.size() == 1;
    Act<output_layout> y;
    bool added = false;  // the residual is in y
    if (sequence_parallel && ctx.tp_comm_overlap && ctx.tp_comm_overlap_rs && ctx.tp.size() > 1 && !fp8_) {
      // The reduce-scatter as a ring whose exchanges run beside the GEMM of the next block of rows
      // (reduce_scatter_dim0_ring); the input is checked as linear_forward checks it.
      const index_t in = weight_.value.size(1), out = weight_.value.size(0);
      detail::check_linear_input(saved.input.shape(), weight_, "RowParallelLinear");
      const Shape full = saved.input.shape().with(-1, out);
      const index_t block_rows = full.rows() / ctx.tp.size();
      y = Act<output_layout>(detail::reduce_scatter_dim0_ring<T, Space>(
          ctx.device, ctx.tp, full,
          [&](int r, T* into) {
            detail::linear_forward_rows(ctx.device, saved.input.data() + r * block_rows * in, block_rows, weight_,
                                        nullptr, into);
          },
          "RowParallelLinear (the ring reduce-scatter of --tp-comm-overlap)"));
    } else {
      added = residual != nullptr && ctx.tp.size() == 1;  // one rank: the sum is complete in the GEMM
      Act<layout::partial> partial(
          fp8_ ? fp8_forward(ctx, saved.input, fused_bias ? &*bias_ : nullptr, saved.fp8_input, producer,
                             added ? &residual->tensor : nullptr, input_codes_later) :
          added ? detail::linear_forward_add(ctx.device, saved.input, weight_, fused_bias ? &*bias_ : nullptr,
                                             residual->tensor, "RowParallelLinear")
                : detail::linear_forward(ctx.device, saved.input, weight_, fused_bias ? &*bias_ : nullptr,
                                         "RowParallelLinear"));
      if (!saved.fp8_input.empty() || saved.fp8_input.codes_t_later) saved.input = Tensor<T, Space>();
      if constexpr (sequence_parallel) y = reduce_scatter_to_sequence_parallel(ctx.device, ctx.tp, partial);
      else y = reduce_from_tensor_parallel(ctx.tp, std::move(partial));
    }
    if (bias_ && !Options.skip_bias_add && !fused_bias) detail::add_bias(ctx.device, y.tensor, *bias_);  // y is ours
    if (residual && !added) {
      check_same_shape(y.shape(), residual->shape(), "RowParallelLinear residual");
      ctx.device.template add<T>(y.data(), residual->data(), y.tensor.numel(), y.data());
    }
    return {std::move(y), std::move(saved)};
  }

 public:
  // With `deferred`, the weight gradients are appended to it instead (a split backward). With an
  // `at_collectives` list under sequence parallelism, the all-gather of dy runs on the
  // communicator's overlapped handle while the list's weight gradients (earlier layers') run, and
  // this layer's own are appended after them (ColumnParallelLinear::backward says why); with
  // ctx.tp_comm_overlap and no such work waiting (none given, or an empty list), dy is gathered as
  // a ring beside the input gradients of its arrived blocks (ring_backward). Without
  // `bias_gradient`, the bias gradient is left to the caller (one that already reads dy and adds its
  // column sums: TransformerLayer's norms).
  template <class Layout>
  Act<input_layout> backward(Context& ctx, const Saved& saved, const Act<Layout>& dy, DeferredWeightGradients* deferred = nullptr,
                             bool bias_gradient = true) {
    return backward_impl(ctx, saved, dy, nullptr, deferred, bias_gradient);
  }
  // backward() of a layer whose input was gelu(gelu_pre) (an MLP's fc2): returns the gradient with
  // respect to gelu_pre, fused into the dX GEMM where the backend can (backend gemm_gelu_backward).
  template <class Layout>
  Act<input_layout> backward_through_gelu(Context& ctx, const Saved& saved, const Act<Layout>& dy,
                                          const Tensor<T, Space>& gelu_pre, DeferredWeightGradients* deferred = nullptr,
                                          bool bias_gradient = true)
    requires(Options.input_is_parallel)
  {
    return backward_impl(ctx, saved, dy, &gelu_pre, deferred, bias_gradient);
  }

 private:
  template <class Layout>
  Act<input_layout> backward_impl(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Tensor<T, Space>* gelu_pre,
                                  DeferredWeightGradients* deferred, bool bias_gradient) {
    expect_layout<output_layout, Layout>();
    Param* bias = bias_ && bias_gradient ? &*bias_ : nullptr;
    Tensor<T, Space> dy_full;
    if constexpr (sequence_parallel) {
      const bool overlap = ctx.tp.size() > 1 && ctx.tp_comm_overlap && !fp8_ && (!deferred || deferred->runs_at_collectives());
      if (overlap && (!deferred || deferred->empty())) return ring_backward(ctx, saved, dy, gelu_pre, deferred, bias);
      if (overlap) {
        Comm comm = overlapped_handle(ctx.tp);
        dy_full = reduce_scatter_to_sequence_parallel_backward(ctx.device, comm, dy).tensor;
        const std::uint64_t mark = overlapped_mark(comm);
        {
          detail::gemms_beside_communication beside(ctx.device);
          deferred->run();
        }
        join_overlapped(ctx.tp, mark);
      } else {
        dy_full = reduce_scatter_to_sequence_parallel_backward(ctx.device, ctx.tp, dy).tensor;
      }
    } else {
      dy_full = reduce_from_tensor_parallel_backward(dy).tensor;  // shared, read only
    }
    Act<layout::sharded<-1>> dx(
        fp8_ ? fp8_backward(ctx, saved, dy_full, bias, gelu_pre, deferred)
             : detail::linear_backward(ctx.device, saved.input, dy_full, weight_, bias, gelu_pre, deferred));
    if constexpr (Options.input_is_parallel) return dx;
    else return scatter_to_tensor_parallel_backward(ctx.device, ctx.tp, dx);
  }

 public:
  void init(Context& ctx, std::uint64_t seed, double stddev) {
    init_normal(ctx.device, weight_, seed, stddev);
    if (bias_) init_constant(ctx.device, *bias_, 0.0);
    if (fp8_) fp8_->drop_weight_cache();  // new weights: cast again at the next use
  }

  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(weight_);
    if (bias_) visit(*bias_);
  }

  Param& weight() { return weight_; }
  Param* bias() { return bias_ ? &*bias_ : nullptr; }
  // The FP8 scaling state (null when the GEMMs run in T).
  const std::shared_ptr<Fp8State<Space>>& fp8_state() const { return fp8_; }

 private:
  // The input and the weight are split over tp; the output gradient is the full sequence's.
  static constexpr detail::Fp8Sharding fp8_sharding() { return {true, false}; }
  // (A backend without FP8 never has a state here: make_fp8_state refuses it.)
  static constexpr bool fp8_backend = backend_has_fp8<typename Policy::backend>;
  // With `addend` (the output's shape): y + addend, in the FP8 GEMM's epilogue where the backend can.
  Tensor<T, Space> fp8_forward(Context& ctx, const Tensor<T, Space>& input, const Param* bias,
                               detail::Fp8Pair<Space>& keep, Fp8Producer producer, const Tensor<T, Space>* addend,
                               bool input_codes_later) const {
    if (input_codes_later && (producer == Fp8Producer::copy || ctx.fp8->options.recipe == Fp8RecipeKind::blockwise))
      fail<Error>("RowParallelLinear (", fp8_->name, "): input codes left for later need a per-tensor cast that makes its "
                  "input (a GELU or SwiGLU)");
    // the input the GEMM multiplies: the tensor, or (swiglu) what the cast makes of [gate | up]
    const Shape shape = producer == Fp8Producer::swiglu ? input.shape().with(-1, input.shape().cols() / 2) : input.shape();
    detail::check_linear_input(shape, weight_, "RowParallelLinear");
    auto y = Tensor<T, Space>::empty(shape.with(-1, weight_.value.size(0)));  // (rows, out)
    if (addend) check_same_shape(y.shape(), addend->shape(), "RowParallelLinear residual");
    if constexpr (fp8_backend) {
      detail::fp8_linear_forward_rows(ctx, *fp8_, fp8_sharding(), input.data(), shape.rows(), weight_, bias, y.data(), keep,
                                      static_cast<T*>(nullptr), producer, static_cast<detail::Fp8Pair<Space>*>(nullptr),
                                      addend ? addend->data() : nullptr, input_codes_later);
      if (!keep.empty() || keep.codes_t_later) keep.shape = shape;
    }
    return y;
  }
  Tensor<T, Space> fp8_backward(Context& ctx, const Saved& saved, const Tensor<T, Space>& dy, Param* bias,
                                const Tensor<T, Space>* gelu_pre, DeferredWeightGradients* deferred) {
    if constexpr (fp8_backend)
      return detail::fp8_linear_backward(ctx, fp8_, fp8_sharding(), saved.input, saved.fp8_input, dy, weight_, bias, gelu_pre,
                                         deferred);
    else
      return Tensor<T, Space>();
  }

  // The backward under --tp-comm-overlap when no earlier weight gradient waits to hide the
  // all-gather of dy (a layer's first backward collective): dy is gathered as a ring
  // (all_gather_dim0_ring) and the input gradient of each arrived block of rows is computed beside
  // the next exchange; the weight gradient, which needs every row, comes after (or is appended to
  // `deferred`).
  template <class Layout>
  Act<input_layout> ring_backward(Context& ctx, const Saved& saved, const Act<Layout>& dy,
                                  const Tensor<T, Space>* gelu_pre, DeferredWeightGradients* deferred, Param* bias) {
    const index_t in = weight_.value.size(1), out = weight_.value.size(0), rows = saved.input.shape().rows();
    const index_t block_rows = dy.tensor.shape().rows();
    if (dy.tensor.shape().cols() != out || block_rows * ctx.tp.size() != rows)
      fail<ShapeError>("RowParallelLinear backward: output gradient ", dy.tensor.shape().str(), " on each of ",
                       ctx.tp.size(), " ranks does not match ", rows, " rows of ", out, " features");
    if (gelu_pre && !(gelu_pre->shape() == saved.input.shape()))
      fail<ShapeError>("RowParallelLinear backward: the GELU pre-activation ", gelu_pre->shape().str(),
                       " does not match the input ", saved.input.shape().str());
    Act<layout::sharded<-1>> dx(Tensor<T, Space>::empty(saved.input.shape()));  // (rows, in)
    Tensor<T, Space> dy_full = detail::all_gather_dim0_ring(ctx.device, ctx.tp, dy.tensor, [&](int r, const T* block) {
      const index_t at = r * block_rows * in;
      detail::linear_input_gradient_rows(ctx.device, block, block_rows, weight_, dx.data() + at,
                                         gelu_pre ? gelu_pre->data() + at : nullptr);
    }, detail::overlap_gathers_whole(ctx));
    if (deferred) detail::defer_weight_gradient(ctx.device, saved.input, dy_full, weight_, bias, *deferred);
    else detail::linear_weight_gradient_rows(ctx.device, saved.input.data(), dy_full.data(), rows, weight_, bias);
    return dx;
  }

  Param weight_;
  std::optional<Param> bias_;
  std::shared_ptr<Fp8State<Space>> fp8_;
};

STRATA_NAMESPACE_END
