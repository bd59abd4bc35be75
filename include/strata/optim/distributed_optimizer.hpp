// strata/optim/distributed_optimizer.hpp: `DistributedOptimizer<T, Space>`, AdamW with its state
// sharded over the data-parallel group (ZeRO stage 1; Megatron's --use-distributed-optimizer).
//
// It works on a GradBuffer built with `distributed = true, param_buffer = true`. Every bucket of
// that buffer is split into dp equal shards; data-parallel rank r owns shard r of every bucket:
//
//   bucket b:   | shard 0 | shard 1 | ... | shard dp-1 |       (shard_size = bucket.numel / dp)
//   rank r:                 ^ owned: fp32 main copy, exp_avg, exp_avg_sq for these elements only
//
// One iteration:
//   1. GradBuffer reduction: reduce-scatter of each bucket, so shard r holds the summed gradient;
//   2. the global gradient norm over the owned shards (below), clipping of the owned shards;
//   3. AdamW (backend adamw_step / adamw_step_many, the math of optim/adamw.hpp) on the owned
//      elements, one piece per (parameter x owned shard) intersection, so parameters without weight
//      decay (biases, norms) keep it off; the updated values are written in T into the parameter
//      buffer's owned shard;
//   4. all-gather of the parameter buffer over dp (GradBuffer::all_gather_parameters), in place.
//      Under the FP8 parameter gather (a buffer with code buckets) step() stops before it, and
//      finish_step(ctx, dp), after fp8_after_optimizer_step(ctx) set the step's weight scales, casts
//      this rank's shards of the FP8 weights to their codes and runs the gather, codes for those.
// Padding between and after parameters is never updated (its gradient is zero and no piece covers it).
//
// Memory per rank for N parameters in T with fp32 gradients (A = float): values 2N (bf16), gradients
// 4N, optimizer state 12N / dp (main, exp_avg, exp_avg_sq), plus padding; AdamW keeps 12N on every
// rank. So bf16 training needs 6 + 12 / dp bytes per parameter instead of 18.
//
// Gradient norm. Rank r's shard holds complete (reduced) gradients for its elements, so the square
// sum over owned elements, summed over dp and then over ctx.model_parallel, is the whole model's,
// with Megatron's rule for tensor-parallel duplicates: a replicated parameter (a norm weight, a
// row-parallel bias) is counted on tp rank 0 only. The sum runs in another order than over whole
// parameters, so it equals the unsharded norm to rounding, and is identical on every rank.
//
// Checkpoints: for_each_state_piece gives each (parameter x owned shard) piece of the state with
// where it lies in its parameter's local shard, so a checkpoint stores it under the parameter's
// name and loads into any dp size or bucket layout (checkpoint.hpp). for_each_sharded_state, the
// three flat tensors "distributed.main", ".exp_avg", ".exp_avg_sq" whole, fit only the same layout.
//
// Experts: over a buffer of expert weights (GradBuffer over expert_parameters(model), split over
// ctx.expert_dp; pass ctx.expert_dp where `dp` is asked and its rank as dp_rank) the state is
// sharded over expert dp, and the norm's squares are counted by etp rank and summed over
// ctx.expert_model_parallel instead of tp and ctx.model_parallel.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../backend/adamw_step.hpp"
#include "../core/error.hpp"
#include "../core/fp8_recipe.hpp"
#include "../core/tensor.hpp"
#include "../layers/fp8_linear.hpp"
#include "../shard/shard_spec.hpp"
#include "adamw.hpp"
#include "grad_buffer.hpp"
#include "grad_utils.hpp"

STRATA_NAMESPACE_BEGIN

template <class T, class Space = space::host>
class DistributedOptimizer {
 public:
  using element_type = T;
  using state_type = accumulate_t<T>;
  using space_type = Space;
  using Buffer = GradBuffer<T, Space>;

  // One parameter's share of this rank's shard of its bucket.
  struct Piece {
    std::string name;      // the parameter's
    index_t buffer_offset; // first element in the gradient and parameter buffers
    index_t state_offset;  // first element in main / exp_avg / exp_avg_sq
    index_t n;
    bool weight_decay;
    bool tensor_parallel;  // the parameter is split over tp (else it is counted on tp rank 0 only)
    bool pipeline_copy;    // a tied weight's copy on another pipeline stage: never counted in the norm
    bool expert;           // an expert's weight (the buffer holds experts only)
    index_t param_offset;  // first element within the parameter's local shard
    Shape global_shape;    // the parameter's, and its shard (for checkpoints)
    ShardSpec shard;
    bool decoupled_lr = false;  // steps with the decoupled learning rate when one is given (Parameter::decoupled_lr)
    Fp8State<Space>* fp8 = nullptr;  // an FP8 weight whose codes this rank casts (a code bucket's)
    std::uint8_t* codes = nullptr;   // where (the buffer's codes of the piece's elements)
    std::size_t fp8_index = 0;       // the weight's place in fp8_weights_
  };

