// strata/backend/cpu/attention.hpp: causal grouped-query attention that saves the log-sum-exp
// instead of the probabilities (the CPU twin of a flash-attention kernel), in the accumulate type.
//
//   q, out [s, b, heads, d];  k, v [s, b, groups, d];  lse [b, heads, s];  query head h reads
//   key/value head h / (heads / groups) (heads = groups is multi-head attention)
//   forward, per (batch, head, query i), over keys j <= i only:
//     z_j = scale q_i . k_j,  m = max_j z_j,  l = sum_j e^(z_j - m),  out_i = sum_j e^(z_j - m) v_j / l,
//     lse_i = m + log l
//   backward recomputes p_j = e^(z_j - lse_i) from q, k and lse:
//     D_i = dout_i . out_i,  dp_j = dout_i . v_j,  ds_j = p_j (dp_j - D_i)
//     dq_i = scale sum_j ds_j k_j;  dk_j += scale ds_j q_i;  dv_j += p_j dout_i
// Only the causal half is computed. dk and dv are summed in A over (head of the group, query) in
// ascending order in a scratch buffer and rounded once, so two runs give the same bits.
// The trailing AttentionOptions (backend/attention_options.hpp) holds two things:
//   strides   q, dq and k, v, dk, dv may be strided views (the default is the contiguous layout
//             above); the arithmetic, and so every bit of the results, does not depend on them.
//             out, dout and lse are contiguous.
//   dropout   on the probabilities, with Z_ij = kept(batch, head, i, j) / (1 - p) from the
//             counter-based mask:  out_i = sum_j p_j Z_j v_j / l  (lse undropped);  backward
//             dp_j = Z_j dout_i . v_j,  D_i = dout_i . out_i (the dropped out),  dv_j += p_j Z_j dout_i.
//             p = 0 takes the plain path: the same arithmetic and bits as without the option.
//   causal, query_offset, key_offset   (context parallelism) causal = false lets every query see
//             all s keys; the offsets are the global positions the dropout mask is drawn at.
//   window    (sliding-window attention) query i sees keys i - window .. i only, by global
//             positions (attention_keys_of); a row of a block that sees no key gets out 0 and
//             lse -inf.
//   softmax   (attention sinks) a sink logit s_h joins each denominator: m = max(m, s_h),
//             l += e^(s_h - m), so lse_i includes it; the backward adds
//             d s_h -= e^(s_h - lse_i) D_i to sink_gradient, summed over (batch, query) in
//             ascending order (see backend/attention_options.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "../attention_options.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void attention_forward(const T* q, const T* k, const T* v, index_t s, index_t b, index_t heads, index_t groups,
                       index_t d, A scale, T* out, A* lse, AttentionOptions options = {}) {
  const index_t hpg = heads / groups;
  const AttentionStrides x = checked_attention_strides("cpu::attention_forward", options.strides, heads, groups, d);
  const bool dropping = options.dropout.active();
  const AttentionDropoutMask<A> mask = attention_dropout_mask<A>("cpu::attention_forward", options.dropout);
  check_attention_block("cpu::attention_forward", options);
  const index_t qo = options.query_offset, ko = options.key_offset;  // global positions of query 0, key 0
  const index_t q_step = b * x.q_row, kv_step = b * x.kv_row;  // from position i to i + 1 of one sequence
  const index_t out_step = b * heads * d;                        // out [s, b, heads, d]
  const T* sinks = static_cast<const T*>(options.sinks);         // learnable: [heads]
  std::vector<A> z(static_cast<std::size_t>(s)), acc(static_cast<std::size_t>(d));
  for (index_t batch = 0; batch < b; ++batch)
    for (index_t h = 0; h < heads; ++h) {
      const index_t g = h / hpg;
      const T* qh = q + batch * x.q_row + h * x.q_head;  // q[i] at qh + i * q_step
      const T* kh = k + batch * x.kv_row + g * x.kv_head;
      const T* vh = v + batch * x.kv_row + g * x.kv_head;
      const A sink = options.softmax == SoftmaxType::learnable ? A(sinks[h]) : A(0);  // s_h (off-by-one: 0)
      for (index_t i = 0; i < s; ++i) {
        const T* qi = qh + i * q_step;
        const auto [first, last] = attention_keys_of(options.causal, options.window, qo - ko, s, i);
        A m = -std::numeric_limits<A>::infinity();
        for (index_t j = first; j <= last; ++j) {
          const T* kj = kh + j * kv_step;
          A dot = 0;
          for (index_t e = 0; e < d; ++e) dot += A(qi[e]) * A(kj[e]);
          z[j] = scale * dot;
          m = std::max(m, z[j]);
        }
        if (options.has_sink()) m = std::max(m, sink);
        A l = options.has_sink() ? std::exp(sink - m) : A(0);  // the sink's share of the denominator
        std::fill(acc.begin(), acc.end(), A(0));
        for (index_t j = first; j <= last; ++j) {
          const A p = std::exp(z[j] - m);
          l += p;  // the undropped softmax's sum
          const A weight = dropping ? p * mask.factor(batch, h, qo + i, ko + j) : p;
          const T* vj = vh + j * kv_step;
          for (index_t e = 0; e < d; ++e) acc[e] += weight * A(vj[e]);
        }
        T* oi = out + i * out_step + (batch * heads + h) * d;
        const A inv_l = l > A(0) ? A(1) / l : A(0);  // a row that sees no key (and no sink): out 0, lse -inf
        for (index_t e = 0; e < d; ++e) oi[e] = T(acc[e] * inv_l);
        lse[(batch * heads + h) * s + i] = l > A(0) ? m + std::log(l) : -std::numeric_limits<A>::infinity();
      }
    }
}

