// strata/layers/fp8_linear.hpp: the three GEMMs of a parallel linear layer in FP8, and the step
// update of every layer's scaling state.
//
//   forward  y[rows, out]  = x[rows, in] W[out, in]^T        x, W in the forward format (E4M3)
//   dgrad    dx[rows, in]  = dy[rows, out] W[out, in]        dy in the gradient format (E5M2 hybrid)
//   wgrad    dW[out, in]  += dy^T x                          (accumulated in accumulate_t<T>)
//
// Each operand is cast to FP8 with its role's scale (backend fp8_cast, which folds the amax into
// the role's history[0] under the delayed recipe), and the GEMM (backend fp8_gemm) multiplies the
// codes and applies both inverse scales to the sum. Bias, GELU and everything else stay in T.
//
// Scales agree across ranks. Tensorwise: a tensor's amax is taken now and all-reduced (max) over
// the ranks that hold pieces of it -- the tensor-parallel group for a sharded weight, tp x cp for a
// sharded or sequence-split activation or gradient -- before the scale is derived. Delayed: the
// amaxes of a step stay local until fp8_after_optimizer_step, which reduces every state over the
// ranks of the pipeline stage (tp x cp x dp, Megatron's amax reduction group) and rolls the
// histories. So a sharded run casts with the unsharded run's scales, code for code.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/fp8_recipe.hpp"
#include "../core/tensor.hpp"
#include "deferred_weight_gradients.hpp"
#include "parameter.hpp"

STRATA_NAMESPACE_BEGIN

// Whether a backend has the FP8 entry points (docs/DEVICE.md): cpu::backend and cuda::backend do;
// a backend without them still runs every layer, and refuses ctx.fp8 when a layer is built.
template <class Device>
concept backend_has_fp8 = requires(Device& d, const float* x, float* f, std::uint8_t* q, const std::uint8_t* codes, index_t n,
                                   Fp8UpdateArgs args) {
  d.template fp8_amax<float>(x, n, f);
  d.template fp8_cast<float>(x, n, Fp8Format::e4m3, x, q, f);
  d.template fp8_cast_transpose<float>(x, n, n, Fp8Format::e4m3, x, q, q, f);
  d.template fp8_gemm<float>(false, true, n, n, n, codes, Fp8Format::e4m3, x, codes, Fp8Format::e4m3, x, f, false);
  d.fp8_update_scale(f, 1.0f, args);
};

// A new scaling state for the linear layer `name`, registered in ctx.fp8, when the layer is built
// where FP8 runs (ctx.fp8 set and fp8_here()); else null. Rows start as history 0, scale 1.
template <class Context>
std::shared_ptr<Fp8State<typename Context::space>> make_fp8_state(const Context& ctx, const std::string& name) {
  using Space = typename Context::space;
  if (!ctx.fp8 || !ctx.fp8->fp8_here()) return nullptr;
  if constexpr (!backend_has_fp8<typename Context::device_type>)
    fail<ConfigError>("the linear layer ", name, " is built for FP8 (ctx.fp8), but this backend has no FP8 entry points "
                      "(fp8_cast, fp8_gemm, ...: docs/DEVICE.md); leave ctx.fp8 unset");
  auto state = std::make_shared<Fp8State<Space>>();
  state->name = name;
  state->history = ctx.fp8->options.history();
  const index_t length = state->row_length();
  std::vector<float> initial(static_cast<std::size_t>(kFp8Roles * length), 0.0f);
  for (int r = 0; r < kFp8Roles; ++r) initial[r * length + state->history] = initial[r * length + state->history + 1] = 1.0f;
  state->rows = Tensor<float, Space>::empty(Shape{kFp8Roles, length});
  auto& device = const_cast<Context&>(ctx).device;  // an upload; the backend object is per rank
  device.template copy_from_host<float>(initial.data(), static_cast<index_t>(initial.size()), state->rows.data());
  ctx.fp8->states.push_back(state);
  return state;
}