  // main = this rank's shards of the parameter buffer (converted to A), moments = 0.
  template <class Device>
  DistributedOptimizer(Device& device, Buffer& buffer, int dp_rank, AdamWConfig config = {})
      : buffer_(&buffer), dp_rank_(dp_rank), config_(config) {
    config_.validate();
    const GradBufferOptions& options = buffer.options();
    if (!options.distributed || !options.param_buffer)
      fail<ConfigError>("DistributedOptimizer: the gradient buffer must be built with distributed = true and "
                        "param_buffer = true (its buckets are reduce-scattered and its values all-gathered)");
    if (dp_rank < 0 || dp_rank >= options.dp)
      fail<ConfigError>("DistributedOptimizer: dp_rank=", dp_rank, " is not a rank of the dp=", options.dp, " group");
    for (const auto& e : buffer.entries()) {
      experts_ = experts_ || e.param->expert;
      if (e.param->fp8 && buffer.buckets()[e.bucket].codes) fp8_weights_.push_back(e.param->fp8);
    }
    index_t state = 0;
    for (std::size_t b = 0; b < buffer.buckets().size(); ++b) {
      const index_t first = buffer.shard_begin(b, dp_rank), size = buffer.shard_size(b);
      shard_offsets_.push_back(state);
      for (const auto& e : buffer.entries()) {
        if (e.bucket != b) continue;
        const index_t begin = std::max(first, e.offset), end = std::min(first + size, e.offset + e.numel);
        if (begin >= end) continue;
        pieces_.push_back(Piece{e.param->name, begin, state + (begin - first), end - begin, e.param->weight_decay,
                                e.param->tensor_parallel(), detail::is_pipeline_copy(*e.param), e.param->expert,
                                begin - e.offset, e.param->global_shape, e.param->shard, detail::is_decoupled_lr(*e.param)});
        if (buffer.buckets()[b].codes) {
          Piece& piece = pieces_.back();
          piece.fp8 = e.param->fp8;
          piece.codes = buffer.codes().data() + buffer.buckets()[b].code_offset + (begin - buffer.buckets()[b].offset);
          piece.fp8_index = static_cast<std::size_t>(std::find(fp8_weights_.begin(), fp8_weights_.end(), piece.fp8) -
                                                     fp8_weights_.begin());
        }
      }
      state += size;
    }
    main_ = Tensor<state_type, Space>::empty(Shape{state});
    exp_avg_ = Tensor<state_type, Space>::zeros(Shape{state});
    exp_avg_sq_ = Tensor<state_type, Space>::zeros(Shape{state});
    reload_main_from_model(device);
  }

  // main = the values of the owned shards (after the model's weights were loaded from outside).
  template <class Device>
  void reload_main_from_model(Device& device) {
    for (std::size_t b = 0; b < buffer_->buckets().size(); ++b)
      device.template convert<T, state_type>(buffer_->params().data() + buffer_->shard_begin(b, dp_rank_),
                                             buffer_->shard_size(b), main_.data() + shard_offsets_[b]);
  }
  // exp_avg = exp_avg_sq = 0 (a fresh optimizer over loaded weights).
  template <class Device>
  void reset_moments(Device& device) {
    device.template fill<state_type>(exp_avg_.data(), exp_avg_.numel(), 0.0);
    device.template fill<state_type>(exp_avg_sq_.data(), exp_avg_sq_.numel(), 0.0);
  }

  // accumulator[0] += sum of squares of the owned, reduced gradient elements this rank counts.
  template <class Device>
  void accumulate_grad_squares(Device& device, int tp_rank, double* accumulator) const {
    std::vector<SquaresTensor<state_type>> list;
    for (const Piece& p : pieces_)
      if (!p.pipeline_copy && (p.tensor_parallel || tp_rank == 0))
        list.push_back({buffer_->grads().data() + p.buffer_offset, p.n});
    if constexpr (has_sum_of_squares_many<Device, state_type>) {
      device.template sum_of_squares_many<state_type>(std::span<const SquaresTensor<state_type>>(list), accumulator);
    } else {
      for (const auto& t : list) device.template sum_of_squares<state_type>(t.data, t.n, accumulator);
    }
  }

