// strata/policy.hpp: `default_policy`, the struct users inherit from to pick element type, compute
// backend, communicator and semantic switches. It lives above the layers: layers read a policy's
// members and include no concrete backend or communicator.
//
//   struct MyPolicy : strata::default_policy {
//     using element = double;
//     static constexpr bool sequence_parallel = true;
//   };
//
// Semantic choices live here; tuning never does (it may not change results).
#pragma once

#include "backend/cpu/backend.hpp"
#include "comm/inprocess.hpp"
#include "comm/parallel_context.hpp"
#include "layers/policy.hpp"

STRATA_NAMESPACE_BEGIN

struct default_policy {
  using element = float;                            // parameter and activation type
  using backend = cpu::backend;                     // compute kernels
  using comm = inprocess::communicator;             // collectives
  static constexpr bool sequence_parallel = false;  // shard norms/dropout/residuals on the sequence dim
};

STRATA_NAMESPACE_END
