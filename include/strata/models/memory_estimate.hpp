// strata/models/memory_estimate.hpp: `MemoryEstimate`, the bytes one rank of a decoder-only model
// (GPT or Llama, `DecoderShape`) needs for training, computed from its ModelConfig before anything
// is allocated -- Megatron's "theoretical memory usage" report, for host RAM today and for device
// memory later.
//
// Per rank, with T the parameter/activation type and A = accumulate_t<T> (gradients, optimizer):
//   parameters   P x sizeof(T), with P this rank's parameter count (sharded tensors / tp)
//   gradients    P x sizeof(A)
//   optimizer    P x 3 x sizeof(A)       AdamW's main copy, exp_avg and exp_avg_sq
//   activations  what forward keeps for backward, for one micro-batch of b sequences of s tokens,
//                per layer Korthikanti et al. (2022) without their attention-probability term
//                (2.5 a s elements per token): every strata attention (the flash kernels, cuDNN,
//                the CPU twin) keeps the log-sum-exp of each head and row instead, a values of A:
//                  sequence parallel: s b (17 h / tp in T + a / tp in A)
//                  otherwise:         s b (5 h + 12 h / tp in T + a / tp in A)
//                plus the embedding output and final norm (s b h, sharded under sequence
//                parallelism), and for the output layer and the loss either
//                  unfused: the logits with their softmax (2 s b V / tp, in A), or
//                  fused (classifier_block_bytes > 0, the budget of DecoderModel's FusedLoss
//                  blocks): one block of logits [rows, V / tp] in T, rows = budget / row bytes
//                  (at least 1, at most s b), and the final norm's output gradient (s b h, in T,
//                  sharded under sequence parallelism).
//                A mixture-of-experts layer (each layer of a MoE model, or those ModelConfig::moe
//                .layers marks 1) keeps, instead of the dense MLP's intermediate (the 8 h / tp of
//                the 12 h / tp above, Korthikanti's 4h-wide fc1 and fc2 inputs):
//                  the router's logits          T_r x E in A, T_r the tokens this rank routes
//                                               (s b / tp: the sequence is split over tp with or
//                                               without sequence parallelism)
//                  the experts' rows            rows x (h + 3 w / etp) in T: each row its dispatched
//                                               input, the gated fc1's output and the activation's,
//                                               w the expert width; rows = T_r x topk (the tokens
//                                               dispatched to this rank's ep group, as many as it
//                                               sends on average), or with pad_to_capacity every
//                                               expert's whole capacity (E x capacity, capacity =
//                                               ceil(T_r topk / E x factor), at most T_r)
//                  the shared experts           s b (3 w_s / tp) in T, a dense MLP of width w_s
//                A dense layer of a MoE model counts as a dense model's. Each multi-token
//                prediction depth (on the head's stage) counts as one more layer, plus its
//                embedding output, three norm outputs and the fused output gradient (5 s b h,
//                sharded under sequence parallelism).
// Activation recompute (RecomputeConfig, models/recompute.hpp) changes what the layers keep:
//   selective, attention_core  a layer drops the attention's output and lse (a n d / tp in T and
//                              a / tp in A per token; an FP8 projection's codes of the output too)
//   selective, moe_activation  a MoE layer drops the experts' activation (rows x w / etp in T, or its
//                              one-byte codes for FP8 experts)
//   selective, moe_block       a MoE layer keeps the block's input (s b h, / tp under sequence
//                              parallelism) in place of the MoE tensors above
//   full, uniform n            each chunk of n of the piece's layers keeps its input alone
//   full, block n              the piece's first n layers keep their input alone
// and the backward holds again, beside one layer's backward, what one recompute makes: a chunk's
// layers (uniform), one layer (block), or one module's tensors (selective; an FP8 expert activation
// is made in T before its cast).
// Parameter counts are exact (a test compares them with the models); activations are an estimate
// of the same order as the real use. Every product is checked (core/checked.hpp): a configuration
// too large for 64-bit byte counts throws ConfigError instead of wrapping.
//
// Under pipeline parallelism a rank holds a piece of the model (`ModelPiece`): the layers of its
// chunks, the embedding on the first stage, the final norm and output layer on the last (with a
// tied output layer, a copy of the word embedding there). estimate_pipeline_rank_memory sums its
// chunks' parameters and counts the activations of the micro-batch chunks its schedule keeps in
// flight at its peak (pipeline::claimed_peak_in_flight), each as large as its largest chunk's; the
// distributed optimizer divides the optimizer state by dp. A schedule that splits the backward
// (zero-bubble) also holds, for the micro-batch chunk between its input half and its weight half,
// the output gradient of every linear layer whose weight gradient waits
// (deferred_weight_gradient_bytes: per layer and token, the qkv projection's (heads + 2 groups) d / tp
// and the fc1's (2 w / tp gated, else w / tp), and h for each row-parallel one, the output projection
// and fc2, whose gradient is whole on the sequence even under sequence parallelism; a MoE layer's
// experts take their weight gradients at once, its shared experts defer theirs).
//
// Under context parallelism the activations are those of the rank's local tokens (the caller
// passes seq_length / cp), and context_parallel_attention_bytes adds the transient buffers of one
// layer's attention backward (the largest moment of its exchanges; local = the rank's s / cp
// tokens, kv = local x b x groups / tp x d elements, q = local x b x heads / tp x d):
//   p2p        the ring's keys, values and their running gradient sums, each held and arriving,
//              and one step's block gradients (10 kv), plus one block's dq, dk, dv (q / 2 + kv)
//   allgather  every rank's keys, values and their gradients at once (4 cp kv), plus one block's
//              dq, dk, dv (q / 2 + kv)
//   a2a        one all-to-all's send and receive buffers of the largest tensor (2 q) and the
//              whole-sequence dq, dk, dv of this rank's heads (q + 2 kv)
//   a2a+p2p    the ring's buffers over its runs of heads / a heads (the same element counts as
//              p2p's: 11 kv + q / 2) beside dout, dq, dk, dv of those heads (2 q + 2 kv)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "../backend/moe_routing.hpp"
#include "../comm/parallel_context.hpp"
#include "../core/checked.hpp"
#include "../core/dtype.hpp"
#include "../layers/chunked_classifier.hpp"
#include "config.hpp"
#include "recompute.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

