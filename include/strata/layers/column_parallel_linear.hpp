// strata/layers/column_parallel_linear.hpp: `ColumnParallelLinear`, Y = X A^T + b with A split by
// rows (output features) over the tensor-parallel group.
//
//   weight [out/tp, in] (rank r holds output rows partition(out, tp, r); with `stacks` > 1, the
//   r-th slice of each of the stacked blocks, e.g. SwiGLU's [gate; up]), bias [out/tp]
//
//   forward:  input replicated (or sharded<0> under sequence parallelism: all-gather on seq first)
//             -> local matmul -> sharded<-1> (or all-gather on hidden when gather_output)
//   backward: dX partial -> all-reduce (f's backward), or reduce-scatter on seq under SP
//
// Built under ctx.fp8 inside a transformer layer that runs FP8, the three GEMMs run in FP8
// (layers/fp8_linear.hpp; the input cast from the full-sequence input, or under sequence parallelism
// with a per-tensor recipe each rank's rows cast and their codes gathered; the weight and the output
// gradient sharded over tp); the --tp-comm-overlap rings are then not used.
//
// The weight may be borrowed from another layer (GPT's output layer uses the word embedding); the
// borrowed parameter's gradient accumulates in its owner and is not visited again.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../comm/parallel_context.hpp"
#include "conversions.hpp"
#include "fp8_linear.hpp"
#include "linear_common.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

struct ColumnOptions {
  bool gather_output = false;  // all-gather the output to replicated
  bool skip_bias_add = false;  // return Y without b; the caller adds bias() (db is still accumulated)
};

template <class Policy, ColumnOptions Options = ColumnOptions{}>
class ColumnParallelLinear {
 public:
  using T = typename Policy::element;
  using Comm = typename Policy::comm;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Param = Parameter<T, Space>;
  template <class L>
  using Act = Activation<T, L, Space>;
  static constexpr bool sequence_parallel = Policy::sequence_parallel;
  using input_layout = std::conditional_t<sequence_parallel, layout::sharded<0>, layout::replicated>;
  using output_layout = std::conditional_t<Options.gather_output, layout::replicated, layout::sharded<-1>>;
  static_assert(!(sequence_parallel && Options.gather_output),
                "ColumnParallelLinear: gather_output cannot be combined with sequence parallelism; keep the "
                "output sharded and follow it with a RowParallelLinear.");

  struct Saved {
    Tensor<T, Space> input;  // the full-sequence input (gathered under sequence parallelism)
    // FP8 with a per-tensor recipe: the codes of the input^T the forward's cast wrote for the weight
    // gradient, kept instead of the input (which is then dropped); empty otherwise.
    detail::Fp8Pair<Space> fp8_input;
  };

  // in, out: global feature counts. stacks: out is `stacks` equal blocks, each split over tp.
  ColumnParallelLinear(const Context& ctx, std::string name, index_t in, index_t out, bool bias = true, int stacks = 1)
      : owned_weight_(Param(name + ".weight", Shape{out, in}, ShardSpec::split(0, ctx.tp.rank(), ctx.tp.size(), stacks))),
        weight_(&*owned_weight_), fp8_(make_fp8_state(ctx, name)) {
    owned_weight_->grad_first_write = true;  // only linear_weight_gradient_rows writes it (a borrowed weight may have other writers)
    owned_weight_->fp8 = fp8_.get();  // (null without FP8)
    if (bias) bias_.emplace(name + ".bias", Shape{out}, ShardSpec::split(0, ctx.tp.rank(), ctx.tp.size(), stacks), false);
    check_gather(stacks);
    if (fp8_) check_fp8_block_shard(ctx, name, "output features", out / stacks / ctx.tp.size());
  }
  // Borrows `weight` (global [out, in], split on dim 0); no bias.
  explicit ColumnParallelLinear(Param& borrowed_weight) : weight_(&borrowed_weight) {
    check_gather(borrowed_weight.shard.stacks);
  }
  ColumnParallelLinear(const ColumnParallelLinear&) = delete;  // weight_ may point into *this
  ColumnParallelLinear& operator=(const ColumnParallelLinear&) = delete;
  ColumnParallelLinear(ColumnParallelLinear&& other) noexcept { *this = std::move(other); }
  ColumnParallelLinear& operator=(ColumnParallelLinear&& other) noexcept {
    const bool owns = other.owned_weight_.has_value();
    owned_weight_ = std::move(other.owned_weight_);
    bias_ = std::move(other.bias_);
    weight_ = owns ? &*owned_weight_ : other.weight_;
    fp8_ = std::move(other.fp8_);
    return *this;
  }

