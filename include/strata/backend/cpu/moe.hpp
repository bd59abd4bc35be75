// strata/backend/cpu/moe.hpp: the mixture-of-experts kernels on the CPU (the reference the CUDA
// ones are tested against). Tokens are rows; an assignment is one (token, choice) pair, numbered
// token * k + choice; a slot is a row of the experts' input, grouped by expert.
//
//   moe_router_forward    per token: top-k experts, their weights, the load-balancing scores and
//                         logsumexp(z) (backend/moe_routing.hpp has the math)
//   moe_router_backward   per token: dz from the weights' gradient, the aux-loss coefficients of
//                         the token's group (token % groups) and the z-loss
//   moe_drop              routed[a] = idx[a] when within capacity, else -1
//   moe_count             counts[(token % groups) * E + expert] (+)= 1 over the routed assignments
//   moe_sort_by_expert    slots of the experts [first, first + count), expert-major and in
//                         assignment order within an expert (packed, or `capacity` slots per expert
//                         when padding): slot_of[a] (-1 when not here), token_of_slot[r] (-1: padding)
//   moe_chunk_maps        the row maps between an exchange padded to capacity (chunks of `capacity`
//                         rows, real ones first) and the experts' order with the real rows alone
//   moe_gather_rows       out[r] = in[rows[r]] (zero where rows[r] < 0)
//   moe_combine           out[x] = sum_j w[x,j] * in[slot[x,j]] over slot >= 0, j ascending (w null: 1)
//   moe_combine_backward  d_in[slot[x,j]] = w[x,j] * dy[x] (other slots zero);
//                         dw[x,j] = dy[x] . in[slot[x,j]] (0 where slot < 0)
//   moe_aux_loss          loss[0] += factor * sum_i p_i c_i;  coefficient_i = factor * c_i
//   moe_expert_bias_update bias_e += rate * sign(mean(c) - c_e)
//   grouped_gemm          C_g = op(A_g) op(B_g) for each group g (host arrays of sizes and pointers)
//   grouped_gemm_rows     C[rows, n] = A[rows, k] op(B_g) over consecutive groups of counts[g] rows
//                         (counts in the backend's memory); rows past the counts' total are zero
//   grouped_gemm_weights  C_g[m, n] (+)= A_g^T B_g over group g's rows of A [rows, m] and B [rows, n]
//   grouped_gemm_counts_on_device<T>(n, k)  (a backend member, constexpr true here) whether the two
//                         above read the counts without waiting for the host at these sizes; the
//                         experts read the counts once per layer and call grouped_gemm when not
#pragma once

#include <cstdint>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "../moe_routing.hpp"
#include "gemm.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class A>
void moe_router_forward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                        const A* expert_bias, std::int32_t* indices, A* weights, A* aux_scores, A* logsumexp) {
  for (index_t x = 0; x < tokens; ++x)
    moe_math::route_row<A>(logits + x * experts, experts, k, routing, expert_bias, indices + x * k, weights + x * k,
                           aux_scores ? aux_scores + x * experts : nullptr, logsumexp ? logsumexp + x : nullptr);
}

template <class A>
void moe_router_backward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                         const std::int32_t* indices, const A* dweights, const A* aux_coefficients, index_t groups,
                         double aux_scale, double z_scale, A* dlogits) {
  for (index_t x = 0; x < tokens; ++x)
    moe_math::route_row_backward<A>(logits + x * experts, experts, k, routing, indices + x * k,
                                    dweights ? dweights + x * k : nullptr,
                                    aux_coefficients ? aux_coefficients + (x % groups) * experts : nullptr, aux_scale,
                                    z_scale, dlogits + x * experts);
}

template <class A>
void moe_drop(const std::int32_t* indices, const A* weights, index_t assignments, index_t capacity, bool by_position,
              std::int32_t* routed) {
  for (index_t a = 0; a < assignments; ++a)
    routed[a] = moe_math::kept_within_capacity<A>(indices, weights, assignments, a, capacity, by_position) ? indices[a] : -1;
}

