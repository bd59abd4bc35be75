// strata/layers/moe/experts.hpp: `GroupedExperts<Policy, Activation>`, this rank's experts, each an
// MLP without bias, run as one grouped GEMM per projection over the tokens the dispatcher grouped
// by local expert (Megatron-Core's GroupedMLP).
//
//   fc1 (expert e) [ffn (x2 for swiglu: [gate; up]), hidden], split over etp on its rows (each
//                  stacked block on its own, as the dense column-parallel fc1)
//   fc2 (expert e) [hidden, ffn], split over etp on its columns (as the dense row-parallel fc2)
//   forward   h = x_e fc1_e^T (grouped), a = gelu(h) or glu(gate, up), y_e = a fc2_e^T (grouped)
//             glu: ExpertsConfig::glu, silu(gate) * up by default (SwiGLU), or quick_gelu with
//             gpt-oss's clamp and offset (backend/activation_options.hpp), as the dense Mlp
//             y is partial over etp: the dispatcher's combine sums it over the etp ranks
//   backward  da = dy_e fc2_e, dfc2_e += dy_e^T a_e, dh = act'(h) da, dx_e = dh fc1_e (partial over
//             etp, summed by the dispatcher), dfc1_e += dh^T x_e
//
// Parameters are named `<name>.<global expert>.fc1.weight` / `.fc2.weight` and flagged `expert`, so
// initialization (at each element's global index) and checkpoints do not depend on ep or etp.
//
// With ExpertsConfig::bias (Megatron's add_bias_linear, gpt-oss) each expert also has
// `fc1.bias` [ffn (x2)] (split over etp as fc1's rows) and `fc2.bias` [hidden] (replicated over
// etp, added on etp rank 0 only, since the output is summed over etp; every etp rank computes its
// whole gradient, the same on each). Each group's rows get their expert's bias, so the counts are
// needed on the host: the dispatcher's (MoeMlp asks for them: read for its exchanges, the padded
// capacity, or on one rank read beside its permutation and the shared experts), else read here once
// per forward (a synchronization the bias-free GEMMs on Hopper avoid).
//
// FP8 (ctx.fp8 under the delayed recipe with Fp8Options::experts, in a layer that runs FP8): the
// six GEMMs run on FP8 codes (layers/fp8_linear.hpp), with one scaling state per projection for all
// the experts of the model (`<name>.fc1`, `<name>.fc2`: input, weight and gradient scales shared by
// every expert, so every rank holds the same states and the step's amax reduction over the pipeline
// stage gives the scales of one rank holding every expert). x, the activation, dy and the
// activation's gradient are cast once each over all their grouped rows (both layouts in one pass);
// each expert's weight once per step in both layouts (a stacked weight cache). The counts are
// needed on the host (per-expert GEMMs), as with biases; the weight gradients take each group's
// columns of the transposed codes, padded with zero columns to a multiple of 16 (FP8 GEMMs need
// whole 16-byte rows; zeros add nothing). The backward keeps x^T's and the activation^T's codes
// instead of x and the activation. The tensorwise and blockwise recipes leave the experts in T (a
// scale taken per call would depend on which tokens an expert-parallel rank received; blocks on
// the grouped rows likewise).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../backend/backend.hpp"
#include "../fp8_linear.hpp"
#include "../mlp.hpp"
#include "../parameter.hpp"
#include "../policy.hpp"

STRATA_NAMESPACE_BEGIN

struct ExpertsConfig {
  index_t hidden_size = 0;
  index_t ffn_hidden_size = 0;  // of one expert
  index_t num_experts = 0;      // in the whole model
  GluActivation glu{};          // the gated activation (Activation swiglu); the default is SwiGLU
  bool bias = false;            // fc1 and fc2 biases per expert (see above)
};

template <class Policy, class Act = gelu>
class GroupedExperts {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Param = Parameter<T, Space>;
  static constexpr bool gated = std::is_same_v<Act, swiglu>;
  static_assert(std::is_same_v<Act, gelu> || gated, "GroupedExperts: the activation must be strata::gelu or strata::swiglu.");
  static_assert(check_moe_backend<typename Policy::backend>());