// The choices of a decoder model that change its parameter count.
struct DecoderShape {
  bool learned_positions = true;  // GPT: learned position embedding [seq, hidden]
  bool tied_output = true;        // GPT: the output layer reuses the word embedding
  bool linear_bias = true;        // GPT: every linear layer has a bias
  bool norm_bias = true;          // GPT: LayerNorm (weight + bias); Llama: RMSNorm (weight)
  bool gated_mlp = false;         // Llama: SwiGLU, fc1 produces [gate; up]

  static constexpr DecoderShape gpt() { return {true, true, true, true, false}; }
  static constexpr DecoderShape llama() { return {false, false, false, false, true}; }
};

// Bytes per element of the parameters / activations (T) and of gradients and optimizer state (A).
struct ElementBytes {
  std::int64_t value = 4;       // sizeof(T)
  std::int64_t accumulate = 4;  // sizeof(accumulate_t<T>)
};

template <class T>
constexpr ElementBytes element_bytes_of() {
  return {static_cast<std::int64_t>(sizeof(T)), static_cast<std::int64_t>(sizeof(accumulate_t<T>))};
}

struct MemoryEstimate {
  std::int64_t parameters = 0;        // this rank's parameter count
  std::int64_t parameter_bytes = 0;
  std::int64_t gradient_bytes = 0;
  std::int64_t optimizer_bytes = 0;
  std::int64_t activation_bytes = 0;  // the micro-batches in flight at the peak (one without a pipeline)
  std::int64_t fp8_cache_bytes = 0;   // FP8 layers' weight caches (their weights' codes) and a GEMM's own codes

  std::int64_t total() const {
    std::int64_t sum = checked_add(parameter_bytes, gradient_bytes, "memory estimate");
    sum = checked_add(sum, optimizer_bytes, "memory estimate");
    sum = checked_add(sum, fp8_cache_bytes, "memory estimate");
    return checked_add(sum, activation_bytes, "memory estimate");
  }
};

// The transient bytes of one layer's context-parallel attention backward (see the top); 0 at cp 1.
inline std::int64_t context_parallel_attention_bytes(const ModelConfig& m, int tp, int cp, ContextParallelComm comm,
                                                     std::int64_t micro_batch_size, ElementBytes bytes) {
  if (cp <= 1) return 0;
  const char* what = "context-parallel attention memory";
  const std::int64_t heads = m.num_attention_heads, groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const std::int64_t d = m.hidden_size / heads, local = m.seq_length / cp;
  const std::int64_t kv = checked_product(what, local, micro_batch_size, groups / tp, d);
  const std::int64_t q = checked_product(what, local, micro_batch_size, heads / tp, d);
  std::int64_t elements = 0;
  switch (comm) {
    case ContextParallelComm::allgather: elements = checked_add(checked_mul(4 * cp, kv, what), q / 2 + kv, what); break;
    case ContextParallelComm::a2a: elements = checked_add(checked_mul(3, q, what), 2 * kv, what); break;
    case ContextParallelComm::a2a_p2p: elements = checked_add(checked_mul(13, kv, what), 2 * q + q / 2, what); break;
    default: elements = checked_add(checked_mul(11, kv, what), q / 2, what); break;
  }
  return checked_mul(elements, bytes.value, what);
}

// What a rank holds of the model (the whole model by default).
struct ModelPiece {
  std::int64_t layers = -1;  // transformer layers; -1: all of them
  bool embedding = true;     // the word (and position) embedding: the first pipeline stage
  bool head = true;          // the final norm and the output layer: the last pipeline stage
  int ep = 1, etp = 1;       // mixture of experts: num_experts / ep experts, each split over etp
  std::int64_t first_layer = 0;  // the global index of its first layer (which are MoE layers: ModelConfig::moe_layer)

  std::int64_t layer_count(const ModelConfig& m) const { return layers < 0 ? m.num_layers : layers; }
  // Its MoE layers (ModelConfig::moe_layer over its layers); 0 for a dense model.
  std::int64_t moe_layer_count(const ModelConfig& m) const {
    const std::int64_t begin = layers < 0 ? 0 : first_layer;
    return m.moe_layer_count(static_cast<int>(begin), static_cast<int>(begin + layer_count(m)));
  }
};

