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
// Squares are summed in double on the backend (sum_of_squares), in visiting order, and the in-process all-reduce adds ranks in
// rank order, so the norm is bit-identical from run to run and the same on every rank. Data-parallel
// replicas hold the same (already reduced) gradients and compute the same norm without talking.
// A parameter held by two pipeline stages (the tied word embedding, whose gradients the pipeline
// sums between the two copies) is counted on the first stage only: the copy on the last stage has
// Parameter::pipeline_copy set.
//
// Mixture of experts: an expert's weight (Parameter::expert) is split over ctx.expert_tp and held by
// one expert-parallel rank, and its gradient is summed over ctx.expert_dp, not dp. So the norm of a
// model with experts is  sqrt(dense squares summed over ctx.model_parallel + expert squares summed
// over ctx.expert_model_parallel), an expert weight counted on every etp rank when split, else on
// etp rank 0 (global_grad_square_sum does this; a model without experts takes the path above,
// unchanged). It is the same on every rank, so a non-finite gradient anywhere (found-inf) makes
// it non-finite everywhere. dense_parameters(model) / expert_parameters(model) are views of a
// module that visit one kind only: reduce them over their own groups, e.g.
//   all_reduce_gradients(ctx.dp, dense_parameters(model));
//   all_reduce_gradients(ctx.expert_dp, expert_parameters(model));
//
// Zeroing, the sum of squares and the clipping scale go to the backend's multi-tensor entry points
// (fill_many, sum_of_squares_many, scale_by_many over backend/tensor_ref.hpp lists) where it has
// them for both float and double: consecutive gradients of one element type form one list, so the
// work keeps the visiting order and gives the same bits as one call per gradient (a GPT-2 124M
// step: a handful of launches instead of 148 per function).
#pragma once

#include <cmath>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/cpu/backend.hpp"
#include "../backend/tensor_ref.hpp"
#include "../comm/communicator.hpp"
#include "../core/tensor.hpp"
#include "../core/error.hpp"
#include "state_piece.hpp"

STRATA_NAMESPACE_BEGIN

// Backends with the multi-tensor forms for float and double gradients (namespace-scope concepts:
// nvcc's front end fails on requires-expressions naming local variables inside function bodies).
template <class Device, class X>
concept has_sum_of_squares_many = requires(Device& d, std::span<const SquaresTensor<X>> list, double* accumulator) {
  d.template sum_of_squares_many<X>(list, accumulator);
};
template <class Device, class X>
concept has_scale_by_many = requires(Device& d, std::span<const TensorRef<X>> list, const double* factor) {
  d.template scale_by_many<X>(list, factor);
};
template <class Device, class X>
concept has_fill_many = requires(Device& d, std::span<const TensorRef<X>> list, double value) {
  d.template fill_many<X>(list, value);
};

namespace detail {

// Runs of consecutive float or double tensors in the order they are added; flush() hands each run
// to `send(std::span<const TensorRef<X>>)` as one list, oldest first.
template <template <class> class Const, class Send>
class tensor_runs {
 public:
  explicit tensor_runs(Send send) : send_(send) {}
  template <class X>
  void add(X* data, index_t n) {
    if constexpr (std::is_same_v<std::remove_const_t<X>, float>) {
      if (!doubles_.empty()) flush();
      floats_.push_back({data, n});
    } else {
      static_assert(std::is_same_v<std::remove_const_t<X>, double>, "Multi-tensor gradient lists hold float or double gradients only.");
      if (!floats_.empty()) flush();
      doubles_.push_back({data, n});
    }
  }
  void flush() {
    if (!floats_.empty()) send_(std::span<const TensorRef<Const<float>>>(floats_));
    if (!doubles_.empty()) send_(std::span<const TensorRef<Const<double>>>(doubles_));
    floats_.clear();
    doubles_.clear();
  }