  // With ctx.tp_comm_overlap (and tp_comm_overlap_ag) under sequence parallelism over more than one rank, the input is
  // gathered as a ring of exchanges (all_gather_dim0_ring) and each rank's block of rows goes
  // through the GEMM as soon as it has arrived, while the next exchange is in flight
  // (tp_comm_overlap_gather collective or copy_engines: one all-gather beside the own block's GEMM).
  // With `given` (fp8_input_state's layer: the input's codes made by what produced the input, the
  // full sequence), the GEMMs take those codes and x serves for its layout alone.
  template <class Layout>
  std::pair<Act<output_layout>, Saved> forward(Context& ctx, const Act<Layout>& x,
                                               detail::Fp8Pair<Space>* given = nullptr) const {
    const Param* bias = Options.skip_bias_add || !bias_ ? nullptr : &*bias_;
    Saved saved;
    Tensor<T, Space> y;
    if (given && !fp8_input_state(ctx))
      fail<Error>("ColumnParallelLinear: input codes given to a layer that does not take them (fp8_input_state)");
    if (fp8_) {
      y = fp8_forward(ctx, x, bias, saved, nullptr, given);
    } else if (ring_gathers(ctx)) {
      y = output_of_gathered(ctx, x);
      const index_t block_rows = x.tensor.shape().rows(), out = y.shape().cols();
      saved.input = detail::all_gather_dim0_ring(ctx.device, ctx.tp, x.tensor, [&](int r, const T* rows) {
        detail::linear_forward_rows(ctx.device, rows, block_rows, *weight_, bias, y.data() + r * block_rows * out);
      }, detail::overlap_gathers_whole(ctx));
    } else {
      saved.input = full_input(ctx, x);
      y = detail::linear_forward(ctx.device, saved.input, *weight_, bias, "ColumnParallelLinear");
    }
    Act<layout::sharded<-1>> local(std::move(y));
    if constexpr (Options.gather_output) return {gather_from_tensor_parallel(ctx.device, ctx.tp, local), std::move(saved)};
    else return {std::move(local), std::move(saved)};
  }

  // forward() followed by GELU, fused where the backend can (backend gemm_gelu): returns gelu(Y) and
  // the pre-activation Y itself (which the GELU backward needs), both sharded<-1>.
  template <class Layout>
  std::tuple<Act<layout::sharded<-1>>, Tensor<T, Space>, Saved> forward_gelu(Context& ctx, const Act<Layout>& x) const
    requires(!Options.gather_output && !Options.skip_bias_add)
  {
    Saved saved;
    Tensor<T, Space> pre, y;
    if (fp8_) {
      const index_t rows = x.tensor.size(0) * (sequence_parallel ? ctx.tp.size() : 1);
      y = Tensor<T, Space>::empty(x.tensor.shape().with(0, rows).with(-1, weight_->value.size(0)));
      pre = fp8_forward(ctx, x, bias_ ? &*bias_ : nullptr, saved, y.data());
    } else if (ring_gathers(ctx)) {
      y = output_of_gathered(ctx, x);
      pre = Tensor<T, Space>::empty(y.shape());
      const index_t block_rows = x.tensor.shape().rows(), out = y.shape().cols(), in = weight_->value.size(1);
      saved.input = detail::all_gather_dim0_ring(ctx.device, ctx.tp, x.tensor, [&](int r, const T* rows) {
        const index_t at = r * block_rows * out;
        ctx.device.template gemm_gelu<T>(false, true, block_rows, out, in, rows, weight_->value.data(),
                                         bias_ ? bias_->value.data() : nullptr, pre.data() + at, y.data() + at);
      }, detail::overlap_gathers_whole(ctx));
    } else {
      saved.input = full_input(ctx, x);
      y = detail::linear_forward_gelu(ctx.device, saved.input, *weight_, bias_ ? &*bias_ : nullptr, pre,
                                      "ColumnParallelLinear");
    }
    return {Act<layout::sharded<-1>>(std::move(y)), std::move(pre), std::move(saved)};
  }