// The transformer layers whose linear layers run their GEMMs in FP8: layers [first, end) of the
// model (--first-last-layers-bf16 leaves some out); none by default. Each FP8 linear layer keeps its
// weight's codes in both layouts for the step (the weight cache: 2 bytes per weight; W^T alone, 1
// byte, without `forward_codes_cached`). Under the
// per-tensor recipes (delayed, tensorwise; `codes_kept`) its forward also keeps the one-byte codes
// of its input^T for the weight gradient in place of the input (layers/fp8_linear.hpp): the norms'
// outputs (the qkv and fc1 inputs) and the activation's output (fc2's input) are then held as codes
// instead of T, and the output projection's input, which the attention keeps anyway, is held twice
// (in T by the attention, as codes by the projection) unless `attention_output_recast`
// (Fp8Options::recast_attention_output: the projection holds the attention's tensor and casts it again).
// With `activation_codes_later` (the delayed recipe's Fp8Options::activation_codes_in_backward, where a
// dense MLP's activation runs inside the casts: GELU, SwiGLU without clamp or offset) fc2 keeps
// nothing of its input; fc1's backward cast writes its codes^T (a byte per element of one layer's
// activation, until fc2's weight gradient has read them).
// With `experts` (the delayed recipe: layers/moe/experts.hpp) the MoE layers' experts run FP8 too:
// their weights' codes in both layouts (2 bytes per local expert weight; 1 where the cache keeps W^T
// alone, the forward's codes of one projection existing while its GEMMs run; or both layouts while
// each projection's GEMMs run without a weight cache), and each dispatched row keeps the codes of
// its input and of the activation (h + w / etp bytes) instead of both in T.
struct Fp8Layers {
  std::int64_t first = 0, end = 0;
  bool codes_kept = true;
  bool attention_output_recast = false;
  bool activation_codes_later = false;
  bool experts = false;
  // The weight cache keeps the forward's layout too (Fp8Options::cache_forward_weights); without it,
  // one byte per weight, and the largest weight's forward codes exist while its GEMM runs.
  bool forward_codes_cached = true;
  // Any weight cache (Fp8Options::cache_weights, --fp8-weight-cache none): without one, no weight's
  // codes outlive its GEMM, and the largest weight's exist while its GEMM runs.
  bool weight_cache = true;
  // How many of `piece`'s layers are FP8 layers, and how many of those are MoE layers.
  std::int64_t in(const ModelConfig& m, const ModelPiece& piece) const {
    const auto [begin, stop] = overlap(m, piece);
    return stop - begin;
  }
  std::int64_t moe_in(const ModelConfig& m, const ModelPiece& piece) const {
    const auto [begin, stop] = overlap(m, piece);
    return stop > begin ? m.moe_layer_count(static_cast<int>(begin), static_cast<int>(stop)) : 0;
  }

 private:
  // The global layers [begin, stop) that are both the piece's and FP8 (begin == stop: none).
  std::pair<std::int64_t, std::int64_t> overlap(const ModelConfig& m, const ModelPiece& piece) const {
    const std::int64_t piece_begin = piece.layers < 0 ? 0 : piece.first_layer;
    const std::int64_t begin = std::max(piece_begin, first), stop = std::min(piece_begin + piece.layer_count(m), end);
    return {begin, std::max(begin, stop)};
  }
};

// Per FP8 layer (see Fp8Layers): the weight cache's bytes on one tensor-parallel rank (the attention's
// projections, and a dense layer's MLP: both layouts, or W^T alone), and the change of the bytes
// kept per token.
inline std::int64_t fp8_weight_cache_bytes(const ModelConfig& m, int tp, bool gated_mlp, bool dense_mlp,
                                           bool both_layouts = true) {
  const char* what = "FP8 weight cache";
  const std::int64_t h = m.hidden_size, heads = m.num_attention_heads, groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const std::int64_t d = m.head_dim();
  std::int64_t weights = checked_product(what, checked_add(heads + 2 * groups, heads, what), d, h);  // qkv and the projection
  if (dense_mlp) weights = checked_add(weights, checked_product(what, gated_mlp ? 3 : 2, m.ffn(), h), what);  // fc1 and fc2
  return checked_mul(weights / std::max(1, tp), both_layouts ? 2 : 1, what);
}
// The forward codes of the largest FP8 weight of a layer on one rank (the cache without its forward
// layout casts each forward's W into a buffer of its GEMM's own).
inline std::int64_t fp8_largest_forward_codes(const ModelConfig& m, int tp, bool gated_mlp, bool dense_mlp) {
  const std::int64_t h = m.hidden_size, heads = m.num_attention_heads, groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  std::int64_t largest = (heads + 2 * groups) * m.head_dim() * h;
  if (dense_mlp) largest = std::max(largest, (gated_mlp ? 2 : 1) * m.ffn() * h);
  return largest / std::max(1, tp);
}
inline std::int64_t fp8_kept_delta_per_token(const ModelConfig& m, int tp, bool dense_mlp, ElementBytes bytes,
                                             bool attention_output_recast = false, bool activation_codes_later = false) {
  const std::int64_t h = m.hidden_size, core = m.num_attention_heads * m.head_dim() / std::max(1, tp);
  const std::int64_t activation = dense_mlp ? m.ffn() / std::max(1, tp) : 0;
  const std::int64_t inputs = dense_mlp ? 2 * h + (activation_codes_later ? 0 : activation) : h;  // held as codes instead of T
  return inputs * (1 - bytes.value) - (activation_codes_later ? activation * bytes.value : 0) +
         (attention_output_recast ? 0 : core);
}
// Whether a dense MLP's activation runs inside the FP8 casts under the delayed recipe (layers/mlp.hpp:
// GELU, SwiGLU without clamp or offset), where Fp8Options::activation_codes_in_backward applies.
inline bool fp8_activation_inside_casts(const ModelConfig& m, bool gated_mlp) {
  if (m.activation == MlpActivation::squared_relu || m.activation == MlpActivation::quick_geglu) return false;
  return !gated_mlp || (m.activation_clamp == 0 && m.glu_linear_offset == 0);
}

