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
// The blockwise recipe casts each operand in blocks along the GEMM's inner dimension (backend
// fp8_cast_blocks: x and dy in runs of B along their rows for the forward and the input gradient,
// along their columns, transposed, for the weight gradient; fp8_cast_tiles: W in B x B tiles, both
// layouts) and multiplies with fp8_gemm_blocks; its scales need no state and no collective.
// The weight is cast once per optimizer step, both layouts in one pass (the weight cache,
// core/fp8_recipe.hpp), and read from there by every forward and input gradient of the step;
// fp8_after_optimizer_step drops the caches, and fp8_drop_weight_caches does for any other write.
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
  d.template fp8_cast_transpose_fused<float>(Fp8Producer::gelu, x, x, n, n, Fp8Format::e4m3, x, q, q, f, f);
  d.template fp8_gemm<float>(false, true, n, n, n, codes, Fp8Format::e4m3, x, codes, Fp8Format::e4m3, x, f, false, x);
  d.template fp8_gemm_gelu<float>(n, n, n, codes, Fp8Format::e4m3, x, codes, Fp8Format::e4m3, x, x, f, f);
  d.template fp8_gemm_gelu_backward<float>(n, n, n, codes, Fp8Format::e4m3, x, codes, Fp8Format::e4m3, x, x, f);
  d.fp8_update_scale(f, 1.0f, args);
};

// A backend whose FP8 GEMM can add a tensor of the output's shape in its epilogue (cuda::backend):
// fp8_gemm_add(m, n, k, a, fa, a_scale_inv, b, fb, b_scale_inv, bias, addend, out, accumulation)
// writes out = product (+ bias) + addend (TN). Elsewhere the product and the add are two steps.
template <class Device, class C>
concept has_fp8_gemm_add = requires(Device& d, const std::uint8_t* codes, const float* s, const C* ct, C* t, index_t n) {
  d.template fp8_gemm_add<C>(n, n, n, codes, Fp8Format::e4m3, s, codes, Fp8Format::e4m3, s, ct, ct, t, Fp8Accumulation::split);
};

// Whether a backend has the blockwise recipe's entry points (docs/DEVICE.md).
template <class Device>
concept backend_has_fp8_blocks = requires(Device& d, const float* x, float* f, std::uint8_t* q, const std::uint8_t* codes,
                                          index_t n) {
  d.template fp8_cast_blocks<float>(x, n, n, Fp8Format::e4m3, n, q, f, q, f);
  d.template fp8_cast_tiles<float>(x, n, n, Fp8Format::e4m3, n, q, q, f, f);
  d.template fp8_gemm_blocks<float>(n, n, n, codes, Fp8Format::e4m3, x, false, codes, Fp8Format::e4m3, x, true, n, f, false);
};

// The blockwise recipe under tensor parallelism: a block must not straddle two ranks' shards, so that
// a sharded run casts the unsharded run's blocks. `local` is the length of this rank's part of the
// sharded dimension (of each stack, for stacked weights); a ConfigError names the layer otherwise.
template <class Context>
void check_fp8_block_shard(const Context& ctx, const std::string& name, const char* what, index_t local) {
  if (!ctx.fp8 || !ctx.fp8->fp8_here() || ctx.fp8->options.recipe != Fp8RecipeKind::blockwise || ctx.tp.size() == 1) return;
  const index_t block = ctx.fp8->options.block;
  if (local % block != 0)
    fail<ConfigError>("--fp8-recipe blockwise: the linear layer ", name, " gives each of the tp=", ctx.tp.size(), " ranks ",
                      local, " ", what, ", not whole blocks of ", block,
                      ", so a block would straddle two ranks; choose sizes whose shards are multiples of ", block,
                      ", another tp, or --fp8-recipe delayed or tensorwise");
}

