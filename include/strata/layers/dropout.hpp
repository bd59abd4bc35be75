// strata/layers/dropout.hpp: dropout whose mask is a function of the *global* element position and
// a key, so nothing is stored: the backward recomputes the mask (backend dropout_forward /
// dropout_backward with a GlobalIndexMap).
//
// The keep/drop decision for an element is uniform(key, global index) >= p, where the global index
// is the element's position in the unsharded tensor. Replicated activations therefore get the same
// mask on every tensor-parallel rank, sharded ones get different masks per rank, and a sharded run
// draws exactly the mask of the unsharded run (stronger than Megatron's per-rank RNG tracker).
// Under context parallelism the global index is that of the whole sequence (each rank's two
// chunks placed where they lie in it), so a cp run draws the cp = 1 mask too.
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

// The map of an activation [s_local, b, ...] of this rank under context parallelism: the local
// sequence is two chunks of the global one (shard/context_parallel.hpp), so the index in the local
// sequence moves by the offset of its chunk and the mask is the cp = 1 run's. Unchanged for cp = 1.
template <class Layout>
GlobalIndexMap context_parallel_index_map(GlobalIndexMap map, const Shape& local, int tp_size, int cp_rank, int cp_size) {
  if (cp_size <= 1 || local.rank() == 0 || local[0] == 0) return map;
  const bool sequence_sharded = std::is_same_v<Layout, layout::sharded<0>>;
  const index_t positions = local[0] * (sequence_sharded ? tp_size : 1);  // 2c: this rank's local sequence
  const index_t per_position = (local.numel() / local[0]) * (std::is_same_v<Layout, layout::sharded<-1>> ? tp_size : 1);
  const index_t chunk = positions / 2 * per_position;  // elements of one chunk
  map.split = chunk;
  map.low_shift = cp_rank * chunk;
  map.high_shift = (2 * cp_size - 1 - cp_rank) * chunk - chunk;
  return map;
}
template <class Layout, class Context>
GlobalIndexMap activation_index_map(const Context& ctx, const Shape& local) {
  return context_parallel_index_map<Layout>(global_index_map<Layout>(local, ctx.tp.rank(), ctx.tp.size()), local,
                                            ctx.tp.size(), ctx.cp.rank(), ctx.cp.size());
}

// In place on `x`, which must be the caller's own tensor (never one it was given). Kept values
// are scaled by 1 / (1 - p). p = 0 does nothing.
template <class Context, class T, class Layout, class Space>
void dropout_forward(Context& ctx, Activation<T, Layout, Space>& x, double p, std::uint64_t key) {
  if (p <= 0.0) return;
  if (p >= 1.0) fail<ConfigError>("dropout probability ", p, " must be below 1");
  ctx.device.template dropout_forward<T>(x.data(), x.tensor.numel(),
                                         activation_index_map<Layout>(ctx, x.shape()), p, key);
}

// The gradient through the same mask (recomputed from the key), in place on `dy`, which must be
// the caller's own tensor.
template <class Context, class T, class Layout, class Space>
void dropout_backward(Context& ctx, Activation<T, Layout, Space>& dy, double p, std::uint64_t key) {
  if (p <= 0.0) return;
  ctx.device.template dropout_backward<T>(dy.data(), dy.tensor.numel(),
                                          activation_index_map<Layout>(ctx, dy.shape()), p, key);
}

STRATA_NAMESPACE_END
