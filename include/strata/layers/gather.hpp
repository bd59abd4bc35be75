// strata/layers/gather.hpp: assemble the global (unsharded) tensor of a parameter, or of its
// gradient, from the shards of the tensor-parallel group, on the host (device tensors are copied
// with to_host). Used by tests that compare with an unsharded run and by checkpoint export.
#pragma once

#include <span>

#include "../comm/communicator.hpp"
#include "parameter.hpp"

STRATA_NAMESPACE_BEGIN

// Collective over `tp`. `local` is p.value or p.grad (or any tensor of the shard's shape), in any
// memory space; the result is a new host tensor (a copy even when nothing is sharded).
template <class Comm, class T, class PSpace, class X, class Space>
Tensor<X> gather_global(Comm& tp, const Parameter<T, PSpace>& p, const Tensor<X, Space>& local) {
  Tensor<X> mine = to_host(local);
  if (!p.shard.sharded || tp.size() == 1) return mine;
  if (tp.size() != p.shard.parts)
    fail<ConfigError>("gather_global(", p.name, "): the group has ", tp.size(), " ranks, the shard expects ", p.shard.parts);
  const index_t n = mine.numel();
  auto all = Tensor<X, Space>::empty(Shape{tp.size(), n});  // gathered in the communicator's space
  tp.all_gather(local.buffer(), all.buffer());
  const Tensor<X> all_host = to_host(all);
  Tensor<X> out(p.global_shape);
  for (int r = 0; r < tp.size(); ++r)
    for (index_t i = 0; i < n; ++i) out[global_index(p.global_shape, p.shard, i, r)] = all_host[r * n + i];
  return out;
}

STRATA_NAMESPACE_END
