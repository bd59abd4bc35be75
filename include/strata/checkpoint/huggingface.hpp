// strata/checkpoint/huggingface.hpp: import and export of Hugging Face transformers checkpoints
// (config.json + safetensors) for strata's GPT-2 (GPT2LMHeadModel) and Llama (LlamaForCausalLM), and
// the Llama model with Qwen2's (Qwen2ForCausalLM: add_qkv_bias) or Qwen3's (Qwen3ForCausalLM:
// qk_layernorm, kv_channels) run-time options; the mixture-of-experts model models::Mixtral as
// MixtralForCausalLM, or with Qwen3's options as Qwen3MoeForCausalLM.
//
//   save_hf(dir, architecture, config, get_global, options)   export from whole (global) tensors
//   save_hf_from_model(ctx, dir, model, options)              export a model held with pp = 1
//   load_hf(ctx, dir, model)                                  import into any tp / pp layout
//   read_config(dir)                                          what config.json says, as a ModelConfig
//
// Names and layouts (strata -> transformers; L = layer index, d = head dim, G query groups, H heads):
//
//   GPT-2 (prefix "transformer.", or none in files saved from GPT2Model)
//     embedding.word.weight [Vp, h]        wte.weight [V, h]               rows >= V: vocabulary padding
//     embedding.position.weight [s, h]     wpe.weight [n_positions, h]
//     layers.L.norm1.{weight,bias}         h.L.ln_1.{weight,bias}
//     layers.L.attention.qkv.weight        h.L.attn.c_attn.weight [h, 3h]  Conv1D: stored [in, out]
//     layers.L.attention.qkv.bias          h.L.attn.c_attn.bias [3h]
//     layers.L.attention.proj.{weight,bias} h.L.attn.c_proj                Conv1D
//     layers.L.norm2.{weight,bias}         h.L.ln_2
//     layers.L.mlp.fc1.{weight,bias}       h.L.mlp.c_fc                    Conv1D
//     layers.L.mlp.fc2.{weight,bias}       h.L.mlp.c_proj                  Conv1D
//     final_norm.{weight,bias}             ln_f
//     (output layer tied to embedding.word; attn.bias and attn.masked_bias in a file are ignored, and so is an
//     lm_head.weight equal to wte; one that differs, an untied model, is refused)
//   Llama (no biases; output untied: a config.json with tie_word_embeddings true is refused, since strata's
//     Llama would train and export it untied; files without lm_head.weight start the output from embed_tokens)
//     embedding.word.weight [Vp, h]        model.embed_tokens.weight [V, h]
//     layers.L.norm1.weight                model.layers.L.input_layernorm.weight
//     layers.L.attention.qkv.weight        model.layers.L.self_attn.{q,k,v}_proj.weight  [H d, h], [G d, h], [G d, h]
//     layers.L.attention.proj.weight       model.layers.L.self_attn.o_proj.weight
//     layers.L.norm2.weight                model.layers.L.post_attention_layernorm.weight
//     layers.L.mlp.fc1.weight [2f, h]      model.layers.L.mlp.{gate,up}_proj.weight     [gate; up] stacked
//     layers.L.mlp.fc2.weight              model.layers.L.mlp.down_proj.weight
//     final_norm.weight                    model.norm.weight
//     output.weight [Vp, h]                lm_head.weight [V, h]
//   Qwen2 (model_type "qwen2"): Llama's names, and biases on q, k, v only (ModelConfig::add_qkv_bias)
//     layers.L.attention.qkv.bias          model.layers.L.self_attn.{q,k,v}_proj.bias    [H d], [G d], [G d]
//   Qwen3 (model_type "qwen3"): Llama's names, a head_dim of its own (ModelConfig::kv_channels), and
//     RMSNorm over each head of q and k before RoPE (ModelConfig::qk_layernorm)
//     layers.L.attention.q_norm.weight [d] model.layers.L.self_attn.q_norm.weight
//     layers.L.attention.k_norm.weight [d] model.layers.L.self_attn.k_norm.weight
//   In the Llama family d is head_dim (kv_channels), so q_proj is [H d, h] and o_proj [h, H d]. A Llama
//   config's rope_scaling of rope_type "llama3" maps to ModelConfig's rope_scaling_* (Llama 3.1), and of rope_type
//   "yarn" (any of the Llama family; gpt-oss, Qwen3 long context) to its yarn_* fields (hf_detail::read_yarn).
//   Mixtral (model_type "mixtral", models::Mixtral / MoeLlama): Llama's names for the attention and
//   norms; every layer's MLP a mixture of E experts of width w (config.json's intermediate_size is
//   the expert width; ModelConfig's expert_ffn()), no shared experts
//     layers.L.mlp.router.weight [E, h]    model.layers.L.block_sparse_moe.gate.weight
//     layers.L.mlp.experts.e.fc1.weight    model.layers.L.block_sparse_moe.experts.e.{w1,w3}.weight  [gate; up], [w, h] each
//     layers.L.mlp.experts.e.fc2.weight    model.layers.L.block_sparse_moe.experts.e.w2.weight       [h, w]
//   transformers' Mixtral routes as strata's default router: softmax over all E in fp32, top-k, the
//   k weights divided by their sum, which is the softmax over the k chosen logits. Router settings
//   it cannot express (sigmoid scores, pre-softmax weights, a scaling factor, groups, expert bias),
//   shared experts and dense layers (--moe-layer-freq) are refused. Expert weights live on the
//   ep rank that holds the expert, split over etp (rows of fc1's blocks, columns of fc2) as the dense
//   MLP is over tp; import reads each rank's own experts' shards, export gathers them.
//   Qwen3-MoE (model_type "qwen3_moe"): the MoE model with Qwen3's qk norms and head_dim; the experts
//   are moe_intermediate_size wide, the dense layers (mlp_only_layers, or those decoder_sparse_step
//   skips: ModelConfig::moe.layers 0) an MLP of intermediate_size with Llama's names
//     layers.L.mlp.router.weight [E, h]    model.layers.L.mlp.gate.weight
//     layers.L.mlp.experts.e.fc1.weight    model.layers.L.mlp.experts.e.{gate,up}_proj.weight
//     layers.L.mlp.experts.e.fc2.weight    model.layers.L.mlp.experts.e.down_proj.weight
//   Its router takes the top-k of the softmax over all experts, renormalized when norm_topk_prob
//   (strata's softmax over the k chosen logits), else as they are (MoeRouting::pre_softmax).
//   Qwen2-MoE (model_type "qwen2_moe"): Qwen3-MoE's experts, router and dense layers with Qwen2's
//   attention (q, k, v biases, heads of hidden / heads) and one shared expert per MoE layer behind a
//   sigmoid gate (MoeModelConfig::shared_expert_gate)
//     layers.L.mlp.shared_experts.fc1/fc2  model.layers.L.mlp.shared_expert.{gate,up,down}_proj.weight
//     layers.L.mlp.shared_experts.gate_weight [1, h]  model.layers.L.mlp.shared_expert_gate.weight
//   gpt-oss (model_type "gpt_oss"): the MoE model with every linear bias (ModelConfig::add_bias_linear),
//   learned sinks, quick GeGLU experts clamped at swiglu_limit, windows by layer_types; Llama's names
//   for the attention (with q, k, v, o biases) and norms, and
//     layers.L.attention.softmax_offset    model.layers.L.self_attn.sinks  [H]
//     layers.L.mlp.router.{weight,bias}    model.layers.L.mlp.router.{weight,bias}
//     layers.L.mlp.experts.e.fc1.weight    slice e of model.layers.L.mlp.experts.gate_up_proj [E, h, 2w]
//                                          ([in, out], gate and up interleaved: TensorMapping::expert)
//     layers.L.mlp.experts.e.fc1.bias      slice e of ...gate_up_proj_bias [E, 2w] (interleaved)
//     layers.L.mlp.experts.e.fc2.weight    slice e of ...down_proj [E, w, h] ([in, out])
//     layers.L.mlp.experts.e.fc2.bias      slice e of ...down_proj_bias [E, h]
//   DeepSeek-V3 (model_type "deepseek_v3"): the MoE model with multi-latent attention
//   (ModelConfig::multi_latent_attention, layers/latent_attention.hpp); Qwen3-MoE's names for the
//   experts and the dense first_k_dense_replace layers, and
//     layers.L.attention.q_down.weight     model.layers.L.self_attn.q_a_proj.weight  [q_lora_rank, h]
//     layers.L.attention.q_latent_norm     model.layers.L.self_attn.q_a_layernorm
//     layers.L.attention.q_up.weight       model.layers.L.self_attn.q_b_proj.weight  [H (dn + dr), q_lora_rank]
//     layers.L.attention.q.weight          model.layers.L.self_attn.q_proj.weight    (q_lora_rank null)
//     layers.L.attention.kv_down.weight    model.layers.L.self_attn.kv_a_proj_with_mqa.weight  [kv_lora_rank + dr, h]
//     layers.L.attention.kv_latent_norm    model.layers.L.self_attn.kv_a_layernorm
//     layers.L.attention.kv_up.weight      model.layers.L.self_attn.kv_b_proj.weight [H (dn + dv), kv_lora_rank]
//     layers.L.attention.proj.weight       model.layers.L.self_attn.o_proj.weight
//     layers.L.mlp.router.expert_bias      model.layers.L.mlp.gate.e_score_correction_bias  (a persistent tensor)
//     layers.L.mlp.shared_experts.fc1/fc2  model.layers.L.mlp.shared_experts.{gate,up,down}_proj
//   in the same row orders (per head [nope | rope] and [k_nope | v]). Its router takes sigmoid
//   scores, chooses with the bias among the top topk_group of n_group groups (a group scored by its
//   top 2: strata's top topk / group_topk, so topk must be 2 x topk_group), divides the k weights by
//   their sum (norm_topk_prob, strata's sigmoid router with k > 1) and scales them by
//   routed_scaling_factor; rope_interleave is ModelConfig::rotary_interleaved (transformers'
//   de-interleaving permutes q and k alike, which leaves the scores those of interleaved pairs).
//
// strata's qkv rows are group-major (layers/attention.hpp): for each query group g, [the H/G query
// heads of g | k_g | v_g], d rows each. transformers keeps [all q heads | all k | all v] (GPT-2's
// c_attn columns) or three tensors (Llama), and its query head h uses key/value head h / (H/G)
// (repeat_kv), which is strata's grouping; the rows are permuted accordingly, the same for the bias.
// RoPE needs no permutation: strata's (backend/cpu/rope.hpp) and transformers' Llama
// (rotate_half, cos/sin of cat(freqs, freqs)) both rotate the pair (x[i], x[i + d/2]) by
// position * base^(-2i/d). GELU is the tanh one on both sides ("gelu_new"), RMSNorm and LayerNorm
// are the usual ones, attention scales by 1/sqrt(d).
//
// Vocabulary padding: export writes the real vocab_size rows; import fills the padded rows with zeros.
//
// config.json is written with what transformers needs, and read back on import: each field that
// shapes the weights or the math is checked against the model's ModelConfig (a mismatch names the
// field and both values), and settings strata cannot express (another activation, RoPE scaling other than Llama 3.1's,
// attention biases in Llama, GPT-2's inverse-layer-index scaling) are refused. Llama's
// max_position_embeddings is not checked (RoPE has no table): it is written as SaveOptions says (an
// imported config's own value, carry_settings), else as ModelConfig::positions(); bos_token_id and
// eos_token_id likewise come from SaveOptions (an imported config's, or the tokenizer's).
//
// Import reads, on every rank, only the part of each file its shards need (one positioned read per
// source tensor, from the first to the last element it uses), converts to the parameter's element
// type, and copies into the parameter (to the device for device parameters). No communication.
//
// This header knows the names of models/ (and includes models/config.hpp, which needs only core
// and shard) while living in checkpoint/: the mapping is a table of names and index arithmetic, and
// the model types are only forward-declared, so no layer header is included.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/file.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"
#include "../models/config.hpp"
#include "../shard/shard_spec.hpp"
#include "durable_file.hpp"
#include "json.hpp"
#include "safetensors.hpp"

STRATA_NAMESPACE_BEGIN

namespace models {
template <class Policy>
class Gpt;
template <class Policy>
class Llama;
template <class Policy, class Dispatch>
class MoeLlama;
template <template <class> class Model, class Policy>
class PipelineModel;
}  // namespace models

