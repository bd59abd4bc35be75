// strata/layers/parameter.hpp: `Parameter<T>`, a layer's weight with its gradient and the map
// from its local shard to the global (unsharded) tensor.
//
// A sharded parameter splits one dimension evenly over the tensor-parallel group. That dimension
// may be a stack of `stacks` equal blocks (SwiGLU's [gate; up]), each split on its own, so rank r
// holds the r-th slice of every block. The map from local to global index is what makes
// initialization independent of the TP size (the counter-based RNG is indexed by the global
// element), lets tests compare gathered gradients with an unsharded run, and lets checkpoints
// record where a shard lives.
//
// Gradients are kept in accumulate_t<T> (float for bf16 parameters) and accumulate with +=.
#pragma once

#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../shard/shard_spec.hpp"

STRATA_NAMESPACE_BEGIN

template <class T>
struct Parameter {
  using value_type = T;
  using grad_type = accumulate_t<T>;

  std::string name;
  Shape global_shape;
  ShardSpec shard;
  bool weight_decay = true;  // false for biases and norm weights
  Tensor<T> value;
  Tensor<grad_type> grad;

  Parameter() = default;
  Parameter(std::string name_, Shape global, ShardSpec spec, bool decay = true)
      : name(std::move(name_)), global_shape(global), shard(spec), weight_decay(decay),
        value(local_shape(global, spec)), grad(local_shape(global, spec)) {}

  // True when the tensor-parallel ranks hold different pieces (counted by every rank in a norm).
  bool tensor_parallel() const { return shard.sharded && shard.parts > 1; }
};

// value = std * N(0, 1), drawn per global element under key (seed, name).
template <class T>
void init_normal(Parameter<T>& p, std::uint64_t seed, double stddev) {
  const std::uint64_t key = rng::parameter_key(seed, p.name);
  for (index_t i = 0; i < p.value.numel(); ++i)
    p.value[i] = static_cast<T>(stddev * rng::normal(key, static_cast<std::uint64_t>(global_index(p.global_shape, p.shard, i, p.shard.rank))));
}

template <class T>
void init_constant(Parameter<T>& p, double value) {
  p.value.fill(static_cast<T>(value));
}

STRATA_NAMESPACE_END
