// strata/models/config.hpp: `ModelConfig`, the numbers of a decoder-only language model (GPT-2 and
// Llama presets), and its validation against a parallel configuration before anything is allocated.
//
// A mixture-of-experts model (models/moe_llama.hpp) keeps its numbers in `moe` (MoeModelConfig;
// num_experts = 0, the default, is a dense model and leaves everything else as it was).
//
// Sizes derived from the configuration (the default ffn width 4 x hidden) use checked arithmetic,
// and every floating-point field must be finite and in its range: NaN compares false with
// everything, so each check is written so that NaN fails it.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "../backend/activation_options.hpp"
#include "../backend/attention_options.hpp"
#include "../backend/moe_routing.hpp"
#include "../backend/rope_options.hpp"
#include "../core/checked.hpp"
#include "../shard/parallel_config.hpp"
#include "../shard/partition.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

// The mixture-of-experts numbers, with the Megatron flag each one mirrors. Read only when
// num_experts > 0 (a MoE model); a dense model ignores the rest.
struct MoeModelConfig {
  int num_experts = 0;                     // --num-experts (0: a dense model)
  int topk = 2;                            // --moe-router-topk
  int expert_ffn_hidden_size = 0;          // --moe-ffn-hidden-size (0: the model's ffn_hidden_size)
  int shared_expert_ffn_hidden_size = 0;   // --moe-shared-expert-intermediate-size (0: no shared experts)
  bool shared_expert_gate = false;         // --moe-shared-expert-gate: the shared output times sigmoid(x . w) (Qwen2-MoE)
  MoeRouting routing{};                    // --moe-router-score-function, --moe-router-pre-softmax,
                                           // --moe-router-topk-scaling-factor
  MoeLoadBalancing load_balancing = MoeLoadBalancing::aux_loss;  // --moe-router-load-balancing-type
  double aux_loss_coeff = 0.0;             // --moe-aux-loss-coeff
  double z_loss_coeff = 0.0;               // --moe-z-loss-coeff
  bool expert_bias = false;                // --moe-router-enable-expert-bias
  double expert_bias_update_rate = 1e-3;   // --moe-router-bias-update-rate
  double capacity_factor = 0.0;            // --moe-expert-capacity-factor (0: no capacity, nothing dropped)
  MoeDropPolicy drop_policy = MoeDropPolicy::probability;  // --moe-token-drop-policy (probs / position)
  bool pad_to_capacity = false;            // --moe-pad-expert-input-to-capacity
  bool force_load_balancing = false;       // --moe-router-force-load-balancing (random logits, benchmarks)
  // --moe-token-dispatcher-type: read by models built with the moe_configured tag (models::Mixtral);
  // a model whose dispatcher is fixed at compile time (moe_alltoall / moe_allgather) ignores it.
  MoeDispatcherType token_dispatcher = MoeDispatcherType::alltoall;
  // --moe-layer-freq: 1 where layer l (0-based) is a MoE layer, 0 where it is a dense MLP of the
  // model's ffn_hidden_size (DeepSeek-V3's first dense layers); empty: every layer is a MoE layer.
  std::vector<int> layers;

  bool enabled() const { return num_experts > 0; }
};

struct ModelConfig {
  int num_layers = 2;
  int hidden_size = 64;
  int num_attention_heads = 4;
  int num_query_groups = 0;  // 0: multi-head attention
  int ffn_hidden_size = 0;   // 0: 4 * hidden_size
  int vocab_size = 257;
  int seq_length = 64;       // tokens per sample
  int max_position_embeddings = 0;  // rows of the learned position table (GPT); 0: seq_length
  int make_vocab_size_divisible_by = 128;
  double init_method_std = 0.02;
  double norm_epsilon = 1e-5;
  double rope_base = 10000.0;
  double hidden_dropout = 0.0;     // on the embedding output and on each block's output before the residual add
  double attention_dropout = 0.0;  // on the attention probabilities
  double label_smoothing = 0.0;
  MoeModelConfig moe{};  // mixture of experts (num_experts = 0: dense)