  // With `deferred`, the weight gradients are appended to it instead (a split backward).
  //
  // With ctx.tp_comm_overlap over more than one rank, the input gradient is computed first and its
  // reduction (all-reduce, or reduce-scatter under sequence parallelism) is issued on the
  // communicator's overlapped handle, so on NCCL it runs on the communication stream while the
  // compute stream accumulates weight gradients, which do not depend on it; the compute stream
  // joins it before the result is returned. Those weight gradients are this layer's own, or with an `at_collectives` list
  // (DeferredWeightGradients) the list's (earlier layers'), this layer's own then appended to it.
  // The operations and their operands are the same as without overlap, so are the bits (an
  // in-process communicator has finished each collective when it returns).
  // With `given_dy` (fp8_grad_state's layer: dy's codes made by what produced dy), the GEMMs take
  // those codes and dy serves for its shape alone.
  template <class Layout>
  Act<input_layout> backward(Context& ctx, const Saved& saved, const Act<Layout>& dy, DeferredWeightGradients* deferred = nullptr,
                             detail::Fp8Pair<Space>* given_dy = nullptr) {
    expect_layout<output_layout, Layout>();
    Tensor<T, Space> dy_local;
    if constexpr (Options.gather_output) dy_local = gather_from_tensor_parallel_backward(ctx.device, ctx.tp, dy).tensor;
    else dy_local = dy.tensor;  // shared, read only
    if (given_dy && !fp8_grad_state(ctx))
      fail<Error>("ColumnParallelLinear: output-gradient codes given to a layer that does not take them (fp8_grad_state)");
    if (fp8_)
      return reduce_input_gradient(
          ctx, Act<layout::partial>(fp8_backward(ctx, saved, dy_local, deferred, given_dy)));
    if (ctx.tp.size() == 1 || !ctx.tp_comm_overlap || (deferred && !deferred->runs_at_collectives()))
      return reduce_input_gradient(
          ctx, Act<layout::partial>(detail::linear_backward(ctx.device, saved.input, dy_local, *weight_,
                                                            bias_ ? &*bias_ : nullptr, nullptr, deferred)));
    DeferredWeightGradients mine;
    Act<layout::partial> dx(
        detail::linear_backward(ctx.device, saved.input, dy_local, *weight_, bias_ ? &*bias_ : nullptr, nullptr, &mine));
    Comm comm = overlapped_handle(ctx.tp);
    Act<input_layout> reduced = reduce_input_gradient_on(ctx, comm, dx);  // dx stays alive until the join
    const std::uint64_t mark = overlapped_mark(comm);
    {
      detail::gemms_beside_communication beside(ctx.device);
      (deferred ? *deferred : mine).run();
    }
    join_overlapped(ctx.tp, mark);
    if (deferred) deferred->append(std::move(mine));
    return reduced;
  }