// Parameters held by tensor-parallel rank 0 of `tp` (every rank holds the same count) of `piece`.
inline std::int64_t parameters_per_rank(const ModelConfig& m, DecoderShape shape, int tp, ModelPiece piece = {}) {
  const char* what = "parameter count";
  shape.linear_bias = shape.linear_bias || m.add_bias_linear;  // the Llama block with biases (gpt-oss)
  const std::int64_t h = m.hidden_size, heads = m.num_attention_heads;
  const std::int64_t groups = m.num_query_groups == 0 ? heads : m.num_query_groups;
  const std::int64_t head_dim = h / heads;
  const std::int64_t ffn = m.ffn(), vocab = m.padded_vocab(tp);
  const std::int64_t norm = shape.norm_bias ? checked_mul(2, h, what) : h;
  // qkv: [heads + 2 groups] x head_dim output columns, sharded by tp.
  const std::int64_t qkv_out = checked_product(what, checked_add(heads, checked_mul(2, groups, what), what), head_dim);
  std::int64_t layer = checked_mul(2, norm, what);
  if (m.multi_latent_attention) {
    // The replicated down projections and latent RMSNorms, the up projections and the output
    // projection split by heads (layers/latent_attention.hpp).
    const std::int64_t rq = m.q_lora_rank, rkv = m.kv_lora_rank, dr = m.qk_pos_emb_head_dim, dv = m.v_head_dim;
    const std::int64_t qk = checked_product(what, heads, m.qk_head_dim + dr);
    const std::int64_t norms = m.qk_layernorm ? 1 : 0;  // the latents' RMSNorms
    if (rq > 0)
      layer = checked_add(layer, checked_add(checked_add(checked_mul(rq, h, what), norms * rq, what), checked_mul(qk, rq, what) / tp, what),
                          what);
    else
      layer = checked_add(layer, checked_mul(qk, h, what) / tp, what);
    layer = checked_add(layer, checked_add(checked_mul(rkv + dr, h, what), norms * rkv, what), what);
    layer = checked_add(layer, checked_product(what, heads, m.qk_head_dim + dv, rkv) / tp, what);
    layer = checked_add(layer, checked_product(what, heads, dv, h) / tp, what);  // output projection
  } else {
    layer = checked_add(layer, checked_product(what, qkv_out, h) / tp, what);
    if (shape.linear_bias) layer = checked_add(layer, qkv_out / tp, what);
    layer = checked_add(layer, checked_product(what, heads * head_dim, h) / tp, what);  // output projection
  }
  if (shape.linear_bias) layer = checked_add(layer, h, what);                            // its bias is replicated
  // A dense MLP of width w sharded over `over` ranks (fc1, fc2 and their biases).
  auto mlp = [&](std::int64_t w, std::int64_t over) {
    const std::int64_t fc1_out = shape.gated_mlp ? checked_mul(2, w, what) : w;
    std::int64_t n = checked_product(what, fc1_out, h) / over;
    if (shape.linear_bias) n = checked_add(n, fc1_out / over, what);
    n = checked_add(n, checked_product(what, w, h) / over, what);
    if (shape.linear_bias) n = checked_add(n, h, what);
    return n;
  };
  // A MoE layer's MLP: router [E, h] (replicated), this rank's experts, shared experts (tensor parallel).
  std::int64_t moe_mlp = 0;
  if (m.moe.enabled()) {
    const std::int64_t local_experts = m.moe.num_experts / std::max(1, piece.ep);
    moe_mlp = checked_product(what, m.moe.num_experts, shape.linear_bias ? h + 1 : h);  // and the logits' bias
    moe_mlp = checked_add(moe_mlp, checked_product(what, local_experts, mlp(m.expert_ffn(), std::max(1, piece.etp))), what);
    if (m.moe.shared_expert_ffn_hidden_size > 0) moe_mlp = checked_add(moe_mlp, mlp(m.moe.shared_expert_ffn_hidden_size, tp), what);
    if (m.moe.shared_expert_gate) moe_mlp = checked_add(moe_mlp, h, what);  // its gate's weight [1, h], replicated
  }
  const std::int64_t moe_layers = piece.moe_layer_count(m), dense_layers = piece.layer_count(m) - moe_layers;

  const std::int64_t word_embedding = checked_product(what, vocab, h) / tp;  // vocab-parallel
  std::int64_t total = checked_product(what, layer, piece.layer_count(m));
  total = checked_add(total, checked_product(what, moe_mlp, moe_layers), what);
  total = checked_add(total, checked_product(what, mlp(ffn, tp), dense_layers), what);
  if (piece.embedding) {
    total = checked_add(total, word_embedding, what);
    if (shape.learned_positions) total = checked_add(total, checked_product(what, m.positions(), h), what);
  }
  if (piece.head) {
    total = checked_add(total, norm, what);  // final norm
    // the output layer: its own weight, or (tied) the embedding's, a copy of it on a last stage
    if (!shape.tied_output || !piece.embedding) total = checked_add(total, word_embedding, what);
    // multi-token prediction: per depth three norms, the two halves of eh_proj [h, h] / tp, a layer
    // of the last layer's kind; and a copy of the word embedding on a last stage without it (untied: the tied copy is above)
    if (m.mtp_num_layers > 0 && !piece.embedding && !shape.tied_output) total = checked_add(total, word_embedding, what);
    if (m.mtp_num_layers > 0) {
      const std::int64_t depth_mlp = m.moe_layer(m.num_layers - 1) ? moe_mlp : mlp(ffn, tp);  // the last layer's kind
      const std::int64_t depth = checked_add(checked_add(checked_mul(3, norm, what), checked_product(what, 2, h, h) / tp, what),
                                             checked_add(layer, depth_mlp, what), what);
      total = checked_add(total, checked_mul(depth, m.mtp_num_layers, what), what);
    }
  }
  return total;
}

// Whether the model's MLP is gated (fc1 makes [gate; up]): its activation when the flags name one,
// else the decoder's (Llama: SwiGLU, GPT: GELU).
inline bool gated_mlp_of(const ModelConfig& m, DecoderShape shape) {
  switch (m.activation) {
    case MlpActivation::swiglu:
    case MlpActivation::quick_geglu: return true;
    case MlpActivation::preset: return shape.gated_mlp;
    default: return false;
  }
}

