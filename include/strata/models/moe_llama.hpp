// strata/models/moe_llama.hpp: `models::MoeLlama<Policy, Dispatch>`, a Mixtral-style decoder: the
// Llama block (RMSNorm, RoPE, grouped-query attention, no biases, untied output layer) with a
// mixture-of-experts MLP in every layer: MoeMlp<Policy, swiglu, Dispatch> (TopKRouter, the token
// dispatcher over ep with expert tensor parallelism etp, SwiGLU experts run as grouped GEMMs,
// optional shared experts). Dispatch is strata::moe_alltoall (the default), strata::moe_allgather,
// or strata::moe_configured (models::Mixtral: the dispatcher ModelConfig::moe.token_dispatcher names).
//
// The MoE numbers come from ModelConfig::moe (num_experts > 0, topk, expert and shared-expert
// widths, router options); the model reaches its routers through DecoderModel (routers(),
// router_losses, reset_router_losses, update_expert_bias; the loss scale is set by forward and
// backward). Expert weights are Parameter::expert: the gradient reduction, the optimizers and the
// checkpoints treat them over ctx.expert_dp / ctx.expert_tp (docs/MOE.md).
#pragma once

#include <string_view>

#include "decoder.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

template <class Policy, class Dispatch = moe_alltoall>
class MoeLlama : public DecoderModel<Policy, RmsNorm, SelfAttention<Policy, rope, gqa>, MoeMlp<Policy, swiglu, Dispatch>,
                                     /*LearnedPositions=*/false, /*TiedOutput=*/false> {
  using Base = DecoderModel<Policy, RmsNorm, SelfAttention<Policy, rope, gqa>, MoeMlp<Policy, swiglu, Dispatch>, false, false>;

 public:
  // Recorded in checkpoints ("model.architecture"), for converters that read them without the type.
  static constexpr std::string_view architecture = "mixtral";
  MoeLlama(typename Base::Context& ctx, const ModelConfig& config) : Base(ctx, config, config.add_bias_linear) {}
  // One pipeline stage (pipeline::stage_layers_of).
  MoeLlama(typename Base::Context& ctx, const ModelConfig& config, pipeline::StageLayers stage)
      : Base(ctx, config, config.add_bias_linear, stage) {}
};

// The all-gather dispatcher's variant, as a one-parameter template (what the trainers' loops take).
template <class Policy>
using MoeLlamaAllGather = MoeLlama<Policy, moe_allgather>;

// The trainers' Mixtral: one compiled model whose dispatcher ModelConfig::moe.token_dispatcher
// picks at construction (--moe-token-dispatcher-type alltoall | allgather).
template <class Policy>
using Mixtral = MoeLlama<Policy, moe_configured>;

}  // namespace models
STRATA_NAMESPACE_END
