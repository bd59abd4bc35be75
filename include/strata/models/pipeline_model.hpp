// strata/models/pipeline_model.hpp: `PipelineModel<Model, Policy>`, this rank's share of a model
// cut into pipeline stages: its v chunks (v = virtual stages per rank; chunk c is virtual stage
// c pp + r of S = pp v, pipeline/stage.hpp), each a Model (Gpt or Llama) restricted to its layers.
//
//   train_step   runs one schedule (pipeline/executor.hpp) over the micro-batches, then sums the
//                gradients of the tied word embedding between its two copies (the first stage's
//                embedding and the last stage's output layer: Megatron's embedding group), so the
//                copies, which start equal, stay bit-identical after every optimizer step
//                (a + b and b + a are the same floating-point number).
//   evaluate     forward only, micro-batch by micro-batch through the stages (validation).
//   for_each_parameter visits every chunk's parameters (optimizer, gradient norm, checkpoint).
//
// With pp = 1 and v = 1 it is the whole model on one rank, and train_step is plain gradient
// accumulation over the micro-batches.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../pipeline.hpp"
#include "config.hpp"
#include "decoder.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

struct PipelineLayout {
  int virtual_stages = 1;        // model chunks per rank
  int first_stage_layers = -1;   // Megatron's --decoder-first-pipeline-num-layers (-1: even split)
  int last_stage_layers = -1;    // Megatron's --decoder-last-pipeline-num-layers
};

template <template <class> class Model, class Policy>
class PipelineModel {
 public:
  static constexpr std::string_view architecture = Model<Policy>::architecture;
  using Chunk = Model<Policy>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Boundary = typename Chunk::Boundary;

  PipelineModel(Context& ctx, const ModelConfig& config, PipelineLayout layout = {}) : layout_(layout) {
    const int pp = ctx.pp.size();
    for (int c = 0; c < layout.virtual_stages; ++c)
      chunks_.push_back(std::make_unique<Chunk>(
          ctx, config,
          pipeline::stage_layers_of(config.num_layers, pp, layout.virtual_stages, ctx.pp.rank(), c, layout.first_stage_layers,
                                    layout.last_stage_layers)));
    for (auto& chunk : chunks_) pointers_.push_back(chunk.get());
  }

  void init(Context& ctx, std::uint64_t seed) {
    for (auto& chunk : chunks_) chunk->init(ctx, seed);
  }
  // Activation recompute in every chunk (models/recompute.hpp; --recompute-num-layers counts the
  // layers of a chunk, as Megatron's does those of a pipeline stage).
  void set_recompute(const RecomputeConfig& recompute) {
    for (auto& chunk : chunks_) chunk->set_recompute(recompute);
  }
    void prepare(Context& ctx, index_t micro_batch, bool backward = true) const {
    for (const auto& chunk : chunks_) chunk->prepare(ctx, micro_batch, backward);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    for (auto& chunk : chunks_) chunk->for_each_parameter(visit);
  }

  // ---- mixture of experts: every chunk's routers (nothing for a dense model) ----
  static constexpr bool mixture_of_experts = Chunk::mixture_of_experts;
  // [aux, z] summed over this rank's chunks and their layers since reset_router_losses: this rank's
  // share (sum it over ctx.tp_cp_dp and ctx.pp for the whole batch's). A device tensor [2].
  Tensor<double, Space> router_losses(Context& ctx) const {
    auto sum = Tensor<double, Space>::zeros(Shape{2});
    if constexpr (mixture_of_experts)
      for (const auto& chunk : chunks_) {
        const auto mine = chunk->router_losses(ctx);
        ctx.device.template add<double>(sum.data(), mine.data(), 2, sum.data());
      }
    return sum;
  }
  void reset_router_losses(Context& ctx) {
    for (auto& chunk : chunks_) chunk->reset_router_losses(ctx);
  }
  // ---- multi-token prediction (DecoderModel::mtp_losses; the last stage holds the depths) ----
  // [2 D]: the depths' loss sums and tokens of this rank's last stage, zeros on the other stages
  // (sum it over ctx.pp as over dp); empty without depths.
  int mtp_depths() const { return config().mtp_num_layers; }
  Tensor<double, Space> mtp_losses(Context& ctx) const {
    if (mtp_depths() == 0) return {};
    auto sum = Tensor<double, Space>::zeros(Shape{2 * static_cast<index_t>(mtp_depths())});
    for (const auto& chunk : chunks_)
      if (chunk->mtp_depths() > 0) {
        const auto mine = chunk->mtp_losses(ctx);
        ctx.device.template add<double>(sum.data(), mine.data(), sum.numel(), sum.data());
      }
    return sum;
  }
  void reset_mtp_losses(Context& ctx) {
    for (auto& chunk : chunks_) chunk->reset_mtp_losses(ctx);
  }

  // Once per step after the backward: each router moves its expert bias (collective over ctx.tp_cp_dp).
  void update_expert_bias(Context& ctx) {
    for (auto& chunk : chunks_) chunk->update_expert_bias(ctx);
  }
  // The routers' expert bias of every chunk, for checkpoints.
  template <class Visitor>
  void for_each_persistent_tensor(Visitor&& visit) {
    for (auto& chunk : chunks_) chunk->for_each_persistent_tensor(visit);
  }

