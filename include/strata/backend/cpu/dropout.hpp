// strata/backend/cpu/dropout.hpp: dropout whose mask is a pure function of (key, global index), so
// the backward recomputes it instead of storing it.
//
//   kept(i) = rng::uniform(key, map(i)) >= p;  forward x_i = kept ? x_i / (1 - p) : 0 (in place);
//   backward applies the same to dy. map gives the element's index in the unsharded activation.
#pragma once

#include <cstdint>

#include "../../core/dtype.hpp"
#include "../../core/rng.hpp"
#include "../../core/shape.hpp"
#include "../../shard/shard_spec.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T, class A = accumulate_t<T>>
void dropout_apply(T* x, index_t n, GlobalIndexMap map, double p, std::uint64_t key) {
  const A scale = A(1.0 / (1.0 - p));
  for (index_t i = 0; i < n; ++i) {
    const bool kept = rng::uniform(key, static_cast<std::uint64_t>(map(i))) >= p;
    x[i] = kept ? T(A(x[i]) * scale) : T(0);
  }
}

template <class T>
void dropout_forward(T* x, index_t n, GlobalIndexMap map, double p, std::uint64_t key) {
  dropout_apply<T>(x, n, map, p, key);
}

template <class T>
void dropout_backward(T* dy, index_t n, GlobalIndexMap map, double p, std::uint64_t key) {
  dropout_apply<T>(dy, n, map, p, key);
}

}  // namespace cpu
STRATA_NAMESPACE_END