namespace detail {

// Which tensors of a layer hold pieces on different tensor-parallel ranks (for tensorwise amaxes).
struct Fp8Sharding {
  bool input = false;
  bool grad_output = false;
};

template <class Space>
struct Fp8Operand {
  Tensor<std::uint8_t, Space> codes;
  Fp8Format format;
  const float* scale_inv;
};

// Casts x [rows, cols] for `role` (see the design note for where the amax goes): the codes in x's
// layout, or (transposed) the codes of x^T [cols, rows] in one pass (fp8_cast_transpose), which is
// how the gradient GEMMs get the "TN" operands cuBLASLt's FP8 GEMMs take.
template <class Context, class T>
Fp8Operand<typename Context::space> fp8_quantize(Context& ctx, Fp8State<typename Context::space>& state, Fp8Role role,
                                                  const T* x, index_t rows, index_t cols, bool sharded, bool transposed = false) {
  using Space = typename Context::space;
  const Fp8Options& options = ctx.fp8->options;
  const Fp8Format format = options.format_of(role);
  auto codes = Tensor<std::uint8_t, Space>::empty(transposed ? Shape{cols, rows} : Shape{rows, cols});
  float* amax = state.amax(role);
  if (options.recipe == Fp8RecipeKind::tensorwise) {
    float* row = state.row(role);
    ctx.device.template fill<float>(row, 1, 0.0);
    ctx.device.template fp8_amax<T>(x, rows * cols, row);
    auto now = Tensor<float, Space>::alias(state.rows, row - state.rows.data(), Shape{1});
    if (role == Fp8Role::weight) {
      if (ctx.tp.size() > 1) ctx.tp.all_reduce(now.buffer(), ReduceOp::max);
    } else if (ctx.tp_cp.size() > 1 && (sharded || ctx.cp.size() > 1)) {
      ctx.tp_cp.all_reduce(now.buffer(), ReduceOp::max);
    }
    ctx.device.fp8_update_scale(row, fp8_max(format), Fp8UpdateArgs{1, Fp8AmaxAlgo::most_recent, 0, false});
    amax = nullptr;  // taken above
  }
  if (transposed)
    ctx.device.template fp8_cast_transpose<T>(x, rows, cols, format, state.scale(role), nullptr, codes.data(), amax);
  else
    ctx.device.template fp8_cast<T>(x, rows * cols, format, state.scale(role), codes.data(), amax);
  return {std::move(codes), format, state.scale_inv(role)};
}

// y[rows, out] = x W^T (+ b): the forward GEMM in FP8 (TN as it is), the bias added in T.
template <class Context, class T, class Space>
void fp8_linear_forward_rows(Context& ctx, Fp8State<Space>& state, Fp8Sharding sharding, const T* x, index_t rows,
                             const Parameter<T, Space>& weight, const Parameter<T, Space>* bias, T* y) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  auto xq = fp8_quantize(ctx, state, Fp8Role::input, x, rows, in, sharding.input);
  auto wq = fp8_quantize(ctx, state, Fp8Role::weight, weight.value.data(), out, in, true);
  ctx.device.template fp8_gemm<T>(false, true, rows, out, in, xq.codes.data(), xq.format, xq.scale_inv, wq.codes.data(),
                                  wq.format, wq.scale_inv, y, false);  // (rows, out)
  if (bias) ctx.device.template bias_add<T>(y, bias->value.data(), rows, out);
}

// dx[rows, in] = dy W = dy (W^T)^T: W cast transposed, times gelu'(gelu_pre) when given.
template <class Context, class T, class Space>
void fp8_linear_input_gradient_rows(Context& ctx, Fp8State<Space>& state, Fp8Sharding sharding, const T* dy, index_t rows,
                                    const Parameter<T, Space>& weight, T* dx, const T* gelu_pre = nullptr) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  auto dyq = fp8_quantize(ctx, state, Fp8Role::grad_output, dy, rows, out, sharding.grad_output);
  auto wtq = fp8_quantize(ctx, state, Fp8Role::weight, weight.value.data(), out, in, true, /*transposed=*/true);  // (in, out)
  ctx.device.template fp8_gemm<T>(false, true, rows, in, out, dyq.codes.data(), dyq.format, dyq.scale_inv, wtq.codes.data(),
                                  wtq.format, wtq.scale_inv, dx, false);  // (rows, in)
  if (gelu_pre) ctx.device.template gelu_backward<T>(dx, gelu_pre, rows * in, dx);
}

