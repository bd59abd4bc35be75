// strata/backend/cpu/init.hpp: parameter initialization at the element's global index.
//
//   x[i] = T(stddev * rng::normal(key, map(i)))   map: local index -> index in the unsharded tensor
// so a shard holds exactly its slice of the unsharded initialization, whatever the TP size.
#pragma once

#include <cstdint>

#include "../../core/dtype.hpp"
#include "../../core/rng.hpp"
#include "../../core/shape.hpp"
#include "../../shard/shard_spec.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T>
void init_normal(T* x, index_t n, ShardIndexMap map, std::uint64_t key, double stddev) {
  for (index_t i = 0; i < n; ++i) x[i] = static_cast<T>(stddev * rng::normal(key, static_cast<std::uint64_t>(map(i))));
}

}  // namespace cpu
STRATA_NAMESPACE_END