template <class T, class A = accumulate_t<T>>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const A* lse, index_t s,
                        index_t b, index_t heads, index_t groups, index_t d, A scale, T* dq, T* dk, T* dv,
                        AttentionOptions options = {}) {
  const index_t hpg = heads / groups;
  const AttentionStrides x = checked_attention_strides("cpu::attention_backward", options.strides, heads, groups, d);
  const bool dropping = options.dropout.active();
  const AttentionDropoutMask<A> mask = attention_dropout_mask<A>("cpu::attention_backward", options.dropout);
  check_attention_block("cpu::attention_backward", options);
  const index_t qo = options.query_offset, ko = options.key_offset;  // global positions of query 0, key 0
  const index_t q_step = b * x.q_row, kv_step = b * x.kv_row;  // from position i to i + 1 of one sequence
  const index_t out_step = b * heads * d;                        // out, dout [s, b, heads, d]
  const index_t acc_step = b * groups * d;                       // the scratch [s, b, groups, d]
  const std::size_t kv_size = static_cast<std::size_t>(s * acc_step);
  std::vector<A> dk_acc(kv_size, A(0)), dv_acc(kv_size, A(0));  // [s, b, groups, d]
  std::vector<A> ds(static_cast<std::size_t>(s)), dq_acc(static_cast<std::size_t>(d));
  const T* sinks = static_cast<const T*>(options.sinks);  // learnable: [heads]
  A* sink_gradient = options.softmax == SoftmaxType::learnable ? static_cast<A*>(options.sink_gradient) : nullptr;
  std::vector<A> dsink(static_cast<std::size_t>(heads), A(0));  // d s_h of this call, summed in (batch, query) order
  for (index_t batch = 0; batch < b; ++batch)
    for (index_t h = 0; h < heads; ++h) {
      const index_t g = h / hpg;
      const A sink = sink_gradient ? A(sinks[h]) : A(0);
      const index_t q_off = batch * x.q_row + h * x.q_head, out_off = (batch * heads + h) * d;
      const index_t kv_off = batch * x.kv_row + g * x.kv_head, acc_off = (batch * groups + g) * d;
      for (index_t i = 0; i < s; ++i) {
        const T* qi = q + i * q_step + q_off;
        const T* doi = dout + i * out_step + out_off;
        const T* oi = out + i * out_step + out_off;
        const A lse_i = lse[(batch * heads + h) * s + i];
        const auto [first, last] = attention_keys_of(options.causal, options.window, qo - ko, s, i);
        A big_d = 0;  // D_i = dout_i . out_i = sum_j p_j dp_j (out and dp with the dropout's Z)
        for (index_t e = 0; e < d; ++e) big_d += A(doi[e]) * A(oi[e]);
        if (sink_gradient) dsink[h] -= std::exp(sink - lse_i) * big_d;  // p_sink (0 - D_i)
        for (index_t j = first; j <= last; ++j) {
          const T* kj = k + j * kv_step + kv_off;
          const T* vj = v + j * kv_step + kv_off;
          A dot = 0, dp = 0;
          for (index_t e = 0; e < d; ++e) {
            dot += A(qi[e]) * A(kj[e]);
            dp += A(doi[e]) * A(vj[e]);
          }
          const A p = std::exp(scale * dot - lse_i);
          A* dvj = dv_acc.data() + j * acc_step + acc_off;
          if (dropping) {
            const A factor = mask.factor(batch, h, qo + i, ko + j);  // Z_ij
            ds[j] = p * (factor * dp - big_d);
            const A weight = p * factor;
            for (index_t e = 0; e < d; ++e) dvj[e] += weight * A(doi[e]);
          } else {
            ds[j] = p * (dp - big_d);
            for (index_t e = 0; e < d; ++e) dvj[e] += p * A(doi[e]);
          }
        }
        std::fill(dq_acc.begin(), dq_acc.end(), A(0));
        for (index_t j = first; j <= last; ++j) {
          const T* kj = k + j * kv_step + kv_off;
          A* dkj = dk_acc.data() + j * acc_step + acc_off;
          const A w = scale * ds[j];
          for (index_t e = 0; e < d; ++e) {
            dq_acc[e] += w * A(kj[e]);
            dkj[e] += w * A(qi[e]);
          }
        }
        T* dqi = dq + i * q_step + q_off;
        for (index_t e = 0; e < d; ++e) dqi[e] = T(dq_acc[e]);
      }
    }
  if (sink_gradient)
    for (index_t h = 0; h < heads; ++h) sink_gradient[h] += dsink[h];
  for (index_t i = 0; i < s; ++i)
    for (index_t batch = 0; batch < b; ++batch)
      for (index_t g = 0; g < groups; ++g) {
        const A* dk_row = dk_acc.data() + i * acc_step + (batch * groups + g) * d;
        const A* dv_row = dv_acc.data() + i * acc_step + (batch * groups + g) * d;
        const index_t at = i * kv_step + batch * x.kv_row + g * x.kv_head;  // (i, batch, g, 0) in dk, dv
        for (index_t e = 0; e < d; ++e) {
          dk[at + e] = T(dk_row[e]);
          dv[at + e] = T(dv_row[e]);
        }
      }
}

