// strata/backend/cpu/attention.hpp: causal scaled-dot-product attention and rotary embeddings,
// the straightforward O(T^2) CPU reference, computed in the accumulate type.
//
//   S = scale * Q K^T (causal mask: key j > query i is -inf),  P = softmax(S),  O = P V
//   backward: dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dQ = scale dS K,
//             dK = scale dS^T Q
// Heads are laid out [batch * heads, seq, head_dim]; query head h of a batch reads key/value head
// h / heads_per_group (grouped-query attention; heads_per_group = 1 is multi-head attention).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gemm.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

// q, out: [batch * nq, s, d];  k, v: [batch * nkv, s, d];  probs: [batch * nq, s, s]
template <class A>
void causal_attention_forward(const A* q, const A* k, const A* v, index_t batch, index_t nq, index_t nkv, index_t s,
                              index_t d, A scale, A* out, A* probs) {
  const index_t group = nq / nkv;
  for (index_t b = 0; b < batch; ++b) {
    for (index_t h = 0; h < nq; ++h) {
      const index_t qi = b * nq + h, ki = b * nkv + h / group;
      A* p = probs + qi * s * s;
      gemm<A>(false, true, s, s, d, q + qi * s * d, k + ki * s * d, p, false, scale);  // (s,s)
      for (index_t i = 0; i < s; ++i) {
        A* row = p + i * s;
        A mx = row[0];
        for (index_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        A sum = 0;
        for (index_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - mx));
        for (index_t j = 0; j <= i; ++j) row[j] /= sum;
        for (index_t j = i + 1; j < s; ++j) row[j] = 0;
      }
      gemm<A>(false, false, s, d, s, p, v + ki * s * d, out + qi * s * d, false);  // (s,d)
    }
  }
}

// dq written; dk, dv accumulated (several query heads share one key/value head).
template <class A>
void causal_attention_backward(const A* dout, const A* q, const A* k, const A* v, const A* probs, index_t batch,
                               index_t nq, index_t nkv, index_t s, index_t d, A scale, A* dq, A* dk, A* dv) {
  const index_t group = nq / nkv;
  std::vector<A> dp(static_cast<std::size_t>(s * s));
  std::fill(dk, dk + batch * nkv * s * d, A(0));
  std::fill(dv, dv + batch * nkv * s * d, A(0));
  for (index_t b = 0; b < batch; ++b) {
    for (index_t h = 0; h < nq; ++h) {
      const index_t qi = b * nq + h, ki = b * nkv + h / group;
      const A* p = probs + qi * s * s;
      const A* dov = dout + qi * s * d;
      gemm<A>(true, false, s, d, s, p, dov, dv + ki * s * d, true);           // dV += P^T dO
      gemm<A>(false, true, s, s, d, dov, v + ki * s * d, dp.data(), false);  // dP = dO V^T
      for (index_t i = 0; i < s; ++i) {
        A* row = dp.data() + i * s;
        const A* prow = p + i * s;
        A dot = 0;
        for (index_t j = 0; j <= i; ++j) dot += row[j] * prow[j];
        for (index_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot);
        for (index_t j = i + 1; j < s; ++j) row[j] = 0;
      }
      gemm<A>(false, false, s, d, s, dp.data(), k + ki * s * d, dq + qi * s * d, false, scale);  // dQ
      gemm<A>(true, false, s, d, s, dp.data(), q + qi * s * d, dk + ki * s * d, true, scale);    // dK
    }
  }
}

// Rotary position embedding (rotate-half convention) applied in place to x: [n, s, d], position of
// row t is position_offset + t. inverse = true applies the transpose rotation (the backward).
template <class A>
void rope_apply(A* x, index_t n, index_t s, index_t d, double base, index_t position_offset, bool inverse) {
  const index_t half = d / 2;
  std::vector<A> cosv(static_cast<std::size_t>(s * half)), sinv(static_cast<std::size_t>(s * half));
  for (index_t t = 0; t < s; ++t)
    for (index_t i = 0; i < half; ++i) {
      double freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      double angle = static_cast<double>(position_offset + t) * freq;
      cosv[t * half + i] = A(std::cos(angle));
      sinv[t * half + i] = A(inverse ? -std::sin(angle) : std::sin(angle));
    }
  for (index_t r = 0; r < n; ++r)
    for (index_t t = 0; t < s; ++t) {
      A* row = x + (r * s + t) * d;
      for (index_t i = 0; i < half; ++i) {
        A a = row[i], b = row[i + half], c = cosv[t * half + i], sn = sinv[t * half + i];
        row[i] = a * c - b * sn;
        row[i + half] = b * c + a * sn;
      }
    }
}

}  // namespace cpu
STRATA_NAMESPACE_END