  // The squared global gradient norm as a device scalar. Collective over dp, then ctx.model_parallel
  // (an expert buffer: over ctx.expert_dp, then ctx.expert_model_parallel; that is the norm of the
  // experts alone, to be added to the dense buffer's).
  template <class Context, class Comm>
  Tensor<double, Space> global_grad_square_sum(Context& ctx, Comm& dp) const {
    auto sum = Tensor<double, Space>::zeros(Shape{1});
    if (experts_) {
      accumulate_grad_squares(ctx.device, ctx.expert_tp.rank(), sum.data());
      if (dp.size() > 1) dp.all_reduce(sum.buffer(), ReduceOp::sum);
      if (ctx.expert_model_parallel.size() > 1) ctx.expert_model_parallel.all_reduce(sum.buffer(), ReduceOp::sum);
      return sum;
    }
    accumulate_grad_squares(ctx.device, ctx.tp.rank(), sum.data());
    if (dp.size() > 1) dp.all_reduce(sum.buffer(), ReduceOp::sum);
    if (ctx.model_parallel.size() > 1) ctx.model_parallel.all_reduce(sum.buffer(), ReduceOp::sum);
    return sum;
  }

  // grad *= *factor on the owned shards (a device scalar), or *= factor (a host number).
  template <class Device>
  void scale_gradients_by(Device& device, const double* factor) {
    const auto list = owned_shards();
    if constexpr (has_scale_by_many<Device, state_type>) {
      device.template scale_by_many<state_type>(std::span<const TensorRef<state_type>>(list), factor);
    } else {
      for (const auto& t : list) device.template scale_by<state_type>(t.data, t.n, factor);
    }
  }
  template <class Device>
  void scale_gradients(Device& device, double factor) {
    for (const auto& t : owned_shards()) device.template scale<state_type>(t.data, t.n, factor);
  }

  // Megatron's clipping on the owned shards: returns the norm before clipping as a device scalar.
  // Collective over dp and ctx.model_parallel.
  template <class Context, class Comm>
  Tensor<double, Space> clip_grad_norm_device(Context& ctx, Comm& dp, double max_norm) {
    auto [norm, factor] = clip_factor_device(ctx, dp, max_norm);
    if (max_norm > 0) scale_gradients_by(ctx.device, factor.data());
    return norm;
  }
  // The same norm and the clipping factor (1 when max_norm <= 0), both device scalars, without
  // touching the gradients: step(..., grad_scale = factor) then applies it.
  template <class Context, class Comm>
  std::pair<Tensor<double, Space>, Tensor<double, Space>> clip_factor_device(Context& ctx, Comm& dp, double max_norm) {
    return clip_factor_of(ctx.device, global_grad_square_sum(ctx, dp), max_norm);
  }

