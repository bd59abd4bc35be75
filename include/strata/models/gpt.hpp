// strata/models/gpt.hpp: `models::Gpt<Policy>`, GPT-2: learned absolute positions, LayerNorm,
// GELU (tanh), biases on every linear layer, output layer tied to the word embedding (its gradient
// is the sum of both uses). The run-time options of ModelConfig apply (--squared-relu,
// --apply-layernorm-1p, --kv-channels, --qk-layernorm, --add-qkv-bias): the MLP's activation is
// configured_activation<gelu>, GELU unless ModelConfig::activation names another.
#pragma once

#include <string_view>

#include "decoder.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

template <class Policy>
class Gpt : public DecoderModel<Policy, LayerNorm, SelfAttention<Policy, no_rope, mha>,
                                Mlp<Policy, configured_activation<gelu>>, /*LearnedPositions=*/true, /*TiedOutput=*/true> {
  using Base = DecoderModel<Policy, LayerNorm, SelfAttention<Policy, no_rope, mha>, Mlp<Policy, configured_activation<gelu>>,
                           true, true>;

 public:
  // Recorded in checkpoints ("model.architecture"), for converters that read them without the type.
  static constexpr std::string_view architecture = "gpt2";
  Gpt(typename Base::Context& ctx, const ModelConfig& config) : Base(ctx, mha_only(config), /*linear_bias=*/true) {}
  // One pipeline stage (pipeline::stage_layers_of).
  Gpt(typename Base::Context& ctx, const ModelConfig& config, pipeline::StageLayers stage)
      : Base(ctx, mha_only(config), /*linear_bias=*/true, stage) {}

 private:
  static const ModelConfig& mha_only(const ModelConfig& c) {
    if (c.num_query_groups != 0 && c.num_query_groups != c.num_attention_heads)
      fail<ConfigError>("Gpt: GPT-2 uses multi-head attention; num_query_groups=", c.num_query_groups,
                        " must be 0 or num_attention_heads=", c.num_attention_heads, " (use models::Llama for GQA)");
    return c;
  }
};

}  // namespace models
STRATA_NAMESPACE_END