// A new scaling state for the linear layer `name`, registered in ctx.fp8, when the layer is built
// where FP8 runs (ctx.fp8 set and fp8_here()); else null. Rows start as history 0, scale 1.
template <class Context>
std::shared_ptr<Fp8State<typename Context::space>> make_fp8_state(const Context& ctx, const std::string& name) {
  using Space = typename Context::space;
  if (!ctx.fp8 || !ctx.fp8->fp8_here()) return nullptr;
  if constexpr (!backend_has_fp8<typename Context::device_type>)
    fail<ConfigError>("the linear layer ", name, " is built for FP8 (ctx.fp8), but this backend has no FP8 entry points "
                      "(fp8_cast, fp8_gemm, ...: docs/DEVICE.md); leave ctx.fp8 unset");
  if constexpr (!backend_has_fp8_blocks<typename Context::device_type>)
    if (ctx.fp8->options.recipe == Fp8RecipeKind::blockwise)
      fail<ConfigError>("the linear layer ", name, " is built for the blockwise FP8 recipe, but this backend has no "
                        "block-scaled entry points (fp8_cast_blocks, fp8_gemm_blocks: docs/DEVICE.md); use --fp8-recipe "
                        "delayed or tensorwise");
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

// Whether a layer's FP8 casts can take what produces their tensor (a GELU, its backward) into the
// same pass: the layer runs FP8 (`state`) under the delayed recipe, whose scale is known before the
// tensor exists.
template <class Context, class Space>
bool fp8_casts_take_producers(const Context& ctx, const std::shared_ptr<Fp8State<Space>>& state) {
  return state && ctx.fp8 && ctx.fp8->options.recipe == Fp8RecipeKind::delayed;
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

// Makes `role`'s scale ready for a cast of x (n elements) and returns where the cast folds its
// amax: tensorwise takes the amax now, reduces it (max) over the ranks that hold pieces of the
// tensor and derives the scale (nothing left to fold: null); delayed folds into history[0].
template <class Context, class T>
float* fp8_prepare_scale(Context& ctx, Fp8State<typename Context::space>& state, Fp8Role role, const T* x, index_t n,
                         bool sharded) {
  using Space = typename Context::space;
  const Fp8Options& options = ctx.fp8->options;
  if (options.recipe != Fp8RecipeKind::tensorwise) return state.amax(role);
  float* row = state.row(role);
  ctx.device.template fill<float>(row, 1, 0.0);
  ctx.device.template fp8_amax<T>(x, n, row);
  auto now = Tensor<float, Space>::alias(state.rows, row - state.rows.data(), Shape{1});
  if (role == Fp8Role::weight) {
    if (ctx.tp.size() > 1) ctx.tp.all_reduce(now.buffer(), ReduceOp::max);
  } else if (ctx.tp_cp.size() > 1 && (sharded || ctx.cp.size() > 1)) {
    ctx.tp_cp.all_reduce(now.buffer(), ReduceOp::max);
  }
  ctx.device.fp8_update_scale(row, fp8_max(options.format_of(role)), Fp8UpdateArgs{1, Fp8AmaxAlgo::most_recent, 0, false});
  return nullptr;
}

// Casts x [rows, cols] for `role` (see the design note for where the amax goes): the codes in x's
// layout, or (transposed) the codes of x^T [cols, rows] in one pass (fp8_cast_transpose), which is
// how the gradient GEMMs get the "TN" operands cuBLASLt's FP8 GEMMs take.
template <class Context, class T>
Fp8Operand<typename Context::space> fp8_quantize(Context& ctx, Fp8State<typename Context::space>& state, Fp8Role role,
                                                  const T* x, index_t rows, index_t cols, bool sharded, bool transposed = false) {
  using Space = typename Context::space;
  const Fp8Format format = ctx.fp8->options.format_of(role);
  auto codes = Tensor<std::uint8_t, Space>::empty(transposed ? Shape{cols, rows} : Shape{rows, cols});
  float* amax = fp8_prepare_scale(ctx, state, role, x, rows * cols, sharded);
  if (transposed)
    ctx.device.template fp8_cast_transpose<T>(x, rows, cols, format, state.scale(role), nullptr, codes.data(), amax);
  else
    ctx.device.template fp8_cast<T>(x, rows * cols, format, state.scale(role), codes.data(), amax);
  if (role == Fp8Role::weight) ++state.weight_casts;
  return {std::move(codes), format, state.scale_inv(role)};
}

// A per-tensor operand cast once for two GEMMs: x's codes (unless not asked for) and x^T's in one
// pass (fp8_cast_transpose), and the 1/scale they were cast with. Under tensorwise that factor is
// copied aside: the role's row is rewritten by the next cast of the role, which may come before the
// second GEMM (another micro-batch's forward ahead of this one's backward, a deferred weight
// gradient). Under delayed the row's factor holds for the whole step and is used in place.
template <class Space>
struct Fp8Pair {
  Tensor<std::uint8_t, Space> codes, codes_t;  // x [rows, cols], x^T [cols, rows]
  Fp8Format format = Fp8Format::e4m3;
  const float* scale_inv = nullptr;
  Tensor<float, Space> owned_scale_inv;  // [1] (tensorwise)
  Shape shape;                           // x's
  // x^T's codes were not cast with x's (Fp8Options::activation_codes_in_backward): codes_t is
  // allocated in the backward and written by the cast of the producer's gradient before the weight
  // gradient reads it (RowParallelLinear::fp8_input_codes_later).
  bool codes_t_later = false;
  bool empty() const { return codes_t.data() == nullptr; }
};

// The 1/scale a pair's GEMMs read (see Fp8Pair): delayed with the weight cache, the aligned copy the
// cache's fill writes before the step's first GEMM (the factor holds for the whole step), so the GEMMs
// need no aligning copy of their own; tensorwise, a copy of the row's factor taken now; else the row's.
template <class Context>
void fp8_pair_scale_inv(Context& ctx, Fp8State<typename Context::space>& state, Fp8Role role,
                        Fp8Pair<typename Context::space>& q) {
  using Space = typename Context::space;
  const bool delayed_cached = ctx.fp8->options.recipe == Fp8RecipeKind::delayed && ctx.fp8->options.cache_weights;
  q.scale_inv = delayed_cached ? state.gemm_scale_inv(role) : state.scale_inv(role);
  if (ctx.fp8->options.recipe == Fp8RecipeKind::tensorwise) {
    q.owned_scale_inv = Tensor<float, Space>::empty(Shape{1});
    ctx.device.template copy<float>(q.scale_inv, 1, q.owned_scale_inv.data());
    q.scale_inv = q.owned_scale_inv.data();
  }
}

// With `producer` (delayed recipe only: the scale must be known before the values exist), the pair
// is cast from what it makes of x and pre (gelu(x), or x gelu'(pre)) in the same pass, and the
// values themselves are never written. With `column_sums` ([cols], written), also the column sums of
// the values cast (a bias gradient) from the same pass. Without `transposed` (a producer's plain
// codes alone), no x^T's codes: codes_t stays empty and codes_t_later is set. With `activation`
// (the backward producers), the cast also writes the forward activation's codes^T there.
template <class Context, class T>
Fp8Pair<typename Context::space> fp8_quantize_pair(Context& ctx, Fp8State<typename Context::space>& state, Fp8Role role,
                                                   const T* x, index_t rows, index_t cols, bool sharded, bool plain,
                                                   Fp8Producer producer = Fp8Producer::copy, const T* pre = nullptr,
                                                   accumulate_t<T>* column_sums = nullptr, const Fp8Output& activation = {},
                                                   bool transposed = true) {
  using Space = typename Context::space;
  if (producer != Fp8Producer::copy && ctx.fp8->options.recipe != Fp8RecipeKind::delayed)
    fail<Error>("fp8_quantize_pair: a cast fused with its producer needs the delayed recipe's scale (", state.name, ")");
  if (!transposed && (!plain || producer == Fp8Producer::copy))
    fail<Error>("fp8_quantize_pair: x^T's codes left for later are a producer's, beside x's own (", state.name, ")");
  Fp8Pair<Space> q;
  q.format = ctx.fp8->options.format_of(role);
  q.shape = Shape{rows, cols};
  if (plain) q.codes = Tensor<std::uint8_t, Space>::empty(Shape{rows, cols});
  if (transposed) q.codes_t = Tensor<std::uint8_t, Space>::empty(Shape{cols, rows});
  q.codes_t_later = !transposed;
  float* amax = fp8_prepare_scale(ctx, state, role, x, rows * cols, sharded);
  if (producer == Fp8Producer::copy && !column_sums)
    ctx.device.template fp8_cast_transpose<T>(x, rows, cols, q.format, state.scale(role), plain ? q.codes.data() : nullptr,
                                              q.codes_t.data(), amax);
  else
    ctx.device.template fp8_cast_transpose_fused<T>(producer, x, pre, rows, cols, q.format, state.scale(role),
                                                    plain ? q.codes.data() : nullptr, q.codes_t.data(), amax, column_sums,
                                                    activation);
  fp8_pair_scale_inv(ctx, state, role, q);
  return q;
}

// Whether a backend can transpose FP8 codes (fp8_transpose): then a sequence-parallel input is cast
// where it lives and its codes are gathered (fp8_quantize_gathered).
template <class Device>
concept backend_has_fp8_transpose = requires(Device& d, const std::uint8_t* in, std::uint8_t* out, index_t n) {
  d.fp8_transpose(in, n, n, out);
};

// The codes pair of a column-parallel layer's input rows [local rows, cols] (role input) or of its
// output gradient (role grad_output), which `write` writes as codes given an Fp8Output (the role's
// format and scale, where to write, and the amax to fold into); with `gather` (sequence parallelism
// over ctx.tp), each rank writes its own rows and the codes are all-gathered (one byte per element
// on the wire instead of T's). The transposed codes come from a transpose of the bytes. `amax`:
// fp8_prepare_scale's for these rows.
template <class Context, class Write>
Fp8Pair<typename Context::space> fp8_pair_of_rows(Context& ctx, Fp8State<typename Context::space>& state,
                                                  const Shape& local, bool gather, float* amax, Write&& write,
                                                  Fp8Role role = Fp8Role::input) {
  using Space = typename Context::space;
  const int ranks = gather ? ctx.tp.size() : 1;
  const index_t local_rows = local.rows(), cols = local.cols(), rows = local_rows * ranks;
  Fp8Pair<Space> q;
  q.format = ctx.fp8->options.format_of(role);
  q.shape = local.with(0, local[0] * ranks);
  q.codes = Tensor<std::uint8_t, Space>::empty(Shape{rows, cols});
  if (ranks > 1) {
    auto mine = Tensor<std::uint8_t, Space>::empty(Shape{local_rows, cols});
    write(Fp8Output{q.format, state.scale(role), mine.data(), amax});
    ctx.tp.all_gather(std::as_const(mine).buffer(), q.codes.buffer());
  } else {
    write(Fp8Output{q.format, state.scale(role), q.codes.data(), amax});
  }
  q.codes_t = Tensor<std::uint8_t, Space>::empty(Shape{cols, rows});
  ctx.device.fp8_transpose(q.codes.data(), rows, cols, q.codes_t.data());
  fp8_pair_scale_inv(ctx, state, role, q);
  return q;
}

// The input of a column-parallel layer under sequence parallelism, x [rows / tp, cols] on each rank
// of ctx.tp: each rank casts its own rows (tensorwise: with the amax reduced over tp x cp first), the
// codes are all-gathered, and x^T's codes come from a transpose of the gathered ones
// (fp8_pair_of_rows). The codes are those a cast of the gathered x makes.
template <class Context, class T>
Fp8Pair<typename Context::space> fp8_quantize_gathered(Context& ctx, Fp8State<typename Context::space>& state,
                                                       const Tensor<T, typename Context::space>& local) {
  const index_t n = local.numel();
  float* amax = fp8_prepare_scale(ctx, state, Fp8Role::input, local.data(), n, /*sharded=*/true);
  return fp8_pair_of_rows(ctx, state, local.shape(), /*gather=*/true, amax, [&](const Fp8Output& out) {
    ctx.device.template fp8_cast<T>(local.data(), n, out.format, out.scale, out.codes, out.amax);
  });
}

// A weight operand: codes in the layer's weight cache, or owned (cast for this GEMM alone).
template <class Space>
struct Fp8WeightOperand {
  const std::uint8_t* codes;
  Fp8Format format;
  const float* scale_inv;
  Tensor<std::uint8_t, Space> owned;  // the codes when not cached
};

// The weight's operand under the FP8 parameter gather, once the optimizer cast and gathered this
// step's codes (Fp8State::gathered_codes, [out, in]): W is those codes; W^T is made from them by a
// transpose of the bytes at the step's first use and kept in the weight cache, with every role's
// aligned 1 / scale (as the cache's own fill writes them). The codes are those the cache's cast of
// the weight's values would make: the same values, scale and rounding, cast where they were updated.
template <class Context>
Fp8WeightOperand<typename Context::space> fp8_gathered_weight(Context& ctx, Fp8State<typename Context::space>& state,
                                                              index_t out, index_t in, bool transposed) {
  using Space = typename Context::space;
  auto& cache = state.weight_cache;
  if (!cache.valid) {
    if (cache.codes_transposed.data() == nullptr || !(cache.codes_transposed.shape() == Shape{in, out}))
      cache.codes_transposed = Tensor<std::uint8_t, Space>::empty(Shape{in, out});
    cache.codes = Tensor<std::uint8_t, Space>();  // W is the gathered codes
    if constexpr (backend_has_fp8_transpose<typename Context::device_type>)
      ctx.device.fp8_transpose(state.gathered_codes, out, in, cache.codes_transposed.data());
    else
      fail<ConfigError>("the FP8 parameter gather needs a backend with fp8_transpose (docs/DEVICE.md)");
    ctx.device.template copy_columns<float>(state.scale_inv(Fp8Role::input), state.row_length(), kFp8Roles, 1,
                                            state.gemm_scale_inv(Fp8Role::input), 4);
    cache.valid = true;
  }
  return {transposed ? cache.codes_transposed.data() : state.gathered_codes, ctx.fp8->options.format_of(Fp8Role::weight),
          state.gemm_scale_inv(Fp8Role::weight), {}};
}

// The weight W [out, in] in FP8 for one GEMM: the forward's W, or (transposed) the input
// gradient's W^T [in, out]. With Fp8Options::cache_weights, from the state's weight cache, filled
// at the step's first use by one fp8_cast_transpose pass that writes both layouts (the amax folded
// or reduced once) and kept until the weights change (fp8_after_optimizer_step,
// fp8_drop_weight_caches). The scale of a step does not change within it and max is idempotent,
// so these are the codes (and amax, and scale) a cast per GEMM makes. Without the cache: cast now.
// Without Fp8Options::cache_forward_weights the cache keeps W^T alone: the filling pass writes W
// into a buffer of the GEMM's own, and a later forward of the step casts W again with the step's
// scale (the same codes).
template <class Context, class T>
Fp8WeightOperand<typename Context::space> fp8_weight(Context& ctx, Fp8State<typename Context::space>& state, const T* w,
                                                     index_t out, index_t in, bool transposed) {
  using Space = typename Context::space;
  if (state.awaiting_gather)
    fail<Error>("the FP8 linear layer ", state.name, " reads its weight after an optimizer step that has not gathered the "
                "weights yet (FP8 parameter gather): call the optimizer's finish_step(ctx) after fp8_after_optimizer_step(ctx)");
  if (state.gathered_current) return fp8_gathered_weight(ctx, state, out, in, transposed);
  if (!ctx.fp8->options.cache_weights) {
    auto q = fp8_quantize(ctx, state, Fp8Role::weight, w, out, in, /*sharded=*/true, transposed);
    const std::uint8_t* codes = q.codes.data();
    return {codes, q.format, q.scale_inv, std::move(q.codes)};
  }
  const Fp8Format format = ctx.fp8->options.format_of(Fp8Role::weight);
  const bool keep_forward = ctx.fp8->options.cache_forward_weights;
  auto& cache = state.weight_cache;
  float* gemm_scales = state.gemm_scale_inv(Fp8Role::input);  // [3 * 4]
  Tensor<std::uint8_t, Space> own;  // W for this GEMM alone (forward codes not cached)
  if (!cache.valid) {
    // the buffers at the first use (kept while their shapes hold); W for this GEMM alone when not cached
    if (cache.codes_transposed.data() == nullptr || !(cache.codes_transposed.shape() == Shape{in, out}))
      cache.codes_transposed = Tensor<std::uint8_t, Space>::empty(Shape{in, out});
    if (!keep_forward) cache.codes = Tensor<std::uint8_t, Space>();
    else if (cache.codes.data() == nullptr || !(cache.codes.shape() == Shape{out, in}))
      cache.codes = Tensor<std::uint8_t, Space>::empty(Shape{out, in});
    if (!keep_forward && !transposed) own = Tensor<std::uint8_t, Space>::empty(Shape{out, in});
    float* amax = fp8_prepare_scale(ctx, state, Fp8Role::weight, w, out * in, /*sharded=*/true);
    ctx.device.template fp8_cast_transpose<T>(w, out, in, format, state.scale(Fp8Role::weight),
                                              keep_forward ? cache.codes.data() : own.data(), cache.codes_transposed.data(),
                                              amax);  // (out, in) and (in, out)
    // every role's 1/scale into its aligned slot (the weight's of this cast), one pass, unless the
    // step's update wrote them (delayed: the rows do not change before the next update)
    if (!state.gemm_scales_current)
      ctx.device.template copy_columns<float>(state.scale_inv(Fp8Role::input), state.row_length(), kFp8Roles, 1, gemm_scales, 4);
    cache.valid = true;
    ++state.weight_casts;
  } else if (!keep_forward && !transposed) {  // a later forward of the step: W again, with the step's scale
    own = Tensor<std::uint8_t, Space>::empty(Shape{out, in});
    ctx.device.template fp8_cast<T>(w, out * in, format, state.scale(Fp8Role::weight), own.data(), nullptr);
    ++state.weight_casts;
  }
  const std::uint8_t* codes = transposed ? cache.codes_transposed.data() : keep_forward ? cache.codes.data() : own.data();
  return {codes, format, state.gemm_scale_inv(Fp8Role::weight), std::move(own)};
}

// ---- the blockwise recipe ----

template <class Space>
struct Fp8BlockOperand {
  Tensor<std::uint8_t, Space> codes;
  Tensor<float, Space> scale_inv;  // runs: [ceil(k/B), rows] of the operand [rows, k]
  Fp8Format format;
};

// x [rows, cols] for `role` in runs of B along its rows (codes [rows, cols]), or (transposed, for the
// weight gradient) x^T [cols, rows] in runs along x's columns.
template <class Context, class T>
Fp8BlockOperand<typename Context::space> fp8_quantize_blocks(Context& ctx, Fp8Role role, const T* x, index_t rows,
                                                             index_t cols, bool transposed) {
  using Space = typename Context::space;
  const index_t block = ctx.fp8->options.block;
  const Fp8Format format = ctx.fp8->options.format_of(role);
  auto runs = [&](index_t n) { return (n + block - 1) / block; };
  Fp8BlockOperand<Space> q{Tensor<std::uint8_t, Space>::empty(transposed ? Shape{cols, rows} : Shape{rows, cols}),
                           Tensor<float, Space>::empty(transposed ? Shape{runs(rows), cols} : Shape{runs(cols), rows}), format};
  if (transposed)
    ctx.device.template fp8_cast_blocks<T>(x, rows, cols, format, block, nullptr, nullptr, q.codes.data(), q.scale_inv.data());
  else
    ctx.device.template fp8_cast_blocks<T>(x, rows, cols, format, block, q.codes.data(), q.scale_inv.data(), nullptr, nullptr);
  return q;
}

// The weight W [out, in] in B x B tiles for one GEMM: W (tiles [ceil(out/B), ceil(in/B)]) or
// (transposed) W^T (tiles [ceil(in/B), ceil(out/B)]); from the weight cache, as fp8_weight.
template <class Context, class T>
Fp8WeightOperand<typename Context::space> fp8_weight_tiles(Context& ctx, Fp8State<typename Context::space>& state,
                                                           const T* w, index_t out, index_t in, bool transposed) {
  using Space = typename Context::space;
  const index_t block = ctx.fp8->options.block;
  const Fp8Format format = ctx.fp8->options.format_of(Fp8Role::weight);
  auto& cache = state.weight_cache;
  if (!cache.valid || !ctx.fp8->options.cache_weights) {
    if (cache.codes.data() == nullptr || !(cache.codes.shape() == Shape{out, in})) {
      const index_t tile_rows = (out + block - 1) / block, tile_cols = (in + block - 1) / block;
      cache.codes = Tensor<std::uint8_t, Space>::empty(Shape{out, in});
      cache.codes_transposed = Tensor<std::uint8_t, Space>::empty(Shape{in, out});
      cache.scale = Tensor<float, Space>::empty(Shape{tile_rows, tile_cols});
      cache.scale_transposed = Tensor<float, Space>::empty(Shape{tile_cols, tile_rows});
    }
    ctx.device.template fp8_cast_tiles<T>(w, out, in, format, block, cache.codes.data(), cache.codes_transposed.data(),
                                          cache.scale.data(), cache.scale_transposed.data());
    cache.valid = ctx.fp8->options.cache_weights;
    ++state.weight_casts;
  }
  return {transposed ? cache.codes_transposed.data() : cache.codes.data(), format,
          transposed ? cache.scale_transposed.data() : cache.scale.data(), {}};
}

// Runs blocks(ctx) and returns true where the blockwise recipe is on and the backend has its entry
// points; false (nothing run) otherwise. `blocks` is a generic lambda that reaches the context
// through its argument only, so its body is compiled for backends with the entry points alone.
template <class Context, class Blocks>
bool fp8_with_blocks(Context& ctx, Blocks&& blocks) {
  if constexpr (backend_has_fp8_blocks<typename Context::device_type>) {
    if (ctx.fp8->options.recipe == Fp8RecipeKind::blockwise) {
      blocks(ctx);
      return true;
    }
  }
  return false;
}

// y[rows, out] = x W^T (+ b): the forward GEMM in FP8 (TN as it is; accumulated as
// Fp8Options::forward_accumulation says, the gradient GEMMs always split); the bias added in T to the
// rounded product (per-tensor recipes: in the GEMM's epilogue where the backend can). With
// `gelu_out`, also gelu_out = gelu(y) (per-tensor recipes: in the same GEMM's epilogue where the
// backend takes it). Per-tensor recipes: x is cast in both layouts in one pass, and x^T's codes go to
// `keep` for the weight gradient, which then needs neither x nor a cast of its own (blockwise: `keep`
// stays empty).
// With `producer` (delayed recipe), the input is what it makes of x (gelu(x); swiglu of x [rows, 2 in]),
// made by the cast.
// With `given` (per-tensor recipes), the input's codes are those (fp8_quantize_gathered); x is unused.
// With `addend` (y's shape; not with gelu_out): y = x W^T (+ b) + addend, the add in the GEMM's
// epilogue where the backend has fp8_gemm_add (one rounding), else an add of the rounded y after it.
// With `transpose_later` (a producer's input): x's codes alone are cast, and `keep` holds no x^T's
// codes (codes_t_later; Fp8Options::activation_codes_in_backward).
template <class Context, class T, class Space>
void fp8_linear_forward_rows(Context& ctx, Fp8State<Space>& state, Fp8Sharding sharding, const T* x, index_t rows,
                             const Parameter<T, Space>& weight, const Parameter<T, Space>* bias, T* y, Fp8Pair<Space>& keep,
                             T* gelu_out = nullptr, Fp8Producer producer = Fp8Producer::copy, Fp8Pair<Space>* given = nullptr,
                             const T* addend = nullptr, bool transpose_later = false) {
  if (addend && gelu_out) fail<Error>("fp8_linear_forward_rows: an addend and a GELU output together are not a layer's GEMM");
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  const T* b = bias ? bias->value.data() : nullptr;
  const bool blocks = fp8_with_blocks(ctx, [&](auto& c) {
    auto xq = fp8_quantize_blocks(c, Fp8Role::input, x, rows, in, false);                      // runs along in
    auto wq = fp8_weight_tiles(c, state, weight.value.data(), out, in, /*transposed=*/false);  // (out, in) tiles
    c.device.template fp8_gemm_blocks<T>(rows, out, in, xq.codes.data(), xq.format, xq.scale_inv.data(), false, wq.codes,
                                         wq.format, wq.scale_inv, true, c.fp8->options.block, y, false);
    if (b) c.device.template bias_add<T>(y, b, rows, out);
    if (gelu_out) c.device.template gelu_forward<T>(y, rows * out, gelu_out);
    if (addend) c.device.template add<T>(y, addend, rows * out, y);
  });
  if (blocks) return;
  Fp8Pair<Space> xq = given ? std::move(*given)
                            : fp8_quantize_pair(ctx, state, Fp8Role::input, x, rows, in, sharding.input, /*plain=*/true, producer,
                                                static_cast<const T*>(nullptr), nullptr, {}, !transpose_later);
  auto wq = fp8_weight(ctx, state, weight.value.data(), out, in, /*transposed=*/false);  // (out, in)
  const Fp8Accumulation accumulation = ctx.fp8->options.forward_accumulation;
  if (gelu_out)
    ctx.device.template fp8_gemm_gelu<T>(rows, out, in, xq.codes.data(), xq.format, xq.scale_inv, wq.codes, wq.format,
                                         wq.scale_inv, b, y, gelu_out, accumulation);  // (rows, out) twice
  else if (!addend)
    ctx.device.template fp8_gemm<T>(false, true, rows, out, in, xq.codes.data(), xq.format, xq.scale_inv, wq.codes, wq.format,
                                    wq.scale_inv, y, false, b, accumulation);  // (rows, out)
  else if constexpr (has_fp8_gemm_add<typename Context::device_type, T>)
    ctx.device.template fp8_gemm_add<T>(rows, out, in, xq.codes.data(), xq.format, xq.scale_inv, wq.codes, wq.format,
                                        wq.scale_inv, b, addend, y, accumulation);  // (rows, out)
  else {
    ctx.device.template fp8_gemm<T>(false, true, rows, out, in, xq.codes.data(), xq.format, xq.scale_inv, wq.codes, wq.format,
                                    wq.scale_inv, y, false, b, accumulation);  // (rows, out)
    ctx.device.template add<T>(y, addend, rows * out, y);
  }
  xq.codes = Tensor<std::uint8_t, Space>();  // x's own codes served this GEMM alone
  keep = std::move(xq);
}

// dx[rows, in] = dy W = dy (W^T)^T: W^T from the cast that made the forward's W (the weight
// cache), times gelu'(gelu_pre) when given. dy's codes: cast here in runs (blockwise), or dyq's
// (per-tensor recipes).
template <class Context, class T, class Space>
void fp8_linear_input_gradient_rows(Context& ctx, Fp8State<Space>& state, const T* dy, const Fp8Pair<Space>* dyq,
                                    index_t rows, const Parameter<T, Space>& weight, T* dx, const T* gelu_pre = nullptr) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  const bool blocks = fp8_with_blocks(ctx, [&](auto& c) {
    auto dyb = fp8_quantize_blocks(c, Fp8Role::grad_output, dy, rows, out, false);             // runs along out
    auto wtq = fp8_weight_tiles(c, state, weight.value.data(), out, in, /*transposed=*/true);  // (in, out) tiles
    c.device.template fp8_gemm_blocks<T>(rows, in, out, dyb.codes.data(), dyb.format, dyb.scale_inv.data(), false,
                                         wtq.codes, wtq.format, wtq.scale_inv, true, c.fp8->options.block, dx, false);
  });
  if (!blocks) {
    auto wtq = fp8_weight(ctx, state, weight.value.data(), out, in, /*transposed=*/true);  // (in, out)
    if (gelu_pre)  // times gelu'(gelu_pre) in the GEMM's epilogue where the backend can
      ctx.device.template fp8_gemm_gelu_backward<T>(rows, in, out, dyq->codes.data(), dyq->format, dyq->scale_inv, wtq.codes,
                                                    wtq.format, wtq.scale_inv, gelu_pre, dx);  // (rows, in)
    else
      ctx.device.template fp8_gemm<T>(false, true, rows, in, out, dyq->codes.data(), dyq->format, dyq->scale_inv, wtq.codes,
                                      wtq.format, wtq.scale_inv, dx, false);  // (rows, in)
  } else if (gelu_pre) {
    ctx.device.template gelu_backward<T>(dx, gelu_pre, rows * in, dx);
  }
}

// dW[out, in] += dy^T x = (dy^T) (x^T)^T, db += column sums of dy. Blockwise: dy^T and x^T cast
// here in runs along the rows; per-tensor recipes: the codes of dy^T and x^T in dyq and xq.
// Per-tensor recipes with `bias_sums`: db += bias_sums (dy's column sums, taken by dy's cast).
template <class Context, class T, class Space>
void fp8_linear_weight_gradient_rows(Context& ctx, const T* x, const T* dy, const Fp8Pair<Space>* xq,
                                     const Fp8Pair<Space>* dyq, index_t rows, Parameter<T, Space>& weight,
                                     Parameter<T, Space>* bias, const accumulate_t<T>* bias_sums = nullptr) {
  using A = accumulate_t<T>;
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  const bool blocks = fp8_with_blocks(ctx, [&](auto& c) {
    auto dytq = fp8_quantize_blocks(c, Fp8Role::grad_output, dy, rows, out, true);  // (out, rows), runs along rows
    auto xtq = fp8_quantize_blocks(c, Fp8Role::input, x, rows, in, true);           // (in, rows), runs along rows
    const bool overwrite = std::exchange(weight.grad_stale, false);
    c.device.template fp8_gemm_blocks<A>(out, in, rows, dytq.codes.data(), dytq.format, dytq.scale_inv.data(), false,
                                         xtq.codes.data(), xtq.format, xtq.scale_inv.data(), false, c.fp8->options.block,
                                         weight.grad.data(), !overwrite);  // (out, in)
  });
  if (!blocks) {
    const bool overwrite = std::exchange(weight.grad_stale, false);
    ctx.device.template fp8_gemm<A>(false, true, out, in, rows, dyq->codes_t.data(), dyq->format, dyq->scale_inv,
                                    xq->codes_t.data(), xq->format, xq->scale_inv, weight.grad.data(), !overwrite);  // (out, in)
  }
  if (bias && bias_sums) ctx.device.template add<A>(bias->grad.data(), bias_sums, out, bias->grad.data());
  else if (bias) ctx.device.template bias_grad<T>(dy, rows, out, bias->grad.data());
}

// The layer's backward in FP8: dx written (times gelu'(gelu_pre) when given), dW and db accumulated
// now, or appended to `deferred` (the closure keeps what it reads and ctx, which must outlive it).
// Per-tensor recipes: dy is cast once in both layouts (dx's GEMM reads dy's codes, dW's dy^T's), with
// its column sums for the bias gradient in the same pass, and x^T's codes are those the forward kept
// (`kept`), or cast now from x when it kept none. With `producer` gelu_backward (delayed recipe: an
// MLP's fc1), the output gradient is dy gelu'(pre), made by that cast and never written; with
// swiglu_backward it is SwiGLU's backward of dy [rows, out / 2] at pre [rows, out]. With `given_dy`
// (per-tensor, no bias), dy's codes in both layouts are those (made by dy's producer; dy unread).
// With `activation` (a backward producer), its cast also writes the forward activation's codes^T there
// (the codes the next layer's pair left for later: RowParallelLinear::fp8_input_codes_later).
// Blockwise: x and dy are cast in runs for each GEMM (their scales differ by layout).
template <class Context, class T, class Space>
Tensor<T, Space> fp8_linear_backward(Context& ctx, const std::shared_ptr<Fp8State<Space>>& state, Fp8Sharding sharding,
                                     const Tensor<T, Space>& x, const Fp8Pair<Space>& kept, const Tensor<T, Space>& dy,
                                     Parameter<T, Space>& weight, Parameter<T, Space>* bias,
                                     const std::type_identity_t<Tensor<T, Space>>* gelu_pre,
                                     DeferredWeightGradients* deferred, Fp8Producer producer = Fp8Producer::copy,
                                     const std::type_identity_t<Tensor<T, Space>>* pre = nullptr,
                                     Fp8Pair<Space>* given_dy = nullptr, const Fp8Output& activation = {}) {
  using A = accumulate_t<T>;
  if (kept.codes_t_later && kept.empty())
    fail<Error>("linear backward (FP8): ", state->name, "'s forward left its input^T's codes to the backward of the layer "
                "before it, and nothing allocated them (RowParallelLinear::fp8_input_codes_later)");
  if (activation.codes && (producer == Fp8Producer::copy || producer == Fp8Producer::gelu || producer == Fp8Producer::swiglu))
    fail<Error>("linear backward (FP8): activation codes asked of ", state->name, "'s output-gradient cast, which makes no "
                "activation's gradient");
  const Shape shape = kept.empty() ? x.shape() : kept.shape;
  const index_t out = weight.value.size(0), in = weight.value.size(1), rows = shape.rows();
  // dy is what the producer reads: the output gradient itself, or (swiglu_backward) the activation's
  // gradient of half its width, from which the cast makes the output gradient
  if (dy.shape().rows() != rows || dy.shape().cols() != fp8_producer_input_cols(producer, out) ||
      (producer == Fp8Producer::swiglu_backward && (out % 2 != 0 || !pre || pre->shape().cols() != out)))
    fail<ShapeError>("linear backward (FP8): output gradient ", dy.shape().str(), " does not match ", rows, " rows of ", out,
                     " features");
  auto dx = Tensor<T, Space>::empty(shape);  // (rows, in)
  const bool per_tensor = ctx.fp8->options.recipe != Fp8RecipeKind::blockwise;
  if (!per_tensor && producer != Fp8Producer::copy)
    fail<Error>("linear backward (FP8): a fused output-gradient producer needs a per-tensor recipe (", state->name, ")");
  Fp8Pair<Space> dyq, xq;
  Tensor<A, Space> bias_sums;
  if (given_dy && (!per_tensor || bias || producer != Fp8Producer::copy || given_dy->shape.rows() != rows ||
                   given_dy->shape.cols() != out))
    fail<Error>("linear backward (FP8): output-gradient codes given where the layer casts its own (", state->name, ")");
  if (given_dy) {
    dyq = std::move(*given_dy);
  } else if (per_tensor) {
    if (bias) bias_sums = Tensor<A, Space>::empty(Shape{out});
    dyq = fp8_quantize_pair(ctx, *state, Fp8Role::grad_output, dy.data(), rows, out, sharding.grad_output, true, producer,
                            pre ? pre->data() : nullptr, bias ? bias_sums.data() : nullptr, activation);
  }
  fp8_linear_input_gradient_rows(ctx, *state, dy.data(), &dyq, rows, weight, dx.data(), gelu_pre ? gelu_pre->data() : nullptr);
  if (per_tensor) {
    dyq.codes = Tensor<std::uint8_t, Space>();  // dy's own codes served the input gradient alone
    xq = kept.empty() ? fp8_quantize_pair(ctx, *state, Fp8Role::input, x.data(), rows, in, sharding.input, false) : kept;
  }
  // Blockwise reads x and dy; the per-tensor recipes the codes and dy's column sums.
  Tensor<T, Space> x_read = per_tensor ? Tensor<T, Space>() : x, dy_read = per_tensor ? Tensor<T, Space>() : dy;
  auto weight_gradient = [&ctx, x_read, dy_read, xq, dyq, bias_sums, rows, &weight, bias] {
    fp8_linear_weight_gradient_rows(ctx, x_read.data(), dy_read.data(), &xq, &dyq, rows, weight, bias, bias_sums.data());
  };
  if (deferred) deferred->add(weight_gradient);
  else weight_gradient();
  return dx;
}

}  // namespace detail

