// strata/backend/moe_routing.hpp: `MoeRouting`, how a mixture-of-experts router turns a token's
// logits z[E] into its top-k experts and their weights, as the backend's router kernels take it
// (by value, so trivially copyable). The math (Megatron-Core's topk_routing_with_score_function):
//
//   softmax, !pre_softmax: choose top-k of z (+ bias), weights = softmax over the k chosen z
//   softmax,  pre_softmax: s = softmax(z); choose top-k of s (+ bias), weights = s at the chosen
//   sigmoid:               s = sigmoid(z); choose top-k of s (+ bias), weights = s at the chosen,
//                          divided by their sum (+1e-20) when k > 1
//   then weights *= scaling_factor.
//
// Group-limited routing (DeepSeek-V3; Megatron's --moe-router-num-groups, --moe-router-group-topk):
// the experts form num_groups groups of E / num_groups consecutive experts; a group's score is the
// sum of its top (k / group_topk) choice scores (bias included), the group_topk groups of the highest
// scores are kept, and the top-k is chosen among their experts alone. The weights and the losses
// are computed as without groups: the groups steer only the choice.
//
// The expert bias (aux-loss-free balancing) steers only the choice, never the weights. Ties in the
// choice go to the lower expert index, so two backends choose alike. Scores for the load-balancing
// loss are softmax(z) (softmax) or s / (sum s + 1e-20) (sigmoid), over all E experts.
#pragma once

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN

enum class MoeScore : std::int32_t { softmax = 0, sigmoid = 1 };

struct MoeRouting {
  MoeScore score = MoeScore::softmax;
  bool pre_softmax = false;     // softmax over all experts before the choice (softmax only)
  double scaling_factor = 1.0;  // the weights' factor (Megatron's moe_router_topk_scaling_factor)
  std::int32_t num_groups = 0;  // group-limited routing: expert groups (0: none)
  std::int32_t group_topk = 0;  // and the groups a token's experts come from
  STRATA_HOST_DEVICE constexpr bool grouped() const { return num_groups > 1; }
};
static_assert(std::is_trivially_copyable_v<MoeRouting>, "MoeRouting is passed to kernels by value, so it must be trivially copyable.");

// The router's load balancing (layers/moe/router.hpp) and what capacity dropping drops first;
// here, beside MoeRouting, so model configurations name them without the layers.
enum class MoeLoadBalancing { none, aux_loss, seq_aux_loss };
enum class MoeDropPolicy { probability, position };
// The token dispatcher a model built with the `moe_configured` tag runs (layers/moe/moe_mlp.hpp):
// Megatron's --moe-token-dispatcher-type.
enum class MoeDispatcherType { alltoall, allgather };

// The group-limited routing of `r` checked against `experts` and `topk` (ConfigError naming `who`).
inline void check_moe_group_routing(const char* who, const MoeRouting& r, index_t experts, index_t topk) {
  if (r.num_groups == 0 && r.group_topk == 0) return;
  if (r.num_groups < 1 || r.num_groups > 64 || experts % r.num_groups != 0)
    fail<ConfigError>(who, ": --moe-router-num-groups=", r.num_groups, " must divide num_experts=", experts,
                      " (at most 64 groups): the groups are equal runs of consecutive experts");
  if (r.group_topk < 1 || r.group_topk > r.num_groups || r.group_topk > topk)
    fail<ConfigError>(who, ": --moe-router-group-topk=", r.group_topk, " must be between 1 and --moe-router-num-groups=",
                      r.num_groups, " and at most --moe-router-topk=", topk,
                      ": each kept group scores its top topk / group_topk experts (DeepSeek-V3: 8 groups, 4 kept, top-8)");
  if (topk > static_cast<index_t>(r.group_topk) * (experts / r.num_groups))
    fail<ConfigError>(who, ": --moe-router-topk=", topk, " is more than the ", r.group_topk, " kept groups of ",
                      experts / r.num_groups, " experts hold; keep more groups (--moe-router-group-topk) or choose fewer");
}

