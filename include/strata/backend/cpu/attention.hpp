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
// q, dq and k, v, dk, dv may be strided views (backend/attention_strides.hpp; the default is the
// contiguous layout above); the arithmetic, and so every bit of the results, does not depend on
// the strides. out, dout and lse are contiguous.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "../attention_strides.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void attention_forward(const T* q, const T* k, const T* v, index_t s, index_t b, index_t heads, index_t groups,
                       index_t d, A scale, T* out, A* lse, AttentionStrides strides = {}) {
  const index_t hpg = heads / groups;
  const AttentionStrides x = checked_attention_strides("cpu::attention_forward", strides, heads, groups, d);
  const index_t q_step = b * x.q_row, kv_step = b * x.kv_row;  // from position i to i + 1 of one sequence
  const index_t out_step = b * heads * d;                        // out [s, b, heads, d]
  std::vector<A> z(static_cast<std::size_t>(s)), acc(static_cast<std::size_t>(d));
  for (index_t batch = 0; batch < b; ++batch)
    for (index_t h = 0; h < heads; ++h) {
      const index_t g = h / hpg;
      const T* qh = q + batch * x.q_row + h * x.q_head;  // q[i] at qh + i * q_step
      const T* kh = k + batch * x.kv_row + g * x.kv_head;
      const T* vh = v + batch * x.kv_row + g * x.kv_head;
      for (index_t i = 0; i < s; ++i) {
        const T* qi = qh + i * q_step;
        A m = -std::numeric_limits<A>::infinity();
        for (index_t j = 0; j <= i; ++j) {
          const T* kj = kh + j * kv_step;
          A dot = 0;
          for (index_t e = 0; e < d; ++e) dot += A(qi[e]) * A(kj[e]);
          z[j] = scale * dot;
          m = std::max(m, z[j]);
        }
        A l = 0;
        std::fill(acc.begin(), acc.end(), A(0));
        for (index_t j = 0; j <= i; ++j) {
          const A p = std::exp(z[j] - m);
          l += p;
          const T* vj = vh + j * kv_step;
          for (index_t e = 0; e < d; ++e) acc[e] += p * A(vj[e]);
        }
        T* oi = out + i * out_step + (batch * heads + h) * d;
        for (index_t e = 0; e < d; ++e) oi[e] = T(acc[e] / l);
        lse[(batch * heads + h) * s + i] = m + std::log(l);
      }
    }
}

template <class T, class A = accumulate_t<T>>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const A* lse, index_t s,
                        index_t b, index_t heads, index_t groups, index_t d, A scale, T* dq, T* dk, T* dv,
                        AttentionStrides strides = {}) {
  const index_t hpg = heads / groups;
  const AttentionStrides x = checked_attention_strides("cpu::attention_backward", strides, heads, groups, d);
  const index_t q_step = b * x.q_row, kv_step = b * x.kv_row;  // from position i to i + 1 of one sequence
  const index_t out_step = b * heads * d;                        // out, dout [s, b, heads, d]
  const index_t acc_step = b * groups * d;                       // the scratch [s, b, groups, d]
  const std::size_t kv_size = static_cast<std::size_t>(s * acc_step);
  std::vector<A> dk_acc(kv_size, A(0)), dv_acc(kv_size, A(0));  // [s, b, groups, d]
  std::vector<A> ds(static_cast<std::size_t>(s)), dq_acc(static_cast<std::size_t>(d));
  for (index_t batch = 0; batch < b; ++batch)
    for (index_t h = 0; h < heads; ++h) {
      const index_t g = h / hpg;
      const index_t q_off = batch * x.q_row + h * x.q_head, out_off = (batch * heads + h) * d;
      const index_t kv_off = batch * x.kv_row + g * x.kv_head, acc_off = (batch * groups + g) * d;
      for (index_t i = 0; i < s; ++i) {
        const T* qi = q + i * q_step + q_off;
        const T* doi = dout + i * out_step + out_off;
        const T* oi = out + i * out_step + out_off;
        const A lse_i = lse[(batch * heads + h) * s + i];
        A big_d = 0;  // D_i = dout_i . out_i = sum_j p_j dp_j
        for (index_t e = 0; e < d; ++e) big_d += A(doi[e]) * A(oi[e]);
        for (index_t j = 0; j <= i; ++j) {
          const T* kj = k + j * kv_step + kv_off;
          const T* vj = v + j * kv_step + kv_off;
          A dot = 0, dp = 0;
          for (index_t e = 0; e < d; ++e) {
            dot += A(qi[e]) * A(kj[e]);
            dp += A(doi[e]) * A(vj[e]);
          }
          const A p = std::exp(scale * dot - lse_i);
          ds[j] = p * (dp - big_d);
          A* dvj = dv_acc.data() + j * acc_step + acc_off;
          for (index_t e = 0; e < d; ++e) dvj[e] += p * A(doi[e]);
        }
        std::fill(dq_acc.begin(), dq_acc.end(), A(0));
        for (index_t j = 0; j <= i; ++j) {
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

}  // namespace cpu
STRATA_NAMESPACE_END