  // Building blocks of current open models, each a run-time option of the compiled model (Megatron's flag):
  int kv_channels = 0;              // --kv-channels: the head dimension (0: hidden_size / num_attention_heads)
  bool add_qkv_bias = false;        // --add-qkv-bias: a bias on q, k, v only (Qwen2)
  bool add_bias_linear = false;     // the Llama block's linear biases (Megatron's default without --disable-bias-linear;
                                    // gpt-oss): q, k, v, the output projection, the MLP, the router and experts
  bool qk_layernorm = false;        // --qk-layernorm: the model's norm over each head of q and k (Qwen3, OLMo 2)
  bool apply_layernorm_1p = false;  // --apply-layernorm-1p: every norm stores gamma - 1 (Nemotron)
  double rotary_percent = 1.0;      // --rotary-percent: the share of each head's dimensions RoPE turns
  bool rotary_interleaved = false;  // --rotary-interleaved: RoPE pairs (2i, 2i+1)
  double rope_scaling_factor = 0.0; // --use-rope-scaling with --rope-scaling-factor (Llama 3.1: 8); 0: off
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;  // Llama 3.1's (Megatron's fixed values)
  double rope_original_max_positions = 8192.0;
  // --position-embedding-type yarn with --rotary-scaling-factor (0 here: no YaRN) and its parameters
  // (backend/rope_options.hpp; Megatron's defaults when the flags are absent)
  double yarn_scaling_factor = 0.0;
  double yarn_original_max_positions = 4096.0;  // --yarn-original-max-position-embeddings
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;  // --yarn-beta-fast, --yarn-beta-slow
  double yarn_mscale = 1.0, yarn_mscale_all_dim = 0.0;  // --mscale, --mscale-all-dim
  bool yarn_round_to_int = true;  // --[no-]yarn-correction-range-round-to-int
  MlpActivation activation = MlpActivation::preset;  // --swiglu / --squared-relu / --quick-geglu (preset: the model's)
  double activation_clamp = 0.0;    // --activation-func-clamp-value (gated activations; 0: none)
  double glu_linear_offset = 0.0;   // --glu-linear-offset (gated activations)
  SoftmaxType softmax_type = SoftmaxType::vanilla;  // --softmax-type: attention sinks (gpt-oss: learnable)
  int window_size = -1;             // --window-size's left bound: query i sees keys i - window .. i (-1: all)
  std::vector<int> window_layers{};  // --window-attn-skip-freq: 1 where a layer has the window (empty: every layer)
  // Multi-token prediction (DeepSeek-V3; models/decoder.hpp): depths after the main head, each
  // predicting one token further, and the weight of their mean loss.
  int mtp_num_layers = 0;                // --mtp-num-layers (0: none)
  double mtp_loss_scaling_factor = 0.1;  // --mtp-loss-scaling-factor
  // Multi-latent attention (DeepSeek-V2/V3; layers/latent_attention.hpp), RoPE models only. The
  // sizes default to Megatron's (q_lora_rank 0 stands for its None: queries without compression).
  bool multi_latent_attention = false;  // --multi-latent-attention (qk_layernorm: the latents' RMSNorms, as Megatron's)
  int q_lora_rank = 0;                  // --q-lora-rank
  int kv_lora_rank = 32;                // --kv-lora-rank
  int qk_head_dim = 128;                // --qk-head-dim
  int qk_pos_emb_head_dim = 64;         // --qk-pos-emb-head-dim
  int v_head_dim = 128;                 // --v-head-dim

  // The window of layer `layer` (0-based): window_size where the layer has one, else -1.
  int layer_window(int layer) const {
    if (window_size < 0) return -1;
    if (window_layers.empty()) return window_size;
    return layer >= 0 && layer < static_cast<int>(window_layers.size()) && window_layers[static_cast<std::size_t>(layer)] != 0
               ? window_size
               : -1;
  }

