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
// Value and gradient live in the backend's memory space. Gradients are kept in accumulate_t<T>
// (float for bf16 parameters) and accumulate with +=. Initialization runs on the backend
// (init_normal at the element's global index through ShardIndexMap; fill for constants).
//
// Zeroing by first write. A GradBuffer zeroed with first_write (GradBuffer::zero) does not fill the
// gradients of parameters marked `grad_first_write` (the weights a Column/RowParallelLinear owns and
// the experts' weights, whose gradients only the weight-gradient GEMMs write; an expert with no token
// gets zeros from its grouped GEMM); it marks them `grad_stale` instead, and the
// first weight-gradient GEMM of the iteration writes dW where it would have added it to zeros (the
// same bits: 0 + x is x), which saves a fill and a read of the gradient per step. Whatever reads or
// adds to a gradient some other way calls settle_gradient first, which fills a stale one with zeros;
// the buffer settles every parameter of a bucket before the bucket's scaling and collective.
#pragma once

#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "../core/rng.hpp"
#include "../core/space.hpp"
#include "../core/tensor.hpp"
#include "../shard/shard_spec.hpp"

STRATA_NAMESPACE_BEGIN

template <class Space>
struct Fp8State;  // core/fp8_recipe.hpp

template <class T, class Space = space::host>
struct Parameter {
  using value_type = T;
  using grad_type = accumulate_t<T>;
  using space_type = Space;

  std::string name;
  Shape global_shape;
  ShardSpec shard;
  bool weight_decay = true;  // false for biases and norm weights
  // A copy of a parameter another pipeline stage holds (the tied output embedding on the last
  // stage): its gradient is summed with the original's every step, so both stay the same, and
  // gradient norms count it once (on the original).
  bool pipeline_copy = false;
  // An expert's weight (layers/moe/experts.hpp): `shard` splits it over the expert-tensor-parallel
  // group (ctx.expert_tp), one expert-parallel rank holds it, and its gradient is summed over the
  // expert-data-parallel group (ctx.expert_dp) instead of dp (and counted over
  // ctx.expert_model_parallel, not ctx.model_parallel, in gradient norms).
  bool expert = false;
  // The word embedding and the output layer (Megatron's is_embedding_or_output_parameter): the
  // optimizer steps them with the decoupled learning rate when one is given (--decoupled-lr).
  bool decoupled_lr = false;
  // Only the weight-gradient GEMM (layers/linear_common.hpp) writes this gradient, so it may be left
  // stale by a zero and overwritten by the first GEMM (see above). Set by the layer that owns it.
  bool grad_first_write = false;
  // The gradient's memory holds an earlier iteration's values that count as zero (see above).
  bool grad_stale = false;
  // The FP8 scaling state of the linear layer that casts this weight to FP8 (null: the weight's GEMMs
  // run in T). Set by the layer that owns it; the FP8 parameter gather (GradBufferOptions::
  // fp8_param_gather) keeps such a weight's codes and gathers them instead of its values.
  Fp8State<Space>* fp8 = nullptr;
  Tensor<T, Space> value;
  Tensor<grad_type, Space> grad;

  Parameter() = default;
  Parameter(std::string name_, Shape global, ShardSpec spec, bool decay = true)
      : name(std::move(name_)), global_shape(global), shard(spec), weight_decay(decay),
        value(Tensor<T, Space>::zeros(local_shape(global, spec))),
        grad(Tensor<grad_type, Space>::zeros(local_shape(global, spec))) {}

  // True when the tensor-parallel ranks hold different pieces (counted by every rank in a norm).
  bool tensor_parallel() const { return shard.sharded && shard.parts > 1; }
  // Where each local element lives in the global tensor (for kernels).
  ShardIndexMap index_map() const { return ShardIndexMap(global_shape, shard); }
};

// Makes a stale gradient (grad_stale, see above) zero before anything other than the weight-gradient
// GEMM reads or adds to it.
template <class Device, class T, class Space>
void settle_gradient(Device& device, Parameter<T, Space>& p) {
  if (!std::exchange(p.grad_stale, false)) return;
  device.template fill<accumulate_t<T>>(p.grad.data(), p.grad.numel(), 0.0);
}

// Told that a parameter's gradient is final for this iteration: no later backward of the step
// adds to it. A model's backward given one calls it for each of its parameters as soon as their
// gradients are complete (layer by layer), so the data-parallel gradient buffer can start reducing
// them while the rest of the backward runs (GradBuffer::mark_ready).
template <class T, class Space = space::host>
using GradientReady = std::function<void(Parameter<T, Space>&)>;

// The forward's counterpart: told that a parameter is about to be read for the first time in this
// iteration's forward. A model's forward given one calls it for each parameter of a layer right
// before that layer runs, so the values can still be arriving while earlier layers compute (the
// distributed optimizer's overlapped all-gather: GradBuffer::needed_hook waits for just the
// parameter's bucket).
template <class T, class Space = space::host>
using ParameterNeeded = std::function<void(const Parameter<T, Space>&)>;

// value = std * N(0, 1), drawn per global element under key (seed, name), by the backend.
template <class Device, class T, class Space>
void init_normal(Device& device, Parameter<T, Space>& p, std::uint64_t seed, double stddev) {
  device.template init_normal<T>(p.value.data(), p.value.numel(), p.index_map(), rng::parameter_key(seed, p.name), stddev);
}

template <class Device, class T, class Space>
void init_constant(Device& device, Parameter<T, Space>& p, double value) {
  device.template fill<T>(p.value.data(), p.value.numel(), value);
}

STRATA_NAMESPACE_END