namespace hf {

// qwen2 and qwen3 are models::Llama with ModelConfig's add_qkv_bias, or qk_layernorm and kv_channels:
// the compiled model is Llama's, the Hugging Face class follows the configuration (hf_architecture).
// mixtral is models::MoeLlama (models::Mixtral): the Llama block with a mixture of experts; with
// qk_layernorm it is qwen3_moe.
enum class Architecture : std::uint8_t { gpt2, llama, qwen2, qwen3, mixtral, qwen3_moe, mistral, deepseek_v3, gpt_oss, qwen2_moe };

constexpr std::string_view architecture_name(Architecture a) {
  switch (a) {
    case Architecture::gpt2: return "gpt2";
    case Architecture::llama: return "llama";
    case Architecture::qwen2: return "qwen2";
    case Architecture::qwen3: return "qwen3";
    case Architecture::mixtral: return "mixtral";
    case Architecture::qwen3_moe: return "qwen3_moe";
    case Architecture::mistral: return "mistral";
    case Architecture::deepseek_v3: return "deepseek_v3";
    case Architecture::gpt_oss: return "gpt_oss";
    case Architecture::qwen2_moe: return "qwen2_moe";
  }
  return "?";
}
constexpr std::string_view architecture_class(Architecture a) {
  switch (a) {
    case Architecture::gpt2: return "GPT2LMHeadModel";
    case Architecture::llama: return "LlamaForCausalLM";
    case Architecture::qwen2: return "Qwen2ForCausalLM";
    case Architecture::qwen3: return "Qwen3ForCausalLM";
    case Architecture::mixtral: return "MixtralForCausalLM";
    case Architecture::qwen3_moe: return "Qwen3MoeForCausalLM";
    case Architecture::mistral: return "MistralForCausalLM";
    case Architecture::deepseek_v3: return "DeepseekV3ForCausalLM";
    case Architecture::gpt_oss: return "GptOssForCausalLM";
    case Architecture::qwen2_moe: return "Qwen2MoeForCausalLM";
  }
  return "?";
}
inline std::optional<Architecture> parse_architecture(std::string_view name) {
  for (Architecture a : {Architecture::gpt2, Architecture::llama, Architecture::qwen2, Architecture::qwen3, Architecture::mixtral,
                         Architecture::qwen3_moe, Architecture::mistral, Architecture::deepseek_v3, Architecture::gpt_oss,
                         Architecture::qwen2_moe})
    if (name == architecture_name(a)) return a;
  return std::nullopt;
}
// Whether the architecture has Llama's attention and norms (llama, qwen2, qwen3, mixtral, qwen3_moe, mistral).
constexpr bool llama_family(Architecture a) { return a != Architecture::gpt2; }
// Whether the architecture is the mixture-of-experts model (models::MoeLlama).
constexpr bool moe_family(Architecture a) {
  return a == Architecture::mixtral || a == Architecture::qwen3_moe || a == Architecture::deepseek_v3 || a == Architecture::gpt_oss ||
         a == Architecture::qwen2_moe;
}

// gpt-oss's quick GeGLU: the sigmoid's slope (transformers' swiglu_alpha) and the offset on the up half.
inline constexpr double kGptOssGluAlpha = 1.702, kGptOssGluOffset = 1.0;

// DeepSeek-V3's group score is the sum of a group's top 2 choice scores (strata's: its top k / group_topk).
inline constexpr int kDeepseekGroupTop = 2;

// The Hugging Face architecture of a strata model type's architecture under a configuration: the
// Llama model with add_qkv_bias is Qwen2, with qk_layernorm Qwen3. Options no Hugging Face class of
// the family has are a ConfigError naming them.
inline Architecture hf_architecture(Architecture a, const models::ModelConfig& c) {
  auto refuse = [&](const char* option, std::string_view why) {
    fail<ConfigError>("hf: a strata ", architecture_name(a), " with ", option, " has no Hugging Face class: ", why);
  };
  if (a != Architecture::gpt2 && (c.add_bias_linear || a == Architecture::gpt_oss)) {  // GptOssForCausalLM
    const MoeRouting& r = c.moe.routing;
    if (!c.add_bias_linear)
      refuse("no linear biases (--disable-bias-linear)", "gpt-oss's attention, router and experts have biases");
    if (!c.moe.enabled() || !moe_family(a))
      refuse("linear biases without experts", "GptOssForCausalLM, the class with them, has experts in every layer "
             "(models::Mixtral); a dense Llama with biases has no Hugging Face class");
    if (!c.moe.layers.empty() && std::find(c.moe.layers.begin(), c.moe.layers.end(), 0) != c.moe.layers.end())
      refuse("dense layers (--moe-layer-freq)", "every gpt-oss layer is a mixture of experts");
    if (c.add_qkv_bias || c.qk_layernorm) refuse("add_qkv_bias or qk_layernorm", "gpt-oss has neither");
    if (c.softmax_type != SoftmaxType::learnable)
      refuse("no learnable attention sinks", "gpt-oss's attention has a learned sink per head (--softmax-type learnable)");
    if (c.activation != MlpActivation::quick_geglu || c.glu_linear_offset != kGptOssGluOffset || !(c.activation_clamp > 0))
      refuse("another expert activation", "gpt-oss's experts run quick GeGLU with an offset of 1 and a clamp (--quick-geglu "
             "--glu-linear-offset 1 --activation-func-clamp-value, swiglu_limit)");
    if (c.rotary_percent != 1.0 || c.rotary_interleaved || c.rope_scaling_factor > 0)
      refuse("partial, interleaved or Llama 3.1-scaled RoPE", "gpt-oss turns the halves of the whole head, with YaRN or without");
    if (c.apply_layernorm_1p) refuse("apply_layernorm_1p", "gpt-oss stores the norm weight itself");
    if (r.score != MoeScore::softmax || r.pre_softmax || r.scaling_factor != 1.0 || r.num_groups > 0 || c.moe.expert_bias ||
        c.moe.shared_expert_ffn_hidden_size > 0)
      refuse("another router (sigmoid, pre-softmax, scaled, grouped, an expert bias or shared experts)",
             "gpt-oss's weights are the softmax over the top-k logits of a linear router with a bias, and it has no shared experts");
    return Architecture::gpt_oss;
  }
  if (c.multi_latent_attention || a == Architecture::deepseek_v3) {  // DeepseekV3ForCausalLM
    const MoeRouting& r = c.moe.routing;
    const char* why_moe = "DeepseekV3ForCausalLM is multi-latent attention with experts (models::Mixtral)";
    if (!c.multi_latent_attention) refuse("no multi-latent attention", why_moe);
    if (!c.qk_layernorm)
      refuse("multi-latent attention without its latent norms", "DeepSeek-V3 RMS-normalizes both latents (--qk-layernorm)");
    if (!c.moe.enabled() || !moe_family(a)) refuse("multi-latent attention without experts", why_moe);
    if (c.rotary_percent != 1.0) refuse("rotary_percent < 1", "DeepSeek-V3 turns the whole qk_rope_head_dim");
    if (c.apply_layernorm_1p) refuse("apply_layernorm_1p", "DeepSeek-V3 stores the norm weight itself");
    if (c.activation == MlpActivation::squared_relu || c.activation == MlpActivation::quick_geglu || c.activation_clamp != 0 ||
        c.glu_linear_offset != 0)
      refuse("another MLP activation", "DeepSeek-V3 uses SwiGLU");
    if (r.score != MoeScore::sigmoid) refuse("softmax routing", "DeepSeek-V3's router takes sigmoid scores");
    if (!c.moe.expert_bias)
      refuse("no expert bias", "DeepSeek-V3's router adds e_score_correction_bias to the choice (--moe-router-enable-expert-bias)");
    if (r.num_groups > 1 && (r.group_topk <= 0 || c.moe.topk != kDeepseekGroupTop * r.group_topk))
      refuse("group-limited routing with topk / group_topk other than 2",
             "DeepSeek-V3 scores a group by the sum of its top 2 choices, strata by its top topk / group_topk");
    if (c.moe.shared_expert_ffn_hidden_size <= 0 || c.moe.shared_expert_ffn_hidden_size % c.expert_ffn() != 0)
      refuse("no shared experts, or shared experts of a width other than a multiple of the experts'",
             "DeepSeek-V3 has n_shared_experts experts of moe_intermediate_size each (--moe-shared-expert-intermediate-size)");
    for (int l = 1; l < c.num_layers; ++l)
      if (c.moe_layer(l - 1) && !c.moe_layer(l))
        refuse("a dense layer after a MoE layer (--moe-layer-freq)", "DeepSeek-V3's dense layers are its first_k_dense_replace first ones");
    return Architecture::deepseek_v3;
  }
  if (c.rotary_percent != 1.0) refuse("rotary_percent < 1", "transformers' Llama and Qwen turn the whole head");
  if (c.rotary_interleaved) refuse("rotary_interleaved", "transformers' Llama and Qwen rotate halves (rotate_half)");
  if (c.apply_layernorm_1p) refuse("apply_layernorm_1p", "GPT-2, Llama and Qwen store the norm weight itself");
  if (c.activation == MlpActivation::squared_relu || c.activation == MlpActivation::quick_geglu || c.activation_clamp != 0 ||
      c.glu_linear_offset != 0)
    refuse("another MLP activation", "the mapped classes use GELU (GPT-2) or SwiGLU (Llama, Qwen)");
  if (c.window_size >= 0 && !c.window_layers.empty())
    refuse("a sliding window on some layers (--window-attn-skip-freq)",
           "Mistral's and Mixtral's sliding_window applies to every layer");
  if (moe_family(a) || c.moe.enabled()) {
    if (!moe_family(a) || !c.moe.enabled())
      refuse(c.moe.enabled() ? "experts (num_experts > 0)" : "no experts (num_experts = 0)",
             "Mixtral and Qwen3-MoE are the MoE model (models::Mixtral), Llama and Qwen the dense one");
    const MoeRouting& r = c.moe.routing;
    const bool qwen2 = c.add_qkv_bias;  // Qwen2-MoE
    const bool qwen = c.qk_layernorm || qwen2;  // Qwen3-MoE or Qwen2-MoE; else Mixtral
    if (qwen2 && c.qk_layernorm) refuse("both add_qkv_bias and qk_layernorm", "Qwen2-MoE has the first, Qwen3-MoE the second");
    if (qwen2 && (c.moe.shared_expert_ffn_hidden_size == 0 || !c.moe.shared_expert_gate))
      refuse("no gated shared expert", "Qwen2-MoE runs one shared expert behind a sigmoid gate on every MoE layer "
             "(--moe-shared-expert-intermediate-size and --moe-shared-expert-gate)");
    if (!qwen2 && c.moe.shared_expert_ffn_hidden_size > 0)
      refuse("shared experts", "Mixtral and Qwen3-MoE route every token to experts alone (Qwen2-MoE, with --add-qkv-bias, "
             "has a gated shared expert)");
    if (!qwen && !c.moe.layers.empty())
      refuse("dense layers (--moe-layer-freq)", "every Mixtral layer is a mixture of experts (Qwen3-MoE, with --qk-layernorm, has dense ones)");
    if (r.score != MoeScore::softmax) refuse("sigmoid routing", "Mixtral's and Qwen3-MoE's routers take a softmax");
    if (!qwen && r.pre_softmax)
      refuse("pre-softmax routing", "Mixtral's weights are the softmax over the top-k logits (Qwen3-MoE's norm_topk_prob false is pre-softmax)");
    if (r.scaling_factor != 1.0) refuse("a routing scaling factor", "Mixtral's and Qwen3-MoE's weights are the probabilities");
    if (r.num_groups > 0) refuse("group-limited routing", "Mixtral and Qwen3-MoE choose among all experts");
    if (c.moe.expert_bias) refuse("an expert bias", "Mixtral's and Qwen3-MoE's routers have no bias");
    if (qwen && c.window_size >= 0)
      refuse("a sliding window", "Qwen3-MoE's and Qwen2-MoE's use_sliding_window is not mapped (Mixtral's is)");
    return qwen2 ? Architecture::qwen2_moe : qwen ? Architecture::qwen3_moe : Architecture::mixtral;
  }
  if (a == Architecture::gpt2) {
    if (c.add_qkv_bias || c.qk_layernorm || c.kv_channels != 0 || c.window_size >= 0)
      refuse("add_qkv_bias, qk_layernorm, kv_channels or a sliding window", "GPT-2 has all its biases, heads of hidden / heads "
             "and full attention");
    return a;
  }
  if (c.add_qkv_bias && c.qk_layernorm) refuse("both add_qkv_bias and qk_layernorm", "Qwen2 has the first, Qwen3 the second");
  if (c.window_size >= 0 && (c.add_qkv_bias || c.qk_layernorm))
    refuse("a sliding window", "Qwen2's and Qwen3's use_sliding_window (with max_window_layers) is not mapped; Mistral is "
           "Llama with a window on every layer");
  if (c.add_qkv_bias) return Architecture::qwen2;
  if (c.qk_layernorm) return Architecture::qwen3;
  // Mistral is Llama with a sliding window on every layer; without one the two are the same model.
  if (c.window_size >= 0 || a == Architecture::mistral) return Architecture::mistral;
  return Architecture::llama;
}

template <class>
inline constexpr bool always_false_v = false;

// The architecture of a strata model type: Gpt -> gpt2, Llama -> llama (and a PipelineModel of either).
template <class Model>
struct architecture_of {
  static_assert(always_false_v<Model>,
                "hf::architecture_of: this model type has no Hugging Face architecture; use models::Gpt or "
                "models::Llama, or pass the architecture to load_hf / save_hf yourself.");
};
template <class Policy>
struct architecture_of<models::Gpt<Policy>> {
  static constexpr Architecture value = Architecture::gpt2;
  using element = typename Policy::element;
};
template <class Policy>
struct architecture_of<models::Llama<Policy>> {
  static constexpr Architecture value = Architecture::llama;
  using element = typename Policy::element;
};
template <class Policy, class Dispatch>
struct architecture_of<models::MoeLlama<Policy, Dispatch>> {  // qwen3_moe with qk_layernorm (hf_architecture)
  static constexpr Architecture value = Architecture::mixtral;
  using element = typename Policy::element;
};
template <template <class> class Model, class Policy>
struct architecture_of<models::PipelineModel<Model, Policy>> : architecture_of<Model<Policy>> {};

// One strata parameter and the Hugging Face tensors ("pieces") it is made of.
struct TensorMapping {
  enum class Rows : std::uint8_t {
    same,          // row r is row r of the one piece
    padded_vocab,  // same, and rows >= real_rows are vocabulary padding (in no piece)
    qkv,           // group-major qkv rows from [q | k | v] (one piece, GPT-2) or q, k, v (three pieces, Llama)
    gate_up,       // [gate; up] rows from two pieces
    gate_up_interleaved,  // [gate; up] rows from one piece whose even rows are gate's, odd rows up's (gpt-oss)
  };
  struct Source {
    int piece = -1;  // -1: padding
    index_t index = 0;
  };

  std::string strata_name;
  Shape strata_shape;  // global; the vocabulary padded
  std::vector<std::string> pieces;
  std::vector<std::vector<std::int64_t>> piece_shapes;
  bool conv1d = false;  // a matrix the piece stores transposed ([in, out], GPT-2's Conv1D)
  Rows rows = Rows::same;
  index_t real_rows = 0;                        // padded_vocab
  index_t heads = 0, groups = 0, head_dim = 0;  // qkv
  index_t ffn = 0;                              // gate_up
  // >= 0: the one piece stacks every expert ([experts, ...], gpt-oss) and this tensor is expert
  // `expert`'s slice of it; with conv1d the slice is stored [in, out].
  index_t expert = -1;

  // Where row r of the strata tensor lives: {piece, row of the piece}.
  Source row_source(index_t r) const {
    switch (rows) {
      case Rows::same: return {0, r};
      case Rows::padded_vocab: return r < real_rows ? Source{0, r} : Source{};
      case Rows::gate_up: return r < ffn ? Source{0, r} : Source{1, r - ffn};
      case Rows::gate_up_interleaved: return r < ffn ? Source{0, 2 * r} : Source{0, 2 * (r - ffn) + 1};
      case Rows::qkv: {
        const index_t per_group = heads / groups, block = (per_group + 2) * head_dim;  // rows of one group
        const index_t group = r / block, slot = (r % block) / head_dim, within = r % head_dim;
        const index_t q_rows = heads * head_dim, kv_rows = groups * head_dim;
        const bool fused = pieces.size() == 1;
        if (slot < per_group) return {0, (group * per_group + slot) * head_dim + within};  // query head g*H/G + slot
        if (slot == per_group) return fused ? Source{0, q_rows + group * head_dim + within} : Source{1, group * head_dim + within};
        return fused ? Source{0, q_rows + kv_rows + group * head_dim + within} : Source{2, group * head_dim + within};
      }
    }
    return {};
  }