// The weights changed (or the scaling rows were written): every FP8 layer of this rank casts its
// weight again at its next use. fp8_after_optimizer_step calls it; a user who writes weights
// another way (their own update, a load of their own) calls it after the write. Local; no collective.
template <class Context>
void fp8_drop_weight_caches(const Context& ctx) {
  if (ctx.fp8) ctx.fp8->drop_weight_caches();
}

namespace detail {

// A backend whose fp8_update_scales takes many states at once (rows [count, 3, stride], and their
// aligned 1 / scale copies [count, 3, 4] written too): cpu::backend and cuda::backend.
template <class Device>
concept has_fp8_update_scales_many = requires(Device& d, float* rows, index_t n, Fp8RoleMaxes maxes, Fp8UpdateArgs args) {
  d.fp8_update_scales(rows, n, n, maxes, args, rows);
};

// Moves every state's rows (and aligned 1 / scale copies) into the scaling's packed buffers, where
// states were added since the last packing: one device copy per state, once.
template <class Context>
void fp8_pack_rows(Context& ctx) {
  using Space = typename Context::space;
  auto& scaling = *ctx.fp8;
  if (scaling.packed_states == scaling.states.size()) return;
  const auto count = static_cast<index_t>(scaling.states.size());
  const index_t length = scaling.states.front()->row_length();
  auto rows = Tensor<float, Space>::empty(Shape{count, kFp8Roles, length});
  auto gemm = Tensor<float, Space>::empty(Shape{count, kFp8Roles, 4});
  for (index_t i = 0; i < count; ++i) {
    auto& state = *scaling.states[static_cast<std::size_t>(i)];
    if (state.row_length() != length)
      fail<Error>("FP8 scaling state ", state.name, " has an amax history of ", state.history, " steps, the first state ",
                  scaling.states.front()->name, " one of ", scaling.states.front()->history,
                  ": every layer of a model keeps the same --fp8-amax-history-len");
    ctx.device.template copy<float>(state.rows.data(), kFp8Roles * length, rows.data() + i * kFp8Roles * length);
    state.rows = Tensor<float, Space>::alias(rows, i * kFp8Roles * length, Shape{kFp8Roles, length});
    state.weight_cache.gemm_scales = Tensor<float, Space>::alias(gemm, i * kFp8Roles * 4, Shape{kFp8Roles * 4});
    state.gemm_scales_current = false;  // the new slots hold nothing yet
  }
  scaling.packed_rows = std::move(rows);
  scaling.packed_gemm_scales = std::move(gemm);
  scaling.packed_states = scaling.states.size();
}

}  // namespace detail