// The experts' rows of one MoE layer for a micro-batch of b sequences (see the top): the tokens this
// rank routes times topk, or every expert's padded capacity.
inline std::int64_t moe_dispatched_rows(const ModelConfig& m, int tp, std::int64_t micro_batch_size) {
  const char* what = "activation memory";
  const std::int64_t routed_tokens = checked_mul(m.seq_length, micro_batch_size, what) / std::max(1, tp);
  return m.moe.pad_to_capacity && m.moe.capacity_factor > 0
             ? checked_mul(m.moe.num_experts, moe_expert_capacity(routed_tokens, m.moe.topk, m.moe.num_experts, m.moe.capacity_factor), what)
             : checked_mul(routed_tokens, m.moe.topk, what);
}

// FP8 experts (Fp8Layers::experts), per MoE layer: the bytes of this rank's experts' weight codes in
// one layout, and the change of what the dispatched rows keep (codes of the input and the activation
// instead of T).
inline std::int64_t fp8_expert_weight_codes(const ModelConfig& m, const ModelPiece& piece, bool gated_mlp) {
  const char* what = "FP8 weight cache";
  const std::int64_t local_experts = m.moe.num_experts / std::max(1, piece.ep);
  return checked_product(what, local_experts, gated_mlp ? 3 : 2, m.expert_ffn(), m.hidden_size) / std::max(1, piece.etp);
}
inline std::int64_t fp8_expert_kept_delta(const ModelConfig& m, int tp, std::int64_t micro_batch_size, ElementBytes bytes,
                                          int etp) {
  const std::int64_t row = m.hidden_size + m.expert_ffn() / std::max(1, etp);
  return checked_product("activation memory", moe_dispatched_rows(m, tp, micro_batch_size), row) * (1 - bytes.value);
}

// What one MoE layer's MLP keeps for a micro-batch of b sequences (see the top): the router's input
// and logits, the routing's choices, slots and weights, the experts' rows (dispatched input, fc1's
// output, the activation, and the experts' output the dispatcher keeps for combine's backward;
// dispatched tokens x topk rows, or every expert's padded capacity), the shared experts' input and
// intermediate. With `backward`: instead, the most its backward holds at once (the output gradient
// of the rank's tokens, the dispatched rows' output gradient, fc1's and the activation's gradients
// and the rows' input gradient, the weights' gradient).
inline std::int64_t moe_layer_activation_bytes(const ModelConfig& m, int tp, std::int64_t micro_batch_size, ElementBytes bytes,
                                               int etp, bool backward = false) {
  const char* what = "activation memory";
  const std::int64_t tokens = checked_mul(m.seq_length, micro_batch_size, what), h = m.hidden_size;
  const std::int64_t routed_tokens = tokens / std::max(1, tp);  // the rank's 1/tp of the sequence, with or without SP
  const std::int64_t rows = moe_dispatched_rows(m, tp, micro_batch_size);
  const std::int64_t row_elements = checked_add(2 * h, checked_mul(3, m.expert_ffn(), what) / std::max(1, etp), what);
  std::int64_t out = checked_product(what, rows, row_elements, bytes.value);
  out = checked_add(out, checked_product(what, routed_tokens, h, bytes.value), what);  // router input / output gradient
  if (backward) return checked_add(out, checked_product(what, routed_tokens, m.moe.topk, bytes.accumulate), what);  // d weights
  out = checked_add(out, checked_product(what, routed_tokens, m.moe.num_experts, bytes.accumulate), what);  // router logits
  // the chosen experts and their slots (int32) and weights (A)
  out = checked_add(out, checked_product(what, routed_tokens, m.moe.topk, checked_add(8, bytes.accumulate, what)), what);
  if (m.moe.shared_expert_ffn_hidden_size > 0)  // its fc1's input (whole sequence) and gated intermediate
    out = checked_add(out, checked_product(what, tokens, checked_add(h, checked_mul(3, m.moe.shared_expert_ffn_hidden_size, what) / tp, what), bytes.value), what);
  return out;
}

// The output gradients a split backward holds for one micro-batch chunk of `piece` between its
// input half and its weight half (see the top).
inline std::int64_t deferred_weight_gradient_bytes(const ModelConfig& m, DecoderShape shape, int tp, std::int64_t micro_batch_size,
                                                   ElementBytes bytes, ModelPiece piece) {
  const char* what = "deferred weight gradient memory";
  const std::int64_t h = m.hidden_size, heads = m.num_attention_heads;
  const std::int64_t groups = m.num_query_groups == 0 ? heads : m.num_query_groups;
  const std::int64_t attention = checked_add(checked_product(what, heads + 2 * groups, h / heads) / tp, h, what);
  auto mlp = [&](std::int64_t w) { return checked_add(checked_mul(shape.gated_mlp ? 2 : 1, w, what) / tp, h, what); };
  const std::int64_t moe_layers = piece.moe_layer_count(m), dense_layers = piece.layer_count(m) - moe_layers;
  std::int64_t per_token = checked_mul(attention, piece.layer_count(m), what);
  per_token = checked_add(per_token, checked_mul(mlp(m.ffn()), dense_layers, what), what);
  if (moe_layers > 0 && m.moe.shared_expert_ffn_hidden_size > 0)
    per_token = checked_add(per_token, checked_mul(mlp(m.moe.shared_expert_ffn_hidden_size), moe_layers, what), what);
  return checked_product(what, per_token, m.seq_length, micro_batch_size, bytes.value);
}

