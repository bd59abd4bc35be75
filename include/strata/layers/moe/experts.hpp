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
// read on the host once per forward (a synchronization the bias-free GEMMs on Hopper avoid).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../backend/backend.hpp"
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
    Tensor<T, Space> activation;              // [rows, ffn local]
    Tensor<std::int32_t, Space> counts;       // [local experts] rows of each, in the backend's memory
    std::vector<index_t> host_counts;         // the same on the host, when the backend reads them there
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
      if (c.bias) {
        fc1_bias_.emplace_back(prefix + ".fc1.bias", Shape{(gated ? 2 : 1) * c.ffn_hidden_size},
                               ShardSpec::split(0, ctx.expert_tp.rank(), etp, gated ? 2 : 1));
        fc2_bias_.emplace_back(prefix + ".fc2.bias", Shape{c.hidden_size}, ShardSpec::replicated());
        fc1_bias_.back().expert = fc2_bias_.back().expert = true;
        fc1_bias_.back().weight_decay = fc2_bias_.back().weight_decay = false;
      }
    }
    output_bias_rank_ = ctx.expert_tp.rank() == 0;
  }

  index_t local_experts() const { return local_; }
  index_t first_expert() const { return first_; }

  // x: [rows, hidden], its first counts[0] rows local expert 0's, the next counts[1] expert 1's, ...;
  // counts (in the backend's memory) may total fewer than rows: the rest are outside every group and
  // their outputs are zero. The GEMMs read the counts where they are; a backend whose grouped GEMMs
  // would read them on the host (grouped_gemm_counts_on_device false: CUDA without the Hopper kernel,
  // other element types or sizes) gets them read once here, for the forward and the backward.
  std::pair<Tensor<T, Space>, Saved> forward(Context& ctx, const Tensor<T, Space>& x,
                                             const Tensor<std::int32_t, Space>& counts) const {
    const index_t rows = x.shape().rows(), h = config_.hidden_size;
    const index_t fc1_local = fc1_.empty() ? 0 : fc1_[0].value.size(0), ffn_local = gated ? fc1_local / 2 : fc1_local;
    if (counts.numel() != local_)
      fail<ShapeError>("GroupedExperts: ", counts.numel(), " token counts for ", local_, " local experts");
    Saved saved{x, Tensor<T, Space>::empty(Shape{rows, fc1_local}), Tensor<T, Space>::empty(Shape{rows, ffn_local}), counts,
                {}};
    if (config_.bias || !ctx.device.template grouped_gemm_counts_on_device<T>(fc1_local, h) ||
        !ctx.device.template grouped_gemm_counts_on_device<T>(h, ffn_local)) {
      std::vector<std::int32_t> host(static_cast<std::size_t>(local_));
      ctx.device.template copy_to_host<std::int32_t>(counts.data(), local_, host.data());
      saved.host_counts.assign(host.begin(), host.end());
    }
    rows_gemm(ctx, saved, true, rows, fc1_local, h, x.data(), pointers(fc1_), saved.pre.data());  // (rows, fc1 local)
    if (config_.bias) add_group_biases(ctx, saved, fc1_local, pointers(fc1_bias_), saved.pre.data());
    if constexpr (gated) {
      if (plain_swiglu()) ctx.device.template swiglu_forward<T>(saved.pre.data(), rows, ffn_local, saved.activation.data());
      else ctx.device.template glu_forward<T>(saved.pre.data(), rows, ffn_local, config_.glu, saved.activation.data());
    } else ctx.device.template gelu_forward<T>(saved.pre.data(), rows * ffn_local, saved.activation.data());
    auto y = Tensor<T, Space>::empty(Shape{rows, h});
    rows_gemm(ctx, saved, true, rows, h, ffn_local, saved.activation.data(), pointers(fc2_),
              y.data());  // (rows, hidden), partial over etp
    if (config_.bias && output_bias_rank_) add_group_biases(ctx, saved, h, pointers(fc2_bias_), y.data());
    return {std::move(y), std::move(saved)};
  }

  Tensor<T, Space> backward(Context& ctx, const Saved& saved, const Tensor<T, Space>& dy) {
    const index_t rows = saved.input.shape().rows(), h = config_.hidden_size;
    const index_t fc1_local = saved.pre.shape().cols(), ffn_local = saved.activation.shape().cols();
    auto dact = Tensor<T, Space>::empty(Shape{rows, ffn_local});
    rows_gemm(ctx, saved, false, rows, ffn_local, h, dy.data(), pointers(fc2_), dact.data());  // da (rows, ffn local)
    weights_gemm(ctx, saved, rows, h, ffn_local, dy.data(), saved.activation.data(),
                 gradients(fc2_));  // dfc2 (hidden, ffn local)
    if (config_.bias) group_bias_gradients(ctx, saved, h, dy.data(), fc2_bias_);
    auto dpre = Tensor<T, Space>::empty(Shape{rows, fc1_local});
    if constexpr (gated) {
      if (plain_swiglu()) ctx.device.template swiglu_backward<T>(dact.data(), saved.pre.data(), rows, ffn_local, dpre.data());
      else ctx.device.template glu_backward<T>(dact.data(), saved.pre.data(), rows, ffn_local, config_.glu, dpre.data());
    } else ctx.device.template gelu_backward<T>(dact.data(), saved.pre.data(), rows * ffn_local, dpre.data());
    if (config_.bias) group_bias_gradients(ctx, saved, fc1_local, dpre.data(), fc1_bias_);
    auto dx = Tensor<T, Space>::empty(Shape{rows, h});
    rows_gemm(ctx, saved, false, rows, h, fc1_local, dpre.data(), pointers(fc1_), dx.data());  // dx, partial over etp
    weights_gemm(ctx, saved, rows, fc1_local, h, dpre.data(), saved.input.data(),
                 gradients(fc1_));  // dfc1 (fc1 local, hidden)
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
  // C_l[m, n] += A_l^T B_l over the saved row groups of A [rows, m] and B [rows, n].
  void weights_gemm(Context& ctx, const Saved& s, index_t rows, index_t m, index_t n, const T* a, const T* b,
                    const std::vector<A*>& c) const {
    if (s.host_counts.empty()) {
      ctx.device.template grouped_gemm_weights<T, A>(local_, s.counts.data(), rows, m, n, a, b, c.data(), true);
      return;
    }
    GemmGroups<A> w(local_);
    index_t at = 0;
    for (index_t l = 0; l < local_; ++l) {
      w.set(l, m, n, s.host_counts[l], a + at * m, b + at * n, c[l]);
      at += s.host_counts[l];
    }
    ctx.device.template grouped_gemm<T, A>(true, false, local_, w.m.data(), w.n.data(), w.k.data(), w.a.data(), w.b.data(),
                                           w.c.data(), true);
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
  bool output_bias_rank_ = true;             // adds fc2's bias (etp rank 0)
};

STRATA_NAMESPACE_END