  // Whether layer `layer` (0-based) has a mixture-of-experts MLP: every layer of a MoE model unless
  // moe.layers (--moe-layer-freq) says otherwise; none of a dense model.
  bool moe_layer(int layer) const {
    if (!moe.enabled()) return false;
    if (moe.layers.empty()) return true;
    return layer >= 0 && layer < static_cast<int>(moe.layers.size()) && moe.layers[static_cast<std::size_t>(layer)] != 0;
  }
  // The MoE layers among [begin, end) (a pipeline stage's layers; all of them by default).
  int moe_layer_count(int begin = 0, int end = -1) const {
    int n = 0;
    for (int l = begin; l < (end < 0 ? num_layers : end); ++l) n += moe_layer(l) ? 1 : 0;
    return n;
  }

  // The head dimension: kv_channels, or hidden_size / num_attention_heads when it is 0.
  int head_dim() const { return kv_channels != 0 ? kv_channels : (num_attention_heads > 0 ? hidden_size / num_attention_heads : 0); }
  // The rotated width of a head: int(head_dim x rotary_percent), as Megatron.
  int rotary_dim() const { return static_cast<int>(head_dim() * rotary_percent); }
  // `o` with the rotary variant's fields of this configuration: the rotated width (--rotary-percent
  // below 1), --rotary-interleaved, Llama 3.1's scaling and YaRN's. The base and the head size are
  // the attention's to set.
  RopeOptions rope_variant(RopeOptions o = {}) const {
    if (rotary_percent < 1) o.rotary_dim = rotary_dim();
    o.interleaved = rotary_interleaved;
    o.scaling_factor = rope_scaling_factor;
    o.low_freq_factor = rope_low_freq_factor;
    o.high_freq_factor = rope_high_freq_factor;
    o.original_max_positions = rope_original_max_positions;
    o.yarn_factor = yarn_scaling_factor;
    o.yarn_original_max_positions = yarn_original_max_positions;
    o.yarn_beta_fast = yarn_beta_fast;
    o.yarn_beta_slow = yarn_beta_slow;
    o.yarn_mscale = yarn_mscale;
    o.yarn_mscale_all_dim = yarn_mscale_all_dim;
    o.yarn_round_to_int = yarn_round_to_int;
    return o;
  }

  // The MLP width: ffn_hidden_size, or 4 x hidden_size when it is 0 (ConfigError when that does not fit an int).
  int ffn() const {
    return ffn_hidden_size != 0 ? ffn_hidden_size
                                : checked_int(checked_mul(4, hidden_size, "4 x hidden_size"),
                                              "the default ffn_hidden_size (4 x hidden_size)");
  }
  // One expert's MLP width: moe.expert_ffn_hidden_size, or ffn() when it is 0.
  int expert_ffn() const { return moe.expert_ffn_hidden_size != 0 ? moe.expert_ffn_hidden_size : ffn(); }
  // Rows of the learned position table: max_position_embeddings, or seq_length when it is 0.
  int positions() const { return max_position_embeddings != 0 ? max_position_embeddings : seq_length; }
  index_t padded_vocab(int tp) const { return padded_vocab_size(vocab_size, tp, make_vocab_size_divisible_by); }

  // GPT-2 shapes (vocab padded as Megatron's GPT2BPETokenizer: 50257).
  static ModelConfig gpt2_124m() { return {12, 768, 12, 0, 3072, 50257, 1024}; }
  static ModelConfig gpt2_350m() { return {24, 1024, 16, 0, 4096, 50257, 1024}; }
  // Llama shapes.
  static ModelConfig llama2_7b() { return {32, 4096, 32, 32, 11008, 32000, 4096}; }
  static ModelConfig llama3_8b() {
    ModelConfig c{32, 4096, 32, 8, 14336, 128256, 8192};
    c.rope_base = 500000.0;
    return c;
  }
};