  // Where element `global` (row-major) of the strata tensor lives: {piece, linear index in the piece}.
  Source element_source(index_t global) const {
    if (expert >= 0) {  // a slice of the stacked experts' piece
      const auto& ps = piece_shapes[0];
      std::int64_t per_expert = 1;
      for (std::size_t k = 1; k < ps.size(); ++k) per_expert *= ps[k];
      const index_t cols = strata_shape.rank() == 2 ? strata_shape[1] : 1;
      const index_t row = row_source(strata_shape.rank() == 2 ? global / cols : global).index, col = global % cols;
      const index_t within = strata_shape.rank() == 1 ? row : conv1d ? col * ps[2] + row : row * cols + col;
      return {0, expert * per_expert + within};
    }
    if (strata_shape.rank() == 1) return row_source(global);
    const index_t cols = strata_shape[1];
    Source s = row_source(global / cols);
    if (s.piece < 0) return s;
    const index_t col = global % cols;
    if (conv1d) return {s.piece, col * piece_shapes[static_cast<std::size_t>(s.piece)][1] + s.index};
    return {s.piece, s.index * cols + col};
  }
};

struct MappingOptions {
  index_t padded_vocab = 0;               // the strata vocabulary rows (0: config.padded_vocab(1))
  std::string gpt2_prefix = "transformer.";  // "" for files saved from GPT2Model
  bool llama_tied_output = false;         // output.weight from model.embed_tokens.weight
};

// The table of every parameter of the whole model, in the model's order (embedding, layers, head).
inline std::vector<TensorMapping> tensor_mappings(Architecture architecture, const models::ModelConfig& c,
                                                  const MappingOptions& options = {}) {
  const index_t h = c.hidden_size, vocab = c.vocab_size, ffn = c.ffn();
  const index_t padded = options.padded_vocab != 0 ? options.padded_vocab : c.padded_vocab(1);
  if (padded < vocab)
    fail<ConfigError>("hf::tensor_mappings: a padded vocabulary of ", padded, " rows is smaller than vocab_size=", vocab);
  architecture = hf_architecture(architecture, c);
  if (c.softmax_type != SoftmaxType::vanilla && architecture != Architecture::gpt_oss)
    fail<ConfigError>("hf::tensor_mappings: attention sinks (--softmax-type ",
                      c.softmax_type == SoftmaxType::learnable ? "learnable" : "off-by-one", ") have no place in ",
                      architecture_class(architecture), " (GptOssForCausalLM has them, with linear biases and experts); "
                      "exchange this model through strata's own checkpoints");
  if (c.num_attention_heads <= 0 || (c.kv_channels == 0 && h % c.num_attention_heads != 0))
    fail<ConfigError>("hf::tensor_mappings: num_attention_heads=", c.num_attention_heads, " does not divide hidden_size=", h);
  const index_t heads = c.num_attention_heads, d = c.head_dim();
  const index_t groups = architecture == Architecture::gpt2 || c.num_query_groups == 0 ? heads : c.num_query_groups;
  if (heads % groups != 0)
    fail<ConfigError>("hf::tensor_mappings: num_query_groups=", groups, " does not divide num_attention_heads=", heads);
  const index_t qkv_rows = groups * (heads / groups + 2) * d;

  std::vector<TensorMapping> out;
  auto add = [&](std::string strata, Shape shape, std::vector<std::string> pieces, std::vector<std::vector<std::int64_t>> shapes,
                 TensorMapping::Rows rows = TensorMapping::Rows::same, bool conv1d = false) -> TensorMapping& {
    TensorMapping m;
    m.strata_name = std::move(strata);
    m.strata_shape = shape;
    m.pieces = std::move(pieces);
    m.piece_shapes = std::move(shapes);
    m.rows = rows;
    m.conv1d = conv1d;
    m.real_rows = vocab;
    m.heads = heads;
    m.groups = groups;
    m.head_dim = d;
    m.ffn = ffn;
    out.push_back(std::move(m));
    return out.back();
  };
  using R = TensorMapping::Rows;
  if (architecture == Architecture::gpt2) {
    const std::string p = options.gpt2_prefix;
    add("embedding.word.weight", Shape{padded, h}, {p + "wte.weight"}, {{vocab, h}}, R::padded_vocab);
    add("embedding.position.weight", Shape{c.positions(), h}, {p + "wpe.weight"}, {{c.positions(), h}});
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string s = "layers." + std::to_string(i) + ".", t = p + "h." + std::to_string(i) + ".";
      add(s + "norm1.weight", Shape{h}, {t + "ln_1.weight"}, {{h}});
      add(s + "norm1.bias", Shape{h}, {t + "ln_1.bias"}, {{h}});
      add(s + "attention.qkv.weight", Shape{qkv_rows, h}, {t + "attn.c_attn.weight"}, {{h, 3 * h}}, R::qkv, true);
      add(s + "attention.qkv.bias", Shape{qkv_rows}, {t + "attn.c_attn.bias"}, {{3 * h}}, R::qkv);
      add(s + "attention.proj.weight", Shape{h, h}, {t + "attn.c_proj.weight"}, {{h, h}}, R::same, true);
      add(s + "attention.proj.bias", Shape{h}, {t + "attn.c_proj.bias"}, {{h}});
      add(s + "norm2.weight", Shape{h}, {t + "ln_2.weight"}, {{h}});
      add(s + "norm2.bias", Shape{h}, {t + "ln_2.bias"}, {{h}});
      add(s + "mlp.fc1.weight", Shape{ffn, h}, {t + "mlp.c_fc.weight"}, {{h, ffn}}, R::same, true);
      add(s + "mlp.fc1.bias", Shape{ffn}, {t + "mlp.c_fc.bias"}, {{ffn}});
      add(s + "mlp.fc2.weight", Shape{h, ffn}, {t + "mlp.c_proj.weight"}, {{ffn, h}}, R::same, true);
      add(s + "mlp.fc2.bias", Shape{h}, {t + "mlp.c_proj.bias"}, {{h}});
    }
    add("final_norm.weight", Shape{h}, {p + "ln_f.weight"}, {{h}});
    add("final_norm.bias", Shape{h}, {p + "ln_f.bias"}, {{h}});
    return out;
  }
  add("embedding.word.weight", Shape{padded, h}, {"model.embed_tokens.weight"}, {{vocab, h}}, R::padded_vocab);
  const bool deepseek = architecture == Architecture::deepseek_v3;
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string s = "layers." + std::to_string(i) + ".", t = "model.layers." + std::to_string(i) + ".";
    add(s + "norm1.weight", Shape{h}, {t + "input_layernorm.weight"}, {{h}});
    if (deepseek) {  // multi-latent attention (layers/latent_attention.hpp): the same rows on both sides
      const index_t rq = c.q_lora_rank, rkv = c.kv_lora_rank, dr = c.qk_pos_emb_head_dim, dv = c.v_head_dim;
      const index_t qk = heads * (c.qk_head_dim + dr), kv = heads * (c.qk_head_dim + dv);
      const std::string a = s + "attention.", u = t + "self_attn.";
      if (rq > 0) {
        add(a + "q_down.weight", Shape{rq, h}, {u + "q_a_proj.weight"}, {{rq, h}});
        add(a + "q_latent_norm.weight", Shape{rq}, {u + "q_a_layernorm.weight"}, {{rq}});
        add(a + "q_up.weight", Shape{qk, rq}, {u + "q_b_proj.weight"}, {{qk, rq}});
      } else {
        add(a + "q.weight", Shape{qk, h}, {u + "q_proj.weight"}, {{qk, h}});
      }
      add(a + "kv_down.weight", Shape{rkv + dr, h}, {u + "kv_a_proj_with_mqa.weight"}, {{rkv + dr, h}});
      add(a + "kv_latent_norm.weight", Shape{rkv}, {u + "kv_a_layernorm.weight"}, {{rkv}});
      add(a + "kv_up.weight", Shape{kv, rkv}, {u + "kv_b_proj.weight"}, {{kv, rkv}});
      add(a + "proj.weight", Shape{h, heads * dv}, {u + "o_proj.weight"}, {{h, heads * dv}});
    }
    if (!deepseek) add(s + "attention.qkv.weight", Shape{qkv_rows, h},
        {t + "self_attn.q_proj.weight", t + "self_attn.k_proj.weight", t + "self_attn.v_proj.weight"},
        {{heads * d, h}, {groups * d, h}, {groups * d, h}}, R::qkv);
    const bool gpt_oss = architecture == Architecture::gpt_oss;
    if (architecture == Architecture::qwen2 || architecture == Architecture::qwen2_moe || gpt_oss)
      add(s + "attention.qkv.bias", Shape{qkv_rows},
          {t + "self_attn.q_proj.bias", t + "self_attn.k_proj.bias", t + "self_attn.v_proj.bias"},
          {{heads * d}, {groups * d}, {groups * d}}, R::qkv);
    if (!deepseek) add(s + "attention.proj.weight", Shape{h, heads * d}, {t + "self_attn.o_proj.weight"}, {{h, heads * d}});
    if (gpt_oss) {
      add(s + "attention.proj.bias", Shape{h}, {t + "self_attn.o_proj.bias"}, {{h}});
      add(s + "attention.softmax_offset", Shape{heads}, {t + "self_attn.sinks"}, {{heads}});
    }
    if (architecture == Architecture::qwen3 || architecture == Architecture::qwen3_moe) {
      add(s + "attention.q_norm.weight", Shape{d}, {t + "self_attn.q_norm.weight"}, {{d}});
      add(s + "attention.k_norm.weight", Shape{d}, {t + "self_attn.k_norm.weight"}, {{d}});
    }
    add(s + "norm2.weight", Shape{h}, {t + "post_attention_layernorm.weight"}, {{h}});
    if (moe_family(architecture) && c.moe_layer(i)) {
      const bool mixtral = architecture == Architecture::mixtral;
      const index_t experts = c.moe.num_experts, w = c.expert_ffn();
      const std::string moe = t + (mixtral ? "block_sparse_moe." : "mlp.");
      if (gpt_oss) {  // the router's linear with a bias; each stacked expert tensor holds every expert, stored [in, out]
        add(s + "mlp.router.weight", Shape{experts, h}, {moe + "router.weight"}, {{experts, h}});
        add(s + "mlp.router.bias", Shape{experts}, {moe + "router.bias"}, {{experts}});
        for (index_t e = 0; e < experts; ++e) {
          const std::string se = s + "mlp.experts." + std::to_string(e) + ".";
          auto& fc1 = add(se + "fc1.weight", Shape{2 * w, h}, {moe + "experts.gate_up_proj"}, {{experts, h, 2 * w}},
                          R::gate_up_interleaved, true);
          fc1.ffn = w, fc1.expert = e;
          auto& fc1_bias = add(se + "fc1.bias", Shape{2 * w}, {moe + "experts.gate_up_proj_bias"}, {{experts, 2 * w}},
                               R::gate_up_interleaved);
          fc1_bias.ffn = w, fc1_bias.expert = e;
          add(se + "fc2.weight", Shape{h, w}, {moe + "experts.down_proj"}, {{experts, w, h}}, R::same, true).expert = e;
          add(se + "fc2.bias", Shape{h}, {moe + "experts.down_proj_bias"}, {{experts, h}}).expert = e;
        }
        continue;
      }
      add(s + "mlp.router.weight", Shape{experts, h}, {moe + "gate.weight"}, {{experts, h}});
      if (deepseek)  // the router's expert bias: a persistent tensor, not a parameter (DecoderModel::for_each_persistent_tensor)
        add(s + "mlp.router.expert_bias", Shape{experts}, {moe + "gate.e_score_correction_bias"}, {{experts}});
      for (index_t e = 0; e < experts; ++e) {
        const std::string se = s + "mlp.experts." + std::to_string(e) + ".", te = moe + "experts." + std::to_string(e) + ".";
        add(se + "fc1.weight", Shape{2 * w, h}, {te + (mixtral ? "w1.weight" : "gate_proj.weight"), te + (mixtral ? "w3.weight" : "up_proj.weight")},
            {{w, h}, {w, h}}, R::gate_up)
            .ffn = w;
        add(se + "fc2.weight", Shape{h, w}, {te + (mixtral ? "w2.weight" : "down_proj.weight")}, {{h, w}});
      }
      if (const index_t ws = c.moe.shared_expert_ffn_hidden_size; deepseek || architecture == Architecture::qwen2_moe) {
        const std::string shared = moe + (deepseek ? "shared_experts." : "shared_expert.");  // Qwen2-MoE's is one expert
        add(s + "mlp.shared_experts.fc1.weight", Shape{2 * ws, h}, {shared + "gate_proj.weight", shared + "up_proj.weight"},
            {{ws, h}, {ws, h}}, R::gate_up)
            .ffn = ws;
        add(s + "mlp.shared_experts.fc2.weight", Shape{h, ws}, {shared + "down_proj.weight"}, {{h, ws}});
        if (c.moe.shared_expert_gate)
          add(s + "mlp.shared_experts.gate_weight", Shape{1, h}, {moe + "shared_expert_gate.weight"}, {{1, h}});
      }
      continue;
    }
    add(s + "mlp.fc1.weight", Shape{2 * ffn, h}, {t + "mlp.gate_proj.weight", t + "mlp.up_proj.weight"},
        {{ffn, h}, {ffn, h}}, R::gate_up);
    add(s + "mlp.fc2.weight", Shape{h, ffn}, {t + "mlp.down_proj.weight"}, {{h, ffn}});
  }
  add("final_norm.weight", Shape{h}, {"model.norm.weight"}, {{h}});
  add("output.weight", Shape{padded, h}, {options.llama_tied_output ? "model.embed_tokens.weight" : "lm_head.weight"},
      {{vocab, h}}, R::padded_vocab);
  return out;
}

// Tensors a transformers file may hold that have no strata parameter and carry nothing strata
// needs: GPT-2's tied lm_head and causal-mask buffers, old Llama files' rotary inverse frequencies.
inline bool ignorable_tensor(Architecture architecture, std::string_view name, bool llama_tied_output) {
  if (architecture == Architecture::gpt2)
    return name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
  return name.ends_with(".rotary_emb.inv_freq") || (llama_tied_output && name == "lm_head.weight");
}

// ---- config.json ----

// What a transformers config.json says, as strata sees it.
struct HfConfig {
  Architecture architecture = Architecture::gpt2;
  models::ModelConfig config;    // make_vocab_size_divisible_by and the training fields keep their defaults
  bool tie_word_embeddings = false;
  std::string torch_dtype;       // "" when absent
  std::filesystem::path path;    // the file
  // What an export carries through unchanged: bos_token_id and eos_token_id as JSON text (an id or
  // a list of ids, "" when absent or null) and the file's max_position_embeddings (n_positions).
  std::string bos_token_id{}, eos_token_id{};
  int max_position_embeddings = 0;
};

constexpr std::string_view torch_dtype_name(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::float32: return "float32";
    case SafetensorsDtype::bfloat16: return "bfloat16";
    case SafetensorsDtype::float16: return "float16";
    case SafetensorsDtype::float64: return "float64";
    default: return "";
  }
}