 private:
  Send send_;
  std::vector<TensorRef<Const<float>>> floats_;
  std::vector<TensorRef<Const<double>>> doubles_;
};
template <class X>
using as_const = const X;
template <class X>
using as_mutable = X;

// The optional flags of a parameter type, as namespace-scope concepts: nvcc's front end evaluates a
// requires-expression naming a function parameter inside the function's body as false.
template <class P>
concept has_pipeline_copy_member = requires(const P& q) { q.pipeline_copy; };
template <class P>
concept has_expert_member = requires(const P& q) { q.expert; };
template <class P>
concept has_decoupled_lr_member = requires(const P& q) { q.decoupled_lr; };

// A parameter type without the pipeline_copy flag is never a copy.
template <class P>
constexpr bool is_pipeline_copy(const P& p) {
  if constexpr (has_pipeline_copy_member<P>) return p.pipeline_copy;
  else return false;
}

template <class G>
inline constexpr bool float_or_double = std::is_same_v<G, float> || std::is_same_v<G, double>;

// A parameter type without the expert flag is never an expert's.
template <class P>
constexpr bool is_expert(const P& p) {
  if constexpr (has_expert_member<P>) return p.expert;
  else return false;
}

// A parameter type without the decoupled_lr flag always takes the main learning rate.
template <class P>
constexpr bool is_decoupled_lr(const P& p) {
  if constexpr (has_decoupled_lr_member<P>) return p.decoupled_lr;
  else return false;
}

}  // namespace detail

// A view of a module that visits its dense parameters only (Expert = false) or its experts' only.
template <class Module, bool Expert>
class ParameterSubset {
 public:
  explicit ParameterSubset(Module& module) : module_(&module) {}
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    module_->for_each_parameter([&](auto& p) {
      if (detail::is_expert(p) == Expert) visit(p);
    });
  }

 private:
  Module* module_;
};
template <class Module>
ParameterSubset<Module, false> dense_parameters(Module& module) {
  return ParameterSubset<Module, false>(module);
}
template <class Module>
ParameterSubset<Module, true> expert_parameters(Module& module) {
  return ParameterSubset<Module, true>(module);
}
// Whether the module has any expert parameter.
template <class Module>
bool has_expert_parameters(Module& model) {
  bool any = false;
  model.for_each_parameter([&](auto& p) { any = any || detail::is_expert(p); });
  return any;
}
// Whether the module takes part in the experts' gradient-norm collective over
// ctx.expert_model_parallel (which spans the pipeline stages): it has expert parameters, or it is a
// stage of a mixture-of-experts model that holds none (--moe-layer-freq can leave a stage with dense
// layers alone), whose experts' share is then 0.
template <class Module>
bool joins_expert_reductions(Module& model) {
  if constexpr (requires { model.config().moe.num_experts; })
    if (model.config().moe.num_experts > 0) return true;
  return has_expert_parameters(model);
}

// grad = 0 for every parameter, on the rank's backend.
template <class Device, class Module>
void zero_gradients(Device& device, Module& model) {
  if constexpr (has_fill_many<Device, float> && has_fill_many<Device, double>) {
    auto send = [&](auto list) {
      using X = typename decltype(list)::value_type::element_type;
      device.template fill_many<X>(list, 0.0);
    };
    detail::tensor_runs<detail::as_mutable, decltype(send)> runs(send);
    model.for_each_parameter([&](auto& p) {
      using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
      if constexpr (detail::float_or_double<G>) {
        runs.add(p.grad.data(), p.grad.numel());
      } else {
        runs.flush();
        device.template fill<G>(p.grad.data(), p.grad.numel(), 0.0);
      }
    });
    runs.flush();
  } else {
    model.for_each_parameter([&](auto& p) {
      using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
      device.template fill<G>(p.grad.data(), p.grad.numel(), 0.0);
    });
  }
}
// Host parameters: on the CPU backend.
template <class Module>
void zero_gradients(Module& model) {
  cpu::backend device;
  zero_gradients(device, model);
}