  int virtual_stages() const { return layout_.virtual_stages; }
  std::span<Chunk* const> chunks() const { return pointers_; }
  const ModelConfig& config() const { return chunks_.front()->config(); }

  // One training step's forwards and backwards under `kind` (pp from ctx, micro-batches from
  // batches), then the tied-embedding gradient sum. Collective over ctx.pp and ctx.tp. `ready` and
  // `needed`: the parameter hooks of pipeline::run_schedule.
  template <class Batch>
  pipeline::PipelineStepResult<Space> train_step(Context& ctx, pipeline::ScheduleKind kind, std::span<const Batch> batches,
                                                 std::span<const std::uint64_t> dropout_keys, double loss_scale,
                                                 const pipeline::ExecutorOptions& options = {},
                                                 const GradientReady<typename Chunk::T, Space>* ready = nullptr,
                                                 const ParameterNeeded<typename Chunk::T, Space>* needed = nullptr) {
    const pipeline::ScheduleShape shape{kind, ctx.pp.size(), static_cast<int>(batches.size()), layout_.virtual_stages};
    auto result = pipeline::run_schedule(ctx, shape, std::span<Chunk* const>(pointers_), batches, dropout_keys, loss_scale,
                                         options, ready, needed);
    sum_tied_embedding_gradients(ctx);
    if (ready != nullptr && *ready)  // the tied embedding's copies are final once summed
      for (auto& chunk : chunks_)
        if (auto* p = chunk->tied_embedding_copy()) (*ready)(*p);
    return result;
  }

  // The tied word embedding's gradient summed between its copies on the first and the last stage.
  void sum_tied_embedding_gradients(Context& ctx) {
    std::vector<Parameter<typename Chunk::T, Space>*> local;
    for (auto& chunk : chunks_)
      if (auto* p = chunk->tied_embedding_copy()) local.push_back(p);
    if (local.empty()) return;
    for (auto* p : local) settle_gradient(ctx.device, *p);
    using G = typename Parameter<typename Chunk::T, Space>::grad_type;
    if (local.size() == 2) {  // both ends on this rank (pp = 1 with several chunks)
      ctx.device.template add<G>(local[0]->grad.data(), local[1]->grad.data(), local[0]->grad.numel(), local[0]->grad.data());
      ctx.device.template copy<G>(local[0]->grad.data(), local[0]->grad.numel(), local[1]->grad.data());
      return;
    }
    const int peer = ctx.pp.rank() == 0 ? ctx.pp.size() - 1 : 0;
    auto other = Tensor<G, Space>::empty(local[0]->grad.shape());
    auto batch = batch_point_to_point(ctx.pp);
    ctx.pp.send(std::as_const(local[0]->grad).buffer(), peer);
    ctx.pp.recv(other.buffer(), peer);
    batch.end();
    ctx.device.template add<G>(local[0]->grad.data(), other.data(), other.numel(), local[0]->grad.data());
  }

  // Forward only: the loss sum of `batches` (on every rank), micro-batch by micro-batch through the
  // stages. Collective over ctx.pp and ctx.tp. Under context parallelism the sum and the token
  // count are this rank's part (the caller sums them over ctx.cp).
  template <class Batch>
  LossSum<Space> evaluate(Context& ctx, std::span<const Batch> batches, std::uint64_t dropout_key = 0,
                          ClassifierChunks classifier = {}) const {
    using T = typename Chunk::T;
    const int pp = ctx.pp.size(), rank = ctx.pp.rank(), last = pp * layout_.virtual_stages - 1;
    LossSum<Space> total;
    total.sum = Tensor<double, Space>::zeros(Shape{1});
    for (const Batch& b : batches) {
      // this rank's tokens (its two chunks under context parallelism), as the loss sum counts them
      const Tensor<float> mask = local_sequence(b.loss_mask, ctx.cp.size(), ctx.cp.rank(), "model evaluate");
      for (index_t i = 0; i < mask.numel(); ++i) total.tokens += mask[i];
      for (int c = 0; c < layout_.virtual_stages; ++c) {
        const Chunk& chunk = *chunks_[static_cast<std::size_t>(c)];
        const int vs = pipeline::virtual_stage(pp, rank, c);
        Boundary input;
        if (vs > 0) {
          input = Boundary(Tensor<T, Space>::empty(chunk.boundary_shape(ctx, b.tokens.size(0), b.tokens.size(1))));
          ctx.pp.recv(input.tensor.buffer(), pipeline::rank_of_stage(pp, vs - 1));
        }
        auto [out, loss] = chunk.evaluate_stage(ctx, vs > 0 ? &input : nullptr, b.tokens, b.labels, b.loss_mask, dropout_key, classifier);
        if (vs < last) ctx.pp.send(std::as_const(out.tensor).buffer(), pipeline::rank_of_stage(pp, vs + 1));
        else ctx.device.template add<double>(total.sum.data(), loss.sum.data(), 1, total.sum.data());
      }
    }
    if (pp > 1) ctx.pp.broadcast(total.sum.buffer(), pipeline::rank_of_stage(pp, last));
    return total;
  }

 private:
  PipelineLayout layout_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<Chunk*> pointers_;
};

}  // namespace models
STRATA_NAMESPACE_END