  // One AdamW step on the owned shards, then the all-gather of the parameters over `dp`.
  // skip_unless_finite as in AdamW::step (the update changes nothing when it points at NaN or inf;
  // the all-gather still runs, and moves the unchanged values); grad_scale as in AdamW::step.
  // With `overlap_gather` the parameter all-gather runs beside compute (GradBuffer::
  // all_gather_parameters): the next forward waits bucket by bucket through the buffer's
  // needed_hook, anything else reading the parameters after the buffer's wait_gathered(dp). A gather
  // still pending when step() is called is waited for first.
  template <class Device, class Comm>
  void step(Device& device, Comm& dp, double lr, const double* skip_unless_finite = nullptr, bool overlap_gather = false,
            double decoupled_lr = -1, const double* grad_scale = nullptr) {
    if (!std::isfinite(lr) || lr < 0)
      fail<ConfigError>("DistributedOptimizer::step: the learning rate must be finite and >= 0, got ", lr);
    if (!std::isfinite(decoupled_lr))
      fail<ConfigError>("DistributedOptimizer::step: the decoupled learning rate must be finite, got ", decoupled_lr);
    if (gather_pending_)
      fail<Error>("DistributedOptimizer::step: the last step's FP8 parameter gather has not run; call finish_step(ctx, dp) "
                  "after each step (after fp8_after_optimizer_step)");
    buffer_->wait_gathered(dp);
    ++steps_;
    using A = state_type;
    const AdamWStep<A> constants =
        config_.template step_constants<A>(lr, static_cast<std::int64_t>(steps_), skip_unless_finite, grad_scale);
    const AdamWStep<A> decoupled = decoupled_lr >= 0
        ? config_.template step_constants<A>(decoupled_lr, static_cast<std::int64_t>(steps_), skip_unless_finite, grad_scale)
        : constants;
    auto own_rate = [&](const Piece& p) { return decoupled_lr >= 0 && p.decoupled_lr; };
    A* grads = buffer_->grads().data();
    T* values = buffer_->params().data();
    if constexpr (has_adamw_step_many<Device, T, A>) {
      std::vector<AdamWTensor<T, A>> tensors, decoupled_tensors;
      tensors.reserve(pieces_.size());
      for (const Piece& p : pieces_)
        (own_rate(p) ? decoupled_tensors : tensors)
            .push_back(AdamWTensor<T, A>{main_.data() + p.state_offset, exp_avg_.data() + p.state_offset,
                                         exp_avg_sq_.data() + p.state_offset, grads + p.buffer_offset, values + p.buffer_offset,
                                         p.n, p.weight_decay && config_.weight_decay != 0});
      if (!tensors.empty()) device.template adamw_step_many<T>(std::span<const AdamWTensor<T, A>>(tensors), constants);
      if (!decoupled_tensors.empty())
        device.template adamw_step_many<T>(std::span<const AdamWTensor<T, A>>(decoupled_tensors), decoupled);
    } else {
      for (const Piece& p : pieces_) {
        AdamWStep<A> step = own_rate(p) ? decoupled : constants;
        if (!(p.weight_decay && config_.weight_decay != 0)) step.decay = A(0);
        device.template adamw_step<T>(main_.data() + p.state_offset, exp_avg_.data() + p.state_offset,
                                      exp_avg_sq_.data() + p.state_offset, grads + p.buffer_offset,
                                      values + p.buffer_offset, p.n, step);
      }
    }
    if (buffer_->has_codes()) {  // the gather waits for the FP8 weights' new scales (finish_step)
      gather_pending_ = true;
      for (auto* state : fp8_weights_) state->awaiting_gather = true;
      return;
    }
    buffer_->all_gather_parameters(dp, overlap_gather);
  }

  // The FP8 parameter gather (a buffer with code buckets, GradBufferOptions::fp8_param_gather), after
  // step() and after fp8_after_optimizer_step(ctx) has set the step's weight scales: each FP8 weight's
  // piece in this rank's shard is cast with its layer's weight scale (delayed: the scale the roll
  // derived, the piece's amax folded into the new history[0]; tensorwise: the amax of every piece,
  // reduced (max) over dp and tp, then the scale), and the parameter all-gather moves those codes
  // where it moved the values (the other buckets' values as before). Each layer then takes its W
  // from the gathered codes, cast once per step over all ranks. Runs after a skipped step too (the
  // scales changed). Collective over dp (and tp under tensorwise); nothing to do without code buckets
  // but the gather step() left.
  template <class Context, class Comm>
  void finish_step(Context& ctx, Comm& dp, bool overlap_gather = false) {
    if (!buffer_->has_codes()) return;
    if (!ctx.fp8)
      fail<ConfigError>("DistributedOptimizer::finish_step: the buffer holds FP8 weights' codes but the context has no FP8 "
                        "scaling (ctx.fp8)");
    const Fp8Options& options = ctx.fp8->options;
    if (options.recipe != Fp8RecipeKind::delayed && options.recipe != Fp8RecipeKind::tensorwise)
      fail<ConfigError>("the FP8 parameter gather casts each weight with one scale per tensor: it runs under --fp8-recipe "
                        "delayed or tensorwise, not ", options.recipe == Fp8RecipeKind::blockwise ? "blockwise" : "mxfp8");
    if (!options.cache_weights)
      fail<ConfigError>("the FP8 parameter gather keeps each weight's codes for the step: it needs the weight cache "
                        "(drop --fp8-weight-cache none)");
    buffer_->wait_gathered(dp);
    if constexpr (backend_has_fp8<typename Context::device_type>) {
      const Fp8Format format = options.format_of(Fp8Role::weight);
      const T* values = buffer_->params().data();
      if (options.recipe == Fp8RecipeKind::tensorwise) {
        // one amax per weight: its pieces' here (0 where this rank holds none), then the whole tensor's
        auto amaxes = Tensor<float, Space>::zeros(Shape{std::max<index_t>(1, static_cast<index_t>(fp8_weights_.size()))});
        for (const Piece& p : pieces_)
          if (p.fp8) ctx.device.template fp8_amax<T>(values + p.buffer_offset, p.n, amaxes.data() + p.fp8_index);
        if (dp.size() > 1) dp.all_reduce(amaxes.buffer(), ReduceOp::max);
        if (ctx.tp.size() > 1) ctx.tp.all_reduce(amaxes.buffer(), ReduceOp::max);
        const Fp8UpdateArgs now{1, Fp8AmaxAlgo::most_recent, 0, false};
        for (std::size_t i = 0; i < fp8_weights_.size(); ++i) {
          float* row = fp8_weights_[i]->row(Fp8Role::weight);
          ctx.device.template copy<float>(amaxes.data() + i, 1, row);
          ctx.device.fp8_update_scale(row, fp8_max(format), now);
        }
      }
      const bool fold = options.recipe == Fp8RecipeKind::delayed;
      for (const Piece& p : pieces_)
        if (p.fp8)
          ctx.device.template fp8_cast<T>(values + p.buffer_offset, p.n, format, p.fp8->scale(Fp8Role::weight), p.codes,
                                          fold ? p.fp8->amax(Fp8Role::weight) : nullptr);
    } else {
      fail<ConfigError>("the FP8 parameter gather needs a backend with the FP8 entry points (docs/DEVICE.md)");
    }
    buffer_->all_gather_parameters(dp, overlap_gather);
    for (auto* state : fp8_weights_) {
      state->drop_weight_cache();
      state->gathered_current = true;
      state->awaiting_gather = false;
      ++state->weight_casts;
    }
    gather_pending_ = false;
  }