// dW[out, in] += dy^T x = (dy^T) (x^T)^T, both cast transposed (written when the gradient is
// stale), db += column sums of dy.
template <class Context, class T, class Space>
void fp8_linear_weight_gradient_rows(Context& ctx, Fp8State<Space>& state, Fp8Sharding sharding, const T* x, const T* dy,
                                     index_t rows, Parameter<T, Space>& weight, Parameter<T, Space>* bias) {
  using A = accumulate_t<T>;
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  auto dytq = fp8_quantize(ctx, state, Fp8Role::grad_output, dy, rows, out, sharding.grad_output, true);  // (out, rows)
  auto xtq = fp8_quantize(ctx, state, Fp8Role::input, x, rows, in, sharding.input, true);                 // (in, rows)
  const bool overwrite = std::exchange(weight.grad_stale, false);
  ctx.device.template fp8_gemm<A>(false, true, out, in, rows, dytq.codes.data(), dytq.format, dytq.scale_inv, xtq.codes.data(),
                                  xtq.format, xtq.scale_inv, weight.grad.data(), !overwrite);  // (out, in)
  if (bias) ctx.device.template bias_grad<T>(dy, rows, out, bias->grad.data());
}

// The layer's backward in FP8: dx written (times gelu'(gelu_pre) when given), dW and db accumulated
// now, or appended to `deferred` (the closure keeps x, dy and ctx, which must outlive it).
template <class Context, class T, class Space>
Tensor<T, Space> fp8_linear_backward(Context& ctx, const std::shared_ptr<Fp8State<Space>>& state, Fp8Sharding sharding,
                                     const Tensor<T, Space>& x, const Tensor<T, Space>& dy, Parameter<T, Space>& weight,
                                     Parameter<T, Space>* bias, const std::type_identity_t<Tensor<T, Space>>* gelu_pre,
                                     DeferredWeightGradients* deferred) {
  const index_t out = weight.value.size(0), rows = x.shape().rows();
  if (dy.shape().rows() != rows || dy.shape().cols() != out)
    fail<ShapeError>("linear backward (FP8): output gradient ", dy.shape().str(), " does not match ", rows, " rows of ", out,
                     " features");
  auto dx = Tensor<T, Space>::empty(x.shape());  // (rows, in)
  fp8_linear_input_gradient_rows(ctx, *state, sharding, dy.data(), rows, weight, dx.data(),
                                 gelu_pre ? gelu_pre->data() : nullptr);
  if (deferred)
    deferred->add([&ctx, state, sharding, x, dy, rows, &weight, bias] {
      fp8_linear_weight_gradient_rows(ctx, *state, sharding, x.data(), dy.data(), rows, weight, bias);
    });
  else
    fp8_linear_weight_gradient_rows(ctx, *state, sharding, x.data(), dy.data(), rows, weight, bias);
  return dx;
}

}  // namespace detail

// After each optimizer step (delayed recipe; nothing otherwise): every FP8 state of this rank, in
// construction order, is all-reduced (max) over ctx.tp_cp_dp, then each role's scale is updated
// from its amax history and the history rolled (core/fp8_recipe.hpp). Collective over tp_cp_dp.
template <class Context>
void fp8_after_optimizer_step(Context& ctx) {
  if constexpr (!backend_has_fp8<typename Context::device_type>) return;  // no layer holds a state (make_fp8_state)
  if (!ctx.fp8 || ctx.fp8->options.recipe != Fp8RecipeKind::delayed) return;
  const Fp8Options& options = ctx.fp8->options;
  for (auto& state : ctx.fp8->states) {
    if (ctx.tp_cp_dp.size() > 1) ctx.tp_cp_dp.all_reduce(state->rows.buffer(), ReduceOp::max);
    for (int r = 0; r < kFp8Roles; ++r) {
      const auto role = static_cast<Fp8Role>(r);
      ctx.device.fp8_update_scale(state->row(role), fp8_max(options.format_of(role)),
                                  Fp8UpdateArgs{state->history, options.amax_compute_algo, options.margin, true});
    }
  }
}

STRATA_NAMESPACE_END
