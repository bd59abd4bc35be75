// examples/trainer/data_parallel.hpp: the trainers' gradient and optimizer machinery in one object:
// the gradient buffer and its buckets (reduced over the data-parallel group), AdamW or the
// distributed optimizer (--use-distributed-optimizer), and the loss scaler (--fp16, --loss-scale).
//
// Per iteration the trainer calls
//   zero_gradients()                  before the first micro-batch (one fill of the buffer, less the
//                                     linear weights' gradients, which their first GEMM writes)
//   loss_scale()                      the factor the backward multiplies the loss by (1 without a scaler)
//   gradient_ready(ctx)               with --overlap-grad-reduce: the hook the step's backward calls
//                                     per parameter whose gradient is final, which starts each
//                                     bucket's collective on the communication stream as soon as the
//                                     bucket is complete (null without the flag)
//   reduce_gradients()                after the last micro-batch: the collectives of the buckets not
//                                     started yet, then (overlapped) the compute stream waits for all
//   unscale_and_clip(max_norm)        gradients /= loss scale, global norm (device scalar), and the
//                                     clipping factor, which the next step() applies as the AdamW
//                                     kernels read the gradients (no pass of its own)
//   parameters_needed(ctx)            with --overlap-param-gather, after a step: the hook the next
//                                     forward calls per parameter right before reading it, which
//                                     makes the compute stream wait for that bucket's all-gather
//                                     (null when no gather is pending)
//   step(lr, skip_unless_finite)      AdamW or the sharded AdamW + parameter all-gather (with
//                                     --overlap-param-gather on the communication stream, the buckets
//                                     last first; wait_parameters() waits for all of it before
//                                     anything else reads the parameters)
//   finish_step(ctx)                  after fp8_after_optimizer_step: with --fp8-param-gather the
//                                     FP8 weights' shards cast with the new scales and the parameter
//                                     all-gather, codes for those weights (nothing otherwise)
//   gather_values(ctx)                with --fp8-param-gather, before a checkpoint or an export: the
//                                     FP8 weights' values whole on every rank (the gather moved codes)
// and hands the object to save_checkpoint / load_checkpoint as the optimizer (for_each_state_piece,
// steps, set_steps, config, reload_main_from_model, reset_moments).
//
// The dense parameters are replicated over data and context parallelism alike, so their gradients
// are reduced, and the distributed optimizer's state sharded, over ctx.dp_cp (the data-parallel
// group itself when cp = 1), as Megatron does.
//
// A model with experts (Parameter::expert, models::MoeLlama) gets a second gradient buffer with
// buckets of its own for the expert weights, reduced over ctx.expert_dp (the dense buffer over
// ctx.dp_cp, as before), and with the distributed optimizer a second one sharding the experts' state
// over expert dp. The gradient norm adds the experts' squares (summed over
// ctx.expert_model_parallel) to the dense ones (over ctx.model_parallel); everything above treats
// both buffers. A model without experts has the one buffer, as before.
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <type_traits>
#include <optional>
#include <string>

#include <strata/optim.hpp>

namespace trainer {

using namespace strata;

// Bytes this rank allocated for the model's state, and the estimate of its activations.
struct MemoryReport {
  std::int64_t parameters = 0;      // parameter values (count)
  std::int64_t parameter_bytes = 0;
  std::int64_t gradient_bytes = 0;
  std::int64_t optimizer_bytes = 0;
  std::int64_t activation_bytes = 0;  // an estimate (models::estimate_training_memory), not an allocation
  // On a device: the allocator's bytes in use grown by building the model and its optimizer (the
  // three figures above as allocated, with the allocator's rounding); -1 on the CPU.
  std::int64_t measured_state_bytes = -1;
  double bytes_per_parameter() const {
    return parameters == 0 ? 0.0 : static_cast<double>(parameter_bytes + gradient_bytes + optimizer_bytes) / static_cast<double>(parameters);
  }
};

struct DataParallelOptions {
  bool distributed_optimizer = false;
  index_t bucket_size = 0;  // elements; 0: Megatron's default max(40M, 1M x dp)
  AdamWConfig adam{};
  std::optional<LossScalerConfig> loss_scaler;  // set: fp16-style loss scaling
  bool overlap_grad_reduce = false;   // bucket collectives during the backward, beside compute
  bool overlap_param_gather = false;  // (distributed optimizer) the parameter all-gather beside compute
  // zero_gradients() leaves the linear layers' weight gradients to their first GEMM (GradBuffer::zero's
  // first_write) instead of filling the whole buffer.
  bool zero_by_first_write = true;
  // (distributed optimizer, FP8) --fp8-param-gather: the FP8 weights' codes gathered instead of
  // their values (GradBufferOptions::fp8_param_gather, DistributedOptimizer::finish_step).
  bool fp8_param_gather = false;
};

template <class T, class Space>
class DataParallelOptimizer {
 public:
  template <class Context, class Model>
  DataParallelOptimizer(Context& ctx, Model& model, const DataParallelOptions& options)
      : buffer_(dense_buffer(ctx, model, options)),
        overlap_param_gather_(options.overlap_param_gather && options.distributed_optimizer),
        zero_by_first_write_(options.zero_by_first_write) {
    expert_norm_share_only_ = !has_expert_parameters(model) && joins_expert_reductions(model);
    if (has_expert_parameters(model)) {
      auto experts = expert_parameters(model);
      expert_buffer_.emplace(ctx.device, experts, buffer_options(ctx.expert_dp.size(), options));
    }
    if (options.distributed_optimizer) {
      distributed_.emplace(ctx.device, buffer_, ctx.dp_cp.rank(), options.adam);
      if (expert_buffer_) expert_distributed_.emplace(ctx.device, *expert_buffer_, ctx.expert_dp.rank(), options.adam);
    } else {
      adamw_.emplace(ctx.device, model, options.adam);
    }
    if (options.loss_scaler) scaler_.emplace(*options.loss_scaler);
  }