namespace hf_detail {

// count elements of `element` bytes from consecutive places of `in` to every `stride`-th place of
// `out` (a row of a tensor into a column of its transpose), typed for the usual widths.
template <class Word>
void copy_strided_as(const std::byte* in, std::byte* out, std::size_t count, std::size_t stride) {
  for (std::size_t i = 0; i < count; ++i) {
    Word w;
    std::memcpy(&w, in + i * sizeof(Word), sizeof(Word));
    std::memcpy(out + i * stride * sizeof(Word), &w, sizeof(Word));
  }
}
inline void copy_strided(const std::byte* in, std::byte* out, std::size_t count, std::size_t stride, std::size_t element) {
  switch (element) {
    case 2: return copy_strided_as<std::uint16_t>(in, out, count, stride);
    case 4: return copy_strided_as<std::uint32_t>(in, out, count, stride);
    case 8: return copy_strided_as<std::uint64_t>(in, out, count, stride);
    default:
      for (std::size_t i = 0; i < count; ++i) std::memcpy(out + i * stride * element, in + i * element, element);
  }
}

// Whether tensors `a` and `b` of the files hold the same shape and values (read in blocks).
inline bool same_values(const SafetensorsDirectory& files, std::string_view a, std::string_view b) {
  const SafetensorsEntry &x = files.entry(a), &y = files.entry(b);
  if (x.shape != y.shape) return false;
  constexpr std::int64_t kBlock = std::int64_t{1} << 20;
  std::vector<double> p, q;
  for (std::int64_t first = 0; first < x.numel; first += kBlock) {
    const auto n = static_cast<std::size_t>(std::min(kBlock, x.numel - first));
    p.resize(n);
    q.resize(n);
    files.read<double>(a, std::span<double>(p), first);
    files.read<double>(b, std::span<double>(q), first);
    if (std::memcmp(p.data(), q.data(), n * sizeof(double)) != 0) return false;
  }
  return true;
}

inline std::string read_text_file(const std::filesystem::path& path) {
  return read_whole_file(path, "Hugging Face configuration", kMaxConfigBytes);
}

// Typed access to the fields of config.json, with transformers' defaults for absent ones.
class ConfigFields {
 public:
  ConfigFields(const json::Value& root, std::filesystem::path path) : root_(root), path_(std::move(path)) {}

  const json::Value* find(std::string_view key) const { return root_.find(key); }
  bool present(std::string_view key) const {
    const json::Value* v = find(key);
    return v && !v->is_null();
  }
  std::int64_t integer(std::string_view key, std::optional<std::int64_t> fallback = std::nullopt) const {
    const json::Value* v = find(key);
    if (!v || v->is_null()) return required(key, fallback);
    std::int64_t out = 0;
    if (!v->to_int64(out)) wrong(key, *v, "an integer");
    return out;
  }
  int small_integer(std::string_view key, std::optional<std::int64_t> fallback = std::nullopt) const {
    const std::int64_t v = integer(key, fallback);
    if (v < 0 || v > std::numeric_limits<int>::max())
      fail<ConfigError>("config.json ", path_, ": \"", key, "\" is ", v, ", not a size strata can hold (0 to 2^31 - 1)");
    return static_cast<int>(v);
  }
  double real(std::string_view key, std::optional<double> fallback = std::nullopt) const {
    const json::Value* v = find(key);
    if (!v || v->is_null()) return required(key, fallback);
    double out = 0;
    if (!v->to_double(out)) wrong(key, *v, "a number");
    return out;
  }
  bool flag(std::string_view key, bool fallback) const {
    const json::Value* v = find(key);
    if (!v || v->is_null()) return fallback;
    if (!v->is_bool()) wrong(key, *v, "true or false");
    return v->boolean();
  }
  // A token id or a list of them (eos_token_id may list several), as JSON text; "" when absent or null.
  std::string token_ids(std::string_view key) const {
    const json::Value* v = find(key);
    if (!v || v->is_null()) return "";
    std::int64_t id = 0;
    if (v->to_int64(id) && id >= 0) return json::number(id);
    if (v->is_array()) {
      std::string out = "[";
      for (const json::Value& item : v->items()) {
        if (!item.to_int64(id) || id < 0) wrong(key, *v, "a token id or a list of token ids");
        out += (out.size() > 1 ? ", " : "") + json::number(id);
      }
      return out + "]";
    }
    wrong(key, *v, "a token id or a list of token ids");
  }
  std::string text(std::string_view key, std::optional<std::string> fallback = std::nullopt) const {
    const json::Value* v = find(key);
    if (!v || v->is_null()) return required(key, fallback);
    if (!v->is_string()) wrong(key, *v, "a string");
    return v->text();
  }

 private:
  template <class V>
  V required(std::string_view key, const std::optional<V>& fallback) const {
    if (!fallback) fail<FileError>("config.json ", path_, " has no \"", key, "\"");
    return *fallback;
  }
  [[noreturn]] void wrong(std::string_view key, const json::Value& v, const char* expected) const {
    fail<FileError>("config.json ", path_, ": \"", key, "\" is ", json::Value::kind_name(v.kind()),
                    v.is_number() || v.is_string() ? " " + v.text() : std::string(), ", not ", expected);
  }

  const json::Value& root_;
  std::filesystem::path path_;
};

// Pretty-printed JSON object from already-serialized values, in the given order.
inline std::string json_object(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out = "{\n";
  for (std::size_t i = 0; i < members.size(); ++i)
    out += "  " + json::quote(members[i].first) + ": " + members[i].second + (i + 1 < members.size() ? ",\n" : "\n");
  return out + "}\n";
}

// Collective over `tp`: the whole (global) value of parameter p on the host (as layers/gather.hpp's
// gather_global, which checkpoint/ may not include).
template <class Comm, class Param>
auto gather_parameter(Comm& tp, const Param& p) {
  using X = typename Param::value_type;
  Tensor<X> mine = to_host(p.value);
  if (!p.shard.sharded || tp.size() == 1) return mine;
  if (tp.size() != p.shard.parts)
    fail<ConfigError>("hf::save_hf_from_model: parameter '", p.name, "' is split over ", p.shard.parts,
                      " ranks but the tensor-parallel group has ", tp.size());
  const index_t n = mine.numel();
  using Space = typename Param::space_type;
  auto all = Tensor<X, Space>::empty(Shape{tp.size(), n});
  tp.all_gather(p.value.buffer(), all.buffer());
  const Tensor<X> all_host = to_host(all);
  Tensor<X> out = Tensor<X>::empty(p.global_shape);
  for (int r = 0; r < tp.size(); ++r)
    for (index_t i = 0; i < n; ++i) out[global_index(p.global_shape, p.shard, i, r)] = all_host[r * n + i];
  return out;
}

// DeepseekV3ForCausalLM's fields (intermediate_size is the dense layers' width): multi-latent
// attention, sigmoid routing with e_score_correction_bias (strata's expert bias), groups, a scaling
// factor, shared experts and first_k_dense_replace dense layers. What strata cannot express is refused.
inline void read_deepseek_v3(const ConfigFields& f, const std::filesystem::path& path, models::ModelConfig& c) {
  auto refuse = [&](std::string_view field, const std::string& value, std::string_view why) {
    fail<ConfigError>("config.json ", path, ": ", field, " = ", value, " cannot be imported: ", why);
  };
  c.multi_latent_attention = true;
  c.qk_layernorm = true;  // the latents' RMSNorms (Megatron's --qk-layernorm under multi-latent attention)
  c.kv_channels = 0;  // head_dim is qk_rope_head_dim there; the latent attention has its own sizes
  c.q_lora_rank = f.find("q_lora_rank") ? f.small_integer("q_lora_rank", 0) : 1536;  // null: queries without a latent
  c.kv_lora_rank = f.small_integer("kv_lora_rank", 512);
  c.qk_head_dim = f.small_integer("qk_nope_head_dim", 128);
  c.qk_pos_emb_head_dim = f.small_integer("qk_rope_head_dim", 64);
  c.v_head_dim = f.small_integer("v_head_dim", 128);
  c.rotary_interleaved = f.flag("rope_interleave", true);
  c.moe.num_experts = f.small_integer("n_routed_experts", 256);
  c.moe.topk = f.small_integer("num_experts_per_tok", 8);
  c.moe.expert_ffn_hidden_size = f.small_integer("moe_intermediate_size", 2048);
  const int shared = f.small_integer("n_shared_experts", 1);
  if (shared < 1) refuse("n_shared_experts", std::to_string(shared), "DeepseekV3ForCausalLM always runs its shared experts");
  c.moe.shared_expert_ffn_hidden_size = shared * c.moe.expert_ffn_hidden_size;
  if (c.moe.num_experts < 1 || c.moe.topk < 1 || c.moe.topk > c.moe.num_experts)
    refuse("num_experts_per_tok", std::to_string(c.moe.topk),
           detail::concat("each token goes to between 1 and n_routed_experts=", c.moe.num_experts, " experts"));
  c.moe.routing.score = MoeScore::sigmoid;
  c.moe.routing.scaling_factor = f.real("routed_scaling_factor", 2.5);
  c.moe.expert_bias = true;
  if (f.present("scoring_func") && f.text("scoring_func") != "sigmoid")
    refuse("scoring_func", json::quote(f.text("scoring_func")), "DeepseekV3ForCausalLM's router takes sigmoid scores");
  if (f.present("topk_method") && f.text("topk_method") != "noaux_tc")
    refuse("topk_method", json::quote(f.text("topk_method")), "strata routes as DeepseekV3ForCausalLM does (\"noaux_tc\")");
  if (f.flag("norm_topk_prob", true) != (c.moe.topk > 1))
    refuse("norm_topk_prob", f.flag("norm_topk_prob", true) ? "true" : "false",
           "strata's sigmoid router divides the weights by their sum exactly when a token has more than one expert");
  const int groups = f.small_integer("n_group", 8), group_topk = f.small_integer("topk_group", 4);
  if (groups > 1) {
    if (c.moe.num_experts % groups != 0 || group_topk < 1 || group_topk > groups || c.moe.topk != kDeepseekGroupTop * group_topk)
      refuse("n_group, topk_group", detail::concat(groups, ", ", group_topk),
             detail::concat("strata scores a group by its top num_experts_per_tok / topk_group choices and DeepseekV3ForCausalLM "
                            "by its top 2, so num_experts_per_tok must be 2 x topk_group (it is ", c.moe.topk,
                            "), and n_group must divide n_routed_experts"));
    c.moe.routing.num_groups = groups;
    c.moe.routing.group_topk = group_topk;
  }
  if (f.present("moe_layer_freq") && f.small_integer("moe_layer_freq") != 1)
    refuse("moe_layer_freq", std::to_string(f.small_integer("moe_layer_freq")), "only every layer after the dense ones is mapped");
  const int dense = f.present("first_k_dense_replace") ? f.small_integer("first_k_dense_replace") : 0;
  if (dense > c.num_layers)
    refuse("first_k_dense_replace", std::to_string(dense), detail::concat("more than num_hidden_layers=", c.num_layers));
  if (dense > 0) {
    c.moe.layers.assign(static_cast<std::size_t>(c.num_layers), 1);
    std::fill(c.moe.layers.begin(), c.moe.layers.begin() + dense, 0);
  }
}

// rope_scaling (or rope_parameters) of rope_type "yarn" into c's YaRN fields, as transformers'
// _compute_yarn_parameters reads them: factor (absent or null: max_position_embeddings / original);
// original_max_position_embeddings (absent: max_position_embeddings, already c.seq_length);
// beta_fast, beta_slow (absent, null or 0: 32 and 1); the attention factor from attention_factor
// when given, else from mscale / mscale_all_dim when both are non-zero, else 0.1 ln(factor) + 1
// (strata's mscale 1, mscale_all_dim 0; an attention_factor a becomes mscale (a - 1) / (0.1 ln
// factor)); truncate (default true). rope_theta is read by the caller. Older transformers (4.4x,
// 4.5x) replaced the factor by max_position_embeddings / original whenever the original was given;
// the two agree when the configuration is consistent (gpt-oss: 131072 / 4096 = 32).
inline void read_yarn(const std::filesystem::path& path, std::string_view field, const json::Value& rope, models::ModelConfig& c) {
  auto refuse = [&](std::string_view key, const std::string& value, std::string_view why) {
    fail<ConfigError>("config.json ", path, ": ", field, ".", key, " = ", value, " cannot be imported: ", why);
  };
  auto number = [&](std::string_view key, const json::Value& v) {
    double out = 0;
    if (!v.to_double(out) || !std::isfinite(out)) refuse(key, v.text(), "not a number");
    return out;
  };
  std::optional<double> factor, original, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor;
  bool truncate = true;
  for (const auto& [key, value] : rope.members()) {
    if (key == "rope_type" || key == "type" || key == "rope_theta") continue;
    if (value.is_null()) continue;
    if (key == "truncate") {
      if (!value.is_bool()) refuse(key, value.text(), "not true or false");
      truncate = value.boolean();
      continue;
    }
    std::optional<double>* slot = key == "factor"                             ? &factor
                                  : key == "original_max_position_embeddings" ? &original
                                  : key == "beta_fast"                        ? &beta_fast
                                  : key == "beta_slow"                        ? &beta_slow
                                  : key == "mscale"                           ? &mscale
                                  : key == "mscale_all_dim"                   ? &mscale_all_dim
                                  : key == "attention_factor"                 ? &attention_factor
                                                                              : nullptr;
    if (!slot)
      refuse(key, value.is_string() || value.is_number() ? value.text() : "(set)",
             "strata's YaRN reads factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, "
             "mscale_all_dim, attention_factor and truncate");
    *slot = number(key, value);
  }
  c.yarn_original_max_positions = original.value_or(static_cast<double>(c.seq_length));
  if (!(c.yarn_original_max_positions > 0)) refuse("original_max_position_embeddings", std::to_string(c.yarn_original_max_positions), "not positive");
  c.yarn_scaling_factor = factor.value_or(static_cast<double>(c.seq_length) / c.yarn_original_max_positions);
  if (!(c.yarn_scaling_factor > 0)) refuse("factor", std::to_string(c.yarn_scaling_factor), "not a positive number");
  c.yarn_beta_fast = beta_fast && *beta_fast != 0 ? *beta_fast : 32.0;
  c.yarn_beta_slow = beta_slow && *beta_slow != 0 ? *beta_slow : 1.0;
  if (!(c.yarn_beta_slow > 0 && c.yarn_beta_fast > c.yarn_beta_slow))
    refuse("beta_fast", std::to_string(c.yarn_beta_fast), detail::concat("strata needs 0 < beta_slow (", c.yarn_beta_slow,
                                                                        ") < beta_fast"));
  c.yarn_round_to_int = truncate;
  c.yarn_mscale = 1.0, c.yarn_mscale_all_dim = 0.0;
  if (attention_factor) {
    if (c.yarn_scaling_factor > 1) c.yarn_mscale = (*attention_factor - 1.0) / (0.1 * std::log(c.yarn_scaling_factor));
    else if (*attention_factor != 1.0)
      refuse("attention_factor", std::to_string(*attention_factor), "with a factor of at most 1 strata's attention factor is 1");
  } else if (mscale && mscale_all_dim && *mscale != 0 && *mscale_all_dim != 0) {
    c.yarn_mscale = *mscale, c.yarn_mscale_all_dim = *mscale_all_dim;
    if (!(rope_yarn_mscale(c.yarn_scaling_factor, c.yarn_mscale_all_dim) > 0))
      refuse("mscale_all_dim", std::to_string(*mscale_all_dim), "gives an attention factor with a non-positive denominator");
  }
}

}  // namespace hf_detail