// Slots per expert for `tokens` tokens routed to `topk` of `experts` experts with a capacity factor
// (> 0): ceil(tokens x topk / experts x factor) (Megatron's get_capacity), at most `tokens`. An
// expert never receives more than every token once (a token's topk experts differ), so a larger
// capacity drops nothing; the bound keeps a huge factor from overflowing the count or padding
// beyond the tokens.
inline index_t moe_expert_capacity(index_t tokens, index_t topk, index_t experts, double capacity_factor) {
  const double capacity =
      ::ceil(static_cast<double>(tokens) * static_cast<double>(topk) / static_cast<double>(experts) * capacity_factor);
  return capacity >= static_cast<double>(tokens) ? tokens : static_cast<index_t>(capacity);
}

namespace moe_math {

// One token's routing, shared by the CPU kernels and the CUDA ones (one thread per token), so both
// backends choose the same experts and produce the same bits up to the exponential's rounding.
// Everything is computed in double whatever A (float or double) holds.

STRATA_HOST_DEVICE inline double sigmoid(double z) { return 1.0 / (1.0 + ::exp(-z)); }

template <class A>
struct RowStats {
  double max = 0, sum = 0;  // max_e z_e and sum_e exp(z_e - max)
  STRATA_HOST_DEVICE RowStats(const A* z, index_t experts) {
    max = static_cast<double>(z[0]);
    for (index_t e = 1; e < experts; ++e) max = static_cast<double>(z[e]) > max ? static_cast<double>(z[e]) : max;
    for (index_t e = 0; e < experts; ++e) sum += ::exp(static_cast<double>(z[e]) - max);
  }
  STRATA_HOST_DEVICE double softmax(const A* z, index_t e) const { return ::exp(static_cast<double>(z[e]) - max) / sum; }
  STRATA_HOST_DEVICE double logsumexp() const { return max + ::log(sum); }
};

// s_e: softmax(z)_e or sigmoid(z_e).
template <class A>
STRATA_HOST_DEVICE double score(const A* z, const RowStats<A>& stats, MoeRouting r, index_t e) {
  return r.score == MoeScore::softmax ? stats.softmax(z, e) : sigmoid(static_cast<double>(z[e]));
}

// The value expert e is chosen by: its logit (softmax after the choice) or its score, plus the bias.
template <class A>
STRATA_HOST_DEVICE double choice_value(const A* z, const RowStats<A>& stats, MoeRouting r, const A* bias, index_t e) {
  const bool by_logit = r.score == MoeScore::softmax && !r.pre_softmax;
  double v = by_logit ? static_cast<double>(z[e]) : score(z, stats, r, e);
  if (bias) v += static_cast<double>(bias[e]);
  return v;
}

// Group-limited routing: the bit mask of the kept groups (see the top). Ties go to the lower index,
// within a group and between groups.
template <class A>
STRATA_HOST_DEVICE std::uint64_t kept_groups(const A* z, const RowStats<A>& stats, MoeRouting r, const A* bias,
                                             index_t experts, index_t k) {
  const index_t size = experts / r.num_groups, per_group = k / r.group_topk;
  double group_score[64];
  for (index_t g = 0; g < r.num_groups; ++g) {  // the sum of the group's top per_group choice values
    double sum = 0, last = 0;  // the members taken so far rank at or before (last, last_index)
    index_t last_index = -1;
    for (index_t j = 0; j < per_group; ++j) {
      index_t best = -1;
      double best_value = 0;
      for (index_t m = 0; m < size; ++m) {
        const double v = choice_value(z, stats, r, bias, g * size + m);
        // taken: strictly above the last choice, or equal to it at an index not after it
        const bool taken = j > 0 && (v > last || (v == last && m <= last_index));
        if (taken) continue;
        if (best < 0 || v > best_value) best = m, best_value = v;
      }
      sum += best_value, last = best_value, last_index = best;
    }
    group_score[g] = sum;
  }
  std::uint64_t kept = 0;
  for (index_t j = 0; j < r.group_topk; ++j) {
    index_t best = -1;
    for (index_t g = 0; g < r.num_groups; ++g)
      if (!(kept >> g & 1u) && (best < 0 || group_score[g] > group_score[best])) best = g;
    kept |= std::uint64_t{1} << best;
  }
  return kept;
}

// z: [experts] logits; bias: [experts] or null; writes idx[k], w[k], and aux[experts] and *lse when
// not null.
template <class A>
STRATA_HOST_DEVICE void route_row(const A* z, index_t experts, index_t k, MoeRouting r, const A* bias, std::int32_t* idx,
                                  A* w, A* aux, A* lse) {
  const RowStats<A> stats(z, experts);
  const bool by_logit = r.score == MoeScore::softmax && !r.pre_softmax;
  const std::uint64_t kept = r.grouped() ? kept_groups(z, stats, r, bias, experts, k) : ~std::uint64_t{0};
  const index_t group_size = r.grouped() ? experts / r.num_groups : experts;
  for (index_t j = 0; j < k; ++j) {  // the j-th largest choice score among the experts not yet chosen
    index_t best = -1;
    double best_value = 0;
    for (index_t e = 0; e < experts; ++e) {
      if (r.grouped() && !(kept >> (e / group_size) & 1u)) continue;  // outside the kept groups
      bool taken = false;
      for (index_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (taken) continue;
      const double v = choice_value(z, stats, r, bias, e);
      if (best < 0 || v > best_value) best = e, best_value = v;
    }
    idx[j] = static_cast<std::int32_t>(best);
  }
  if (by_logit) {  // softmax over the chosen logits
    double top = static_cast<double>(z[idx[0]]), sum = 0;
    for (index_t j = 1; j < k; ++j) top = static_cast<double>(z[idx[j]]) > top ? static_cast<double>(z[idx[j]]) : top;
    for (index_t j = 0; j < k; ++j) sum += ::exp(static_cast<double>(z[idx[j]]) - top);
    for (index_t j = 0; j < k; ++j) w[j] = static_cast<A>(r.scaling_factor * ::exp(static_cast<double>(z[idx[j]]) - top) / sum);
  } else {
    double sum = 0;
    for (index_t j = 0; j < k; ++j) sum += score(z, stats, r, idx[j]);
    const bool normalize = r.score == MoeScore::sigmoid && k > 1;
    for (index_t j = 0; j < k; ++j) {
      const double s = score(z, stats, r, idx[j]);
      w[j] = static_cast<A>(r.scaling_factor * (normalize ? s / (sum + 1e-20) : s));
    }
  }
  if (aux) {
    double sigmoid_sum = 0;
    if (r.score == MoeScore::sigmoid)
      for (index_t e = 0; e < experts; ++e) sigmoid_sum += sigmoid(static_cast<double>(z[e]));
    for (index_t e = 0; e < experts; ++e)
      aux[e] = static_cast<A>(r.score == MoeScore::softmax ? stats.softmax(z, e)
                                                            : sigmoid(static_cast<double>(z[e])) / (sigmoid_sum + 1e-20));
  }
  if (lse) *lse = static_cast<A>(stats.logsumexp());
}

// The backward of route_row for one token: dz[e] = d/dz_e of
//   sum_j g[j] w[j]  +  aux_scale * sum_e coefficient[e] aux[e]  +  z_scale * logsumexp(z)^2
// (g, coefficient may be null: no such term). idx are the experts route_row chose.
template <class A>
STRATA_HOST_DEVICE void route_row_backward(const A* z, index_t experts, index_t k, MoeRouting r, const std::int32_t* idx,
                                           const A* g, const A* coefficient, double aux_scale, double z_scale, A* dz) {
  const RowStats<A> stats(z, experts);
  const bool by_logit = r.score == MoeScore::softmax && !r.pre_softmax;
  // Terms shared by every expert.
  double top = 0, chosen_sum = 0, weighted = 0;  // softmax over the chosen logits, and sum_j g_j w_j
  if (g && by_logit) {
    top = static_cast<double>(z[idx[0]]);
    for (index_t j = 1; j < k; ++j) top = static_cast<double>(z[idx[j]]) > top ? static_cast<double>(z[idx[j]]) : top;
    for (index_t j = 0; j < k; ++j) chosen_sum += ::exp(static_cast<double>(z[idx[j]]) - top);
    for (index_t j = 0; j < k; ++j)
      weighted += r.scaling_factor * static_cast<double>(g[j]) * ::exp(static_cast<double>(z[idx[j]]) - top) / chosen_sum;
  }
  double sigmoid_chosen = 0, pre_dot = 0;  // sum_j s_j over the chosen; sum_j g_j s_j
  if (g && !by_logit)
    for (index_t j = 0; j < k; ++j) {
      const double s = score(z, stats, r, idx[j]);
      sigmoid_chosen += s;
      pre_dot += r.scaling_factor * static_cast<double>(g[j]) * s;
    }
  double aux_dot = 0, sigmoid_all = 0;
  if (coefficient) {
    if (r.score == MoeScore::sigmoid)
      for (index_t e = 0; e < experts; ++e) sigmoid_all += sigmoid(static_cast<double>(z[e]));
    for (index_t e = 0; e < experts; ++e) {
      const double s = r.score == MoeScore::softmax ? stats.softmax(z, e) : sigmoid(static_cast<double>(z[e]));
      aux_dot += aux_scale * static_cast<double>(coefficient[e]) * s;
    }
  }
  const double lse = stats.logsumexp();
  for (index_t e = 0; e < experts; ++e) {
    const double ze = static_cast<double>(z[e]);
    double d = 0;
    index_t chosen = -1;
    for (index_t j = 0; j < k; ++j)
      if (idx[j] == e) chosen = j;
    if (g) {
      const double ge = chosen >= 0 ? r.scaling_factor * static_cast<double>(g[chosen]) : 0.0;
      if (by_logit) {
        if (chosen >= 0) {
          const double wr = ::exp(ze - top) / chosen_sum;
          d += wr * ge - wr * weighted;
        }
      } else if (r.score == MoeScore::softmax) {  // w_j = s_{idx_j}: ds = g at the chosen
        const double s = stats.softmax(z, e);
        d += s * ge - s * pre_dot;
      } else if (chosen >= 0) {  // sigmoid, divided by the chosen sum when k > 1
        const double s = sigmoid(ze);
        double ds = ge;
        if (k > 1) {
          const double denominator = sigmoid_chosen + 1e-20;
          ds = ge / denominator - pre_dot / (denominator * denominator);
        }
        d += ds * s * (1 - s);
      }
    }
    if (coefficient) {
      const double a = aux_scale * static_cast<double>(coefficient[e]);
      if (r.score == MoeScore::softmax) {
        const double s = stats.softmax(z, e);
        d += s * a - s * aux_dot;
      } else {
        const double s = sigmoid(ze), denominator = sigmoid_all + 1e-20;
        d += (a / denominator - aux_dot / (denominator * denominator)) * s * (1 - s);
      }
    }
    if (z_scale != 0) d += z_scale * 2 * lse * stats.softmax(z, e);
    dz[e] = static_cast<A>(d);
  }
}

// Capacity dropping of assignment a (token a / k's j-th choice, expert idx[a]) among n assignments:
// kept when fewer than `capacity` assignments to the same expert come before it, in token order
// (by position) or by weight, larger first, ties to the earlier assignment (by probability).
// ranks_ahead: whether assignment b (weight wb) comes before assignment a (weight wa) of the same
// expert; the CUDA kernel counts with it too.
template <class A>
STRATA_HOST_DEVICE bool ranks_ahead(index_t b, A wb, index_t a, A wa, bool by_position) {
  return by_position ? b < a : (wb > wa || (wb == wa && b < a));
}
template <class A>
STRATA_HOST_DEVICE bool kept_within_capacity(const std::int32_t* idx, const A* w, index_t n, index_t a, index_t capacity,
                                             bool by_position) {
  const std::int32_t e = idx[a];
  if (e < 0) return false;
  index_t ahead = 0;
  for (index_t b = 0; b < n; ++b)
    if (b != a && idx[b] == e && ranks_ahead(b, w[b], a, w[a], by_position)) ++ahead;
  return ahead < capacity;
}

// The row groups of the experts' device-count grouped GEMMs (grouped_gemm_rows / grouped_gemm_weights
// on every backend), read on the host: counts[g] >= 0 rows each, at most `rows` in all (a dispatcher
// may hand more rows than it routes). Returns the total; `who` names the caller in the error.
inline index_t grouped_rows_total(const char* who, index_t groups, const std::int32_t* counts, index_t rows) {
  index_t total = 0;
  for (index_t g = 0; g < groups; ++g) {
    if (counts[g] < 0) fail<ShapeError>(who, ": group ", g, " has a negative row count ", counts[g]);
    total += counts[g];
  }
  if (total > rows) fail<ShapeError>(who, ": the groups' counts sum to ", total, " rows, more than the ", rows, " given");
  return total;
}

}  // namespace moe_math
STRATA_NAMESPACE_END