// Sums (or averages, with op = ReduceOp::avg) every gradient over `dp`, the data-parallel group
// (pass ctx.dp_cp when context parallelism is on). A no-op for a group of one rank. With the
// default sum the loss each rank backpropagates must already be divided by the global batch.
template <class Comm, class Module>
void all_reduce_gradients(Comm& dp, Module& model, ReduceOp op = ReduceOp::sum) {
  if (dp.size() == 1) return;
  model.for_each_parameter([&](auto& p) { dp.all_reduce(p.grad.buffer(), op); });
}

// accumulator[0] += sum of squared gradient elements this rank counts towards the global norm
// (see the note above), in double, in visiting order; accumulator is in the backend's space.
template <class Device, class Module>
void accumulate_grad_squares(Device& device, Module& model, int tp_rank, double* accumulator) {
  if constexpr (has_sum_of_squares_many<Device, float> && has_sum_of_squares_many<Device, double>) {
    auto send = [&](auto list) {
      using X = std::remove_const_t<typename decltype(list)::value_type::element_type>;
      device.template sum_of_squares_many<X>(list, accumulator);
    };
    detail::tensor_runs<detail::as_const, decltype(send)> runs(send);
    model.for_each_parameter([&](auto& p) {
      if (detail::is_pipeline_copy(p) || (!p.tensor_parallel() && tp_rank != 0)) return;
      using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
      if constexpr (detail::float_or_double<G>) {
        runs.add(static_cast<const G*>(p.grad.data()), p.grad.numel());
      } else {
        runs.flush();
        device.template sum_of_squares<G>(p.grad.data(), p.grad.numel(), accumulator);
      }
    });
    runs.flush();
  } else {
    model.for_each_parameter([&](auto& p) {
      if (detail::is_pipeline_copy(p) || (!p.tensor_parallel() && tp_rank != 0)) return;
      using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
      device.template sum_of_squares<G>(p.grad.data(), p.grad.numel(), accumulator);
    });
  }
}

// Host parameters: the same sum returned as a number (CPU backend).
template <class Module>
double local_grad_square_sum(Module& model, int tp_rank) {
  cpu::backend device;
  double sum = 0;
  accumulate_grad_squares(device, model, tp_rank, &sum);
  return sum;
}

// The squared L2 norm of the whole model's gradient as a one-element tensor in the backend's
// space (a device scalar: nothing is read on the host). Collective over ctx.model_parallel.
// With experts: collective over ctx.model_parallel, then ctx.expert_model_parallel (the note above).
template <class Context, class Module>
auto global_grad_square_sum(Context& ctx, Module& model) {
  using Space = typename Context::space;
  auto sum = Tensor<double, Space>::zeros(Shape{1});
  if (!joins_expert_reductions(model)) {
    accumulate_grad_squares(ctx.device, model, ctx.tp.rank(), sum.data());
    if (ctx.model_parallel.size() > 1) ctx.model_parallel.all_reduce(sum.buffer(), ReduceOp::sum);
    return sum;
  }
  auto dense = dense_parameters(model);
  accumulate_grad_squares(ctx.device, dense, ctx.tp.rank(), sum.data());
  if (ctx.model_parallel.size() > 1) ctx.model_parallel.all_reduce(sum.buffer(), ReduceOp::sum);
  auto experts = expert_parameters(model);
  auto expert_sum = Tensor<double, Space>::zeros(Shape{1});
  accumulate_grad_squares(ctx.device, experts, ctx.expert_tp.rank(), expert_sum.data());
  if (ctx.expert_model_parallel.size() > 1) ctx.expert_model_parallel.all_reduce(expert_sum.buffer(), ReduceOp::sum);
  ctx.device.template add<double>(sum.data(), expert_sum.data(), 1, sum.data());
  return sum;
}