  template <class Context>
  void zero_gradients(Context& ctx) {
    buffer_.zero(ctx.device, zero_by_first_write_);
    if (expert_buffer_) expert_buffer_->zero(ctx.device, zero_by_first_write_);
  }
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  bool scaling() const { return scaler_.has_value(); }

  // The hook for the step's backward (null: no overlap). It holds ctx: rebuild it per step.
  template <class Context>
  GradientReady<T, Space> gradient_ready(Context& ctx) {
    if (!buffer_.options().overlap_communication) return {};
    if (!expert_buffer_) return buffer_.ready_hook(ctx.device, ctx.dp_cp);
    return [dense = buffer_.ready_hook(ctx.device, ctx.dp_cp),
            experts = expert_buffer_->ready_hook(ctx.device, ctx.expert_dp)](Parameter<T, Space>& p) {
      if (p.expert) experts(p);
      else dense(p);
    };
  }

  template <class Context>
  void reduce_gradients(Context& ctx) {
    buffer_.finish_reduction(ctx.device, ctx.dp_cp);
    if (expert_buffer_) expert_buffer_->finish_reduction(ctx.device, ctx.expert_dp);
  }

  // The hook for the next forward (null: no gather pending): each bucket of the last step's
  // overlapped parameter all-gather is waited for right before the forward first reads one of its
  // parameters. It holds ctx: rebuild it per step; call wait_parameters after the step.
  template <class Context>
  ParameterNeeded<T, Space> parameters_needed(Context& ctx) {
    if (!expert_buffer_) {
      if (!buffer_.gather_pending()) return {};
      return buffer_.needed_hook(ctx.dp_cp);
    }
    if (!buffer_.gather_pending() && !expert_buffer_->gather_pending()) return {};
    return [dense = buffer_.needed_hook(ctx.dp_cp), experts = expert_buffer_->needed_hook(ctx.expert_dp)](const Parameter<T, Space>& p) {
      if (p.expert) experts(p);
      else dense(p);
    };
  }

  // With --overlap-param-gather: the compute stream waits for whatever is left of the parameter
  // all-gather of the last step. Call before anything reads the parameters without the hook above
  // (evaluation, a checkpoint, a forward without the hook) and after each training step.
  template <class Context>
  void wait_parameters(Context& ctx) {
    buffer_.wait_gathered(ctx.dp_cp);
    if (expert_buffer_) expert_buffer_->wait_gathered(ctx.expert_dp);
  }