  struct Saved {
    Tensor<T, Space> input;                   // [rows, hidden]
    Tensor<T, Space> pre;                     // [rows, fc1 local]
    Tensor<T, Space> activation;              // [rows, ffn local] (empty under set_recompute_activation)
    Tensor<std::int32_t, Space> counts;       // [local experts] rows of each, in the backend's memory
    std::vector<index_t> host_counts;         // the same on the host, when the backend reads them there
    // FP8: x^T's and the activation^T's codes [cols, grouped rows] (the input and activation above
    // are then not kept)
    detail::Fp8Pair<Space> input_codes, activation_codes;
  };

  GroupedExperts(const Context& ctx, std::string name, ExpertsConfig c) : config_(c) {
    const int ep = ctx.ep.size(), etp = ctx.expert_tp.size();
    if (c.hidden_size <= 0 || c.ffn_hidden_size <= 0 || c.num_experts <= 0)
      fail<ConfigError>("GroupedExperts: hidden_size=", c.hidden_size, ", ffn_hidden_size=", c.ffn_hidden_size,
                        " and num_experts=", c.num_experts, " must be positive.");
    if (c.num_experts % ep != 0)
      fail<ConfigError>("GroupedExperts: ep=", ep, " does not divide num_experts=", c.num_experts,
                        "; each expert-parallel rank holds num_experts / ep whole experts.");
    if (c.ffn_hidden_size % etp != 0)
      fail<ConfigError>("GroupedExperts: etp=", etp, " does not divide the expert ffn hidden size ", c.ffn_hidden_size,
                        "; each expert-tensor-parallel rank holds an equal slice of every expert's MLP.");
    if (!gated && (c.glu.kind != GluKind::silu || c.glu.clamp != 0 || c.glu.linear_offset != 0))
      fail<ConfigError>("GroupedExperts: a gated activation (quick GELU, a clamp or a linear offset) was configured for "
                        "experts built with strata::gelu; build them with strata::swiglu");
    if (!(c.glu.clamp >= 0 && std::isfinite(c.glu.clamp)) || !std::isfinite(c.glu.linear_offset))
      fail<ConfigError>("GroupedExperts: the activation clamp (", c.glu.clamp, ") must be a finite number >= 0 and the "
                        "linear offset (", c.glu.linear_offset, ") finite");
    local_ = c.num_experts / ep;
    first_ = ctx.ep.rank() * local_;
    for (index_t l = 0; l < local_; ++l) {
      const std::string prefix = name + "." + std::to_string(first_ + l);
      fc1_.emplace_back(prefix + ".fc1.weight", Shape{(gated ? 2 : 1) * c.ffn_hidden_size, c.hidden_size},
                        ShardSpec::split(0, ctx.expert_tp.rank(), etp, gated ? 2 : 1));
      fc2_.emplace_back(prefix + ".fc2.weight", Shape{c.hidden_size, c.ffn_hidden_size},
                        ShardSpec::split(1, ctx.expert_tp.rank(), etp));
      fc1_.back().expert = fc2_.back().expert = true;
      // Only the weight-gradient GEMMs write them (zero by first write: layers/parameter.hpp).
      fc1_.back().grad_first_write = fc2_.back().grad_first_write = true;
      if (c.bias) {
        fc1_bias_.emplace_back(prefix + ".fc1.bias", Shape{(gated ? 2 : 1) * c.ffn_hidden_size},
                               ShardSpec::split(0, ctx.expert_tp.rank(), etp, gated ? 2 : 1));
        fc2_bias_.emplace_back(prefix + ".fc2.bias", Shape{c.hidden_size}, ShardSpec::replicated());
        fc1_bias_.back().expert = fc2_bias_.back().expert = true;
        fc1_bias_.back().weight_decay = fc2_bias_.back().weight_decay = false;
      }
    }
    output_bias_rank_ = ctx.expert_tp.rank() == 0;
    if (ctx.fp8 && ctx.fp8->fp8_here() && ctx.fp8->options.recipe == Fp8RecipeKind::delayed && ctx.fp8->options.experts) {
      fc1_fp8_ = make_fp8_state(ctx, name + ".fc1");
      fc2_fp8_ = make_fp8_state(ctx, name + ".fc2");
    }
  }

  // Whether the experts' GEMMs run in FP8 (see the header).
  bool fp8() const { return fc1_fp8_ != nullptr; }