// The L2 norm of the whole model's gradient, read on the host. Collective over ctx.model_parallel.
template <class Context, class Module>
double global_grad_norm(Context& ctx, Module& model) {
  const auto sum = global_grad_square_sum(ctx, model);
  return std::sqrt(to_host(sum)[0]);
}

// grad *= factor for every parameter (factor a host number).
template <class Device, class Module>
void scale_gradients(Device& device, Module& model, double factor) {
  model.for_each_parameter([&](auto& p) {
    using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
    device.template scale<G>(p.grad.data(), p.grad.numel(), factor);
  });
}
template <class Module>
void scale_gradients(Module& model, double factor) {
  cpu::backend device;
  scale_gradients(device, model, factor);
}

// grad *= *factor for every parameter (factor a scalar in the backend's space).
template <class Device, class Module>
void scale_gradients_by(Device& device, Module& model, const double* factor) {
  if constexpr (has_scale_by_many<Device, float> && has_scale_by_many<Device, double>) {
    auto send = [&](auto list) {
      using X = typename decltype(list)::value_type::element_type;
      device.template scale_by_many<X>(list, factor);
    };
    detail::tensor_runs<detail::as_mutable, decltype(send)> runs(send);
    model.for_each_parameter([&](auto& p) {
      using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
      if constexpr (detail::float_or_double<G>) {
        runs.add(p.grad.data(), p.grad.numel());
      } else {
        runs.flush();
        device.template scale_by<G>(p.grad.data(), p.grad.numel(), factor);
      }
    });
    runs.flush();
  } else {
    model.for_each_parameter([&](auto& p) {
      using G = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
      device.template scale_by<G>(p.grad.data(), p.grad.numel(), factor);
    });
  }
}

// The norm sqrt(square_sum) and Megatron's clipping factor of a global square sum already summed
// over every rank that holds gradients, as one-element tensors in square_sum's space.
template <class Device, class Space>
std::pair<Tensor<double, Space>, Tensor<double, Space>> clip_factor_of(Device& device, const Tensor<double, Space>& square_sum,
                                                                       double max_norm) {
  auto norm = Tensor<double, Space>::empty(Shape{1}), factor = Tensor<double, Space>::empty(Shape{1});
  device.clip_factor(square_sum.data(), max_norm, norm.data(), factor.data());
  return {std::move(norm), std::move(factor)};
}

// The norm before clipping and Megatron's clipping factor (max_norm / (norm + 1e-6) when max_norm > 0
// and that is below 1, else 1) as one-element tensors in the backend's space, the gradients left as
// they are: an optimizer step given the factor as grad_scale (AdamW::step) clips as it reads them,
// with the bits of clip_grad_norm_device followed by a plain step. Collective over ctx.model_parallel.
template <class Context, class Module>
auto clip_factor_device(Context& ctx, Module& model, double max_norm) {
  return clip_factor_of(ctx.device, global_grad_square_sum(ctx, model), max_norm);
}

// Clips the global gradient norm to max_norm as Megatron does, without reading anything on the
// host: factor = max_norm / (norm + 1e-6) when max_norm > 0 and that is below 1, else 1 (backend
// clip_factor), then grad *= factor (scale_by). Returns the norm before clipping as a one-element
// tensor in the backend's space. Collective over ctx.model_parallel.
template <class Context, class Module>
auto clip_grad_norm_device(Context& ctx, Module& model, double max_norm) {
  auto [norm, factor] = clip_factor_device(ctx, model, max_norm);
  if (max_norm > 0) scale_gradients_by(ctx.device, model, factor.data());
  return norm;
}

// The same, returning the norm read on the host (for logging and tests).
template <class Context, class Module>
double clip_grad_norm(Context& ctx, Module& model, double max_norm) {
  return to_host(clip_grad_norm_device(ctx, model, max_norm))[0];
}

STRATA_NAMESPACE_END