// Multi-latent attention keeps, per token and layer, other tensors than the packed projection's
// q, k, v and output the count above holds: the latents before and after their norms (2 rq + 2 rkv,
// replicated), q, k, v padded to the head dimension D = qk + pos-emb dims and the attention's output
// (4 n D / tp), and the output projection's input (n dv / tp). The difference, in elements (negative
// where the latents are the smaller).
inline std::int64_t latent_attention_activation_delta(const ModelConfig& m, int tp) {
  const char* what = "activation memory";
  const std::int64_t h = m.hidden_size, heads = m.num_attention_heads, d = h / heads;
  const std::int64_t groups = m.num_query_groups == 0 ? heads : m.num_query_groups;
  const std::int64_t D = m.qk_head_dim + m.qk_pos_emb_head_dim;
  const std::int64_t plain = checked_product(what, heads + 2 * groups + heads, d) / tp;
  const std::int64_t latent = checked_add(checked_mul(2, checked_add(m.q_lora_rank, m.kv_lora_rank, what), what),
                                          checked_add(checked_product(what, 4, heads, D) / tp,
                                                      checked_product(what, heads, m.v_head_dim) / tp, what),
                                          what);
  return latent - plain;
}

// The activations `piece` keeps for one micro-batch (see the top), and the transient logits block
// of the fused output layer (or the unfused logits), which a rank holds for one micro-batch at a time.
struct PieceActivations {
  std::int64_t kept = 0;       // bytes kept from the forward to the backward of one micro-batch
  std::int64_t transient = 0;  // bytes of the output layer's logits (block) while it runs
  std::int64_t backward = 0;   // the most one layer's backward holds at once beyond what is kept (its MLP's gradients)
  std::int64_t recomputed = 0; // the most recompute makes again at once in the backward (one chunk's layers, or a module's)
  // What a rank holds beyond the kept activations at its largest moment: the logits block, or a
  // layer's backward beside what recompute made again, which never run at once.
  std::int64_t extra() const { return std::max(transient, backward + recomputed); }
};
// Per layer and token, in elements of T (see the top): the attention's part (the layer's input, the
// qkv projection's input, its output, the attention's output, the residual after it) and the dense
// MLP's (fc1's input and the intermediate it keeps). Under sequence parallelism the column-parallel
// layers keep their gathered input (h each, whole), the rest is sharded; without it the norms'
// inputs and outputs are replicated.
struct LayerElements {
  std::int64_t attention = 0, mlp = 0, mlp_width = 0;  // mlp_width: the intermediate fc1 / the activation keep (3 w gated, 2 w)
};
inline LayerElements layer_elements_of(const ModelConfig& m, int tp, bool sequence_parallel, bool gated_mlp) {
  const char* what = "activation memory";
  const std::int64_t h = m.hidden_size, heads = m.num_attention_heads, groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const std::int64_t d = m.head_dim();
  const std::int64_t qkv = checked_product(what, heads + 2 * groups, d), core = checked_mul(heads, d, what);
  LayerElements e;
  e.attention = sequence_parallel ? checked_add(h, checked_add(2 * h, checked_add(qkv, core, what), what) / tp, what)
                                  : checked_add(3 * h, checked_add(qkv, core, what) / tp, what);
  e.mlp_width = checked_mul(gated_mlp ? 3 : 2, m.ffn(), what);
  e.mlp = checked_add(h, e.mlp_width / tp, what);
  return e;
}
inline PieceActivations activations_of(const ModelConfig& m, int tp, bool sequence_parallel, std::int64_t micro_batch_size,
                                       ElementBytes bytes, std::int64_t classifier_block_bytes, ModelPiece piece,
                                       bool gated_mlp = false, Fp8Layers fp8 = {}, const RecomputeConfig& recompute = {}) {
  const char* what = "activation memory";
  PieceActivations out;
  const std::int64_t s = m.seq_length, b = micro_batch_size, h = m.hidden_size, a = m.num_attention_heads;
  const std::int64_t tokens = checked_mul(s, b, what);
  // Per layer and token: the attention's and the dense MLP's elements, and the a / tp log-sum-exp values.
  const LayerElements elements = layer_elements_of(m, tp, sequence_parallel, gated_mlp);
  const std::int64_t layer_bytes = checked_add(checked_mul(checked_add(elements.attention, elements.mlp, what), bytes.value, what),
                                               checked_mul(a / tp, bytes.accumulate, what), what);
  std::int64_t dense_layer = checked_mul(tokens, layer_bytes, what);
  if (m.multi_latent_attention)  // see latent_attention_activation_delta
    dense_layer += checked_product(what, tokens, latent_attention_activation_delta(m, tp), bytes.value);
  // a MoE layer: its MLP block's tensors in place of the dense MLP's input and intermediate
  const bool any_moe = piece.moe_layer_count(m) > 0;
  const std::int64_t moe_block =
      any_moe ? moe_layer_activation_bytes(m, tp, micro_batch_size, bytes, piece.etp) : 0;
  const std::int64_t moe_layer = dense_layer + moe_block - (any_moe ? checked_product(what, tokens, elements.mlp, bytes.value) : 0);
  if (any_moe) out.backward = moe_layer_activation_bytes(m, tp, micro_batch_size, bytes, piece.etp, true);
  // a dense MLP's backward: the output gradient and fc1's input gradient (h each, whole) beside the
  // gradients of the activation's output and input (3 w gated; GELU's backward runs inside fc2's dX
  // GEMM, so only its input's gradient, w; squared ReLU 2 w)
  // (with fc2's input codes made in the backward, a byte per element of the activation beside them)
  const bool activation_later = fp8.activation_codes_later && fp8.codes_kept && fp8_activation_inside_casts(m, gated_mlp);
  if (piece.layer_count(m) > piece.moe_layer_count(m)) {
    const std::int64_t width = gated_mlp ? elements.mlp_width : m.activation == MlpActivation::squared_relu ? 2 * m.ffn() : m.ffn();
    std::int64_t backward = checked_product(what, tokens, checked_add(2 * h, width / tp, what), bytes.value);
    if (activation_later && fp8.in(m, piece) > fp8.moe_in(m, piece))  // the piece has FP8 dense layers
      backward = checked_add(backward, checked_mul(tokens, m.ffn() / tp, what), what);
    out.backward = std::max(out.backward, backward);
  }
  // Recompute (see the top): a layer's input, what selective recompute drops, and what
  // one recomputed module or layer holds again in the backward.
  const std::int64_t input = checked_product(what, tokens, h, bytes.value) / (sequence_parallel ? tp : 1);
  const std::int64_t core = checked_mul(a, m.multi_latent_attention ? m.v_head_dim : m.head_dim(), what) / tp;
  const std::int64_t core_bytes = checked_mul(tokens, checked_add(core * bytes.value, a / tp * bytes.accumulate, what), what);
  const std::int64_t expert_activation =
      any_moe ? checked_product(what, moe_dispatched_rows(m, tp, micro_batch_size), m.expert_ffn() / std::max(1, piece.etp)) : 0;
  const bool selective = recompute.granularity == RecomputeGranularity::selective;
  // The bytes layer `global` keeps for one micro-batch (none recomputed in full), and the most its
  // selective recompute makes again at once in its backward.
  auto layer_of = [&](std::int64_t global, std::int64_t& again) {
    const bool moe = m.moe_layer(static_cast<int>(global));
    const bool in_fp8 = fp8.codes_kept && global >= fp8.first && global < fp8.end;  // see Fp8Layers
    const bool fp8_experts = moe && in_fp8 && fp8.experts;
    std::int64_t kept = moe ? moe_layer : dense_layer;
    if (in_fp8)
      kept += checked_mul(tokens, fp8_kept_delta_per_token(m, tp, !moe, bytes, fp8.attention_output_recast, activation_later), what);
    const std::int64_t expert_codes = fp8_experts ? fp8_expert_kept_delta(m, tp, micro_batch_size, bytes, piece.etp) : 0;
    kept += expert_codes;
    again = 0;
    if (!selective) return kept;
    if (recompute.attention_core) {  // the output and lse (and an FP8 projection's codes of the output) dropped
      kept -= core_bytes + (in_fp8 && !fp8.attention_output_recast ? checked_mul(tokens, core, what) : 0);
      again = core_bytes;
    }
    if (moe && recompute.moe_block) {  // the block keeps its input alone
      kept += input - (moe_block + expert_codes);
      again = std::max(again, moe_block + expert_codes);
    } else if (moe && recompute.moe_activation) {  // the activation (FP8 experts: its codes) dropped, made again in T
      kept -= checked_mul(expert_activation, fp8_experts ? 1 : bytes.value, what);
      again = std::max(again, checked_mul(expert_activation, bytes.value, what));
    }
    return kept;
  };
  const std::int64_t layers = piece.layer_count(m), first = piece.layers < 0 ? 0 : piece.first_layer;
  const bool full = recompute.granularity == RecomputeGranularity::full;
  const std::int64_t n = std::max(1, recompute.num_layers);
  std::int64_t chunk = 0;  // full uniform: the kept bytes of the chunk being summed
  for (std::int64_t i = 0; i < layers; ++i) {
    std::int64_t again = 0;
    const std::int64_t kept = layer_of(first + i, again);
    out.recomputed = std::max(out.recomputed, again);
    if (!full) {
      out.kept = checked_add(out.kept, kept, what);
    } else if (recompute.method == RecomputeMethod::uniform) {  // chunks of n keep their input; one chunk's layers again
      if (i % n == 0) out.kept = checked_add(out.kept, input, what), chunk = 0;
      chunk = checked_add(chunk, kept, what);
      out.recomputed = std::max(out.recomputed, chunk);
    } else if (i < n) {  // block: the first n keep their input, recomputed one at a time
      out.kept = checked_add(out.kept, input, what);
      out.recomputed = std::max(out.recomputed, kept);
    } else {
      out.kept = checked_add(out.kept, kept, what);
    }
  }
  // embedding output and final norm: s b h each, sharded on the sequence under sequence parallelism
  const std::int64_t ends = (piece.embedding ? 1 : 0) + (piece.head ? 1 : 0);
  const std::int64_t end_elements = checked_product(what, ends, tokens, h) / (sequence_parallel ? tp : 1);
  out.kept = checked_add(out.kept, checked_mul(end_elements, bytes.value, what), what);
  if (!piece.head) return out;
  if (m.mtp_num_layers > 0) {  // each depth: one more layer, and its embedding output, three norm outputs and output gradient
    const std::int64_t depth_ends = checked_product(what, 5, tokens, h) / (sequence_parallel ? tp : 1);
    const std::int64_t depth = checked_add(checked_mul(tokens, layer_bytes, what), checked_mul(depth_ends, bytes.value, what), what);
    out.kept = checked_add(out.kept, checked_mul(depth, m.mtp_num_layers, what), what);
  }
  const std::int64_t local_vocab = m.padded_vocab(tp) / tp;
  if (classifier_block_bytes <= 0) {  // logits and their softmax, [s, b, V / tp] each
    const std::int64_t logits = checked_product(what, 2, tokens, local_vocab);
    out.transient = checked_mul(logits, bytes.accumulate, what);
  } else {  // one block of logits, and d(final norm output)
    const std::int64_t row_bytes = checked_mul(local_vocab, bytes.value, what);
    const std::int64_t block_rows =
        std::min(tokens, static_cast<std::int64_t>(ClassifierChunks{0, static_cast<std::size_t>(classifier_block_bytes)}.rows_for(
                             static_cast<index_t>(local_vocab), static_cast<std::size_t>(bytes.value))));
    out.transient = checked_mul(block_rows, row_bytes, what);
    const std::int64_t gradient = checked_product(what, tokens, h, bytes.value) / (sequence_parallel ? tp : 1);
    out.kept = checked_add(out.kept, gradient, what);
  }
  return out;
}