  // Under the FP8 parameter gather: the FP8 weights' values all-gathered (GradBuffer::gather_values),
  // so every rank holds them whole, before a checkpoint or an export reads them. Collective over dp.
  template <class Comm>
  void gather_values(Comm& dp) {
    if (gather_pending_)
      fail<Error>("DistributedOptimizer::gather_values: call finish_step(ctx, dp) after the step first");
    buffer_->gather_values(dp);
  }
  bool fp8_param_gather() const { return buffer_->has_codes(); }
  // The FP8 weights' values are current only in this rank's shards (gather_values is due).
  bool values_stale() const { return gather_pending_ || buffer_->values_stale(); }

  template <class Visitor>
  void for_each_state(Visitor&& visit) {
    visit(std::string("distributed.main"), main_);
    visit(std::string("distributed.exp_avg"), exp_avg_);
    visit(std::string("distributed.exp_avg_sq"), exp_avg_sq_);
  }
  template <class Visitor>
  void for_each_sharded_state(Visitor&& visit) {
    for_each_state([&](const std::string& name, auto& tensor) { visit(name, tensor, tensor.shape(), ShardSpec{}); });
  }

  // The state for checkpoints that reshard: visit(piece, main, exp_avg, exp_avg_sq), one piece per
  // (parameter x owned shard) intersection, each this data-parallel rank's own.
  template <class Visitor>
  void for_each_state_piece(Visitor&& visit) {
    for (const Piece& p : pieces_) {
      const StatePiece piece{p.name, p.global_shape, p.shard, p.param_offset, p.n, p.state_offset, false, p.pipeline_copy, p.expert};
      visit(piece, main_, exp_avg_, exp_avg_sq_);
    }
  }

  int steps() const { return steps_; }
  void set_steps(int steps) {
    if (steps < 0) fail<ConfigError>("DistributedOptimizer::set_steps: the step count must be >= 0, got ", steps);
    steps_ = steps;
  }
  const AdamWConfig& config() const { return config_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  bool experts() const { return experts_; }  // the buffer holds expert weights
  // Bytes of optimizer state this rank allocated (main, exp_avg, exp_avg_sq of its shards).
  std::int64_t state_bytes() const {
    return static_cast<std::int64_t>(main_.bytes() + exp_avg_.bytes() + exp_avg_sq_.bytes());
  }

 private:
  std::vector<TensorRef<state_type>> owned_shards() const {
    std::vector<TensorRef<state_type>> list;
    for (std::size_t b = 0; b < buffer_->buckets().size(); ++b)
      list.push_back({buffer_->grads().data() + buffer_->shard_begin(b, dp_rank_), buffer_->shard_size(b)});
    return list;
  }

  Buffer* buffer_;
  int dp_rank_;
  AdamWConfig config_;
  std::vector<Piece> pieces_;
  std::vector<index_t> shard_offsets_;
  Tensor<state_type, Space> main_, exp_avg_, exp_avg_sq_;
  int steps_ = 0;
  bool experts_ = false;
  std::vector<Fp8State<Space>*> fp8_weights_;  // the code buckets' weights' states, in buffer order
  bool gather_pending_ = false;                // step() ran under the FP8 parameter gather; finish_step() has not
};

STRATA_NAMESPACE_END
