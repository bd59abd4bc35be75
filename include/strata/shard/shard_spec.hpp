// strata/shard/shard_spec.hpp: `ShardSpec`, where one rank's piece of a tensor lives in the global
// (unsharded) tensor, and the index arithmetic between the two.
//
// A sharded tensor splits one dimension evenly over the tensor-parallel group. That dimension may
// be a stack of `stacks` equal blocks (SwiGLU's [gate; up]), each split on its own, so rank r holds
// the r-th slice of every block. Parameters, optimizer state and checkpoints all describe their
// shards with it.
#pragma once

#include <array>

#include "../core/error.hpp"
#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN

struct ShardSpec {
  bool sharded = false;  // false: every tensor-parallel rank holds the whole tensor
  int dim = 0;           // the split dimension (when sharded)
  int stacks = 1;        // the split dimension is [stacks, extent / stacks]; each block split on its own
  int rank = 0;          // this rank's position in the tensor-parallel group
  int parts = 1;         // the tensor-parallel size

  static constexpr ShardSpec replicated() { return {}; }
  static constexpr ShardSpec split(int dim, int rank, int parts, int stacks = 1) { return {true, dim, stacks, rank, parts}; }
};

// The local shape of a shard of `global`.
inline Shape local_shape(const Shape& global, const ShardSpec& spec) {
  if (!spec.sharded) return global;
  const index_t extent = global[spec.dim];
  if (extent % (static_cast<index_t>(spec.stacks) * spec.parts) != 0)
    fail<ConfigError>("a dimension of extent ", extent, " in ", global.str(), " split into ", spec.stacks,
                      " block(s) does not divide over ", spec.parts, " tensor-parallel ranks");
  return global.with(spec.dim, extent / spec.parts);
}

// Global linear index of local element `local` held by tensor-parallel rank `rank`.
inline index_t global_index(const Shape& global, const ShardSpec& spec, index_t local, int rank) {
  if (!spec.sharded) return local;
  const Shape shard = local_shape(global, spec);
  std::array<index_t, Shape::kMaxRank> coord{};
  for (int d = shard.rank() - 1; d >= 0; --d) {
    coord[d] = local % shard[d];
    local /= shard[d];
  }
  const int dim = global.normalize(spec.dim);
  const index_t block_global = global[dim] / spec.stacks, block_local = shard[dim] / spec.stacks;
  const index_t block = coord[dim] / block_local, within = coord[dim] % block_local;
  coord[dim] = block * block_global + rank * block_local + within;
  index_t out = 0;
  for (int d = 0; d < global.rank(); ++d) out = out * global[d] + coord[d];
  return out;
}

STRATA_NAMESPACE_END