// Parses <dir>/config.json (or a config.json path) into the architecture and a ModelConfig.
// Settings strata cannot reproduce are a ConfigError naming the field.
inline HfConfig read_config(const std::filesystem::path& dir_or_file) {
  std::error_code ec;
  const std::filesystem::path path =
      std::filesystem::is_directory(dir_or_file, ec) ? dir_or_file / "config.json" : dir_or_file;
  const std::string text = hf_detail::read_text_file(path);
  const json::Value root = json::parse(text, detail::concat("config.json ", path));
  if (!root.is_object()) fail<FileError>("config.json ", path, " is not a JSON object");
  const hf_detail::ConfigFields f(root, path);
  const std::string model_type = f.text("model_type");
  const auto architecture = parse_architecture(model_type);
  if (!architecture)
    fail<ConfigError>("config.json ", path, ": model_type \"", model_type,
                      "\" is not one strata imports (\"gpt2\", \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"mixtral\", \"qwen3_moe\", "
                      "\"qwen2_moe\", \"deepseek_v3\" or \"gpt_oss\")");
  auto refuse = [&](const std::string& field, const std::string& value, std::string_view why) {
    fail<ConfigError>("config.json ", path, ": ", field, " = ", value, " cannot be imported: ", why);
  };
  HfConfig out;
  out.architecture = *architecture;
  out.path = path;
  out.torch_dtype = f.text("torch_dtype", f.text("dtype", std::string()));  // "dtype" from transformers 4.56 on
  out.bos_token_id = f.token_ids("bos_token_id");
  out.eos_token_id = f.token_ids("eos_token_id");
  models::ModelConfig& c = out.config;
  if (*architecture == Architecture::gpt2) {
    c.vocab_size = f.small_integer("vocab_size", 50257);
    c.seq_length = f.small_integer("n_positions", 1024);
    c.max_position_embeddings = c.seq_length;
    out.max_position_embeddings = c.seq_length;
    c.hidden_size = f.small_integer("n_embd", 768);
    c.num_layers = f.small_integer("n_layer", 12);
    c.num_attention_heads = f.small_integer("n_head", 12);
    c.num_query_groups = 0;
    c.ffn_hidden_size = f.present("n_inner") ? f.small_integer("n_inner") : 0;
    c.norm_epsilon = f.real("layer_norm_epsilon", 1e-5);
    c.init_method_std = f.real("initializer_range", 0.02);
    const std::string activation = f.text("activation_function", std::string("gelu_new"));
    if (activation != "gelu_new" && activation != "gelu_pytorch_tanh")
      refuse("activation_function", json::quote(activation), "strata's GPT uses the tanh GELU (\"gelu_new\")");
    if (!f.flag("scale_attn_weights", true))
      refuse("scale_attn_weights", "false", "strata always scales attention scores by 1/sqrt(head_dim)");
    if (f.flag("scale_attn_by_inverse_layer_idx", false))
      refuse("scale_attn_by_inverse_layer_idx", "true", "strata does not scale attention by the layer index");
    if (f.flag("add_cross_attention", false)) refuse("add_cross_attention", "true", "strata's GPT is decoder-only");
    out.tie_word_embeddings = f.flag("tie_word_embeddings", true);
    if (!out.tie_word_embeddings)
      refuse("tie_word_embeddings", "false", "strata's GPT ties its output layer to the word embedding");
  } else {
    c.vocab_size = f.small_integer("vocab_size", 32000);
    c.hidden_size = f.small_integer("hidden_size", 4096);
    c.ffn_hidden_size = f.small_integer("intermediate_size", 11008);
    c.num_layers = f.small_integer("num_hidden_layers", 32);
    c.num_attention_heads = f.small_integer("num_attention_heads", 32);
    c.num_query_groups = f.small_integer("num_key_value_heads", c.num_attention_heads);
    c.seq_length = f.small_integer("max_position_embeddings", 2048);
    c.max_position_embeddings = c.seq_length;
    out.max_position_embeddings = c.seq_length;
    c.norm_epsilon = f.real("rms_norm_eps", 1e-6);
    c.init_method_std = f.real("initializer_range", 0.02);
    const std::string activation = f.text("hidden_act", std::string("silu"));
    if (activation != "silu") refuse("hidden_act", json::quote(activation), "strata's Llama uses SwiGLU with SiLU");
    // RoPE: "rope_theta" (transformers 4), or "rope_parameters": {"rope_type": "default", "rope_theta": ...}
    // (transformers 5); a "rope_scaling" or rope_parameters of any other type is a scaling strata lacks.
    const bool gpt_oss = *architecture == Architecture::gpt_oss;
    std::optional<double> theta;
    if (f.present("rope_theta")) theta = f.real("rope_theta");
    if (gpt_oss && !f.present("rope_parameters") && !f.present("rope_scaling")) {  // GptOssConfig's default: YaRN
      c.yarn_scaling_factor = 32.0, c.yarn_original_max_positions = 4096, c.yarn_beta_fast = 32.0, c.yarn_beta_slow = 1.0;
      c.yarn_round_to_int = false, c.yarn_mscale = 1.0, c.yarn_mscale_all_dim = 0.0;
    }
    for (const char* field : {"rope_parameters", "rope_scaling"}) {
      if (!f.present(field)) continue;
      const json::Value& rope = *f.find(field);
      if (!rope.is_object()) refuse(field, "(not an object)", "expected {\"rope_type\": \"default\", ...}");
      const json::Value* type = nullptr;
      for (const auto& [key, value] : rope.members())
        if (key == "rope_type" || key == "type") type = &value;
      const bool llama3 = type && type->is_string() && type->text() == "llama3" && *architecture == Architecture::llama;
      const bool yarn = type && type->is_string() && type->text() == "yarn";  // any of the Llama family
      if (llama3 && !rope.find("factor"))
        refuse(detail::concat(field, ".rope_type"), "llama3", "Llama 3.1's scaling needs its factor (and low_freq_factor, "
               "high_freq_factor, original_max_position_embeddings)");
      if (yarn) {
        hf_detail::read_yarn(path, field, rope, c);
        if (const json::Value* t = rope.find("rope_theta")) {
          double value = 0;
          if (!t->to_double(value)) refuse(detail::concat(field, ".rope_theta"), t->text(), "not a number");
          if (theta && *theta != value) refuse(detail::concat(field, ".rope_theta"), t->text(), detail::concat("rope_theta says ", *theta));
          theta = value;
        }
        continue;
      }
      for (const auto& [key, value] : rope.members()) {
        if ((key == "rope_type" || key == "type") && value.is_string() && (value.text() == "default" || llama3)) continue;
        if (llama3 && (key == "factor" || key == "low_freq_factor" || key == "high_freq_factor" ||
                       key == "original_max_position_embeddings")) {
          double v = 0;
          if (!value.to_double(v) || !(v > 0)) refuse(detail::concat(field, ".", key), value.text(), "not a positive number");
          (key == "factor"              ? c.rope_scaling_factor
           : key == "low_freq_factor"  ? c.rope_low_freq_factor
           : key == "high_freq_factor" ? c.rope_high_freq_factor
                                       : c.rope_original_max_positions) = v;
          continue;
        }
        if (key == "rope_theta") {
          double t = 0;
          if (!value.to_double(t)) refuse(detail::concat(field, ".rope_theta"), value.text(), "not a number");
          if (theta && *theta != t)
            refuse(detail::concat(field, ".rope_theta"), value.text(), detail::concat("rope_theta says ", *theta));
          theta = t;
          continue;
        }
        refuse(detail::concat(field, ".", key), value.is_string() || value.is_number() ? value.text() : "(set)",
               "strata's RoPE is the default one, YaRN (rope_type \"yarn\"), or Llama 3.1's scaling (rope_type \"llama3\") "
               "in a Llama");
      }
    }
    c.rope_base = theta.value_or(gpt_oss ? 150000.0 : 10000.0);
    // Qwen2 has biases on q, k and v (always); Qwen3 and Llama none unless attention_bias, which
    // puts one on the output projection too (strata's add_qkv_bias does not).
    if (gpt_oss) {
      // every linear layer has a bias (attention_bias: q, k, v, o; the router and experts always)
      if (!f.flag("attention_bias", true))
        refuse("attention_bias", "false", "strata's gpt-oss has every linear bias (add_bias_linear), the attention's included");
      c.add_bias_linear = true;
    } else if (f.flag("attention_bias", false)) {
      refuse("attention_bias", "true", "strata's Llama family has no output-projection bias");
    }
    if (f.flag("mlp_bias", false)) refuse("mlp_bias", "true", "strata's Llama family has no MLP biases");
    if (f.flag("use_sliding_window", false))
      refuse("use_sliding_window", "true", "Qwen's sliding window (with max_window_layers) is not mapped; Mistral's is");
    if (gpt_oss) {  // sliding_window keys on the layers layer_types names "sliding_attention" (default: the even ones)
      std::int64_t keys = 128;
      if (const json::Value* w = f.find("sliding_window"); w && !w->is_null())
        if (!w->to_int64(keys) || keys < 1 || keys > (std::int64_t{1} << 30))
          refuse("sliding_window", w->text(), "a window of at least one key");
      std::vector<int> pattern(static_cast<std::size_t>(c.num_layers));
      for (int l = 0; l < c.num_layers; ++l) pattern[static_cast<std::size_t>(l)] = (l + 1) % 2;
      if (const json::Value* types = f.find("layer_types"); types && !types->is_null()) {
        if (!types->is_array() || static_cast<int>(types->items().size()) != c.num_layers)
          refuse("layer_types", "(set)", detail::concat("expected a list of num_hidden_layers=", c.num_layers, " layer types"));
        int l = 0;
        for (const json::Value& item : types->items()) {
          if (!item.is_string() || (item.text() != "sliding_attention" && item.text() != "full_attention"))
            refuse("layer_types", item.text(), "each layer is \"sliding_attention\" or \"full_attention\"");
          pattern[static_cast<std::size_t>(l++)] = item.text() == "sliding_attention" ? 1 : 0;
        }
      }
      const bool any = std::find(pattern.begin(), pattern.end(), 1) != pattern.end();
      const bool all = std::find(pattern.begin(), pattern.end(), 0) == pattern.end();
      if (any) c.window_size = static_cast<int>(keys - 1);
      if (any && !all) c.window_layers = pattern;
    }
    if (*architecture == Architecture::mistral || *architecture == Architecture::mixtral) {
      // transformers' window counts the query's own key: key j is seen from query i when i - j < sliding_window
      if (const json::Value* w = f.find("sliding_window"); w && !w->is_null()) {
        std::int64_t keys = 0;
        if (!w->to_int64(keys) || keys < 1 || keys > (std::int64_t{1} << 30))
          refuse("sliding_window", w->text(), "a window of at least one key, or null for full attention");
        c.window_size = static_cast<int>(keys - 1);
      }
    }
    c.add_qkv_bias = *architecture == Architecture::qwen2 || *architecture == Architecture::qwen2_moe;
    if (*architecture == Architecture::qwen2_moe && !f.flag("qkv_bias", true))
      refuse("qkv_bias", "false", "strata's Qwen2-MoE attention has q, k and v biases (--add-qkv-bias)");
    const bool qwen3_like = *architecture == Architecture::qwen3 || *architecture == Architecture::qwen3_moe;
    c.qk_layernorm = qwen3_like;
    // head_dim: Qwen3's (and Qwen3-MoE's) default is 128; Llama's and Qwen2's hidden_size / num_attention_heads.
    const std::int64_t plain_head = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
    const std::int64_t head_dim = f.present("head_dim") ? f.integer("head_dim") : qwen3_like ? 128 : gpt_oss ? 64 : plain_head;
    if (head_dim <= 0 || head_dim > (1 << 20)) refuse("head_dim", std::to_string(head_dim), "not a head dimension");
    if (head_dim != plain_head || c.hidden_size % std::max(c.num_attention_heads, 1) != 0) c.kv_channels = static_cast<int>(head_dim);
    out.tie_word_embeddings = f.flag("tie_word_embeddings", false);
    if (gpt_oss || *architecture == Architecture::mixtral) {  // intermediate_size (ffn_hidden_size) is one expert's width
      c.moe.num_experts = f.small_integer("num_local_experts", gpt_oss ? 128 : 8);
      c.moe.topk = f.small_integer("num_experts_per_tok", gpt_oss ? 4 : 2);
      c.moe.aux_loss_coeff = f.real("router_aux_loss_coef", 0.001);
      if (c.moe.num_experts < 1 || c.moe.topk < 1 || c.moe.topk > c.moe.num_experts)
        refuse("num_experts_per_tok", std::to_string(c.moe.topk),
               detail::concat("each token goes to between 1 and num_local_experts=", c.moe.num_experts, " experts"));
    }
    if (gpt_oss) {  // the experts' quick GeGLU, clamped
      if (const double alpha = f.real("swiglu_alpha", kGptOssGluAlpha); alpha != kGptOssGluAlpha)
        refuse("swiglu_alpha", std::to_string(alpha), "strata's quick GeGLU has the slope 1.702");
      c.activation = MlpActivation::quick_geglu;
      c.activation_clamp = f.real("swiglu_limit", 7.0);
      if (!(c.activation_clamp > 0 && std::isfinite(c.activation_clamp)))
        refuse("swiglu_limit", std::to_string(c.activation_clamp), "a positive clamp");
      c.glu_linear_offset = kGptOssGluOffset;
      c.softmax_type = SoftmaxType::learnable;
    }
    if (*architecture == Architecture::mixtral) {
      if (const double jitter = f.real("router_jitter_noise", 0.0); jitter != 0)
        refuse("router_jitter_noise", std::to_string(jitter), "strata's router adds no noise to its inputs");
    }
    if (*architecture == Architecture::qwen3_moe || *architecture == Architecture::qwen2_moe) {
      // intermediate_size: the dense layers'; moe_intermediate_size: an expert's. transformers 5 writes
      // num_local_experts; earlier releases, and Qwen's own files, num_experts. Defaults: each class's.
      const bool qwen2 = *architecture == Architecture::qwen2_moe;
      c.moe.num_experts = f.small_integer(f.find("num_experts") ? "num_experts" : "num_local_experts", qwen2 ? 60 : 128);
      c.moe.topk = f.small_integer("num_experts_per_tok", qwen2 ? 4 : 8);
      c.moe.expert_ffn_hidden_size = f.small_integer("moe_intermediate_size", qwen2 ? 1408 : 768);
      if (qwen2) {  // one shared expert behind a sigmoid gate, on every MoE layer
        c.moe.shared_expert_ffn_hidden_size = f.small_integer("shared_expert_intermediate_size", 5632);
        c.moe.shared_expert_gate = true;
        if (c.moe.shared_expert_ffn_hidden_size < 1)
          refuse("shared_expert_intermediate_size", std::to_string(c.moe.shared_expert_ffn_hidden_size),
                 "Qwen2-MoE always runs its shared expert");
      }
      c.moe.aux_loss_coeff = f.real("router_aux_loss_coef", 0.001);
      c.moe.routing.pre_softmax = !f.flag("norm_topk_prob", false);
      if (c.moe.num_experts < 1 || c.moe.topk < 1 || c.moe.topk > c.moe.num_experts)
        refuse("num_experts_per_tok", std::to_string(c.moe.topk),
               detail::concat("each token goes to between 1 and num_experts=", c.moe.num_experts, " experts"));
      // Qwen's layer l is sparse when it is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
      const int step = f.small_integer("decoder_sparse_step", 1);
      if (step < 1) refuse("decoder_sparse_step", std::to_string(step), "must be at least 1");
      std::vector<int> pattern(static_cast<std::size_t>(c.num_layers));
      for (int l = 0; l < c.num_layers; ++l) pattern[static_cast<std::size_t>(l)] = (l + 1) % step == 0 ? 1 : 0;
      if (const json::Value* dense = f.find("mlp_only_layers"); dense && !dense->is_null()) {
        if (!dense->is_array()) refuse("mlp_only_layers", dense->text(), "expected a list of layer indices");
        for (const json::Value& item : dense->items()) {
          std::int64_t l = -1;
          if (!item.to_int64(l) || l < 0 || l >= c.num_layers)
            refuse("mlp_only_layers", item.text(), detail::concat("not a layer index below num_hidden_layers=", c.num_layers));
          pattern[static_cast<std::size_t>(l)] = 0;
        }
      }
      if (std::find(pattern.begin(), pattern.end(), 0) != pattern.end()) c.moe.layers = pattern;
    }
    if (*architecture == Architecture::deepseek_v3) hf_detail::read_deepseek_v3(f, path, c);
  }
  return out;
}

