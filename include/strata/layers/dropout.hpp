// strata/layers/dropout.hpp: dropout whose mask is a function of the *global* element position and
// a key, so nothing is stored: the backward recomputes the mask (backend dropout_forward /
// dropout_backward with a GlobalIndexMap).
//
// The keep/drop decision for an element is uniform(key, global index) >= p, where the global index
// is the element's position in the unsharded tensor. Replicated activations therefore get the same
// mask on every tensor-parallel rank, sharded ones get different masks per rank, and a sharded run
// draws exactly the mask of the unsharded run (stronger than Megatron's per-rank RNG tracker).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../comm/parallel_context.hpp"
#include "../shard/shard_spec.hpp"
#include "layout.hpp"

STRATA_NAMESPACE_BEGIN

// The map from a local element of an activation of layout `Layout` to its global index.
template <class Layout>
GlobalIndexMap global_index_map(const Shape& local, int tp_rank, int tp_size) {
  const index_t cols = local.cols();
  if constexpr (std::is_same_v<Layout, layout::sharded<0>>) {
    return {cols, cols, local.numel() * tp_rank};
  } else if constexpr (std::is_same_v<Layout, layout::sharded<-1>>) {
    return {cols, cols * tp_size, tp_rank * cols};
  } else {
    static_assert(std::is_same_v<Layout, layout::replicated>, "dropout applies to replicated or sharded activations, not partial sums.");
    (void)tp_rank, (void)tp_size;
    return {cols, cols, 0};
  }
}

// In place on `x`, which must be the caller's own tensor (never one it was given). Kept values
// are scaled by 1 / (1 - p). p = 0 does nothing.
template <class Context, class T, class Layout, class Space>
void dropout_forward(Context& ctx, Activation<T, Layout, Space>& x, double p, std::uint64_t key) {
  if (p <= 0.0) return;
  if (p >= 1.0) fail<ConfigError>("dropout probability ", p, " must be below 1");
  ctx.device.template dropout_forward<T>(x.data(), x.tensor.numel(),
                                         global_index_map<Layout>(x.shape(), ctx.tp.rank(), ctx.tp.size()), p, key);
}

// The gradient through the same mask (recomputed from the key), in place on `dy`, which must be
// the caller's own tensor.
template <class Context, class T, class Layout, class Space>
void dropout_backward(Context& ctx, Activation<T, Layout, Space>& dy, double p, std::uint64_t key) {
  if (p <= 0.0) return;
  ctx.device.template dropout_backward<T>(dy.data(), dy.tensor.numel(),
                                          global_index_map<Layout>(dy.shape(), ctx.tp.rank(), ctx.tp.size()), p, key);
}

STRATA_NAMESPACE_END