  // Selective recompute of the activation function (Megatron's --recompute-modules moe_act): the
  // forward keeps fc1's output alone, not the activation fc2 read (nor, with FP8 experts, its
  // transposed codes), and the backward makes the activation again from fc1's output for fc2's
  // weight gradient. The same bits: the activation is elementwise and deterministic, and an FP8
  // recast within the step has the forward's scale (delayed: fixed for the step; tensorwise and
  // blockwise: from the same values), folding the same amax again.
  void set_recompute_activation(bool on) { recompute_activation_ = on; }
  bool recompute_activation() const { return recompute_activation_; }

  index_t local_experts() const { return local_; }
  // Whether the GEMMs read the counts where they are, with no wait for the host: bf16 experts without
  // biases on a backend whose grouped GEMMs take device counts at these sizes (else forward reads
  // them once, unless the dispatcher hands them over).
  bool takes_device_counts(const Context& ctx) const {
    const index_t fc1_local = fc1_.empty() ? 0 : fc1_[0].value.size(0), ffn_local = gated ? fc1_local / 2 : fc1_local;
    const index_t h = config_.hidden_size;
    return !fp8() && !config_.bias && ctx.device.template grouped_gemm_counts_on_device<T>(fc1_local, h) &&
           ctx.device.template grouped_gemm_counts_on_device<T>(h, ffn_local);
  }
  index_t first_expert() const { return first_; }

  // x: [rows, hidden], its first counts[0] rows local expert 0's, the next counts[1] expert 1's, ...;
  // counts (in the backend's memory) may total fewer than rows: the rest are outside every group and
  // their outputs are zero. The GEMMs read the counts where they are; a backend whose grouped GEMMs
  // would read them on the host (grouped_gemm_counts_on_device false: CUDA without the Hopper kernel,
  // other element types or sizes), experts with biases and FP8 experts get them read once here, for
  // the forward and the backward, unless `host_counts` (the dispatcher's, where it knows them) has them.
  std::pair<Tensor<T, Space>, Saved> forward(Context& ctx, const Tensor<T, Space>& x, const Tensor<std::int32_t, Space>& counts,
                                             const std::vector<index_t>& host_counts = {}) const {
    const index_t rows = x.shape().rows(), h = config_.hidden_size;
    const index_t fc1_local = fc1_.empty() ? 0 : fc1_[0].value.size(0), ffn_local = gated ? fc1_local / 2 : fc1_local;
    if (counts.numel() != local_)
      fail<ShapeError>("GroupedExperts: ", counts.numel(), " token counts for ", local_, " local experts");
    Saved saved{x, Tensor<T, Space>::empty(Shape{rows, fc1_local}), Tensor<T, Space>::empty(Shape{rows, ffn_local}), counts,
                {}, {}, {}};
    if (!host_counts.empty() && static_cast<index_t>(host_counts.size()) != local_)
      fail<ShapeError>("GroupedExperts: ", host_counts.size(), " host token counts for ", local_, " local experts");
    if (!takes_device_counts(ctx)) {
      if (!host_counts.empty()) {
        saved.host_counts = host_counts;
      } else {
        std::vector<std::int32_t> host(static_cast<std::size_t>(local_));
        ctx.device.template copy_to_host<std::int32_t>(counts.data(), local_, host.data());
        saved.host_counts.assign(host.begin(), host.end());
      }
    }
    if constexpr (backend_has_fp8<typename Context::device_type>)  // (a state exists only then: make_fp8_state)
      if (fp8()) return forward_fp8(ctx, std::move(saved), fc1_local, ffn_local);
    rows_gemm(ctx, saved, true, rows, fc1_local, h, x.data(), pointers(fc1_), saved.pre.data());  // (rows, fc1 local)
    if (config_.bias) add_group_biases(ctx, saved, fc1_local, pointers(fc1_bias_), saved.pre.data());
    activate(ctx, saved.pre.data(), rows, ffn_local, saved.activation.data());
    auto y = Tensor<T, Space>::empty(Shape{rows, h});
    rows_gemm(ctx, saved, true, rows, h, ffn_local, saved.activation.data(), pointers(fc2_),
              y.data());  // (rows, hidden), partial over etp
    if (config_.bias && output_bias_rank_) add_group_biases(ctx, saved, h, pointers(fc2_bias_), y.data());
    if (recompute_activation_) saved.activation = Tensor<T, Space>();  // made again by the backward
    return {std::move(y), std::move(saved)};
  }