// Throws ConfigError when what config.json says does not fit the strata model's configuration,
// naming the field and both values.
inline void check_config(const HfConfig& file, Architecture architecture, const models::ModelConfig& model) {
  architecture = hf_architecture(architecture, model);
  if (file.architecture == Architecture::mistral && architecture == Architecture::llama)
    architecture = Architecture::mistral;  // Mistral without a sliding window is Llama
  if (file.architecture != architecture)
    fail<ConfigError>("config.json ", file.path, ": model_type is \"", architecture_name(file.architecture),
                      "\" but the strata model is ", architecture_name(architecture),
                      llama_family(architecture) ? " (Llama with --add-qkv-bias is qwen2, with --qk-layernorm qwen3)" : "");
  const bool gpt = architecture == Architecture::gpt2;
  auto same_int = [&](std::string_view hf_field, std::int64_t theirs, std::string_view ours_field, std::int64_t ours) {
    if (theirs != ours)
      fail<ConfigError>("config.json ", file.path, ": ", hf_field, " is ", theirs, " but the strata model has ", ours_field,
                        "=", ours);
  };
  auto same_real = [&](std::string_view hf_field, double theirs, std::string_view ours_field, double ours) {
    if (!(std::abs(theirs - ours) <= 1e-12 * std::max(std::abs(theirs), std::abs(ours))))
      fail<ConfigError>("config.json ", file.path, ": ", hf_field, " is ", theirs, " but the strata model has ", ours_field,
                        "=", ours);
  };
  const models::ModelConfig& c = file.config;
  same_int(gpt ? "n_layer" : "num_hidden_layers", c.num_layers, "num_layers", model.num_layers);
  same_int(gpt ? "n_embd" : "hidden_size", c.hidden_size, "hidden_size", model.hidden_size);
  same_int(gpt ? "n_head" : "num_attention_heads", c.num_attention_heads, "num_attention_heads", model.num_attention_heads);
  if (!gpt) {
    const int theirs = c.num_query_groups == 0 ? c.num_attention_heads : c.num_query_groups;
    const int ours = model.num_query_groups == 0 ? model.num_attention_heads : model.num_query_groups;
    same_int("num_key_value_heads", theirs, "num_query_groups", ours);
  }
  if (architecture == Architecture::gpt_oss) {  // intermediate_size is the experts' width
    same_int("intermediate_size", c.ffn(), "moe_ffn_hidden_size", model.expert_ffn());
    same_int("num_local_experts", c.moe.num_experts, "num_experts", model.moe.num_experts);
    same_int("num_experts_per_tok", c.moe.topk, "moe_router_topk", model.moe.topk);
    same_real("swiglu_limit", c.activation_clamp, "activation_clamp", model.activation_clamp);
    for (int l = 0; l < model.num_layers; ++l)
      if (c.layer_window(l) != model.layer_window(l))
        fail<ConfigError>("config.json ", file.path, ": sliding_window and layer_types give layer ", l, " a window of ",
                          c.layer_window(l), " keys before the query (-1: full attention) but the strata model's is ",
                          model.layer_window(l), " (--window-size, --window-attn-skip-freq)");
  } else if (architecture == Architecture::mixtral) {  // intermediate_size is the experts' width
    same_int("intermediate_size", c.ffn(), "moe_ffn_hidden_size", model.expert_ffn());
    same_int("num_local_experts", c.moe.num_experts, "num_experts", model.moe.num_experts);
    same_int("num_experts_per_tok", c.moe.topk, "moe_router_topk", model.moe.topk);
  } else if (architecture == Architecture::qwen3_moe || architecture == Architecture::qwen2_moe) {
    if (model.moe_layer_count() < model.num_layers)  // the dense layers' width shapes their weights
      same_int("intermediate_size", c.ffn(), "ffn_hidden_size", model.ffn());
    if (architecture == Architecture::qwen2_moe)
      same_int("shared_expert_intermediate_size", c.moe.shared_expert_ffn_hidden_size, "moe_shared_expert_intermediate_size",
               model.moe.shared_expert_ffn_hidden_size);
    same_int("moe_intermediate_size", c.expert_ffn(), "moe_ffn_hidden_size", model.expert_ffn());
    same_int("num_experts", c.moe.num_experts, "num_experts", model.moe.num_experts);
    same_int("num_experts_per_tok", c.moe.topk, "moe_router_topk", model.moe.topk);
    for (int l = 0; l < model.num_layers; ++l)
      if (c.moe_layer(l) != model.moe_layer(l))
        fail<ConfigError>("config.json ", file.path, ": mlp_only_layers and decoder_sparse_step make layer ", l, " ",
                          c.moe_layer(l) ? "sparse" : "dense", " but the strata model's is ", model.moe_layer(l) ? "MoE" : "dense",
                          " (--moe-layer-freq)");
    if (c.moe.routing.pre_softmax != model.moe.routing.pre_softmax)
      fail<ConfigError>("config.json ", file.path, ": norm_topk_prob is ", c.moe.routing.pre_softmax ? "false" : "true",
                        " but the strata model's router has pre_softmax=", model.moe.routing.pre_softmax ? "true" : "false",
                        " (norm_topk_prob false is --moe-router-pre-softmax)");
  } else if (architecture == Architecture::deepseek_v3) {
    if (model.moe_layer_count() < model.num_layers) same_int("intermediate_size", c.ffn(), "ffn_hidden_size", model.ffn());
    same_int("moe_intermediate_size", c.expert_ffn(), "moe_ffn_hidden_size", model.expert_ffn());
    same_int("n_routed_experts", c.moe.num_experts, "num_experts", model.moe.num_experts);
    same_int("num_experts_per_tok", c.moe.topk, "moe_router_topk", model.moe.topk);
    same_int("n_shared_experts x moe_intermediate_size", c.moe.shared_expert_ffn_hidden_size, "moe_shared_expert_intermediate_size",
             model.moe.shared_expert_ffn_hidden_size);
    same_real("routed_scaling_factor", c.moe.routing.scaling_factor, "moe_router_topk_scaling_factor", model.moe.routing.scaling_factor);
    same_int("n_group (1: none)", std::max(1, c.moe.routing.num_groups), "moe_router_num_groups (0 or 1: none)",
             std::max(1, model.moe.routing.num_groups));
    if (model.moe.routing.num_groups > 1)
      same_int("topk_group", c.moe.routing.group_topk, "moe_router_group_topk", model.moe.routing.group_topk);
    for (int l = 0; l < model.num_layers; ++l)
      if (c.moe_layer(l) != model.moe_layer(l))
        fail<ConfigError>("config.json ", file.path, ": first_k_dense_replace makes layer ", l, " ", c.moe_layer(l) ? "sparse" : "dense",
                          " but the strata model's is ", model.moe_layer(l) ? "MoE" : "dense", " (--moe-layer-freq)");
    same_int("q_lora_rank (null: 0)", c.q_lora_rank, "q_lora_rank", model.q_lora_rank);
    same_int("kv_lora_rank", c.kv_lora_rank, "kv_lora_rank", model.kv_lora_rank);
    same_int("qk_nope_head_dim", c.qk_head_dim, "qk_head_dim", model.qk_head_dim);
    same_int("qk_rope_head_dim", c.qk_pos_emb_head_dim, "qk_pos_emb_head_dim", model.qk_pos_emb_head_dim);
    same_int("v_head_dim", c.v_head_dim, "v_head_dim", model.v_head_dim);
    same_int("rope_interleave", c.rotary_interleaved, "rotary_interleaved", model.rotary_interleaved);
  } else {
    same_int(gpt ? "n_inner" : "intermediate_size", c.ffn(), "ffn_hidden_size", model.ffn());
  }
  same_int("vocab_size", c.vocab_size, "vocab_size", model.vocab_size);
  if (gpt) same_int("n_positions", c.positions(), "max_position_embeddings", model.positions());
  same_real(gpt ? "layer_norm_epsilon" : "rms_norm_eps", c.norm_epsilon, "norm_epsilon", model.norm_epsilon);
  if (!gpt) {
    if (architecture != Architecture::gpt_oss)  // gpt-oss's windows are compared per layer above
      same_int("sliding_window (null: -1 here)", c.window_size < 0 ? -1 : c.window_size + 1, "window_size + 1",
               model.window_size < 0 ? -1 : model.window_size + 1);
    same_real("rope_theta", c.rope_base, "rope_base", model.rope_base);
    same_int("head_dim", c.head_dim(), "kv_channels", model.head_dim());
    same_real("rope_scaling.factor (rope_type llama3)", c.rope_scaling_factor, "rope_scaling_factor", model.rope_scaling_factor);
    same_real("rope_scaling.factor (rope_type yarn)", c.yarn_scaling_factor, "yarn_scaling_factor", model.yarn_scaling_factor);
    if (model.yarn_scaling_factor > 0) {
      same_real("rope_scaling.original_max_position_embeddings (yarn)", c.yarn_original_max_positions,
                "yarn_original_max_positions", model.yarn_original_max_positions);
      same_real("rope_scaling.beta_fast", c.yarn_beta_fast, "yarn_beta_fast", model.yarn_beta_fast);
      same_real("rope_scaling.beta_slow", c.yarn_beta_slow, "yarn_beta_slow", model.yarn_beta_slow);
      same_int("rope_scaling.truncate", c.yarn_round_to_int, "yarn_round_to_int", model.yarn_round_to_int);
      same_real("the YaRN attention factor (rope_scaling.attention_factor, mscale, mscale_all_dim)",
                rope_attention_factor(c.rope_variant()), "the attention factor of yarn_mscale, yarn_mscale_all_dim",
                rope_attention_factor(model.rope_variant()));
    }
    if (model.rope_scaling_factor > 0) {
      same_real("rope_scaling.low_freq_factor", c.rope_low_freq_factor, "rope_low_freq_factor", model.rope_low_freq_factor);
      same_real("rope_scaling.high_freq_factor", c.rope_high_freq_factor, "rope_high_freq_factor", model.rope_high_freq_factor);
      same_real("rope_scaling.original_max_position_embeddings", c.rope_original_max_positions,
                "rope_original_max_positions", model.rope_original_max_positions);
    }
  }
}

struct SaveOptions {
  std::optional<SafetensorsDtype> dtype;          // F32, BF16, F16 or F64; unset: the parameters' own type
  std::uint64_t max_shard_bytes = 5'000'000'000;  // above this, shards + index (transformers' default "5GB")
  index_t padded_vocab = 0;                       // rows of the strata vocabulary tensors (0: config.padded_vocab(1))
  // config.json's bos_token_id and eos_token_id as JSON text (an id, or a list of ids); "": GPT-2
  // writes its last token (50256 for GPT-2's vocabulary), Llama leaves them out.
  std::string bos_token_id{}, eos_token_id{};
  // Llama's max_position_embeddings (RoPE has no table: the length the model was made for); 0: the
  // model's positions(). GPT-2's n_positions is always the rows of its position table.
  int max_position_embeddings = 0;
};

// The settings of an imported config.json that an export carries through unchanged.
inline void carry_settings(const HfConfig& source, SaveOptions& options) {
  options.bos_token_id = source.bos_token_id;
  options.eos_token_id = source.eos_token_id;
  options.max_position_embeddings = source.max_position_embeddings;
}

