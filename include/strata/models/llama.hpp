// strata/models/llama.hpp: `models::Llama<Policy>`: RoPE, RMSNorm, SwiGLU, grouped-query attention,
// no biases, untied output layer.
#pragma once

#include <string_view>

#include "decoder.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

template <class Policy>
class Llama : public DecoderModel<Policy, RmsNorm, SelfAttention<Policy, rope, gqa>, Mlp<Policy, swiglu>,
                                  /*LearnedPositions=*/false, /*TiedOutput=*/false> {
  using Base = DecoderModel<Policy, RmsNorm, SelfAttention<Policy, rope, gqa>, Mlp<Policy, swiglu>, false, false>;

 public:
  // Recorded in checkpoints ("model.architecture"), for converters that read them without the type.
  static constexpr std::string_view architecture = "llama";
  Llama(typename Base::Context& ctx, const ModelConfig& config) : Base(ctx, config, /*linear_bias=*/false) {}
  // One pipeline stage (pipeline::stage_layers_of).
  Llama(typename Base::Context& ctx, const ModelConfig& config, pipeline::StageLayers stage)
      : Base(ctx, config, /*linear_bias=*/false, stage) {}
};

}  // namespace models
STRATA_NAMESPACE_END