template <class C>
void moe_count(const std::int32_t* routed, index_t assignments, index_t k, index_t groups, index_t experts, C* counts,
               bool accumulate) {
  if (!accumulate)
    for (index_t i = 0; i < groups * experts; ++i) counts[i] = C(0);
  for (index_t a = 0; a < assignments; ++a)
    if (routed[a] >= 0) counts[(a / k) % groups * experts + routed[a]] += C(1);
}

inline void moe_sort_by_expert(const std::int32_t* routed, index_t assignments, index_t k, index_t first_expert,
                               index_t experts, index_t capacity, std::int32_t* slot_of, std::int32_t* token_of_slot,
                               index_t slots) {
  for (index_t r = 0; r < slots; ++r) token_of_slot[r] = -1;
  for (index_t a = 0; a < assignments; ++a) slot_of[a] = -1;
  index_t next = 0;
  for (index_t e = 0; e < experts; ++e) {
    if (capacity > 0) next = e * capacity;
    for (index_t a = 0; a < assignments; ++a) {
      if (routed[a] != first_expert + e) continue;
      slot_of[a] = static_cast<std::int32_t>(next);
      token_of_slot[next] = static_cast<std::int32_t>(a / k);
      ++next;
    }
  }
}

// The expert-parallel exchange padded to capacity, its rows compacted: chunk c = g * local + l (source
// g, local expert l) holds `capacity` rows, its first chunk_counts[c] real. In expert order, expert
// l's real rows follow expert l - 1's, source by source. to_expert[r] (r < chunks x local x capacity)
// = the chunk-order row of expert-order row r (-1 past the real rows' total); to_chunk[i] = the
// expert-order row of chunk-order row i (-1 for a padding row); expert_counts[l] = expert l's real rows.
inline void moe_chunk_maps(const std::int32_t* chunk_counts, index_t chunks, index_t local, index_t capacity,
                           std::int32_t* to_expert, std::int32_t* to_chunk, std::int32_t* expert_counts) {
  const index_t rows = chunks * local * capacity;
  for (index_t r = 0; r < rows; ++r) to_expert[r] = to_chunk[r] = -1;
  index_t at = 0;
  for (index_t l = 0; l < local; ++l) {
    expert_counts[l] = 0;
    for (index_t g = 0; g < chunks; ++g) {
      const index_t c = g * local + l, real = chunk_counts[c];
      for (index_t j = 0; j < real; ++j, ++at) {
        to_expert[at] = static_cast<std::int32_t>(c * capacity + j);
        to_chunk[c * capacity + j] = static_cast<std::int32_t>(at);
      }
      expert_counts[l] += static_cast<std::int32_t>(real);
    }
  }
}

template <class T>
void moe_gather_rows(const T* in, index_t cols, const std::int32_t* rows, index_t n, T* out) {
  for (index_t r = 0; r < n; ++r)
    for (index_t c = 0; c < cols; ++c) out[r * cols + c] = rows[r] >= 0 ? in[rows[r] * cols + c] : T{};
}

template <class T, class A = accumulate_t<T>>
void moe_combine(const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k, index_t cols, T* out) {
  for (index_t x = 0; x < tokens; ++x)
    for (index_t c = 0; c < cols; ++c) {
      A sum = 0;
      for (index_t j = 0; j < k; ++j) {
        const std::int32_t s = slot[x * k + j];
        if (s < 0) continue;
        const A v = static_cast<A>(in[static_cast<index_t>(s) * cols + c]);
        sum += weights ? weights[x * k + j] * v : v;
      }
      out[x * cols + c] = static_cast<T>(sum);
    }
}

template <class T, class A = accumulate_t<T>>
void moe_combine_backward(const T* dy, const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k,
                          index_t cols, index_t slots, T* d_in, A* dweights) {
  for (index_t i = 0; i < slots * cols; ++i) d_in[i] = T{};
  for (index_t x = 0; x < tokens; ++x)
    for (index_t j = 0; j < k; ++j) {
      const std::int32_t s = slot[x * k + j];
      if (dweights) dweights[x * k + j] = A(0);
      if (s < 0) continue;
      const A w = weights ? weights[x * k + j] : A(1);
      A dot = 0;
      for (index_t c = 0; c < cols; ++c) {
        d_in[static_cast<index_t>(s) * cols + c] = static_cast<T>(w * static_cast<A>(dy[x * cols + c]));
        if (dweights) dot += static_cast<A>(dy[x * cols + c]) * static_cast<A>(in[static_cast<index_t>(s) * cols + c]);
      }
      if (dweights) dweights[x * k + j] = dot;
    }
}