// The text of config.json for a strata model of this configuration.
inline std::string config_json(Architecture architecture, const models::ModelConfig& c, SafetensorsDtype dtype,
                               const SaveOptions& options = {}) {
  using json::boolean;
  using json::number;
  using json::quote;
  const std::string torch_dtype = quote(torch_dtype_name(dtype));
  architecture = hf_architecture(architecture, c);
  if (architecture == Architecture::gpt2)
    return hf_detail::json_object({
        {"architectures", "[" + quote("GPT2LMHeadModel") + "]"},
        {"model_type", quote("gpt2")},
        {"vocab_size", number(c.vocab_size)},
        {"n_positions", number(c.positions())},
        {"n_ctx", number(c.positions())},
        {"n_embd", number(c.hidden_size)},
        {"n_layer", number(c.num_layers)},
        {"n_head", number(c.num_attention_heads)},
        {"n_inner", number(c.ffn())},
        {"activation_function", quote("gelu_new")},
        {"layer_norm_epsilon", number(c.norm_epsilon)},
        {"initializer_range", number(c.init_method_std)},
        {"resid_pdrop", number(c.hidden_dropout)},
        {"embd_pdrop", number(c.hidden_dropout)},
        {"attn_pdrop", number(c.attention_dropout)},
        {"scale_attn_weights", boolean(true)},
        {"scale_attn_by_inverse_layer_idx", boolean(false)},
        {"reorder_and_upcast_attn", boolean(false)},
        {"tie_word_embeddings", boolean(true)},
        // GPT-2's <|endoftext|> is its last token (50256), unless the source said otherwise
        {"bos_token_id", options.bos_token_id.empty() ? number(c.vocab_size - 1) : options.bos_token_id},
        {"eos_token_id", options.eos_token_id.empty() ? number(c.vocab_size - 1) : options.eos_token_id},
        {"use_cache", boolean(true)},
        {"torch_dtype", torch_dtype},
    });
  const int groups = c.num_query_groups == 0 ? c.num_attention_heads : c.num_query_groups;
  std::vector<std::pair<std::string, std::string>> token_ids;
  if (!options.bos_token_id.empty()) token_ids.emplace_back("bos_token_id", options.bos_token_id);
  if (!options.eos_token_id.empty()) token_ids.emplace_back("eos_token_id", options.eos_token_id);
  std::vector<std::pair<std::string, std::string>> members{
      {"architectures", "[" + quote(std::string(architecture_class(architecture))) + "]"},
      {"model_type", quote(std::string(architecture_name(architecture)))},
      {"vocab_size", number(c.vocab_size)},
      {"hidden_size", number(c.hidden_size)},
      {"intermediate_size", number(c.ffn())},
      {"num_hidden_layers", number(c.num_layers)},
      {"num_attention_heads", number(c.num_attention_heads)},
      {"num_key_value_heads", number(groups)},
      {"head_dim", number(c.head_dim())},
      {"hidden_act", quote("silu")},
      {"max_position_embeddings", number(options.max_position_embeddings > 0 ? options.max_position_embeddings : c.positions())},
      {"rms_norm_eps", number(c.norm_epsilon)},
      {"rope_theta", number(c.rope_base)},
      {"attention_bias", boolean(false)},
      {"attention_dropout", number(c.attention_dropout)},
      {"mlp_bias", boolean(false)},
      {"pretraining_tp", number(1)},
      {"initializer_range", number(c.init_method_std)},
      {"tie_word_embeddings", boolean(false)},
      {"use_cache", boolean(true)},
      {"torch_dtype", torch_dtype},
  };
  // transformers' sliding_window counts the query's own key (strata's window does not)
  const std::string sliding_window = c.window_size >= 0 ? number(c.window_size + 1) : std::string("null");
  if (architecture == Architecture::mistral) {
    members.insert(members.end() - 3, {"sliding_window", sliding_window});
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [](const auto& m) { return m.first == "mlp_bias" || m.first == "pretraining_tp" || m.first == "attention_bias"; }),
                  members.end());
  }
  if (architecture == Architecture::mixtral) {  // intermediate_size is one expert's width
    members[4].second = number(c.expert_ffn());
    members.insert(members.end() - 3, {{"sliding_window", sliding_window},
                                       {"num_local_experts", number(c.moe.num_experts)},
                                       {"num_experts_per_tok", number(c.moe.topk)},
                                       {"output_router_logits", boolean(false)},
                                       {"router_aux_loss_coef", number(c.moe.aux_loss_coeff)},
                                       {"router_jitter_noise", number(0.0)}});
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [](const auto& m) { return m.first == "mlp_bias" || m.first == "pretraining_tp" || m.first == "attention_bias"; }),
                  members.end());
  }
  if (architecture == Architecture::gpt_oss) {  // intermediate_size is one expert's width; windows by layer_types
    members[4].second = number(c.expert_ffn());
    std::string types = "[";
    for (int l = 0; l < c.num_layers; ++l)
      types += std::string(l > 0 ? ", " : "") + quote(c.layer_window(l) >= 0 ? "sliding_attention" : "full_attention");
    members.insert(members.end() - 3, {{"sliding_window", sliding_window},
                                       {"layer_types", types + "]"},
                                       {"num_local_experts", number(c.moe.num_experts)},
                                       {"num_experts_per_tok", number(c.moe.topk)},
                                       {"output_router_logits", boolean(false)},
                                       {"router_aux_loss_coef", number(c.moe.aux_loss_coeff)},
                                       {"swiglu_alpha", number(kGptOssGluAlpha)},
                                       {"swiglu_limit", number(c.activation_clamp)}});
    for (auto& m : members)
      if (m.first == "attention_bias") m.second = boolean(true);
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [](const auto& m) { return m.first == "mlp_bias" || m.first == "pretraining_tp"; }),
                  members.end());
    if (c.yarn_scaling_factor <= 0)  // without rope_parameters GptOssConfig would take its default YaRN
      members.insert(members.end() - 3, {"rope_parameters", hf_detail::json_object({{"rope_type", quote("default")},
                                                                                   {"rope_theta", number(c.rope_base)}})});
  }
  if (architecture == Architecture::qwen3_moe || architecture == Architecture::qwen2_moe) {
    // intermediate_size: the dense layers'; the experts' is moe_intermediate_size
    std::string dense = "[";
    for (int l = 0; l < c.num_layers; ++l)
      if (!c.moe_layer(l)) dense += (dense.size() > 1 ? ", " : "") + std::to_string(l);
    if (architecture == Architecture::qwen2_moe)
      members.insert(members.end() - 3, {{"shared_expert_intermediate_size", number(c.moe.shared_expert_ffn_hidden_size)},
                                         {"qkv_bias", boolean(true)}});
    members.insert(members.end() - 3, {{"moe_intermediate_size", number(c.expert_ffn())},
                                       {"num_experts", number(c.moe.num_experts)},
                                       {"num_experts_per_tok", number(c.moe.topk)},
                                       {"norm_topk_prob", boolean(!c.moe.routing.pre_softmax)},
                                       {"decoder_sparse_step", number(1)},
                                       {"mlp_only_layers", dense + "]"},
                                       {"output_router_logits", boolean(false)},
                                       {"router_aux_loss_coef", number(c.moe.aux_loss_coeff)}});
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [](const auto& m) { return m.first == "mlp_bias" || m.first == "pretraining_tp"; }),
                  members.end());
  }
  if (architecture == Architecture::deepseek_v3) {  // intermediate_size: the dense layers'; head_dim: qk_rope_head_dim
    int dense = 0;
    while (dense < c.num_layers && !c.moe_layer(dense)) ++dense;
    const int groups = c.moe.routing.num_groups > 1 ? c.moe.routing.num_groups : 1;
    for (auto& m : members) {
      if (m.first == "head_dim") m.second = number(c.qk_pos_emb_head_dim);
      if (m.first == "num_key_value_heads") m.second = number(c.num_attention_heads);
    }
    members.insert(members.end() - 3, {{"q_lora_rank", c.q_lora_rank > 0 ? number(c.q_lora_rank) : std::string("null")},
                                       {"kv_lora_rank", number(c.kv_lora_rank)},
                                       {"qk_nope_head_dim", number(c.qk_head_dim)},
                                       {"qk_rope_head_dim", number(c.qk_pos_emb_head_dim)},
                                       {"v_head_dim", number(c.v_head_dim)},
                                       {"rope_interleave", boolean(c.rotary_interleaved)},
                                       {"moe_intermediate_size", number(c.expert_ffn())},
                                       {"n_routed_experts", number(c.moe.num_experts)},
                                       {"n_shared_experts", number(c.moe.shared_expert_ffn_hidden_size / c.expert_ffn())},
                                       {"num_experts_per_tok", number(c.moe.topk)},
                                       {"routed_scaling_factor", number(c.moe.routing.scaling_factor)},
                                       {"n_group", number(groups)},
                                       {"topk_group", number(groups > 1 ? c.moe.routing.group_topk : 1)},
                                       {"norm_topk_prob", boolean(c.moe.topk > 1)},
                                       {"first_k_dense_replace", number(dense)}});
    members.erase(std::remove_if(members.begin(), members.end(), [](const auto& m) { return m.first == "mlp_bias"; }),
                  members.end());
  }
  members.insert(members.end() - 3, token_ids.begin(), token_ids.end());  // before tie_word_embeddings, as transformers
  if (architecture != Architecture::llama && architecture != Architecture::mixtral && architecture != Architecture::mistral &&
      architecture != Architecture::deepseek_v3 && architecture != Architecture::gpt_oss)  // Qwen: no sliding window (its layers' window fields left at their defaults)
    members.insert(members.end() - 3, {"use_sliding_window", boolean(false)});
  if (c.yarn_scaling_factor > 0) {
    // transformers' attention factor: mscale / mscale_all_dim's when both are non-zero (DeepSeek-V3),
    // else 0.1 ln(factor) + 1 unless attention_factor says otherwise.
    std::vector<std::pair<std::string, std::string>> yarn{
        {"rope_type", quote("yarn")},
        {"factor", number(c.yarn_scaling_factor)},
        {"original_max_position_embeddings", number(c.yarn_original_max_positions)},
        {"beta_fast", number(c.yarn_beta_fast)},
        {"beta_slow", number(c.yarn_beta_slow)},
        {"truncate", boolean(c.yarn_round_to_int)}};
    const double factor = rope_attention_factor(c.rope_variant());
    if (c.yarn_mscale != 0 && c.yarn_mscale_all_dim != 0) {
      yarn.emplace_back("mscale", number(c.yarn_mscale));
      yarn.emplace_back("mscale_all_dim", number(c.yarn_mscale_all_dim));
    } else if (factor != rope_yarn_mscale(c.yarn_scaling_factor, 1.0)) {
      yarn.emplace_back("attention_factor", number(factor));
    }
    members.insert(members.end() - 3, {"rope_scaling", hf_detail::json_object(yarn)});
  }
  if (c.rope_scaling_factor > 0)
    members.insert(members.end() - 3,
                   {"rope_scaling", hf_detail::json_object({{"rope_type", quote("llama3")},
                                                            {"factor", number(c.rope_scaling_factor)},
                                                            {"low_freq_factor", number(c.rope_low_freq_factor)},
                                                            {"high_freq_factor", number(c.rope_high_freq_factor)},
                                                            {"original_max_position_embeddings",
                                                             number(c.rope_original_max_positions)}})});
  return hf_detail::json_object(members);
}

// ---- export ----


// Writes <dir>/config.json and the weights (model.safetensors, or model-0000k-of-0000n.safetensors
// shards and model.safetensors.index.json when they exceed options.max_shard_bytes), every file
// durably. get_global(strata_name, global_shape) returns the whole host tensor (Tensor<X>) of a
// strata parameter: from a single-rank model, or assembled from a checkpoint. Each parameter is
// fetched once, and released once its Hugging Face tensors are written. A stale model.safetensors
// (or index, and shards it no longer names) left by an earlier export to `dir` is removed after
// the new files are in place.
template <class GetGlobal>
void save_hf(const std::filesystem::path& dir, Architecture architecture, const models::ModelConfig& config,
             GetGlobal&& get_global, const SaveOptions& options = {}) {
  using Result = std::remove_cvref_t<std::invoke_result_t<GetGlobal&, const std::string&, const Shape&>>;
  using X = typename Result::value_type;
  static_assert(std::is_same_v<Result, Tensor<X>>,
                "hf::save_hf: get_global(name, global_shape) must return a host Tensor<X> of the whole parameter.");
  const SafetensorsDtype dtype = options.dtype.value_or(safetensors_dtype<X>());
  if (!is_safetensors_float(dtype))
    fail<ConfigError>("hf::save_hf: weights are written as F32, BF16, F16 or F64, not ", safetensors_dtype_code(dtype));
  const std::vector<TensorMapping> mappings =
      tensor_mappings(architecture, config, MappingOptions{.padded_vocab = options.padded_vocab});
  const std::size_t element = safetensors_dtype_size(dtype);

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail<FileError>("cannot create directory ", dir, ": ", ec.message());

  // The parameters whose pieces each file tensor is written from: one, or (a piece stacking every
  // expert, gpt-oss) every expert's; the tensor is written with the first of them.
  std::map<std::string, std::vector<std::pair<std::size_t, std::size_t>>> piece_users;  // name -> (mapping, piece)
  for (std::size_t m = 0; m < mappings.size(); ++m)
    for (std::size_t k = 0; k < mappings[m].pieces.size(); ++k) piece_users[mappings[m].pieces[k]].emplace_back(m, k);
  auto first_user = [&](std::size_t m, std::size_t k) { return piece_users.at(mappings[m].pieces[k]).front().first == m; };

  // Shards: whole parameters, in the model's order.
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t shard_bytes = 0, total_bytes = 0;
  for (std::size_t m = 0; m < mappings.size(); ++m) {
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < mappings[m].piece_shapes.size(); ++k) {
      if (!first_user(m, k)) continue;
      std::uint64_t n = element;
      for (std::int64_t x : mappings[m].piece_shapes[k]) n *= static_cast<std::uint64_t>(x);
      bytes += n;
    }
    if (!shards.back().empty() && options.max_shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(m);
    shard_bytes += bytes;
    total_bytes += bytes;
  }

  // Each parameter's global value, converted to `dtype` once, kept until its last piece is written.
  struct Fetched {
    std::vector<std::byte> bytes;
    std::size_t pieces_left = 0;
  };
  std::map<std::size_t, Fetched> fetched;
  auto fill_piece = [&](std::size_t m, std::size_t piece, std::span<std::byte> out) {
    const TensorMapping& map = mappings[m];
    auto it = fetched.find(m);
    if (it == fetched.end()) {
      const Tensor<X> global = get_global(map.strata_name, map.strata_shape);
      if (!(global.shape() == map.strata_shape))
        fail<ShapeError>("hf::save_hf: parameter '", map.strata_name, "' came back with shape ", global.shape().str(),
                         "; its global shape is ", map.strata_shape.str());
      Fetched f;
      f.bytes.resize(static_cast<std::size_t>(global.numel()) * element);
      safetensors_detail::store_elements(global.data(), static_cast<std::size_t>(global.numel()), dtype, f.bytes.data());
      f.pieces_left = map.pieces.size();
      it = fetched.emplace(m, std::move(f)).first;
    }
    const std::byte* in = it->second.bytes.data();
    const Shape& shape = map.strata_shape;
    const index_t rows = shape[0];
    const index_t cols = shape.rank() == 2 ? shape[1] : 1;
    // An expert's slice of a stacked piece [E, ...] starts at expert * (the slice's elements), its
    // rows placed as a piece of the slice's shape would place them (in piece 0).
    const std::vector<std::int64_t>& piece_shape = map.piece_shapes[map.expert >= 0 ? 0 : piece];
    index_t base = 0;
    if (map.expert >= 0) {
      base = map.expert;
      for (std::size_t k = 1; k < piece_shape.size(); ++k) base *= piece_shape[k];
    }
    const index_t piece_cols = piece_shape.back();  // the [in, out] layout's row length (conv1d)
    for (index_t r = 0; r < rows; ++r) {
      TensorMapping::Source s = map.row_source(r);
      if (map.expert >= 0) s.piece = 0;
      if (s.piece != static_cast<int>(piece)) continue;
      if (shape.rank() == 1 || !map.conv1d) {  // a whole row
        std::memcpy(out.data() + static_cast<std::size_t>(base + s.index * cols) * element,
                    in + static_cast<std::size_t>(r * cols) * element, static_cast<std::size_t>(cols) * element);
      } else {  // column s.index of the [in, out] piece: a strided copy
        hf_detail::copy_strided(in + static_cast<std::size_t>(r * cols) * element, out.data() + static_cast<std::size_t>(base + s.index) * element,
                             static_cast<std::size_t>(cols), static_cast<std::size_t>(piece_cols), element);
      }
    }
    if (--it->second.pieces_left == 0) fetched.erase(it);
  };

  auto file_name = [&](std::size_t k) {
    if (shards.size() == 1) return std::string(kSafetensorsModelFile);
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    return std::string(buffer);
  };
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (std::size_t k = 0; k < shards.size(); ++k) {
    SafetensorsWriter writer;
    writer.set_metadata("format", "pt");  // transformers refuses safetensors files without it
    for (std::size_t m : shards[k])
      for (std::size_t piece = 0; piece < mappings[m].pieces.size(); ++piece) {
        if (!first_user(m, piece)) continue;
        const auto& users = piece_users.at(mappings[m].pieces[piece]);
        writer.add(mappings[m].pieces[piece], dtype, mappings[m].piece_shapes[piece], [&fill_piece, &users](std::span<std::byte> out) {
          for (const auto& [user, user_piece] : users) fill_piece(user, user_piece, out);
        });
        weight_map.emplace_back(mappings[m].pieces[piece], file_name(k));
      }
    writer.write(dir / file_name(k));
  }
  checkpoint_detail::write_text_file_durably(dir / "config.json", config_json(architecture, config, dtype, options));

  const std::filesystem::path single = dir / kSafetensorsModelFile, index = dir / kSafetensorsIndexFile;
  if (shards.size() > 1) {
    std::sort(weight_map.begin(), weight_map.end());
    std::string text = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_bytes) +
                       "\n  },\n  \"weight_map\": {\n";
    for (std::size_t i = 0; i < weight_map.size(); ++i)
      text += "    " + json::quote(weight_map[i].first) + ": " + json::quote(weight_map[i].second) +
              (i + 1 < weight_map.size() ? ",\n" : "\n");
    text += "  }\n}\n";
    checkpoint_detail::write_text_file_durably(index, text);
    std::filesystem::remove(single, ec);  // transformers would prefer it over the index
  } else {
    std::filesystem::remove(index, ec);
  }
  // Shards of an earlier export that the new files do not name.
  std::set<std::string> written;
  for (std::size_t k = 0; k < shards.size(); ++k) written.insert(file_name(k));
  for (const auto& item : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = item.path().filename().string();
    if (name.starts_with("model-") && name.ends_with(".safetensors") && name.find("-of-") != std::string::npos &&
        !written.count(name))
      std::filesystem::remove(item.path(), ec);
  }
  checkpoint_detail::sync_directory(dir);
}

