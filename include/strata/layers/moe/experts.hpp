// strata/layers/moe/experts.hpp: `GroupedExperts<Policy, Activation>`, this rank's experts, each an
// MLP without bias, run as one grouped GEMM per projection over the tokens the dispatcher grouped
// by local expert (Megatron-Core's GroupedMLP).
//
//   fc1 (expert e) [ffn (x2 for swiglu: [gate; up]), hidden], split over etp on its rows (each
//                  stacked block on its own, as the dense column-parallel fc1)
//   fc2 (expert e) [hidden, ffn], split over etp on its columns (as the dense row-parallel fc2)
//   forward   h = x_e fc1_e^T (grouped), a = gelu(h) or silu(gate) * up, y_e = a fc2_e^T (grouped)
//             y is partial over etp: the dispatcher's combine sums it over the etp ranks
//   backward  da = dy_e fc2_e, dfc2_e += dy_e^T a_e, dh = act'(h) da, dx_e = dh fc1_e (partial over
//             etp, summed by the dispatcher), dfc1_e += dh^T x_e
//
// Parameters are named `<name>.<global expert>.fc1.weight` / `.fc2.weight` and flagged `expert`, so
// initialization (at each element's global index) and checkpoints do not depend on ep or etp.
#pragma once

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
    local_ = c.num_experts / ep;
    first_ = ctx.ep.rank() * local_;
    for (index_t l = 0; l < local_; ++l) {
      const std::string prefix = name + "." + std::to_string(first_ + l);
      fc1_.emplace_back(prefix + ".fc1.weight", Shape{(gated ? 2 : 1) * c.ffn_hidden_size, c.hidden_size},
                        ShardSpec::split(0, ctx.expert_tp.rank(), etp, gated ? 2 : 1));
      fc2_.emplace_back(prefix + ".fc2.weight", Shape{c.hidden_size, c.ffn_hidden_size},
                        ShardSpec::split(1, ctx.expert_tp.rank(), etp));
      fc1_.back().expert = fc2_.back().expert = true;
    }
  }

  index_t local_experts() const { return local_; }
  index_t first_expert() const { return first_; }

  // x: [rows, hidden], its first counts[0] rows local expert 0's, the next counts[1] expert 1's, ...;
  // counts (in the backend's memory, never read on the host here) may total fewer than rows: the rest
  // are outside every group and their outputs are zero.
  std::pair<Tensor<T, Space>, Saved> forward(Context& ctx, const Tensor<T, Space>& x,
                                             const Tensor<std::int32_t, Space>& counts) const {
    const index_t rows = x.shape().rows(), h = config_.hidden_size;
    const index_t fc1_local = fc1_.empty() ? 0 : fc1_[0].value.size(0), ffn_local = gated ? fc1_local / 2 : fc1_local;
    if (counts.numel() != local_)
      fail<ShapeError>("GroupedExperts: ", counts.numel(), " token counts for ", local_, " local experts");
    Saved saved{x, Tensor<T, Space>::empty(Shape{rows, fc1_local}), Tensor<T, Space>::empty(Shape{rows, ffn_local}), counts};
    ctx.device.template grouped_gemm_rows<T>(true, local_, counts.data(), rows, fc1_local, h, x.data(),
                                             pointers(fc1_).data(), saved.pre.data());  // (rows, fc1 local)
    if constexpr (gated) ctx.device.template swiglu_forward<T>(saved.pre.data(), rows, ffn_local, saved.activation.data());
    else ctx.device.template gelu_forward<T>(saved.pre.data(), rows * ffn_local, saved.activation.data());
    auto y = Tensor<T, Space>::empty(Shape{rows, h});
    ctx.device.template grouped_gemm_rows<T>(true, local_, counts.data(), rows, h, ffn_local, saved.activation.data(),
                                             pointers(fc2_).data(), y.data());  // (rows, hidden), partial over etp
    return {std::move(y), std::move(saved)};
  }

  Tensor<T, Space> backward(Context& ctx, const Saved& saved, const Tensor<T, Space>& dy) {
    const index_t rows = saved.input.shape().rows(), h = config_.hidden_size;
    const index_t fc1_local = saved.pre.shape().cols(), ffn_local = saved.activation.shape().cols();
    const std::int32_t* counts = saved.counts.data();
    auto dact = Tensor<T, Space>::empty(Shape{rows, ffn_local});
    ctx.device.template grouped_gemm_rows<T>(false, local_, counts, rows, ffn_local, h, dy.data(), pointers(fc2_).data(),
                                             dact.data());  // da (rows, ffn local)
    ctx.device.template grouped_gemm_weights<T, A>(local_, counts, rows, h, ffn_local, dy.data(), saved.activation.data(),
                                                   gradients(fc2_).data(), true);  // dfc2 (hidden, ffn local)
    auto dpre = Tensor<T, Space>::empty(Shape{rows, fc1_local});
    if constexpr (gated) ctx.device.template swiglu_backward<T>(dact.data(), saved.pre.data(), rows, ffn_local, dpre.data());
    else ctx.device.template gelu_backward<T>(dact.data(), saved.pre.data(), rows * ffn_local, dpre.data());
    auto dx = Tensor<T, Space>::empty(Shape{rows, h});
    ctx.device.template grouped_gemm_rows<T>(false, local_, counts, rows, h, fc1_local, dpre.data(), pointers(fc1_).data(),
                                             dx.data());  // dx (rows, hidden), partial over etp
    ctx.device.template grouped_gemm_weights<T, A>(local_, counts, rows, fc1_local, h, dpre.data(), saved.input.data(),
                                                   gradients(fc1_).data(), true);  // dfc1 (fc1 local, hidden)
    return dx;
  }

  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    for (auto& p : fc1_) init_normal(ctx.device, p, seed, stddev);
    for (auto& p : fc2_) init_normal(ctx.device, p, seed, output_stddev);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    for (index_t l = 0; l < local_; ++l) {
      visit(fc1_[l]);
      visit(fc2_[l]);
    }
  }

 private:
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
};

STRATA_NAMESPACE_END