  Tensor<T, Space> backward(Context& ctx, const Saved& saved, const Tensor<T, Space>& dy) {
    if constexpr (backend_has_fp8<typename Context::device_type>)
      if (fp8()) return backward_fp8(ctx, saved, dy);
    const index_t rows = saved.input.shape().rows(), h = config_.hidden_size;
    const index_t fc1_local = saved.pre.shape().cols(), ffn_local = gated ? fc1_local / 2 : fc1_local;
    auto dact = Tensor<T, Space>::empty(Shape{rows, ffn_local});
    rows_gemm(ctx, saved, false, rows, ffn_local, h, dy.data(), pointers(fc2_), dact.data());  // da (rows, ffn local)
    {
      Tensor<T, Space> activation = saved.activation;  // or made again (set_recompute_activation), freed after its use
      if (activation.data() == nullptr) {
        activation = Tensor<T, Space>::empty(Shape{rows, ffn_local});
        activate(ctx, saved.pre.data(), rows, ffn_local, activation.data());
      }
      weights_gemm(ctx, saved, rows, h, ffn_local, dy.data(), activation.data(), fc2_);  // dfc2 (hidden, ffn local)
    }
    if (config_.bias) group_bias_gradients(ctx, saved, h, dy.data(), fc2_bias_);
    auto dpre = Tensor<T, Space>::empty(Shape{rows, fc1_local});
    activate_backward(ctx, dact.data(), saved.pre.data(), rows, ffn_local, dpre.data());
    if (config_.bias) group_bias_gradients(ctx, saved, fc1_local, dpre.data(), fc1_bias_);
    auto dx = Tensor<T, Space>::empty(Shape{rows, h});
    rows_gemm(ctx, saved, false, rows, h, fc1_local, dpre.data(), pointers(fc1_), dx.data());  // dx, partial over etp
    weights_gemm(ctx, saved, rows, fc1_local, h, dpre.data(), saved.input.data(), fc1_);  // dfc1 (fc1 local, hidden)
    return dx;
  }

  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    for (auto& p : fc1_) init_normal(ctx.device, p, seed, stddev);
    for (auto& p : fc2_) init_normal(ctx.device, p, seed, output_stddev);
    for (auto& p : fc1_bias_) init_constant(ctx.device, p, 0.0);  // zeros, as Megatron's linear biases
    for (auto& p : fc2_bias_) init_constant(ctx.device, p, 0.0);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    for (index_t l = 0; l < local_; ++l) {
      visit(fc1_[l]);
      visit(fc2_[l]);
      if (config_.bias) {
        visit(fc1_bias_[l]);
        visit(fc2_bias_[l]);
      }
    }
  }

 private:
  // Adds bias[l] to the rows of local expert l (the counts read on the host: forward with a bias).
  void add_group_biases(Context& ctx, const Saved& s, index_t cols, const std::vector<const T*>& bias, T* c) const {
    index_t at = 0;
    for (index_t l = 0; l < local_; ++l) {
      if (s.host_counts[l] > 0) ctx.device.template bias_add<T>(c + at * cols, bias[l], s.host_counts[l], cols);
      at += s.host_counts[l];
    }
  }
  // Adds the column sums of each group's rows of dy [rows, cols] to its expert's bias gradient.
  static void group_bias_gradients(Context& ctx, const Saved& s, index_t cols, const T* dy, std::vector<Param>& bias) {
    index_t at = 0;
    for (std::size_t l = 0; l < bias.size(); ++l) {
      settle_gradient(ctx.device, bias[l]);
      if (s.host_counts[l] > 0) ctx.device.template bias_grad<T, A>(dy + at * cols, s.host_counts[l], cols, bias[l].grad.data());
      at += s.host_counts[l];
    }
  }
  // SwiGLU without clamp or offset runs on the backend's own swiglu kernels.
  bool plain_swiglu() const {
    return config_.glu.kind == GluKind::silu && config_.glu.clamp == 0 && config_.glu.linear_offset == 0;
  }
  // C[rows, n] = A[rows, k] op(B_l) by the saved row groups (op: transposed when tb): the backend's
  // device-count GEMM, or with the counts read on the host (then the rows past them are zeroed here).
  void rows_gemm(Context& ctx, const Saved& s, bool tb, index_t rows, index_t n, index_t k, const T* a,
                 const std::vector<const T*>& b, T* c) const {
    if (s.host_counts.empty()) {
      ctx.device.template grouped_gemm_rows<T>(tb, local_, s.counts.data(), rows, n, k, a, b.data(), c);
      return;
    }
    GemmGroups<T> g(local_);
    index_t at = 0;
    for (index_t l = 0; l < local_; ++l) {
      g.set(l, s.host_counts[l], n, k, a + at * k, b[l], c + at * n);
      at += s.host_counts[l];
    }
    ctx.device.template grouped_gemm<T>(false, tb, local_, g.m.data(), g.n.data(), g.k.data(), g.a.data(), g.b.data(),
                                        g.c.data(), false);
    if (rows > at) ctx.device.template fill<T>(c + at * n, (rows - at) * n, 0.0);
  }
  // Whether the weight-gradient GEMM of `weights` writes their gradients instead of adding to them:
  // every one is stale (zeroed by first write, layers/parameter.hpp; then none is after the call). A
  // mix (not made by GradBuffer::zero, which marks all of a layer's experts alike) settles the stale
  // ones and adds.
  static bool take_stale(Context& ctx, std::vector<Param>& weights) {
    bool all = true;
    for (const auto& p : weights) all = all && p.grad_stale;
    for (auto& p : weights) {
      if (all) p.grad_stale = false;
      else settle_gradient(ctx.device, p);
    }
    return all;
  }
  // C_l[m, n] += A_l^T B_l over the saved row groups of A [rows, m] and B [rows, n] (C_l = when the
  // gradients are stale: an empty group's is then zero).
  void weights_gemm(Context& ctx, const Saved& s, index_t rows, index_t m, index_t n, const T* a, const T* b,
                    std::vector<Param>& weights) const {
    const bool accumulate = !take_stale(ctx, weights);
    const std::vector<A*> c = gradients(weights);
    if (s.host_counts.empty()) {
      ctx.device.template grouped_gemm_weights<T, A>(local_, s.counts.data(), rows, m, n, a, b, c.data(), accumulate);
      return;
    }
    GemmGroups<A> w(local_);
    index_t at = 0;
    for (index_t l = 0; l < local_; ++l) {
      w.set(l, m, n, s.host_counts[l], a + at * m, b + at * n, c[l]);
      at += s.host_counts[l];
    }
    ctx.device.template grouped_gemm<T, A>(true, false, local_, w.m.data(), w.n.data(), w.k.data(), w.a.data(), w.b.data(),
                                           w.c.data(), accumulate);
  }

  // The activation of pre [rows, fc1 local] into out [rows, ffn local], and its backward.
  void activate(Context& ctx, const T* pre, index_t rows, index_t ffn_local, T* out) const {
    if constexpr (gated) {
      if (plain_swiglu()) ctx.device.template swiglu_forward<T>(pre, rows, ffn_local, out);
      else ctx.device.template glu_forward<T>(pre, rows, ffn_local, config_.glu, out);
    } else ctx.device.template gelu_forward<T>(pre, rows * ffn_local, out);
  }
  void activate_backward(Context& ctx, const T* dact, const T* pre, index_t rows, index_t ffn_local, T* dpre) const {
    if constexpr (gated) {
      if (plain_swiglu()) ctx.device.template swiglu_backward<T>(dact, pre, rows, ffn_local, dpre);
      else ctx.device.template glu_backward<T>(dact, pre, rows, ffn_local, config_.glu, dpre);
    } else ctx.device.template gelu_backward<T>(dact, pre, rows * ffn_local, dpre);
  }

  // ---- FP8 (see the header) ----

  // The rows in the groups (the saved counts' sum; the rest are outside every group).
  static index_t grouped_rows(const Saved& s) {
    index_t grouped = 0;
    for (const index_t c : s.host_counts) grouped += c;
    return grouped;
  }

  // The local experts' weights [out, in] each in FP8 with the projection's weight scale: W (forward)
  // or W^T [in, out] (transposed) of expert l at codes + l * out * in. From the state's weight cache
  // (stacked, filled at the step's first use; dropped after each optimizer step), or cast now when
  // the options keep no cache (`own` holds them). Without Fp8Options::cache_forward_weights the cache
  // keeps W^T alone, as the dense layers' does: the filling pass writes W into `own`, and a later
  // forward of the step casts W again with the step's scale (the same codes).
  const std::uint8_t* expert_weight_codes(Context& ctx, Fp8State<Space>& state, const std::vector<Param>& weights, index_t out,
                                          index_t in, bool transposed, detail::Fp8Pair<Space>& own) const {
    auto& cache = state.weight_cache;
    const bool keep = ctx.fp8->options.cache_weights, keep_forward = keep && ctx.fp8->options.cache_forward_weights;
    const Shape forward{local_ * out, in}, backward{local_ * in, out};
    const auto sized = [](Tensor<std::uint8_t, Space>& t, const Shape& shape) {
      if (t.data() == nullptr || !(t.shape() == shape)) t = Tensor<std::uint8_t, Space>::empty(shape);
    };
    const Fp8Format format = ctx.fp8->options.format_of(Fp8Role::weight);
    Tensor<std::uint8_t, Space>& codes = keep_forward ? cache.codes : own.codes;
    Tensor<std::uint8_t, Space>& codes_t = keep ? cache.codes_transposed : own.codes_t;
    if (!keep || !cache.valid) {
      sized(codes_t, backward);
      if (keep && !keep_forward) cache.codes = Tensor<std::uint8_t, Space>();
      const bool write_forward = keep_forward || !keep || !transposed;  // W^T alone when only it is asked for and kept
      if (write_forward) sized(codes, forward);
      for (index_t l = 0; l < local_; ++l)
        ctx.device.template fp8_cast_transpose<T>(weights[l].value.data(), out, in, format, state.scale(Fp8Role::weight),
                                                  write_forward ? codes.data() + l * out * in : nullptr,
                                                  codes_t.data() + l * in * out, state.amax(Fp8Role::weight));
      // every role's 1 / scale into its aligned slot, as the dense layers' cache fill writes them
      ctx.device.template copy_columns<float>(state.scale_inv(Fp8Role::input), state.row_length(), kFp8Roles, 1,
                                              state.gemm_scale_inv(Fp8Role::input), 4);
      cache.valid = keep;
      ++state.weight_casts;
    } else if (!keep_forward && !transposed) {  // a later forward of the step: W again, with the step's scale
      sized(codes, forward);
      for (index_t l = 0; l < local_; ++l)
        ctx.device.template fp8_cast<T>(weights[l].value.data(), out * in, format, state.scale(Fp8Role::weight),
                                        codes.data() + l * out * in, nullptr);
      ++state.weight_casts;
    }
    return (transposed ? codes_t : codes).data();
  }
  const float* weight_scale_inv(Fp8Scaling<Space>& scaling, Fp8State<Space>& state) const {
    return scaling.options.cache_weights ? state.gemm_scale_inv(Fp8Role::weight) : state.scale_inv(Fp8Role::weight);
  }

  // c [rows, n] (row groups of the saved counts) = a's codes [rows, k] times expert l's b codes
  // [n, k]^T (at b + l * n * k); rows past the counts zero.
  void fp8_rows_gemm(Context& ctx, const Saved& s, index_t rows, index_t n, index_t k, const detail::Fp8Pair<Space>& a,
                     const std::uint8_t* b, Fp8Format b_format, const float* b_scale_inv, T* c) const {
    index_t at = 0;
    for (index_t l = 0; l < local_; ++l) {
      const index_t m = s.host_counts[l];
      if (m > 0)
        ctx.device.template fp8_gemm<T>(false, true, m, n, k, a.codes.data() + at * k, a.format, a.scale_inv, b + l * n * k,
                                        b_format, b_scale_inv, c + at * n, false, nullptr);
      at += m;
    }
    if (rows > at) ctx.device.template fill<T>(c + at * n, (rows - at) * n, 0.0);
  }

  // Expert l's columns [at, at + count) of codes [rows, cols] (a transposed operand, cols the grouped
  // rows), as [rows, count rounded up to 16] with zero columns after them.
  static Tensor<std::uint8_t, Space> group_columns(Context& ctx, const Tensor<std::uint8_t, Space>& codes, index_t at,
                                                   index_t count) {
    const index_t rows = codes.shape().rows(), cols = codes.shape().cols(), padded = (count + 15) / 16 * 16;
    auto out = padded > count ? Tensor<std::uint8_t, Space>::zeros(Shape{rows, padded})
                              : Tensor<std::uint8_t, Space>::empty(Shape{rows, padded});
    ctx.device.template copy_columns<std::uint8_t>(codes.data() + at, cols, rows, count, out.data(), padded);
    return out;
  }

  // grads[l] [m, n] += a_l^T b_l over the groups (= when stale: take_stale): a^T's codes [m, grouped
  // rows], b^T's [n, grouped rows].
  void fp8_weights_gemm(Context& ctx, const Saved& s, const detail::Fp8Pair<Space>& a, const detail::Fp8Pair<Space>& b,
                        std::vector<Param>& weights) const {
    const index_t m = a.codes_t.shape().rows(), n = b.codes_t.shape().rows();
    const bool accumulate = !take_stale(ctx, weights);
    index_t at = 0;
    for (index_t l = 0; l < local_; ++l) {
      const index_t count = s.host_counts[l];
      if (count > 0) {
        const auto al = group_columns(ctx, a.codes_t, at, count), bl = group_columns(ctx, b.codes_t, at, count);
        ctx.device.template fp8_gemm<A>(false, true, m, n, al.shape().cols(), al.data(), a.format, a.scale_inv, bl.data(),
                                        b.format, b.scale_inv, weights[l].grad.data(), accumulate, nullptr);
      } else if (!accumulate) {
        ctx.device.template fill<A>(weights[l].grad.data(), m * n, 0.0);
      }
      at += count;
    }
  }

  std::pair<Tensor<T, Space>, Saved> forward_fp8(Context& ctx, Saved saved, index_t fc1_local, index_t ffn_local) const {
    const index_t rows = saved.input.shape().rows(), h = config_.hidden_size, grouped = grouped_rows(saved);
    auto& scaling = *ctx.fp8;
    // fc1: x's grouped rows cast once, both layouts (x^T's codes kept for dfc1)
    auto xq = detail::fp8_quantize_pair(ctx, *fc1_fp8_, Fp8Role::input, saved.input.data(), grouped, h, false, true);
    detail::Fp8Pair<Space> own1, own2;
    const std::uint8_t* w1 = expert_weight_codes(ctx, *fc1_fp8_, fc1_, fc1_local, h, false, own1);
    fp8_rows_gemm(ctx, saved, rows, fc1_local, h, xq, w1, scaling.options.format_of(Fp8Role::weight),
                  weight_scale_inv(scaling, *fc1_fp8_), saved.pre.data());  // (rows, fc1 local)
    if (config_.bias) add_group_biases(ctx, saved, fc1_local, pointers(fc1_bias_), saved.pre.data());
    activate(ctx, saved.pre.data(), rows, ffn_local, saved.activation.data());
    // fc2: the activation's grouped rows cast once (its transposed codes kept for dfc2)
    auto aq = detail::fp8_quantize_pair(ctx, *fc2_fp8_, Fp8Role::input, saved.activation.data(), grouped, ffn_local, false, true);
    const std::uint8_t* w2 = expert_weight_codes(ctx, *fc2_fp8_, fc2_, h, ffn_local, false, own2);
    auto y = Tensor<T, Space>::empty(Shape{rows, h});
    fp8_rows_gemm(ctx, saved, rows, h, ffn_local, aq, w2, scaling.options.format_of(Fp8Role::weight),
                  weight_scale_inv(scaling, *fc2_fp8_), y.data());  // (rows, hidden), partial over etp
    if (config_.bias && output_bias_rank_) add_group_biases(ctx, saved, h, pointers(fc2_bias_), y.data());
    xq.codes = aq.codes = Tensor<std::uint8_t, Space>();  // the forward's own layouts served it alone
    saved.input_codes = std::move(xq);
    if (!recompute_activation_) saved.activation_codes = std::move(aq);  // else cast again by the backward
    saved.input = saved.activation = Tensor<T, Space>();  // the backward reads their codes
    return {std::move(y), std::move(saved)};
  }

  Tensor<T, Space> backward_fp8(Context& ctx, const Saved& saved, const Tensor<T, Space>& dy) {
    const index_t rows = saved.pre.shape().rows(), h = config_.hidden_size;
    const index_t fc1_local = saved.pre.shape().cols(), ffn_local = gated ? fc1_local / 2 : fc1_local;
    const index_t grouped = grouped_rows(saved);
    auto& scaling = *ctx.fp8;
    const Fp8Format weight_format = scaling.options.format_of(Fp8Role::weight);
    // fc2: dy's grouped rows cast once, both layouts
    auto dyq = detail::fp8_quantize_pair(ctx, *fc2_fp8_, Fp8Role::grad_output, dy.data(), grouped, h, false, true);
    detail::Fp8Pair<Space> own1, own2;
    const std::uint8_t* w2t = expert_weight_codes(ctx, *fc2_fp8_, fc2_, h, ffn_local, true, own2);  // [ffn local, h] each
    auto dact = Tensor<T, Space>::empty(Shape{rows, ffn_local});
    fp8_rows_gemm(ctx, saved, rows, ffn_local, h, dyq, w2t, weight_format, weight_scale_inv(scaling, *fc2_fp8_),
                  dact.data());                                                // da (rows, ffn local)
    if (saved.activation_codes.empty()) {  // set_recompute_activation: the activation and its transposed codes again
      auto activation = Tensor<T, Space>::empty(Shape{rows, ffn_local});
      activate(ctx, saved.pre.data(), rows, ffn_local, activation.data());
      const auto aq = detail::fp8_quantize_pair(ctx, *fc2_fp8_, Fp8Role::input, activation.data(), grouped, ffn_local, false,
                                                false);
      activation = Tensor<T, Space>();
      fp8_weights_gemm(ctx, saved, dyq, aq, fc2_);                              // dfc2 (hidden, ffn local)
    } else {
      fp8_weights_gemm(ctx, saved, dyq, saved.activation_codes, fc2_);          // dfc2 (hidden, ffn local)
    }
    if (config_.bias) group_bias_gradients(ctx, saved, h, dy.data(), fc2_bias_);
    dyq = detail::Fp8Pair<Space>();
    own2 = detail::Fp8Pair<Space>();
    auto dpre = Tensor<T, Space>::empty(Shape{rows, fc1_local});
    activate_backward(ctx, dact.data(), saved.pre.data(), rows, ffn_local, dpre.data());
    dact = Tensor<T, Space>();  // what this backward holds at once stays the element type path's
    if (config_.bias) group_bias_gradients(ctx, saved, fc1_local, dpre.data(), fc1_bias_);
    // fc1: the pre-activation's gradient cast once, both layouts
    auto dpq = detail::fp8_quantize_pair(ctx, *fc1_fp8_, Fp8Role::grad_output, dpre.data(), grouped, fc1_local, false, true);
    const std::uint8_t* w1t = expert_weight_codes(ctx, *fc1_fp8_, fc1_, fc1_local, h, true, own1);  // [h, fc1 local] each
    auto dx = Tensor<T, Space>::empty(Shape{rows, h});
    fp8_rows_gemm(ctx, saved, rows, h, fc1_local, dpq, w1t, weight_format, weight_scale_inv(scaling, *fc1_fp8_),
                  dx.data());                                       // dx, partial over etp
    fp8_weights_gemm(ctx, saved, dpq, saved.input_codes, fc1_);    // dfc1 (fc1 local, hidden)
    return dx;
  }

  // Sizes and pointers of one grouped GEMM (host arrays), for C_g = op(A_g) op(B_g).
  template <class C>
  struct GemmGroups {
    std::vector<index_t> m, n, k;
    std::vector<const T*> a, b;
    std::vector<C*> c;
    explicit GemmGroups(index_t groups) : m(groups), n(groups), k(groups), a(groups), b(groups), c(groups) {}
    void set(index_t g, index_t m_, index_t n_, index_t k_, const T* a_, const T* b_, C* c_) {
      m[g] = m_, n[g] = n_, k[g] = k_, a[g] = a_, b[g] = b_, c[g] = c_;
    }
  };

  static std::vector<const T*> pointers(const std::vector<Param>& ps) {
    std::vector<const T*> out;
    for (const auto& p : ps) out.push_back(p.value.data());
    return out;
  }
  static std::vector<A*> gradients(std::vector<Param>& ps) {
    std::vector<A*> out;
    for (auto& p : ps) out.push_back(p.grad.data());
    return out;
  }

  ExpertsConfig config_;
  index_t local_ = 0, first_ = 0;
  std::vector<Param> fc1_, fc2_;
  std::vector<Param> fc1_bias_, fc2_bias_;  // with ExpertsConfig::bias
  bool recompute_activation_ = false;        // set_recompute_activation
  bool output_bias_rank_ = true;             // adds fc2's bias (etp rank 0)
  std::shared_ptr<Fp8State<Space>> fc1_fp8_, fc2_fp8_;  // FP8 (see the header), else null
};

STRATA_NAMESPACE_END