template <class A>
void moe_aux_loss(const A* prob_sums, const A* counts, index_t n, double factor, double* loss, A* coefficients) {
  double sum = 0;
  for (index_t i = 0; i < n; ++i) {
    sum += static_cast<double>(prob_sums[i]) * static_cast<double>(counts[i]);
    coefficients[i] = static_cast<A>(factor * static_cast<double>(counts[i]));
  }
  loss[0] += factor * sum;
}

template <class A>
void moe_expert_bias_update(const A* counts, index_t experts, double rate, A* bias) {
  double mean = 0;
  for (index_t e = 0; e < experts; ++e) mean += static_cast<double>(counts[e]);
  mean /= static_cast<double>(experts);
  for (index_t e = 0; e < experts; ++e) {
    const double offset = mean - static_cast<double>(counts[e]);
    bias[e] = static_cast<A>(static_cast<double>(bias[e]) + rate * (offset > 0 ? 1.0 : (offset < 0 ? -1.0 : 0.0)));
  }
}

// For each group g: C_g[m_g, n_g] (+)= op(A_g)[m_g, k_g] op(B_g)[k_g, n_g], row-major as cpu::gemm. An
// empty inner dimension writes zeros (or adds nothing).
template <class T, class C = T>
void grouped_gemm(bool transpose_a, bool transpose_b, index_t groups, const index_t* m, const index_t* n, const index_t* k,
                  const T* const* a, const T* const* b, C* const* c, bool accumulate) {
  for (index_t g = 0; g < groups; ++g) {
    if (m[g] == 0 || n[g] == 0) continue;
    if (k[g] == 0) {
      if (!accumulate)
        for (index_t i = 0; i < m[g] * n[g]; ++i) c[g][i] = C{};
      continue;
    }
    gemm<T, C>(transpose_a, transpose_b, m[g], n[g], k[g], a[g], b[g], c[g], accumulate);
  }
}

// C[rows, n] = A[rows, k] op(B_g) for the rows of group g (consecutive groups of counts[g] rows, from
// row 0; B_g [n, k] when transpose_b, else [k, n]); the rows past the counts' total are set to zero.
template <class T>
void grouped_gemm_rows(bool transpose_b, index_t groups, const std::int32_t* counts, index_t rows, index_t n, index_t k,
                       const T* a, const T* const* b, T* c) {
  const index_t total = moe_math::grouped_rows_total("grouped_gemm_rows", groups, counts, rows);
  index_t at = 0;
  for (index_t g = 0; g < groups; ++g) {
    const index_t m = counts[g];
    if (m > 0 && k > 0) gemm<T, T>(false, transpose_b, m, n, k, a + at * k, b[g], c + at * n, false);
    else
      for (index_t i = 0; i < m * n; ++i) c[at * n + i] = T{};
    at += m;
  }
  for (index_t i = total * n; i < rows * n; ++i) c[i] = T{};
}

// C_g[m, n] (+)= A_g^T B_g, where A_g and B_g are group g's rows of A [rows, m] and B [rows, n] (an
// empty group writes zeros, or adds nothing).
template <class T, class C>
void grouped_gemm_weights(index_t groups, const std::int32_t* counts, index_t rows, index_t m, index_t n, const T* a,
                          const T* b, C* const* c, bool accumulate) {
  (void)moe_math::grouped_rows_total("grouped_gemm_weights", groups, counts, rows);
  index_t at = 0;
  for (index_t g = 0; g < groups; ++g) {
    const index_t r = counts[g];
    if (r > 0) gemm<T, C>(true, false, m, n, r, a + at * m, b + at * n, c[g], accumulate);
    else if (!accumulate)
      for (index_t i = 0; i < m * n; ++i) c[g][i] = C{};
    at += r;
  }
}

}  // namespace cpu
STRATA_NAMESPACE_END
