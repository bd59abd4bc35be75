// strata/layers/gather.hpp: assemble the global (unsharded) tensor of a parameter, or of its
// gradient, from the shards of the tensor-parallel group. Used by tests that compare with an
// unsharded run and by checkpoint export.
#pragma once

#include <span>

#include "../comm/communicator.hpp"
#include "parameter.hpp"

STRATA_NAMESPACE_BEGIN

// Collective over `tp`. `local` is p.value or p.grad (or any tensor of the shard's shape).
template <class Comm, class T, class X>
Tensor<X> gather_global(Comm& tp, const Parameter<T>& p, const Tensor<X>& local) {
  if (!p.shard.sharded || tp.size() == 1) return local;
  if (tp.size() != p.shard.parts)
    fail<ConfigError>("gather_global(", p.name, "): the group has ", tp.size(), " ranks, the shard expects ", p.shard.parts);
  const index_t n = local.numel();
  Tensor<X> all(Shape{tp.size(), n});
  tp.all_gather(std::span<const X>(local.span()), all.span());
  Tensor<X> out(p.global_shape);
  for (int r = 0; r < tp.size(); ++r)
    for (index_t i = 0; i < n; ++i) out[global_index(p.global_shape, p.shard, i, r)] = all[r * n + i];
  return out;
}

STRATA_NAMESPACE_END