// After each optimizer step, whatever the recipe: the weight caches are dropped (the weights
// changed). Then, delayed recipe only: every FP8 state of this rank, in construction order, is
// all-reduced (max) over ctx.tp_cp_dp, then each role's scale is updated from its amax history and
// the history rolled (core/fp8_recipe.hpp). Collective over tp_cp_dp (delayed). Where the backend
// updates many states in one call, the states' rows live in one packed buffer (detail::fp8_pack_rows):
// one all-reduce and one launch for the model, which also write the aligned 1 / scale copies the
// GEMMs read (so the weight cache's fill copies nothing).
template <class Context>
void fp8_after_optimizer_step(Context& ctx) {
  if constexpr (!backend_has_fp8<typename Context::device_type>) return;  // no layer holds a state (make_fp8_state)
  fp8_drop_weight_caches(ctx);
  if (!ctx.fp8 || ctx.fp8->options.recipe != Fp8RecipeKind::delayed) return;
  const Fp8Options& options = ctx.fp8->options;
  Fp8RoleMaxes maxes;
  for (int r = 0; r < kFp8Roles; ++r) maxes.value[r] = fp8_max(options.format_of(static_cast<Fp8Role>(r)));
  const Fp8UpdateArgs args{0, options.amax_compute_algo, options.margin, true};
  if (ctx.fp8->states.empty()) return;
  if constexpr (detail::has_fp8_update_scales_many<typename Context::device_type>) {
    detail::fp8_pack_rows(ctx);
    auto& scaling = *ctx.fp8;
    if (ctx.tp_cp_dp.size() > 1) ctx.tp_cp_dp.all_reduce(scaling.packed_rows.buffer(), ReduceOp::max);
    Fp8UpdateArgs mine = args;
    mine.history = scaling.states.front()->history;
    ctx.device.fp8_update_scales(scaling.packed_rows.data(), static_cast<index_t>(scaling.states.size()),
                                 scaling.states.front()->row_length(), maxes, mine, scaling.packed_gemm_scales.data());
    for (auto& state : scaling.states) state->gemm_scales_current = true;
  } else {
    for (auto& state : ctx.fp8->states) {
      if (ctx.tp_cp_dp.size() > 1) ctx.tp_cp_dp.all_reduce(state->rows.buffer(), ReduceOp::max);
      Fp8UpdateArgs mine = args;
      mine.history = state->history;
      for (int r = 0; r < kFp8Roles; ++r) ctx.device.fp8_update_scale(state->row(static_cast<Fp8Role>(r)), maxes.value[r], mine);
    }
  }
}

STRATA_NAMESPACE_END
