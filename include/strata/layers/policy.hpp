// strata/layers/policy.hpp: `default_policy`, the struct users inherit from to pick element type,
// compute backend, communicator and semantic switches.
//
//   struct MyPolicy : strata::default_policy {
//     using element = double;
//     static constexpr bool sequence_parallel = true;
//   };
//
// Semantic choices live here; tuning never does (it may not change results).
#pragma once

#include "../backend/cpu/backend.hpp"
#include "../comm/inprocess.hpp"
#include "layout.hpp"

STRATA_NAMESPACE_BEGIN

struct default_policy {
  using element = float;                       // parameter and activation type
  using backend = cpu::backend;                // compute kernels
  using comm = inprocess::communicator;        // collectives
  static constexpr bool sequence_parallel = false;  // shard norms/dropout/residuals on the sequence dim
};

// The layout of the residual stream (between transformer layers) under a policy.
template <class Policy>
using residual_layout_t =
    std::conditional_t<Policy::sequence_parallel, layout::sharded<0>, layout::replicated>;

STRATA_NAMESPACE_END