// The mixture-of-experts numbers (num_experts > 0; ep and etp against them are checked with the
// parallel layout). Throws ConfigError naming the first problem (value, reason, what to do).
inline void validate_moe(const MoeModelConfig& m, const ParallelConfig& p) {
  if (m.topk < 1 || m.topk > m.num_experts)
    fail<ConfigError>("moe topk=", m.topk, " must be between 1 and num_experts=", m.num_experts,
                      ": each token goes to topk different experts (set --moe-router-topk, Mixtral uses 2)");
  if (m.shared_expert_ffn_hidden_size < 0 || m.shared_expert_ffn_hidden_size % p.tp != 0)
    fail<ConfigError>("moe shared_expert_ffn_hidden_size=", m.shared_expert_ffn_hidden_size,
                      " must be 0 (no shared experts) or a positive multiple of tp=", p.tp,
                      ": the shared experts are a tensor-parallel MLP split over tp");
  if (m.shared_expert_gate && m.shared_expert_ffn_hidden_size == 0)
    fail<ConfigError>("moe shared_expert_gate is set without shared experts: the gate scales the shared experts' output; "
                      "give --moe-shared-expert-intermediate-size too, or drop --moe-shared-expert-gate");
  if (!(std::isfinite(m.routing.scaling_factor) && m.routing.scaling_factor > 0))
    fail<ConfigError>("moe router scaling_factor=", m.routing.scaling_factor,
                      " must be a finite positive number (1 leaves the routing weights as they are)");
  if (m.routing.pre_softmax && m.routing.score != MoeScore::softmax)
    fail<ConfigError>("moe pre_softmax applies to the softmax score function only; turn it off with the sigmoid scores");
  check_moe_group_routing("moe", m.routing, m.num_experts, m.topk);
  if (!(std::isfinite(m.aux_loss_coeff) && m.aux_loss_coeff >= 0))
    fail<ConfigError>("moe aux_loss_coeff=", m.aux_loss_coeff, " must be a finite number >= 0 (0 turns the aux loss off; 1e-2 is usual)");
  if (!(std::isfinite(m.z_loss_coeff) && m.z_loss_coeff >= 0))
    fail<ConfigError>("moe z_loss_coeff=", m.z_loss_coeff, " must be a finite number >= 0 (0 turns the z-loss off; 1e-3 is usual)");
  if (!(std::isfinite(m.expert_bias_update_rate) && m.expert_bias_update_rate >= 0))
    fail<ConfigError>("moe expert_bias_update_rate=", m.expert_bias_update_rate,
                      " must be a finite number >= 0 (Megatron's default is 1e-3)");
  if (!(std::isfinite(m.capacity_factor) && m.capacity_factor >= 0))
    fail<ConfigError>("moe capacity_factor=", m.capacity_factor,
                      " must be a finite number >= 0 (0: no capacity, no token dropped; 1.0 is usual when dropping)");
  if (m.pad_to_capacity && m.capacity_factor <= 0)
    fail<ConfigError>("moe pad_to_capacity needs a capacity, but capacity_factor=", m.capacity_factor,
                      "; set capacity_factor > 0 (e.g. 1.0) or turn padding off");
  int moe_layers = 0;
  for (const int x : m.layers) {
    if (x != 0 && x != 1)
      fail<ConfigError>("the MoE layer pattern (--moe-layer-freq) holds ", x, "; each layer is 1 (MoE) or 0 (dense MLP)");
    moe_layers += x;
  }
  if (!m.layers.empty() && moe_layers == 0)
    fail<ConfigError>("the MoE layer pattern (--moe-layer-freq) makes every layer dense; train a dense model (no "
                      "--num-experts), or mark at least one layer 1");
}