  // Divides the gradients by the loss scale (with a scaler), then measures the global norm and the
  // clipping factor (--clip-grad); returns the norm before clipping as a device scalar. The gradients
  // are not scaled by the factor here: the next step() hands it to the AdamW kernels (AdamWStep::
  // grad_scale), which multiply each gradient as they read it, with the bits of a scaling pass
  // followed by the step. Collective over dp (sharded) and ctx.model_parallel.
  template <class Context, class Model>
  Tensor<double, Space> unscale_and_clip(Context& ctx, Model& model, double max_norm) {
    using G = accumulate_t<T>;
    clip_factor_.reset();
    if (scaler_) {
      const double inverse = scaler_->inverse_scale();
      if (distributed_) distributed_->scale_gradients(ctx.device, inverse);
      else ctx.device.template scale<G>(buffer_.grads().data(), buffer_.grads().numel(), inverse);
      if (expert_distributed_) expert_distributed_->scale_gradients(ctx.device, inverse);
      else if (expert_buffer_) ctx.device.template scale<G>(expert_buffer_->grads().data(), expert_buffer_->grads().numel(), inverse);
    }
    if (distributed_ && expert_distributed_) {  // dense squares over dp x model_parallel + the experts' over edp x expert_model_parallel
      auto square_sum = distributed_->global_grad_square_sum(ctx, ctx.dp_cp);
      const auto expert_square_sum = expert_distributed_->global_grad_square_sum(ctx, ctx.expert_dp);
      ctx.device.template add<double>(square_sum.data(), expert_square_sum.data(), 1, square_sum.data());
      auto [norm, factor] = clip_factor_of(ctx.device, square_sum, max_norm);
      if (max_norm > 0) clip_factor_ = std::move(factor);
      return norm;
    }
    if (distributed_ && expert_norm_share_only_) {  // a stage of a MoE model without experts: adds 0, gets the others' experts
      auto square_sum = distributed_->global_grad_square_sum(ctx, ctx.dp_cp);
      auto expert_square_sum = Tensor<double, Space>::zeros(Shape{1});
      if (ctx.expert_model_parallel.size() > 1) ctx.expert_model_parallel.all_reduce(expert_square_sum.buffer(), ReduceOp::sum);
      ctx.device.template add<double>(square_sum.data(), expert_square_sum.data(), 1, square_sum.data());  // the other stages' experts
      auto [norm, factor] = clip_factor_of(ctx.device, square_sum, max_norm);
      if (max_norm > 0) clip_factor_ = std::move(factor);
      return norm;
    }
    // with experts and without sharding: their squares over expert_model_parallel
    auto [norm, factor] = distributed_ ? distributed_->clip_factor_device(ctx, ctx.dp_cp, max_norm)
                                       : clip_factor_device(ctx, model, max_norm);
    if (max_norm > 0) clip_factor_ = std::move(factor);
    return norm;
  }

  // With a loss scaler: reads the norm on the host (one wait per iteration), updates the scale and
  // returns true when this iteration's step must be skipped (a gradient overflowed).
  bool update_loss_scale(const Tensor<double, Space>& norm) {
    if (!scaler_) return false;
    double value = 0;
    if constexpr (std::is_same_v<Space, space::host>) value = norm[0];
    else value = to_host(norm)[0];
    const bool skip = scaler_->update(!std::isfinite(value));
    if (skip) ++skipped_;
    return skip;
  }

  template <class Context, class Model>
  // decoupled_lr >= 0: the learning rate of the word embedding and the output layer (--decoupled-lr).
  // The clipping factor of the last unscale_and_clip applies here, once.
  void step(Context& ctx, Model& model, double lr, const double* skip_unless_finite, double decoupled_lr = -1) {
    const double* clip = clip_factor_ ? clip_factor_->data() : nullptr;
    if (distributed_) {
      distributed_->step(ctx.device, ctx.dp_cp, lr, skip_unless_finite, overlap_param_gather_, decoupled_lr, clip);
      if (expert_distributed_)
        expert_distributed_->step(ctx.device, ctx.expert_dp, lr, skip_unless_finite, overlap_param_gather_, decoupled_lr,
                                  clip);
    } else {
      adamw_->step(ctx.device, model, lr, skip_unless_finite, decoupled_lr, clip);
    }
    clip_factor_.reset();
  }

  // After step() and fp8_after_optimizer_step(ctx): the FP8 parameter gather (see the list above).
  template <class Context>
  void finish_step(Context& ctx) {
    if (distributed_) distributed_->finish_step(ctx, ctx.dp_cp, overlap_param_gather_);
  }
  // Before a checkpoint or an export reads the values (see the list above). Collective over dp.
  template <class Context>
  void gather_values(Context& ctx) {
    if (distributed_) distributed_->gather_values(ctx.dp_cp);
  }

  // Whether gather_values is due before the values are read whole (checkpoint_writer refuses to save then).
  bool values_stale() const { return distributed_ && distributed_->values_stale(); }

