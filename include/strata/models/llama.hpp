// strata/models/llama.hpp: `models::Llama<Policy>`: RoPE, RMSNorm, SwiGLU, grouped-query attention,
// no biases (ModelConfig::add_bias_linear: every linear layer's, gpt-oss), untied output layer. The
// run-time options of ModelConfig make the Qwen2 (add_qkv_bias),
// Qwen3 (qk_layernorm, kv_channels) and Llama 3.1 (rope_scaling_factor) variants of the same
// compiled model; the MLP's activation is configured_activation<swiglu> (--quick-geglu at run time).
#pragma once

#include <string_view>

#include "decoder.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

template <class Policy>
class Llama : public DecoderModel<Policy, RmsNorm, SelfAttention<Policy, rope, gqa>,
                                  Mlp<Policy, configured_activation<swiglu>>, /*LearnedPositions=*/false, /*TiedOutput=*/false> {
  using Base = DecoderModel<Policy, RmsNorm, SelfAttention<Policy, rope, gqa>, Mlp<Policy, configured_activation<swiglu>>,
                           false, false>;

 public:
  // Recorded in checkpoints ("model.architecture"), for converters that read them without the type.
  static constexpr std::string_view architecture = "llama";
  Llama(typename Base::Context& ctx, const ModelConfig& config) : Base(ctx, config, config.add_bias_linear) {}
  // One pipeline stage (pipeline::stage_layers_of).
  Llama(typename Base::Context& ctx, const ModelConfig& config, pipeline::StageLayers stage)
      : Base(ctx, config, config.add_bias_linear, stage) {}
};

}  // namespace models
STRATA_NAMESPACE_END
