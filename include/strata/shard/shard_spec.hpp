// strata/shard/shard_spec.hpp: `ShardSpec`, where one rank's piece of a tensor lives in the global
// (unsharded) tensor, and the index arithmetic between the two.
//
// A sharded tensor splits one dimension evenly over the tensor-parallel group. That dimension may
// be a stack of `stacks` equal blocks (SwiGLU's [gate; up]), each split on its own, so rank r holds
// the r-th slice of every block. Parameters, optimizer state and checkpoints all describe their
// shards with it.
#pragma once

#include <limits>

#include <array>
#include <type_traits>

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

// global_index(global, spec, i, spec.rank) as a value a kernel can call: the local extents, the
// split dimension and this rank's offset inside each stacked block.
struct ShardIndexMap {
  index_t local_extents[Shape::kMaxRank] = {};
  index_t global_extents[Shape::kMaxRank] = {};
  int rank = 0;                // number of dimensions
  int dim = 0;                 // the split dimension (normalized), or -1 when not sharded
  index_t block_global = 0;    // extent of one stacked block in the global tensor
  index_t block_local = 0;     // extent of one stacked block in the local shard
  index_t rank_offset = 0;     // tensor-parallel rank * block_local

  ShardIndexMap() = default;
  ShardIndexMap(const Shape& global, const ShardSpec& spec) : rank(global.rank()), dim(-1) {
    const Shape shard = local_shape(global, spec);
    for (int d = 0; d < rank; ++d) {
      local_extents[d] = shard[d];
      global_extents[d] = global[d];
    }
    if (spec.sharded) {
      dim = global.normalize(spec.dim);
      block_global = global[dim] / spec.stacks;
      block_local = shard[dim] / spec.stacks;
      rank_offset = static_cast<index_t>(spec.rank) * block_local;
    }
  }

  // Global linear index of local element `local`.
  STRATA_HOST_DEVICE constexpr index_t operator()(index_t local) const {
    if (dim < 0) return local;
    index_t coord[Shape::kMaxRank] = {};
    for (int d = rank - 1; d >= 0; --d) {  // local linear index -> local coordinates
      coord[d] = local % local_extents[d];
      local /= local_extents[d];
    }
    const index_t block = coord[dim] / block_local, within = coord[dim] % block_local;
    coord[dim] = block * block_global + rank_offset + within;
    index_t out = 0;
    for (int d = 0; d < rank; ++d) out = out * global_extents[d] + coord[d];
    return out;
  }
};
static_assert(std::is_trivially_copyable_v<ShardIndexMap>, "ShardIndexMap is passed to kernels by value, so it must be trivially copyable.");

// An activation element's index in the unsharded activation: (i / cols) * row_stride + offset +
// i % cols. Replicated: {cols, cols, 0}; sharded<0> over the sequence: {cols, cols, numel * rank};
// sharded<-1> over the last dimension: {cols, cols * tp, rank * cols}.
//
// Context parallelism holds two chunks of the sequence that are not next to each other: an index g
// from the formula above (the index in this rank's local sequence) below `split` moves by
// `low_shift`, one at or above it by `high_shift` (shard/context_parallel.hpp). The defaults leave
// every index as it is.
struct GlobalIndexMap {
  index_t cols = 1;
  index_t row_stride = 1;
  index_t offset = 0;
  index_t split = std::numeric_limits<index_t>::max();
  index_t low_shift = 0;
  index_t high_shift = 0;

  STRATA_HOST_DEVICE constexpr index_t operator()(index_t i) const {
    const index_t g = (i / cols) * row_stride + offset + i % cols;
    return g + (g < split ? low_shift : high_shift);
  }

  static constexpr GlobalIndexMap identity(index_t cols) { return {cols, cols, 0}; }
};
static_assert(std::is_trivially_copyable_v<GlobalIndexMap>, "GlobalIndexMap is passed to kernels by value, so it must be trivially copyable.");

STRATA_NAMESPACE_END