// Merges the attention of the same queries over another block of keys into out and lse:
//   out, block_out [s, b, heads, d];  lse, block_lse [b, heads, s]
//   lse' = log(e^lse + e^block_lse) = m + log(e^(lse - m) + e^(block_lse - m)),  m = max of the two
//   out' = e^(lse - lse') out + e^(block_lse - lse') block_out
// (each block's output is normalized by its own sum, so the weights are the blocks' shares of the
// whole softmax). In place on out and lse, in the accumulate type. A row that saw no key has lse
// -inf and weight 0 (both -inf: the row stays as it is).
template <class T, class A = accumulate_t<T>>
void attention_merge(T* out, A* lse, const T* block_out, const A* block_lse, index_t s, index_t b, index_t heads,
                     index_t d) {
  for (index_t batch = 0; batch < b; ++batch)
    for (index_t h = 0; h < heads; ++h)
      for (index_t i = 0; i < s; ++i) {
        A& l = lse[(batch * heads + h) * s + i];
        const A lb = block_lse[(batch * heads + h) * s + i];
        const A m = std::max(l, lb);
        if (m == -std::numeric_limits<A>::infinity()) continue;  // neither saw a key
        const A merged = m + std::log(std::exp(l - m) + std::exp(lb - m));
        const A w = std::exp(l - merged), wb = std::exp(lb - merged);
        T* oi = out + (i * b * heads + batch * heads + h) * d;
        const T* bi = block_out + (i * b * heads + batch * heads + h) * d;
        for (index_t e = 0; e < d; ++e) oi[e] = T(w * A(oi[e]) + wb * A(bi[e]));
        l = merged;
      }
}

}  // namespace cpu
STRATA_NAMESPACE_END