  // Checkpoints: the optimizer's state in pieces (for_each_state_piece: any layout loads it), its
  // step count and its AdamW numbers; a fresh state over loaded weights (--no-load-optim).
  template <class Visitor>
  void for_each_state_piece(Visitor&& visit) {
    if (distributed_) distributed_->for_each_state_piece(visit);
    else adamw_->for_each_state_piece(visit);
    if (expert_distributed_) expert_distributed_->for_each_state_piece(visit);
  }
  template <class Device, class Model>
  void reload_main_from_model(Device& device, Model& model) {
    if (distributed_) distributed_->reload_main_from_model(device);
    else adamw_->reload_main_from_model(device, model);
    if (expert_distributed_) expert_distributed_->reload_main_from_model(device);
  }
  template <class Device>
  void reset_moments(Device& device) {
    if (distributed_) distributed_->reset_moments(device);
    else adamw_->reset_moments(device);
    if (expert_distributed_) expert_distributed_->reset_moments(device);
  }
  int steps() const { return distributed_ ? distributed_->steps() : adamw_->steps(); }
  void set_steps(int steps) {
    if (distributed_) distributed_->set_steps(steps);
    else adamw_->set_steps(steps);
    if (expert_distributed_) expert_distributed_->set_steps(steps);
  }
  const AdamWConfig& config() const { return distributed_ ? distributed_->config() : adamw_->config(); }

  LossScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }
  int skipped_iterations() const { return skipped_; }
  const GradBuffer<T, Space>& buffer() const { return buffer_; }  // the dense parameters' (all of a model without experts)
  const GradBuffer<T, Space>* expert_buffer() const { return expert_buffer_ ? &*expert_buffer_ : nullptr; }
  Tensor<accumulate_t<T>, Space>& gradients() { return buffer_.grads(); }
  bool distributed() const { return distributed_.has_value(); }

  // What this rank allocated: values (the parameter buffer when sharded, else the parameters'
  // own tensors), the gradient buffer, the optimizer state.
  template <class Model>
  MemoryReport memory(Model& model, std::int64_t activation_bytes) const {
    MemoryReport r;
    model.for_each_parameter([&](auto& p) {
      r.parameters += p.value.numel();
      if (!distributed_) r.parameter_bytes += static_cast<std::int64_t>(p.value.bytes());
    });
    if (distributed_) r.parameter_bytes = buffer_.param_bytes() + (expert_buffer_ ? expert_buffer_->param_bytes() : 0);
    r.gradient_bytes = buffer_.grad_bytes() + (expert_buffer_ ? expert_buffer_->grad_bytes() : 0);
    if (distributed_) {
      r.optimizer_bytes = distributed_->state_bytes() + (expert_distributed_ ? expert_distributed_->state_bytes() : 0);
    } else {
      for (const auto& s : adamw_->states())
        r.optimizer_bytes += static_cast<std::int64_t>(s.main.bytes() + s.exp_avg.bytes() + s.exp_avg_sq.bytes());
    }
    r.activation_bytes = activation_bytes;
    return r;
  }

 private:
  // Every parameter's gradient, or (a model with experts) the dense parameters'.
  template <class Context, class Model>
  static GradBuffer<T, Space> dense_buffer(Context& ctx, Model& model, const DataParallelOptions& options) {
    if (!has_expert_parameters(model)) return GradBuffer<T, Space>(ctx.device, model, buffer_options(ctx.dp_cp.size(), options));
    auto dense = dense_parameters(model);
    return GradBuffer<T, Space>(ctx.device, dense, buffer_options(ctx.dp_cp.size(), options));
  }

  static GradBufferOptions buffer_options(int dp, const DataParallelOptions& options) {
    GradBufferOptions o;
    o.dp = dp;
    o.bucket_size = options.bucket_size > 0 ? options.bucket_size : std::max<index_t>(40'000'000, index_t{1'000'000} * dp);
    o.distributed = options.distributed_optimizer;
    o.param_buffer = options.distributed_optimizer;
    o.overlap_communication = options.overlap_grad_reduce;
    o.gradient_scaling_factor = 1.0;  // each rank's loss is already divided by the global batch's tokens
    o.fp8_param_gather = options.fp8_param_gather && options.distributed_optimizer;
    return o;
  }

  GradBuffer<T, Space> buffer_;                        // dense parameters, reduced over dp
  std::optional<GradBuffer<T, Space>> expert_buffer_;  // expert parameters, reduced over expert dp
  std::optional<AdamW<T, Space>> adamw_;
  std::optional<DistributedOptimizer<T, Space>> distributed_;
  std::optional<DistributedOptimizer<T, Space>> expert_distributed_;
  bool expert_norm_share_only_ = false;  // a stage of a MoE model that holds no expert (joins the experts' norm with 0)
  std::optional<LossScaler> scaler_;
  int skipped_ = 0;
  std::optional<Tensor<double, Space>> clip_factor_;  // unscale_and_clip's factor, applied by the next step()
  bool overlap_param_gather_ = false;
  bool zero_by_first_write_ = true;
};

}  // namespace trainer