// Parameters, gradients and AdamW state of `parameters` (the optimizer state over `optimizer_shards`
// ranks: dp under the distributed optimizer, else 1).
inline MemoryEstimate state_estimate(std::int64_t parameters, ElementBytes bytes, std::int64_t optimizer_shards = 1) {
  MemoryEstimate e;
  e.parameters = parameters;
  e.parameter_bytes = checked_mul(e.parameters, bytes.value, "parameter memory");
  e.gradient_bytes = checked_mul(e.parameters, bytes.accumulate, "gradient memory");
  e.optimizer_bytes = checked_product("optimizer memory", e.parameters, 3, bytes.accumulate) / std::max<std::int64_t>(1, optimizer_shards);
  return e;
}

// The estimate for one rank training micro-batches of `micro_batch_size` sequences (the whole
// model; one micro-batch in flight).
inline MemoryEstimate estimate_training_memory(const ModelConfig& m, DecoderShape shape, int tp, bool sequence_parallel,
                                               std::int64_t micro_batch_size, ElementBytes bytes,
                                               std::int64_t classifier_block_bytes = 0, const RecomputeConfig& recompute = {}) {
  MemoryEstimate e = state_estimate(parameters_per_rank(m, shape, tp), bytes);
  const PieceActivations act = activations_of(m, tp, sequence_parallel, micro_batch_size, bytes, classifier_block_bytes, {},
                                              gated_mlp_of(m, shape), {}, recompute);
  e.activation_bytes = checked_add(act.kept, act.extra(), "activation memory");
  return e;
}