// Collective over ctx.world: exports a model that each rank holds whole but for tensor parallelism
// (pp = 1): every parameter is gathered over ctx.tp, and world rank 0 writes the files (save_hf);
// every rank returns once they are written. Holds the whole model on the host of each rank while
// writing, which suits the small and mid-sized models this convenience is for; export a large
// model from its checkpoint with save_hf.
template <class Context, class Model>
void save_hf_from_model(Context& ctx, const std::filesystem::path& dir, Model& model, SaveOptions options = {}) {
  if (ctx.config.pp != 1)
    fail<ConfigError>("hf::save_hf_from_model: the model is split over pp=", ctx.config.pp,
                      " pipeline stages; it needs every layer on each rank (pp=1), or export with hf::save_hf and a "
                      "getter that reads the checkpoint");
  using Traits = architecture_of<std::remove_cvref_t<Model>>;
  using X = typename Traits::element;
  const bool writer = ctx.world.rank() == 0;
  std::map<std::string, Tensor<X>> globals, experts;
  model.for_each_parameter([&](auto& p) {
    if (p.pipeline_copy) return;
    if (p.expert) {  // this rank's experts, gathered over the expert-tensor-parallel group
      experts.emplace(p.name, hf_detail::gather_parameter(ctx.expert_tp, p));
      return;
    }
    Tensor<X> global = hf_detail::gather_parameter(ctx.tp, p);
    if (p.name == "embedding.word.weight" && options.padded_vocab == 0) options.padded_vocab = p.global_shape[0];
    if (writer) globals.emplace(p.name, std::move(global));
  });
  // The routers' expert biases (DeepSeek-V3's e_score_correction_bias), replicated, in the element type.
  if constexpr (requires { model.for_each_persistent_tensor([](const std::string&, auto&) {}); })
    model.for_each_persistent_tensor([&](const std::string& name, auto& tensor) {
      const auto host = to_host(tensor);
      Tensor<X> out = Tensor<X>::empty(host.shape());
      for (index_t i = 0; i < host.numel(); ++i) out[i] = static_cast<X>(host[i]);
      if (writer) globals.emplace(name, std::move(out));
    });
  // Every expert to the writer: ep rank r holds experts [r E / ep, (r + 1) E / ep) of each MoE layer
  // and broadcasts them over its ep group (collective over ctx.ep, in the same order on every rank).
  if (const models::ModelConfig& c = model.config(); c.moe.enabled()) {
    using Space = typename std::remove_cvref_t<Model>::Space;
    const int ep = ctx.ep.size();
    const index_t per_rank = c.moe.num_experts / ep, h = c.hidden_size, w = c.expert_ffn();
    for (int layer = 0; layer < c.num_layers; ++layer) {
      if (!c.moe_layer(layer)) continue;
      std::vector<std::pair<std::string, Shape>> parts{{"fc1.weight", Shape{2 * w, h}}, {"fc2.weight", Shape{h, w}}};
      if (c.add_bias_linear) parts.insert(parts.end(), {{"fc1.bias", Shape{2 * w}}, {"fc2.bias", Shape{h}}});  // gpt-oss
      for (index_t e = 0; e < c.moe.num_experts; ++e)
        for (const auto& [part, shape] : parts) {
          const std::string name = "layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + "." + part;
          const int owner = static_cast<int>(e / per_rank);
          Tensor<X> whole;
          if (ep == 1) {
            whole = std::move(experts.at(name));
          } else {
            auto buffer = Tensor<X, Space>::empty(shape);
            if (ctx.ep.rank() == owner) strata::copy(buffer, experts.at(name));
            ctx.ep.broadcast(buffer.buffer(), owner);
            whole = to_host(buffer);
          }
          if (writer) globals.emplace(name, std::move(whole));
        }
    }
  }
  if (writer) {
    save_hf(dir, Traits::value, model.config(),
            [&](const std::string& name, const Shape&) -> Tensor<X> {
              auto it = globals.find(name);
              if (it == globals.end())
                fail<ConfigError>("hf::save_hf_from_model: the model has no parameter '", name, "', which ",
                                  architecture_class(Traits::value), " needs");
              Tensor<X> out = std::move(it->second);
              globals.erase(it);
              return out;
            },
            options);
  }
  ctx.world.barrier();
}

// ---- import ----

struct LoadOptions {
  bool check_config = true;  // read <dir>/config.json and check it against the model's configuration
};

// Loads the transformers checkpoint in `dir` (config.json + model.safetensors or shards with an
// index) into `model`, on each rank its own shards of the parameters it holds (any tp, any pipeline
// stage). No communication. Throws ConfigError when config.json does not fit the model, when a
// parameter has no Hugging Face tensor or a tensor has the wrong shape, and when the directory holds
// a tensor the architecture has no place for; FileError for missing or corrupt files.
template <class Context, class Model>
void load_hf(Context& ctx, const std::filesystem::path& dir, Model& model, Architecture architecture,
             const models::ModelConfig& config, const LoadOptions& options = {}) {
  const SafetensorsDirectory files(dir);
  MappingOptions mapping_options;
  if (options.check_config) {
    const HfConfig file = read_config(dir);
    check_config(file, architecture, config);
    if (llama_family(architecture) && file.tie_word_embeddings)
      fail<ConfigError>("config.json ", file.path, ": tie_word_embeddings = true cannot be imported: strata's Llama "
                        "(--untie-embeddings-and-output-weights) has an output layer of its own, so the model would be trained "
                        "and exported untied; strata compiles no tied Llama. To fine-tune it untied all the same, set "
                        "\"tie_word_embeddings\": false in config.json (without an lm_head.weight in the files, the output layer "
                        "then starts as a copy of model.embed_tokens.weight)");
    // An untied config whose files hold no lm_head.weight (a tied model whose config was untied
    // on purpose): the output layer starts from the embedding.
    mapping_options.llama_tied_output =
        llama_family(architecture) && !files.has("lm_head.weight") && files.has("model.embed_tokens.weight");
    if (mapping_options.llama_tied_output && ctx.world.rank() == 0)
      std::fprintf(stderr, "note: %s holds no lm_head.weight: the output layer starts as a copy of model.embed_tokens.weight "
                           "and is trained and exported untied\n", dir.string().c_str());
  } else {
    mapping_options.llama_tied_output =
        llama_family(architecture) && !files.has("lm_head.weight") && files.has("model.embed_tokens.weight");
  }
  if (architecture == Architecture::gpt2 && !files.has("transformer.wte.weight") && files.has("wte.weight"))
    mapping_options.gpt2_prefix = "";  // saved from GPT2Model rather than GPT2LMHeadModel
  // GPT-2 ties its output layer to the embedding: an lm_head.weight that differs from it would be
  // dropped, so it is refused (transformers would untie the model; strata's GPT cannot).
  if (const std::string wte = mapping_options.gpt2_prefix + "wte.weight";
      architecture == Architecture::gpt2 && files.has("lm_head.weight") && files.has(wte) &&
      !hf_detail::same_values(files, "lm_head.weight", wte))
    fail<ConfigError>(files.file_of("lm_head.weight").path(), " holds an lm_head.weight that differs from ", wte,
                      ", an untied output layer; strata's GPT ties its output layer to the word embedding and would drop it, "
                      "so it cannot be imported (save the model tied, with lm_head.weight equal to ", wte, ")");
  const std::string where = files.index_path().empty() ? detail::concat(files.directory() / kSafetensorsModelFile)
                                                       : detail::concat(files.index_path());

  // The padded vocabulary: the rows of the model's own embedding or output layer.
  mapping_options.padded_vocab = config.padded_vocab(ctx.tp.size());
  model.for_each_parameter([&](auto& p) {
    if ((p.name == "embedding.word.weight" || p.name == "output.weight") && p.global_shape.rank() == 2)
      mapping_options.padded_vocab = p.global_shape[0];
  });
  std::map<std::string, TensorMapping, std::less<>> by_name;
  for (TensorMapping& m : tensor_mappings(architecture, config, mapping_options)) by_name.emplace(m.strata_name, m);
  // Every tensor in the files must have a place (a config that does not match the files, or files of another model).
  std::set<std::string, std::less<>> expected;
  for (const auto& [name, m] : by_name)
    for (const std::string& piece : m.pieces) expected.insert(piece);
  for (const std::string& name : files.names())
    if (!expected.count(name) && !ignorable_tensor(architecture, name, mapping_options.llama_tied_output))
      fail<ConfigError>(where, " holds tensor '", name, "', which has no place in strata's ", architecture_name(architecture),
                        " of this configuration");

  model.for_each_parameter([&](auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    auto it = by_name.find(p.name);
    if (it == by_name.end())
      fail<ConfigError>("hf::load_hf: the model's parameter '", p.name, "' has no counterpart in ",
                        architecture_class(architecture));
    const TensorMapping& m = it->second;
    if (!(p.global_shape == m.strata_shape))
      fail<ConfigError>("hf::load_hf: the model's parameter '", p.name, "' has global shape ", p.global_shape.str(),
                        " but the configuration gives ", m.strata_shape.str());
    if (const int group = p.expert ? ctx.expert_tp.size() : ctx.tp.size(); p.shard.sharded && p.shard.parts != group)
      fail<ConfigError>("hf::load_hf: parameter '", p.name, "' is split over ", p.shard.parts, " ranks but the ",
                        p.expert ? "expert-tensor-parallel" : "tensor-parallel", " group has ", group);
    for (std::size_t k = 0; k < m.pieces.size(); ++k) {
      if (!files.has(m.pieces[k]))
        fail<ConfigError>(where, " has no tensor '", m.pieces[k], "', which strata's parameter '", p.name, "' needs");
      const SafetensorsEntry& e = files.entry(m.pieces[k]);
      if (e.shape != m.piece_shapes[k]) {
        SafetensorsEntry wanted;
        wanted.shape = m.piece_shapes[k];
        fail<ConfigError>("safetensors file ", files.file_of(m.pieces[k]).path(), ": tensor '", m.pieces[k], "' has shape ",
                          e.shape_str(), " but strata's ", architecture_name(architecture), " of this configuration needs ",
                          wanted.shape_str());
      }
    }
    // This rank's elements: where each comes from, and the span of each piece they touch.
    const index_t n = p.value.numel();
    const ShardIndexMap index_map = p.index_map();
    std::vector<index_t> first(m.pieces.size(), std::numeric_limits<index_t>::max()), last(m.pieces.size(), -1);
    for (index_t i = 0; i < n; ++i) {
      const TensorMapping::Source s = m.element_source(index_map(i));
      if (s.piece < 0) continue;
      first[s.piece] = std::min(first[s.piece], s.index);
      last[s.piece] = std::max(last[s.piece], s.index);
    }
    std::vector<std::vector<T>> spans(m.pieces.size());
    for (std::size_t k = 0; k < m.pieces.size(); ++k) {
      if (last[k] < 0) continue;
      spans[k].resize(static_cast<std::size_t>(last[k] - first[k] + 1));
      files.read<T>(m.pieces[k], std::span<T>(spans[k]), first[k]);
      // Weights that are NaN or infinite are refused here, not blamed on the learning rate later.
      for (std::size_t j = 0; j < spans[k].size(); ++j)
        if (!std::isfinite(static_cast<double>(spans[k][j])))
          fail<FileError>("safetensors file ", files.file_of(m.pieces[k]).path(), ": tensor '", m.pieces[k],
                          "' holds a non-finite value (", static_cast<double>(spans[k][j]), ") at element ",
                          first[k] + static_cast<index_t>(j), "; a model cannot be trained from it: export it again from a "
                          "run that had not diverged");
    }
    Tensor<T> local = Tensor<T>::zeros(p.value.shape());  // padded vocabulary rows stay zero
    for (index_t i = 0; i < n; ++i) {
      const TensorMapping::Source s = m.element_source(index_map(i));
      if (s.piece >= 0) local[i] = spans[s.piece][static_cast<std::size_t>(s.index - first[s.piece])];
    }
    strata::copy(p.value, local);  // into the parameter's own storage (a gradient buffer may alias it), on its device
  });
  // The routers' expert biases (DeepSeek-V3's e_score_correction_bias), whole on every rank.
  if constexpr (requires { model.for_each_persistent_tensor([](const std::string&, auto&) {}); })
    model.for_each_persistent_tensor([&](const std::string& name, auto& tensor) {
      using A = typename std::remove_cvref_t<decltype(tensor)>::value_type;
      auto it = by_name.find(name);
      if (it == by_name.end())
        fail<ConfigError>("hf::load_hf: the model's '", name, "' has no counterpart in ", architecture_class(architecture));
      const TensorMapping& m = it->second;
      if (!files.has(m.pieces[0]))
        fail<ConfigError>(where, " has no tensor '", m.pieces[0], "', which strata's '", name, "' needs");
      if (files.entry(m.pieces[0]).shape != m.piece_shapes[0] || !(tensor.shape() == m.strata_shape))
        fail<ConfigError>("safetensors file ", files.file_of(m.pieces[0]).path(), ": tensor '", m.pieces[0], "' has shape ",
                          files.entry(m.pieces[0]).shape_str(), " but strata's '", name, "' is ", tensor.shape().str());
      std::vector<A> values(static_cast<std::size_t>(tensor.numel()));
      files.read<A>(m.pieces[0], std::span<A>(values), 0);
      Tensor<A> local = Tensor<A>::empty(tensor.shape());
      for (index_t i = 0; i < local.numel(); ++i) local[i] = values[static_cast<std::size_t>(i)];
      auto handle = tensor;  // a handle on the model's own storage
      strata::copy(handle, local);
    });
  if (ctx.fp8) ctx.fp8->drop_weight_caches();  // new weights: the FP8 layers cast them again
}

// The same, for models::Gpt, models::Llama, models::Mixtral or a PipelineModel of one (the architecture and the
// configuration come from the model).
template <class Context, class Model>
void load_hf(Context& ctx, const std::filesystem::path& dir, Model& model, const LoadOptions& options = {}) {
  load_hf(ctx, dir, model, architecture_of<std::remove_cvref_t<Model>>::value, model.config(), options);
}

}  // namespace hf
STRATA_NAMESPACE_END