  // backward() with the output gradient dy gelu'(pre) (an MLP's fc1, whose output pre went through
  // a GELU): where the output gradient's cast can make it itself (fp8_fuses_casts), it is never
  // written; otherwise the GELU backward runs first (backend gelu_backward). With `activation` (where
  // the cast makes it), that cast also writes the codes of gelu(pre)^T there (the next layer's input
  // codes left for later: RowParallelLinear::fp8_input_codes_later).
  template <class Layout>
  Act<input_layout> backward_gelu_of(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Tensor<T, Space>& pre,
                                     DeferredWeightGradients* deferred = nullptr, const Fp8Output& activation = {})
    requires(!Options.gather_output)
  {
    check_same_shape(dy.shape(), pre.shape(), "ColumnParallelLinear::backward_gelu_of");
    return backward_produced(ctx, saved, dy, pre, Fp8Producer::gelu_backward, deferred, activation, [&](T* dh) {
      ctx.device.template gelu_backward<T>(dy.data(), pre.data(), pre.numel(), dh);
    });
  }
  // backward() with the output gradient SwiGLU's backward of dy at pre = [gate | up] (an MLP's gated
  // fc1; dy [.., f], pre [.., 2f]), as backward_gelu_of: made by the output gradient's cast where it
  // can, else by the backend's swiglu_backward first.
  template <class Layout>
  Act<input_layout> backward_swiglu_of(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Tensor<T, Space>& pre,
                                       DeferredWeightGradients* deferred = nullptr, const Fp8Output& activation = {})
    requires(!Options.gather_output)
  {
    check_same_shape(dy.shape().with(-1, 2 * dy.shape().cols()), pre.shape(), "ColumnParallelLinear::backward_swiglu_of");
    return backward_produced(ctx, saved, dy, pre, Fp8Producer::swiglu_backward, deferred, activation, [&](T* dh) {
      ctx.device.template swiglu_backward<T>(dy.data(), pre.data(), pre.shape().rows(), dy.shape().cols(), dh);
    });
  }
  // Whether this layer's FP8 casts take what produces their tensor (a GELU or SwiGLU, or their
  // backward) into the same pass (fp8_casts_take_producers).
  bool fp8_fuses_casts(const Context& ctx) const { return fp8_casts_take_producers(ctx, fp8_); }
  // The FP8 state whose input role a producer of this layer's input may write codes for (a norm:
  // TransformerLayer), handing them to forward(ctx, x, &given): under the delayed recipe with
  // Fp8Options::norm_writes_codes, where the backend transposes codes; else null (forward casts x).
  // The codes: this rank's rows, all-gathered over tp under sequence parallelism (fp8_input_of).
  Fp8State<Space>* fp8_input_state(const Context& ctx) const {
    if constexpr (detail::backend_has_fp8_transpose<typename Policy::backend>)
      if (fp8_fuses_casts(ctx) && ctx.fp8->options.norm_writes_codes) return fp8_.get();
    return nullptr;
  }
  // The FP8 state whose output-gradient role a producer of dy may write codes for (the attention's
  // merge of dq, dk, dv), handing them to backward(ctx, saved, dy, deferred, &given_dy): under the
  // delayed recipe with Fp8Options::attention_writes_grad_codes, without a bias (whose gradient the
  // cast sums) and without gather_output; else null (backward casts dy). fp8_output_gradient_of
  // makes the pair.
  Fp8State<Space>* fp8_grad_state(const Context& ctx) const {
    if constexpr (detail::backend_has_fp8_transpose<typename Policy::backend> && !Options.gather_output)
      if (fp8_fuses_casts(ctx) && ctx.fp8->options.attention_writes_grad_codes && !bias_) return fp8_.get();
    return nullptr;
  }
  template <class Write>
  detail::Fp8Pair<Space> fp8_output_gradient_of(Context& ctx, const Shape& dy, Write&& write) const {
    return codes_of(ctx, fp8_grad_state(ctx), dy, weight_->value.size(0), /*gather=*/false, Fp8Role::grad_output,
                    std::forward<Write>(write));
  }
  // The input pair of forward(ctx, x, &given) for x [rows, in] (this rank's rows), whose codes
  // `write(Fp8Output)` writes with the state's input scale and amax (fp8_input_state non-null).
  template <class Write>
  detail::Fp8Pair<Space> fp8_input_of(Context& ctx, const Shape& x, Write&& write) const {
    return codes_of(ctx, fp8_input_state(ctx), x, weight_->value.size(1), sequence_parallel && ctx.tp.size() > 1,
                    Fp8Role::input, std::forward<Write>(write));
  }
  // The pieces of forward and backward, for a caller that runs the matmul over blocks of rows itself
  // (the chunked classifier, layers/chunked_classifier.hpp): the full-sequence input (all-gathered
  // under sequence parallelism; otherwise x's tensor, shared), the matmul of `rows` rows of it
  // (y = x W^T (+ b), and its backward, which accumulates dW and db and writes dx), and the
  // reduction of the partial input gradient to the input layout (reduce-scatter under sequence
  // parallelism, all-reduce otherwise; `dx` is the caller's own tensor, reduced in place).
  template <class Layout>
  Tensor<T, Space> full_input(Context& ctx, const Act<Layout>& x) const {
    expect_layout<input_layout, Layout>();
    if constexpr (sequence_parallel) return gather_from_sequence_parallel(ctx.device, ctx.tp, x).tensor;
    else return x.tensor;  // shared, read only
  }
  void forward_rows(Context& ctx, const T* input, index_t rows, T* y) const {
    detail::linear_forward_rows(ctx.device, input, rows, *weight_, Options.skip_bias_add || !bias_ ? nullptr : &*bias_, y);
  }
  void backward_rows(Context& ctx, const T* input, const T* dy, index_t rows, T* dx) {
    detail::linear_backward_rows(ctx.device, input, dy, rows, *weight_, bias_ ? &*bias_ : nullptr, dx);
  }
  Act<input_layout> reduce_input_gradient(Context& ctx, Act<layout::partial> dx) const {
    return reduce_input_gradient_on(ctx, ctx.tp, dx);
  }