// One pipeline rank's chunks (their pieces, in chunk order) and the micro-batch chunks its
// schedule keeps in flight at its peak.
struct PipelineRankHolding {
  std::vector<ModelPiece> chunks;
  std::int64_t peak_in_flight = 1;
  std::int64_t deferred_weight_gradients = 0;  // micro-batch chunks between their input and weight halves (zero-bubble: 1)
};

// The estimate for one pipeline rank: the parameters of all its chunks; the activations of
// peak_in_flight micro-batch chunks, each counted as the largest of its chunks keeps, plus one
// logits block, plus the output gradients of deferred_weight_gradients chunks (the largest); the
// optimizer state over `optimizer_shards` ranks.
inline MemoryEstimate estimate_pipeline_rank_memory(const ModelConfig& m, DecoderShape shape, int tp, bool sequence_parallel,
                                                    std::int64_t micro_batch_size, ElementBytes bytes,
                                                    std::int64_t classifier_block_bytes, const PipelineRankHolding& rank,
                                                    std::int64_t optimizer_shards = 1, Fp8Layers fp8 = {},
                                                    const RecomputeConfig& recompute = {}) {
  const char* what = "pipeline rank memory";
  std::int64_t parameters = 0, largest_kept = 0, transient = 0, largest_deferred = 0, fp8_cache = 0, fp8_forward_codes = 0;
  const bool gated = gated_mlp_of(m, shape);
  for (const ModelPiece& piece : rank.chunks) {
    parameters = checked_add(parameters, parameters_per_rank(m, shape, tp, piece), what);
    const std::int64_t fp8_moe = fp8.moe_in(m, piece), fp8_dense = fp8.in(m, piece) - fp8_moe;
    const bool both = fp8.forward_codes_cached;
    if (fp8.weight_cache)
      fp8_cache = checked_add(fp8_cache,
                              checked_add(checked_mul(fp8_dense, fp8_weight_cache_bytes(m, tp, gated, true, both), what),
                                          checked_mul(fp8_moe, fp8_weight_cache_bytes(m, tp, gated, false, both), what), what),
                              what);
    if ((!both || !fp8.weight_cache) && fp8_dense + fp8_moe > 0)
      fp8_forward_codes = std::max(fp8_forward_codes, fp8_largest_forward_codes(m, tp, gated, fp8_dense > 0));
    if (fp8.experts && fp8_moe > 0) {  // kept for the step (both layouts, or W^T alone), or while a projection's GEMMs run
      const std::int64_t layout = fp8_expert_weight_codes(m, piece, gated), codes = checked_mul(2, layout, what);
      if (!fp8.weight_cache) {
        fp8_forward_codes = std::max(fp8_forward_codes, codes);
      } else {
        fp8_cache = checked_add(fp8_cache, checked_mul(fp8_moe, both ? codes : layout, what), what);
        if (!both) fp8_forward_codes = std::max(fp8_forward_codes, layout);
      }
    }
    const PieceActivations act =
        activations_of(m, tp, sequence_parallel, micro_batch_size, bytes, classifier_block_bytes, piece, gated, fp8, recompute);
    largest_kept = std::max(largest_kept, act.kept);
    transient = std::max(transient, act.extra());
    if (rank.deferred_weight_gradients > 0)
      largest_deferred = std::max(largest_deferred, deferred_weight_gradient_bytes(m, shape, tp, micro_batch_size, bytes, piece));
  }
  MemoryEstimate e = state_estimate(parameters, bytes, optimizer_shards);
  e.fp8_cache_bytes = checked_add(fp8_cache, fp8_forward_codes, what);
  e.activation_bytes = checked_add(checked_mul(largest_kept, std::max<std::int64_t>(1, rank.peak_in_flight), what), transient, what);
  e.activation_bytes = checked_add(e.activation_bytes, checked_mul(largest_deferred, rank.deferred_weight_gradients, what), what);
  return e;
}

// "1.23 GiB" style text for a byte count.
inline std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

}  // namespace models
STRATA_NAMESPACE_END
