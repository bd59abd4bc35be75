// strata/layers/dropout.hpp: dropout whose mask is a function of the *global* element position.
//
// The keep/drop decision for an element is uniform(key, global index) >= p, where the global index
// is the element's position in the unsharded tensor. Replicated activations therefore get the same
// mask on every tensor-parallel rank, sharded ones get different masks per rank, and a sharded run
// draws exactly the mask of the unsharded run (stronger than Megatron's per-rank RNG tracker).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "../comm/parallel_context.hpp"
#include "../core/rng.hpp"
#include "layout.hpp"

STRATA_NAMESPACE_BEGIN

template <class Layout>
index_t global_element_index(const Shape& local, index_t i, int tp_rank, int tp_size) {
  if constexpr (std::is_same_v<Layout, layout::sharded<0>>) {
    return local.numel() * tp_rank + i;
  } else if constexpr (std::is_same_v<Layout, layout::sharded<-1>>) {
    const index_t cols = local.cols(), row = i / cols, col = i % cols;
    return row * cols * tp_size + tp_rank * cols + col;
  } else {
    static_assert(std::is_same_v<Layout, layout::replicated>, "dropout applies to replicated or sharded activations, not partial sums.");
    (void)tp_rank, (void)tp_size;
    return i;
  }
}

// In place; returns the kept mask (1 kept, 0 dropped). Kept values are scaled by 1 / (1 - p).
template <class T, class Layout, class Comm>
std::vector<std::uint8_t> dropout_forward(Comm& tp, Activation<T, Layout>& x, double p, std::uint64_t key) {
  std::vector<std::uint8_t> mask;
  if (p <= 0.0) return mask;
  if (p >= 1.0) fail<ConfigError>("dropout probability ", p, " must be below 1");
  mask.resize(static_cast<std::size_t>(x.tensor.numel()));
  const auto scale = static_cast<accumulate_t<T>>(1.0 / (1.0 - p));
  for (index_t i = 0; i < x.tensor.numel(); ++i) {
    const auto g = static_cast<std::uint64_t>(global_element_index<Layout>(x.shape(), i, tp.rank(), tp.size()));
    mask[i] = rng::uniform(key, g) >= p;
    x.tensor[i] = mask[i] ? static_cast<T>(static_cast<accumulate_t<T>>(x.tensor[i]) * scale) : T(0);
  }
  return mask;
}

template <class T, class Layout>
void dropout_backward(Activation<T, Layout>& dy, const std::vector<std::uint8_t>& mask, double p) {
  if (mask.empty()) return;
  const auto scale = static_cast<accumulate_t<T>>(1.0 / (1.0 - p));
  for (index_t i = 0; i < dy.tensor.numel(); ++i)
    dy.tensor[i] = mask[i] ? static_cast<T>(static_cast<accumulate_t<T>>(dy.tensor[i]) * scale) : T(0);
}

STRATA_NAMESPACE_END