  void init(Context& ctx, std::uint64_t seed, double stddev) {
    if (owned_weight_) init_normal(ctx.device, *owned_weight_, seed, stddev);
    if (bias_) init_constant(ctx.device, *bias_, 0.0);
    if (fp8_) fp8_->drop_weight_cache();  // new weights: cast again at the next use
  }

  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    if (owned_weight_) visit(*owned_weight_);
    if (bias_) visit(*bias_);
  }

  Param& weight() { return *weight_; }
  const Param& weight() const { return *weight_; }
  Param* bias() { return bias_ ? &*bias_ : nullptr; }
  // The FP8 scaling state (null when the GEMMs run in T).
  const std::shared_ptr<Fp8State<Space>>& fp8_state() const { return fp8_; }

 private:
  // The input is the full sequence, replicated over tp; the weight and the output gradient are split.
  static constexpr detail::Fp8Sharding fp8_sharding() { return {false, true}; }
  // The codes pair a producer of the input (role input) or of the output gradient (grad_output)
  // writes for this layer: `state` from fp8_input_state / fp8_grad_state (null: refused), `width` the
  // weight's dimension the tensor's columns must match, counted in the state for the tests.
  template <class Write>
  detail::Fp8Pair<Space> codes_of(Context& ctx, Fp8State<Space>* state, const Shape& tensor, index_t width, bool gather,
                                   Fp8Role role, Write&& write) const {
    const bool input = role == Fp8Role::input;
    if (!state)
      fail<Error>("ColumnParallelLinear: ", input ? "input" : "output-gradient", " codes asked of a layer that takes none (",
                  input ? "fp8_input_state" : "fp8_grad_state", " is null)");
    if (tensor.cols() != width)
      fail<ShapeError>("ColumnParallelLinear: ", input ? "input" : "output-gradient", " codes of ", tensor.str(),
                       " for a weight of ", weight_->value.shape().str());
    ++(input ? state->inputs_written : state->grads_written);
    if constexpr (detail::backend_has_fp8_transpose<typename Policy::backend>)
      return detail::fp8_pair_of_rows(ctx, *state, tensor, gather, state->amax(role), std::forward<Write>(write), role);
    else
      return {};
  }
  // (A backend without FP8 never has a state here: make_fp8_state refuses it.)
  // The backward of an output gradient that `producer` makes from dy and pre: inside the output
  // gradient's FP8 cast where it can (fp8_fuses_casts), else `unfused(dh)` writes it [pre's shape] first.
  template <class Layout, class Unfused>
  Act<input_layout> backward_produced(Context& ctx, const Saved& saved, const Act<Layout>& dy, const Tensor<T, Space>& pre,
                                      Fp8Producer producer, DeferredWeightGradients* deferred, const Fp8Output& activation,
                                      Unfused&& unfused) {
    expect_layout<output_layout, Layout>();
    if constexpr (fp8_backend) {
      if (fp8_fuses_casts(ctx))
        return reduce_input_gradient(
            ctx, Act<layout::partial>(detail::fp8_linear_backward(ctx, fp8_, fp8_sharding(), saved.input, saved.fp8_input,
                                                                  dy.tensor, *weight_, bias_ ? &*bias_ : nullptr, nullptr,
                                                                  deferred, producer, &pre, static_cast<detail::Fp8Pair<Space>*>(nullptr),
                                                                  activation)));
    }
    if (activation.codes)
      fail<Error>("ColumnParallelLinear: activation codes asked of a backward whose output-gradient cast does not make the "
                  "activation's gradient (fp8_fuses_casts is false)");
    Act<layout::sharded<-1>> dh(Tensor<T, Space>::empty(pre.shape()));
    unfused(dh.data());
    return backward(ctx, saved, dh, deferred);
  }
  static constexpr bool fp8_backend = backend_has_fp8<typename Policy::backend>;
  // y = input W^T (+ bias) of the full-sequence input, returned; with gelu_out, also gelu(y) into
  // gelu_out (same shape). The saved input: x^T's codes for the per-tensor recipes, else the input.
  // Under sequence parallelism over several ranks with a per-tensor recipe, x's own rows are cast and
  // the codes gathered (detail::fp8_quantize_gathered); the input in T is never gathered.
  template <class Layout>
  Tensor<T, Space> fp8_forward(Context& ctx, const Act<Layout>& x, const Param* bias, Saved& saved, T* gelu_out = nullptr,
                               detail::Fp8Pair<Space>* given = nullptr) const {
    if constexpr (fp8_backend) {
      if (given) {  // the input's codes, made by its producer (fp8_input_of)
        expect_layout<input_layout, Layout>();
        const Shape shape = given->shape;
        auto y = Tensor<T, Space>::empty(shape.with(-1, weight_->value.size(0)));  // (rows, out)
        detail::fp8_linear_forward_rows(ctx, *fp8_, fp8_sharding(), static_cast<const T*>(nullptr), shape.rows(), *weight_,
                                        bias, y.data(), saved.fp8_input, gelu_out, Fp8Producer::copy, given);
        saved.fp8_input.shape = shape;
        return y;
      }
      if constexpr (sequence_parallel && detail::backend_has_fp8_transpose<typename Policy::backend>) {
        if (ctx.tp.size() > 1 && ctx.fp8->options.recipe != Fp8RecipeKind::blockwise) {
          expect_layout<input_layout, Layout>();
          detail::check_linear_input(x.tensor.shape(), *weight_, "ColumnParallelLinear");
          detail::Fp8Pair<Space> codes = detail::fp8_quantize_gathered(ctx, *fp8_, x.tensor);
          return fp8_forward(ctx, x, bias, saved, gelu_out, &codes);
        }
      }
      saved.input = full_input(ctx, x);
      detail::check_linear_input(saved.input.shape(), *weight_, "ColumnParallelLinear");
      auto y = Tensor<T, Space>::empty(saved.input.shape().with(-1, weight_->value.size(0)));  // (rows, out)
      detail::fp8_linear_forward_rows(ctx, *fp8_, fp8_sharding(), saved.input.data(), saved.input.shape().rows(), *weight_,
                                      bias, y.data(), saved.fp8_input, gelu_out);
      if (!saved.fp8_input.empty()) {
        saved.fp8_input.shape = saved.input.shape();
        saved.input = Tensor<T, Space>();
      }
      return y;
    } else {
      return Tensor<T, Space>();
    }
  }
  Tensor<T, Space> fp8_backward(Context& ctx, const Saved& saved, const Tensor<T, Space>& dy, DeferredWeightGradients* deferred,
                                detail::Fp8Pair<Space>* given_dy = nullptr) {
    if constexpr (fp8_backend)
      return detail::fp8_linear_backward(ctx, fp8_, fp8_sharding(), saved.input, saved.fp8_input, dy, *weight_,
                                         bias_ ? &*bias_ : nullptr, nullptr, deferred, Fp8Producer::copy, nullptr, given_dy);
    else
      return Tensor<T, Space>();
  }

  // Whether forward gathers its input as a ring beside the GEMMs (see forward).
  bool ring_gathers(const Context& ctx) const {
    return sequence_parallel && ctx.tp_comm_overlap && ctx.tp_comm_overlap_ag && ctx.tp.size() > 1;
  }
  // The output [s, b, out/tp] of a forward whose sequence-sharded input x [s/tp, b, in] is gathered
  // by the ring, after the checks linear_forward makes.
  template <class Layout>
  Tensor<T, Space> output_of_gathered(const Context& ctx, const Act<Layout>& x) const {
    expect_layout<input_layout, Layout>();
    detail::check_linear_input(x.tensor.shape(), *weight_, "ColumnParallelLinear");
    return Tensor<T, Space>::empty(
        x.tensor.shape().with(0, x.tensor.size(0) * ctx.tp.size()).with(-1, weight_->value.size(0)));
  }

  // The reduction on `tp` (the group's handle, or its overlapped one); without sequence parallelism
  // dx's storage is reduced in place and returned.
  Act<input_layout> reduce_input_gradient_on(Context& ctx, Comm& tp, Act<layout::partial>& dx) const {
    if constexpr (sequence_parallel) return gather_from_sequence_parallel_backward(ctx.device, tp, dx);
    else return copy_to_tensor_parallel_backward(tp, Act<layout::partial>(dx.tensor));
  }

  static void check_gather(int stacks) {
    if (Options.gather_output && stacks != 1)
      fail<ConfigError>("ColumnParallelLinear: gather_output needs stacks == 1 (got ", stacks,
                        "); gather each block's output separately instead");
  }

  std::optional<Param> owned_weight_;
  std::optional<Param> bias_;
  Param* weight_ = nullptr;
  std::shared_ptr<Fp8State<Space>> fp8_;
};

STRATA_NAMESPACE_END
