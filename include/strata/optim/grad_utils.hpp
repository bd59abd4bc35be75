// strata/optim/grad_utils.hpp: what a training step does to the gradients between backward and the
// optimizer: zero them, sum them over the data-parallel group, measure their global norm and clip.
//
// Every function visits the module's parameters through `for_each_parameter`, so it works on any
// layer, model or stage without per-layer code.
//
// The global norm is the L2 norm of the gradient of the whole (unsharded) model, computed without
// gathering anything (Megatron's get_grad_norm_fp32):
//   local = sum of g^2 over the parameters this rank counts
//           (a tensor-parallel shard: every rank counts its own piece;
//            a replicated parameter: counted on tensor-parallel rank 0 only, since every rank of
//            the group holds the same copy -- Megatron's param_is_not_tensor_parallel_duplicate)
//   norm  = sqrt(all_reduce_sum(local) over ctx.model_parallel)   (the tp x pp group)
// Squares are summed in double, in visiting order, and the in-process all-reduce adds ranks in
// rank order, so the norm is bit-identical from run to run and the same on every rank. Data-parallel
// replicas hold the same (already reduced) gradients and compute the same norm without talking.
// A parameter shared by two pipeline stages (tied embeddings) would be counted by both stages;
// this function does not deduplicate that case yet.
#pragma once

#include <cmath>
#include <span>
#include <type_traits>

#include "../comm/communicator.hpp"
#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN

// grad = 0 for every parameter.
template <class Module>
void zero_gradients(Module& module) {
  module.for_each_parameter([](auto& p) { p.grad.zero(); });
}

// Sums (or averages, with op = ReduceOp::avg) every gradient over `dp`, the data-parallel group
// (pass ctx.dp_cp when context parallelism is on). A no-op for a group of one rank. With the
// default sum the loss each rank backpropagates must already be divided by the global batch.
template <class Comm, class Module>
void all_reduce_gradients(Comm& dp, Module& module, ReduceOp op = ReduceOp::sum) {
  if (dp.size() == 1) return;
  module.for_each_parameter([&](auto& p) {
    using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
    dp.all_reduce(std::span<G>(p.grad.span()), op);
  });
}

// Sum of squared gradient elements this rank counts towards the global norm (see the note above).
template <class Module>
double local_grad_square_sum(Module& module, int tp_rank) {
  double sum = 0;
  module.for_each_parameter([&](auto& p) {
    if (!p.tensor_parallel() && tp_rank != 0) return;
    for (const auto& g : p.grad.span()) {
      const double x = static_cast<double>(g);
      sum += x * x;
    }
  });
  return sum;
}

// The L2 norm of the whole model's gradient. Collective over ctx.model_parallel.
template <class Context, class Module>
double global_grad_norm(Context& ctx, Module& module) {
  double sum = local_grad_square_sum(module, ctx.tp.rank());
  if (ctx.model_parallel.size() > 1) ctx.model_parallel.all_reduce(std::span<double>(&sum, 1), ReduceOp::sum);
  return std::sqrt(sum);
}

// grad *= factor for every parameter.
template <class Module>
void scale_gradients(Module& module, double factor) {
  module.for_each_parameter([&](auto& p) {
    using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
    const G f = static_cast<G>(factor);
    for (auto& g : p.grad.span()) g = static_cast<G>(g * f);
  });
}

// Clips the global gradient norm to max_norm as Megatron does: with coefficient
// max_norm / (norm + 1e-6), the gradients are scaled when the coefficient is below 1. max_norm <= 0
// disables clipping (the norm is still computed). Returns the norm before clipping. Collective over
// ctx.model_parallel.
template <class Context, class Module>
double clip_grad_norm(Context& ctx, Module& module, double max_norm) {
  const double norm = global_grad_norm(ctx, module);
  if (max_norm > 0) {
    const double coefficient = max_norm / (norm + 1.0e-6);
    if (coefficient < 1.0) scale_gradients(module, coefficient);
  }
  return norm;
}

STRATA_NAMESPACE_END