// Throws ConfigError naming the first problem (value, reason, what to do).
inline void validate(const ModelConfig& m, const ParallelConfig& p, bool sequence_parallel, int world_size = -1) {
  ModelDims dims{};
  dims.num_layers = m.num_layers;
  dims.hidden_size = m.hidden_size;
  dims.num_attention_heads = m.num_attention_heads;
  dims.num_query_groups = m.num_query_groups;
  dims.ffn_hidden_size = m.ffn();
  dims.vocab_size = m.vocab_size;
  dims.seq_length = m.seq_length;
  dims.sequence_parallel = sequence_parallel;
  dims.num_experts = m.moe.num_experts;
  dims.expert_ffn_hidden_size = m.moe.num_experts > 0 ? m.expert_ffn() : 0;
  dims.kv_channels = m.kv_channels;
  if (m.kv_channels < 0)
    fail<ConfigError>("kv_channels=", m.kv_channels, " must be positive (or 0 for hidden_size / num_attention_heads)");
  check(p, dims, world_size);
  if (!(std::isfinite(m.init_method_std) && m.init_method_std > 0))
    fail<ConfigError>("init_method_std=", m.init_method_std, " must be a finite positive number (Megatron's default is 0.02)");
  if (!(m.hidden_dropout >= 0 && m.hidden_dropout < 1))
    fail<ConfigError>("hidden_dropout=", m.hidden_dropout, " must be in [0, 1) (0 disables dropout)");
  if (!(m.attention_dropout >= 0 && m.attention_dropout < 1))
    fail<ConfigError>("attention_dropout=", m.attention_dropout, " must be in [0, 1) (0 disables dropout)");
  if (m.max_position_embeddings < 0 || (m.max_position_embeddings != 0 && m.max_position_embeddings < m.seq_length))
    fail<ConfigError>("max_position_embeddings=", m.max_position_embeddings, " is less than seq_length=", m.seq_length,
                      ": the position table needs a row per position of a sample (raise --max-position-embeddings or "
                      "lower --seq-length)");
  if (!(m.label_smoothing >= 0 && m.label_smoothing < 1))
    fail<ConfigError>("label_smoothing=", m.label_smoothing, " must be in [0, 1) (0 disables smoothing)");
  if (!(std::isfinite(m.rope_base) && m.rope_base > 0))
    fail<ConfigError>("rope_base=", m.rope_base, " must be a finite positive number (10000 for Llama 2, 500000 for Llama 3)");
  if (!(std::isfinite(m.norm_epsilon) && m.norm_epsilon > 0))
    fail<ConfigError>("norm_epsilon=", m.norm_epsilon, " must be a finite positive number (1e-5 is usual)");
  if (!(m.rotary_percent > 0 && m.rotary_percent <= 1))
    fail<ConfigError>("rotary_percent=", m.rotary_percent, " must be in (0, 1] (the share of each head's dimensions RoPE turns)");
  if (m.rotary_percent < 1 && (m.rotary_dim() < 2 || m.rotary_dim() % 2 != 0))
    fail<ConfigError>("rotary_percent=", m.rotary_percent, " turns ", m.rotary_dim(), " of the ", m.head_dim(),
                      " dimensions of a head; RoPE turns pairs, so the width must be even and at least 2 (choose "
                      "another --rotary-percent)");
  if (!(std::isfinite(m.rope_scaling_factor) && m.rope_scaling_factor >= 0))
    fail<ConfigError>("rope_scaling_factor=", m.rope_scaling_factor, " must be a finite number >= 0 (0: no scaling; Llama 3.1 uses 8)");
  if (m.rope_scaling_factor > 0 && !(m.rope_low_freq_factor > 0 && m.rope_high_freq_factor > m.rope_low_freq_factor &&
                                     m.rope_original_max_positions > 0))
    fail<ConfigError>("rope scaling needs 0 < low_freq_factor < high_freq_factor and a positive original context, got ",
                      m.rope_low_freq_factor, ", ", m.rope_high_freq_factor, ", ", m.rope_original_max_positions,
                      " (Llama 3.1: 1, 4, 8192)");
  if (!(std::isfinite(m.yarn_scaling_factor) && m.yarn_scaling_factor >= 0))
    fail<ConfigError>("yarn_scaling_factor=", m.yarn_scaling_factor, " must be a finite number >= 0 (0: no YaRN; gpt-oss uses 32)");
  if (m.yarn_scaling_factor > 0) {
    if (m.rope_scaling_factor > 0)
      fail<ConfigError>("YaRN (yarn_scaling_factor=", m.yarn_scaling_factor, ") and Llama 3.1's rope scaling (rope_scaling_factor=",
                        m.rope_scaling_factor, ") each rescale the rotary frequencies; choose one");
    if (!(std::isfinite(m.yarn_original_max_positions) && m.yarn_original_max_positions > 0))
      fail<ConfigError>("yarn_original_max_positions=", m.yarn_original_max_positions,
                        " must be a finite positive number (the context the model was trained at; gpt-oss: 4096)");
    if (!(std::isfinite(m.yarn_beta_fast) && std::isfinite(m.yarn_beta_slow) && m.yarn_beta_slow > 0 &&
          m.yarn_beta_fast > m.yarn_beta_slow))
      fail<ConfigError>("yarn beta_fast=", m.yarn_beta_fast, " and beta_slow=", m.yarn_beta_slow,
                        " must be finite with 0 < beta_slow < beta_fast (rotations over the original context; 32 and 1)");
    if (!(std::isfinite(m.yarn_mscale) && std::isfinite(m.yarn_mscale_all_dim)) ||
        !(rope_yarn_mscale(m.yarn_scaling_factor, m.yarn_mscale_all_dim) > 0))
      fail<ConfigError>("yarn mscale=", m.yarn_mscale, " and mscale_all_dim=", m.yarn_mscale_all_dim,
                        " must be finite, and 0.1 mscale_all_dim ln(factor) + 1 positive (Megatron's defaults: 1 and 0)");
  }
  if (m.window_size < -1)
    fail<ConfigError>("window_size=", m.window_size, " must be -1 (no sliding window) or a number of keys >= 0 (Mistral: 4095)");
  if (!m.window_layers.empty()) {
    if (static_cast<int>(m.window_layers.size()) != m.num_layers)
      fail<ConfigError>("the sliding-window pattern (--window-attn-skip-freq) has ", m.window_layers.size(),
                        " entries for num_layers=", m.num_layers, "; give one 1 (window) or 0 (full attention) per layer");
    for (const int x : m.window_layers)
      if (x != 0 && x != 1)
        fail<ConfigError>("the sliding-window pattern (--window-attn-skip-freq) holds ", x,
                          "; each layer is 1 (window) or 0 (full attention)");
  }
  if (!(std::isfinite(m.activation_clamp) && m.activation_clamp >= 0))
    fail<ConfigError>("activation_clamp=", m.activation_clamp, " must be a finite number >= 0 (0: no clamp; gpt-oss uses 7)");
  if (m.add_bias_linear && m.multi_latent_attention)
    fail<ConfigError>("add_bias_linear (no --disable-bias-linear) with multi-latent attention: its projections have no "
                      "biases here, as DeepSeek's; add --disable-bias-linear");
  if (m.moe.enabled() && m.activation == MlpActivation::squared_relu)
    fail<ConfigError>("the experts of a mixture-of-experts model run a gated activation (SwiGLU, or quick GeGLU with "
                      "--quick-geglu); --squared-relu needs a dense model");
  if (m.make_vocab_size_divisible_by < 1)
    fail<ConfigError>("make_vocab_size_divisible_by=", m.make_vocab_size_divisible_by, " must be at least 1");
  if (m.mtp_num_layers < 0 || m.mtp_num_layers >= m.seq_length)
    fail<ConfigError>("mtp_num_layers=", m.mtp_num_layers, " (--mtp-num-layers) must be >= 0 (0: no multi-token prediction) "
                      "and below seq_length=", m.seq_length, " (depth k predicts the token k + 1 places ahead)");
  if (!(std::isfinite(m.mtp_loss_scaling_factor) && m.mtp_loss_scaling_factor >= 0))
    fail<ConfigError>("mtp_loss_scaling_factor=", m.mtp_loss_scaling_factor,
                      " (--mtp-loss-scaling-factor) must be a finite number >= 0 (DeepSeek-V3: 0.3, then 0.1)");

  if (m.moe.enabled()) {
    if (!m.moe.layers.empty() && static_cast<int>(m.moe.layers.size()) != m.num_layers)
      fail<ConfigError>("the MoE layer pattern (--moe-layer-freq) has ", m.moe.layers.size(), " entries for num_layers=",
                        m.num_layers, "; give one 1 (MoE) or 0 (dense MLP) per layer");
    validate_moe(m.moe, p);
  }
}

}  // namespace models
STRATA_NAMESPACE_END
