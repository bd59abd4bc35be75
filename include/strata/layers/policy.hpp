// strata/layers/policy.hpp: what layers read from a policy, and the check that a policy has it.
//
// A policy is a struct of types and constants (strata/policy.hpp has `default_policy` to inherit
// from; layers never include a concrete backend or communicator):
//   element             parameter and activation type (float, double, bf16)
//   backend             the compute backend (models strata::Backend)
//   comm                the communicator (models strata::Communicator), in the backend's space
//   sequence_parallel   shard norms / dropout / residuals on the sequence dimension
#pragma once

#include <type_traits>

#include "../backend/backend.hpp"
#include "../comm/communicator.hpp"
#include "../comm/parallel_context.hpp"
#include "layout.hpp"

STRATA_NAMESPACE_BEGIN

// The layout of the residual stream (between transformer layers) under a policy.
template <class Policy>
using residual_layout_t =
    std::conditional_t<Policy::sequence_parallel, layout::sharded<0>, layout::replicated>;

// The context layers of a policy take: its communicator groups and its backend object.
template <class Policy>
using context_t = ParallelContext<typename Policy::comm, typename Policy::backend>;

// The memory space a policy's activations, parameters and gradients live in.
template <class Policy>
using space_t = typename Policy::backend::space;

STRATA_NAMESPACE_END
