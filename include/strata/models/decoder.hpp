// strata/models/decoder.hpp: `DecoderModel`, the decoder-only language model both GPT and Llama
// are made of: vocab-parallel embedding (+ learned positions), a stack of TransformerLayers, a
// final norm, a column-parallel output layer (tied to the embedding or not), vocab-parallel
// cross-entropy.
//
// The residual stream is [seq, batch, hidden] (replicated, or sharded<0> under sequence
// parallelism); batches come in as [batch, seq] token ids and are transposed once. forward returns
// the sum of masked per-token losses and the token count; backward takes the scale of each
// token's loss (1 / tokens of the global batch), so gradients of micro-batches and data-parallel
// ranks add up to the gradient of the global mean.
//
// Two paths through the output layer and the loss:
//   forward(ctx, tokens, labels, mask, key)            the logits [s b, V/tp] are made whole and kept
//                                                      for backward (the reference path; tests)
//   forward(ctx, tokens, labels, mask, key, FusedLoss{loss_scale})
//                                                      training: the loss gradient (mask * loss_scale) is
//                                                      known ahead, so the output layer and the loss run
//                                                      fused over blocks of rows (layers/chunked_classifier.hpp):
//                                                      one block of logits lives at a time, the output
//                                                      weight's gradient is accumulated during the forward,
//                                                      and Saved keeps the gradient with respect to the final
//                                                      norm's output instead of the logits. backward(ctx,
//                                                      saved, loss_scale) then starts from it, and refuses a
//                                                      loss_scale other than the forward's. A fused Saved
//                                                      is meant for one backward (the output layer's share of
//                                                      the gradient was added once, in the forward).
// Both give the same losses and gradients up to rounding (GEMMs over blocks of rows, the output
// weight's gradient summed block by block). evaluate(ctx, tokens, labels, mask) is the forward-only
// loss for validation: chunked too, and keeping no layer's saved tensors.
//
// Pipeline stages: built with a pipeline::StageLayers, a DecoderModel holds only the transformer
// layers of that range (named by their global index, so names, initial values and dropout masks
// are those of the whole model), the embedding only on the first stage, and the final norm, output
// layer and loss only on the last. forward_stage / backward_stage run such a piece on the residual
// stream that crosses stages (the boundary, [s, b, h], or its sequence shard [s/tp, b, h] under
// sequence parallelism), always with the fused loss; backward_stage may split its backward
// (DeferredWeightGradients). With a tied output layer the last stage holds a copy of the word
// embedding (same name, same initial value, Parameter::pipeline_copy set); the pipeline sums the two
// copies' gradients every step, so they stay bit-identical. The whole-model entry points (forward,
// backward, evaluate, next_token_logits) need a stage that holds everything.
//
// Context parallelism (ctx.cp of more than one rank, docs/CONTEXT_PARALLEL.md): every entry point
// still takes the whole [b, s] batch; the model keeps this rank's two chunks of tokens, labels and
// loss mask (shard/context_parallel.hpp), so everything but attention runs on the local 2c tokens
// and LossSum is this rank's part (the caller sums it over the cp group, as over dp); pipeline
// stages exchange the residual stream of the local tokens. With a mixture of experts each rank routes
// its local tokens; the routers count tokens over the tp x cp group (the ranks of one sequence), so
// the losses and their scale are those of whole sequences. Refused in next_token_logits.
//
// Multi-token prediction (config.mtp_num_layers = D > 0, DeepSeek-V3's MTP with Megatron's
// --mtp-num-layers and --mtp-loss-scaling-factor lambda): after the head, depth k = 1..D takes
// h_{k-1} (h_0 the final norm's output) and the embedding of the tokens k places ahead, and computes
//   h_k = final_norm_k(layer_k(proj_e_k(enorm_k(E t_{i+k})) + proj_h_k(hnorm_k(h_{k-1}))))
// (Megatron's eh_proj over [e; h] as two column-parallel halves of its weight, gathered over tp,
// then a transformer layer of the model's kind), and the shared output layer predicts t_{i+k+1}
// from h_k. Tokens, labels and the loss mask are rolled left by k, the last k positions masked
// out. The objective adds lambda / D x each depth's masked loss sum with the main loss's scale
// (1 / the main loss's tokens), so the gradients of the depths reach the main model through h_0 and
// the word embedding. The returned loss is the main one; mtp_losses reads each depth's sums. On the
// fused training path only (the reference forward refuses); a RoPE model (Llama, Mixtral). Under
// context parallelism the whole [b, s] batch is rolled before this rank takes its chunks, so each
// depth reads the tokens one rank would. Under pipeline parallelism the depths are the last stage's,
// with a copy of the word embedding there, whose gradient the pipeline sums with the first
// stage's as a tied output layer's (tied_embedding_copy).
//
// Mixture of experts: with a MoeMlp as the MLP block (models/moe_llama.hpp) the model reaches every
// layer's TopKRouter (routers()). The routers' aux and z losses enter the backward multiplied by
// loss_scale x the micro-batch's tokens (b x s): each micro-batch's router losses then weigh what
// its mean token loss weighs (1 / (micro-batches x dp) without a loss mask, Megatron's
// MoEAuxLossAutoScaler scale). forward (fused), forward_stage and backward set it. The losses
// accumulate in the routers until reset_router_losses (router_losses reads them); validation and
// inference forwards leave them, and the expert-bias load, as they were.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../layers.hpp"
#include "../layers/moe.hpp"
#include "../pipeline/stage.hpp"
#include "config.hpp"
#include "recompute.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

// What a forward returns: the masked loss sum as a one-element tensor in the backend's space (read
// it on the host only where needed: loss_sum()), and the token count, computed on the host.
template <class Space = space::host>
struct LossSum {
  Tensor<double, Space> sum;  // [1]: sum over tokens of mask * loss
  double tokens = 0;          // sum of the mask

  double loss_sum() const { return sum.empty() ? 0.0 : to_host(sum)[0]; }
};

// Asks forward to run the output layer and the loss fused, block of rows by block, with the loss
// gradient known ahead: each token's loss weighs mask * loss_scale (the scale backward will be
// given). `chunks` sizes the blocks (layers/chunked_classifier.hpp: a row count, or by default as
// many rows as keep a block of logits [rows, V/tp] in the element type within 256 MiB, at least
// one); the block size changes nothing but rounding.
struct FusedLoss {
  double loss_scale = 1.0;
  ClassifierChunks chunks = {};
};

template <class Policy, template <class> class Norm, class Attention, class MlpBlock, bool LearnedPositions, bool TiedOutput>
class DecoderModel {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Layout = residual_layout_t<Policy>;
  using Layer = TransformerLayer<Policy, Norm, Attention, MlpBlock>;
  using Output = ColumnParallelLinear<Policy>;
  static constexpr bool mixture_of_experts = is_moe_mlp_v<MlpBlock>;
  // A dense model has no router (and names no TopKRouter, which a backend without the MoE entry
  // points could not instantiate).
  struct NoRouter {};
  using Router = std::conditional_t<mixture_of_experts, TopKRouter<Policy>, NoRouter>;

  // One multi-token-prediction depth (see the top): its parameters, and what its forward keeps.
  struct MtpDepth {
    using Proj = ColumnParallelLinear<Policy>;
    // Built in place (never moved): a MoE layer's router registers its address with the model.
    template <class MlpConfig>
    MtpDepth(Context& ctx, const std::string& name, const ModelConfig& config, const AttentionConfig& attention, MlpConfig mlp)
        : enorm(ctx, name + ".enorm", config.hidden_size, config.norm_epsilon, config.apply_layernorm_1p),
          hnorm(ctx, name + ".hnorm", config.hidden_size, config.norm_epsilon, config.apply_layernorm_1p),
          proj_e(ctx, name + ".eh_proj_e", config.hidden_size, config.hidden_size, false),
          proj_h(ctx, name + ".eh_proj_h", config.hidden_size, config.hidden_size, false),
          layer(ctx, name + ".layer",
                TransformerLayerConfig{config.hidden_size, config.norm_epsilon, config.hidden_dropout, config.apply_layernorm_1p},
                attention, std::move(mlp)),
          final_norm(ctx, name + ".final_norm", config.hidden_size, config.norm_epsilon, config.apply_layernorm_1p) {}
    MtpDepth(const MtpDepth&) = delete;
    MtpDepth& operator=(const MtpDepth&) = delete;
    Norm<Policy> enorm, hnorm;
    Proj proj_e, proj_h;
    Layer layer;
    Norm<Policy> final_norm;
    template <class Visitor>
    void for_each_parameter(Visitor&& visit) {
      enorm.for_each_parameter(visit);
      hnorm.for_each_parameter(visit);
      proj_e.for_each_parameter(visit);
      proj_h.for_each_parameter(visit);
      layer.for_each_parameter(visit);
      final_norm.for_each_parameter(visit);
    }
  };
  struct MtpSaved {
    typename VocabParallelEmbedding<Policy>::Saved embedding;
    typename Norm<Policy>::Saved enorm, hnorm, final_norm;
    typename MtpDepth::Proj::Saved proj_e, proj_h;
    typename Layer::Saved layer;
    Activation<T, Layout, Space> output_gradient;  // d objective / d h_k from the fused output layer
  };

  struct Saved {
    typename VocabParallelEmbedding<Policy>::Saved embedding;
    std::vector<std::optional<typename Layer::Saved>> layers;  // empty for a layer recomputed in backward
    std::vector<std::optional<Activation<T, Layout, Space>>> layer_inputs;  // full recompute: each chunk's input
    std::uint64_t dropout_key = 0;
    typename Norm<Policy>::Saved final_norm;
    typename Output::Saved output;
    typename VocabParallelCrossEntropy<Policy>::Saved loss;
    Tensor<A, Space> mask;  // [s, b]
    Shape logits_shape;
    // The fused path only (output and loss then stay empty): d loss / d final norm output, in the
    // residual layout, and the loss scale it was computed with.
    Activation<T, Layout, Space> final_norm_output_gradient;
    std::optional<double> fused_loss_scale;
    std::vector<MtpSaved> mtp;  // multi-token prediction: one per depth
  };

  using Boundary = Activation<T, Layout, Space>;  // the residual stream between pipeline stages

  // The whole model.
  DecoderModel(Context& ctx, const ModelConfig& config, bool linear_bias)
      : DecoderModel(ctx, config, linear_bias, pipeline::StageLayers::whole(config.num_layers)) {}

  // One pipeline stage: the layers stage.layers, the embedding when stage.has_embedding, the head
  // when stage.has_head (pipeline::stage_layers_of makes the split).
  DecoderModel(Context& ctx, const ModelConfig& config, bool linear_bias, pipeline::StageLayers stage)
      : config_((validate(config, without_pipeline(ctx.config), Policy::sequence_parallel, ctx.world.size() / ctx.config.pp),
                 check_stage(config, stage), config)),
        stage_(stage),
        loss_(config.label_smoothing, config.vocab_size) {
    // A last stage that reads the word embedding holds a copy of it: the tied output layer's, or
    // multi-token prediction's (the depths embed shifted tokens).
    if (stage.has_embedding || ((TiedOutput || config.mtp_num_layers > 0) && stage.has_head)) {
      embedding_.emplace(ctx, "embedding.word", config.padded_vocab(ctx.tp.size()), config.hidden_size, config.vocab_size);
      embedding_->weight().pipeline_copy = !stage.has_embedding;
      embedding_->weight().decoupled_lr = true;  // Megatron's embedding-or-output parameters (--decoupled-lr)
    }
    if constexpr (LearnedPositions)
      if (stage.has_embedding) positions_.emplace(ctx, "embedding.position", config.positions(), config.hidden_size);
    layers_.reserve(static_cast<std::size_t>(stage.layers.size()));
    for (index_t i = stage.layers.begin; i < stage.layers.end; ++i) {
      Fp8LayerScope<Space> fp8_scope(ctx.fp8, static_cast<int>(i));  // its linear layers run FP8 when ctx.fp8 says so
      layers_.emplace_back(ctx, "layers." + std::to_string(i),
                           TransformerLayerConfig{config.hidden_size, config.norm_epsilon, config.hidden_dropout,
                                                  config.apply_layernorm_1p},
                           attention_config(config, linear_bias, static_cast<int>(i)),
                           mlp_config(config, linear_bias, static_cast<int>(i)));
    }
    if (stage.has_head) {
      final_norm_.emplace(ctx, "final_norm", config.hidden_size, config.norm_epsilon, config.apply_layernorm_1p);
      if constexpr (TiedOutput) output_.emplace(embedding_->weight());
      else output_.emplace(ctx, "output", config.hidden_size, config.padded_vocab(ctx.tp.size()), false);
      if constexpr (!TiedOutput) output_->weight().decoupled_lr = true;
    }
    if (config.mtp_num_layers > 0) build_mtp(ctx, config, linear_bias, stage);
  }
  DecoderModel(const DecoderModel&) = delete;  // the tied output layer points at the embedding

  // Megatron's init: N(0, std) everywhere, output projections of each layer N(0, std / sqrt(2 L)).
  void init(Context& ctx, std::uint64_t seed) {
    const double std = config_.init_method_std, scaled = std / std::sqrt(2.0 * config_.num_layers);
    if (embedding_) embedding_->init(ctx, seed, std);  // the tied copy draws the same values (same name)
    if (positions_) positions_->init(ctx, seed, std);
    for (auto& layer : layers_) layer.init(ctx, seed, std, scaled);
    if constexpr (!TiedOutput)
      if (output_) output_->init(ctx, seed, std);
    for (auto& d : mtp_) {
      d->proj_e.init(ctx, seed, std);
      d->proj_h.init(ctx, seed, std);
      d->layer.init(ctx, seed, std, scaled);
    }
  }

  // Plans now what forward (and backward when `backward`) of a [micro_batch, seq_length] batch will
  // use: the attention plans of the backend (cuDNN graphs on the GPU). A process that drives several
  // GPUs from threads must do this before its first collective (docs/DEVICE.md); elsewhere it only
  // moves the planning out of the first step.
  void prepare(Context& ctx, index_t micro_batch, bool backward = true) const {
    for (const auto& layer : layers_) layer.prepare(ctx, config_.seq_length, micro_batch, backward);
  }

  // tokens, labels: [b, s]; loss_mask: [b, s] (1 = counts), on the host. Ids are checked on the
  // host, uploaded, and transposed to [s, b] by the backend.
  std::pair<LossSum<Space>, Saved> forward(Context& ctx, const Tensor<std::int32_t>& tokens,
                                           const Tensor<std::int32_t>& labels, const Tensor<float>& loss_mask,
                                           std::uint64_t dropout_key = 0) const {
    require_whole("model forward");
    if (!mtp_.empty())
      fail<ConfigError>("model forward: the reference path (whole logits) has no multi-token prediction; with "
                        "mtp_num_layers=", mtp_.size(), " call the fused forward (FusedLoss)");
    Saved saved;
    auto h = forward_to_final_norm(ctx, tokens, labels, loss_mask, dropout_key, saved);
    auto [logits, out] = output_->forward(ctx, h);
    saved.output = std::move(out);
    saved.logits_shape = logits.shape();
    auto [losses, ls] = loss_.forward(ctx, logits, sequence_major(ctx, labels, /*are_labels=*/true));
    saved.loss = std::move(ls);
    saved.mask = sequence_major_mask(ctx, loss_mask);
    return {masked_loss_sum(ctx, losses, saved.mask, loss_mask), std::move(saved)};
  }

  // The training forward: as above, with the output layer and the loss fused and chunked (FusedLoss).
  // Accumulates the output weight's gradient of  fused.loss_scale * sum(mask * loss)  now; backward
  // adds the rest.
  std::pair<LossSum<Space>, Saved> forward(Context& ctx, const Tensor<std::int32_t>& tokens,
                                           const Tensor<std::int32_t>& labels, const Tensor<float>& loss_mask,
                                           std::uint64_t dropout_key, const FusedLoss& fused) {
    if (!std::isfinite(fused.loss_scale))
      fail<ConfigError>("model forward: FusedLoss::loss_scale=", fused.loss_scale,
                        " must be a finite number (1 / tokens of the global batch)");
    fused.chunks.check();
    require_whole("model forward");
    set_router_loss_scale(fused.loss_scale, tokens);
    Saved saved;
    auto h = forward_to_final_norm(ctx, tokens, labels, loss_mask, dropout_key, saved);
    auto loss = fused_head(ctx, h, labels, loss_mask, fused, saved);
    mtp_forward(ctx, h, tokens, labels, loss_mask, dropout_key, fused, saved);
    return {std::move(loss), std::move(saved)};
  }

  // ---- pipeline stage entry points ----

  const pipeline::StageLayers& stage() const { return stage_; }
  bool has_embedding() const { return stage_.has_embedding; }
  bool has_head() const { return stage_.has_head; }

  // The shape of the residual stream a stage receives and sends for a [b, s] batch:
  // [s, b, h], or [s / tp, b, h] under sequence parallelism (each rank sends its sequence shard);
  // under context parallelism s is this rank's s / cp tokens.
  Shape boundary_shape(const Context& ctx, index_t micro_batch, index_t seq) const {
    const index_t local = seq / ctx.cp.size();
    return Shape{Policy::sequence_parallel ? local / ctx.tp.size() : local, micro_batch, static_cast<index_t>(config_.hidden_size)};
  }

  struct StageForward {
    Boundary output;     // to the next stage (empty on the last)
    LossSum<Space> loss;  // the last stage only
    Saved saved;
  };

  // The forward of this stage on one micro-batch: from the tokens (first stage) or the previous
  // stage's output `input`; the last stage runs the fused loss with `loss_scale` (the scale
  // backward_stage must be given; blocks of rows as `chunks` says) and returns the loss sum. tokens, labels, loss_mask: [b, s] on the
  // host (every stage checks the shapes; the first reads the tokens, the last the labels and mask).
  // With `needed`, each module's parameters are handed to it right before the module runs (the
  // embedding, each layer, the final norm, the output layer or the tied embedding it reads).
  StageForward forward_stage(Context& ctx, const Boundary* input, const Tensor<std::int32_t>& tokens,
                             const Tensor<std::int32_t>& labels, const Tensor<float>& loss_mask, std::uint64_t dropout_key,
                             double loss_scale, ClassifierChunks chunks = {}, const ParameterNeeded<T, Space>* needed = nullptr) {
    const FusedLoss fused{loss_scale, chunks};
    check_batch(ctx, tokens, labels, loss_mask);
    fused.chunks.check();
    set_router_loss_scale(loss_scale, tokens);
    if (needed != nullptr && !*needed) needed = nullptr;
    auto need = [&](auto& module) {
      if (needed != nullptr) module.for_each_parameter([&](const Parameter<T, Space>& p) { (*needed)(p); });
    };
    StageForward out;
    Boundary x;
    if (stage_.has_embedding) {
      need(*embedding_);
      if (positions_) need(*positions_);
      auto [e, emb] = embedding_->forward(ctx, sequence_major(ctx, tokens, /*are_labels=*/false));
      out.saved.embedding = std::move(emb);
      x = std::move(e);
      if (positions_) positions_->forward(ctx, x);
      dropout_forward(ctx, x, config_.hidden_dropout, embedding_dropout_key(dropout_key));
    } else {
      if (input == nullptr || !(input->shape() == boundary_shape(ctx, tokens.size(0), tokens.size(1))))
        fail<ShapeError>("forward_stage of layers [", stage_.layers.begin, ", ", stage_.layers.end,
                         "): the input from the previous stage must be ",
                         boundary_shape(ctx, tokens.size(0), tokens.size(1)).str(), ", got ",
                         input ? input->shape().str() : std::string("none"));
      x = *input;  // shared, read only
    }
    if (needed != nullptr) run_layers(ctx, x, dropout_key, out.saved, [&](std::size_t k) { need(layers_[k]); });
    else run_layers(ctx, x, dropout_key, out.saved);
    if (!stage_.has_head) {
      out.output = std::move(x);
      return out;
    }
    need(*final_norm_);
    if constexpr (TiedOutput) need(*embedding_);  // the output layer reads the (tied copy of the) embedding
    else need(*output_);
    auto [h, fn] = final_norm_->forward(ctx, x);
    out.saved.final_norm = std::move(fn);
    out.loss = fused_head(ctx, h, labels, loss_mask, fused, out.saved);
    if (!mtp_.empty()) {
      if constexpr (!TiedOutput) need(*embedding_);  // the depths read the (copy of the) word embedding
      for (auto& d : mtp_) need(*d);
      mtp_forward(ctx, h, tokens, labels, loss_mask, dropout_key, fused, out.saved);
    }
    return out;
  }

  // The backward of this stage: from the loss (last stage; loss_scale must be the forward's) or the
  // next stage's gradient `dy`; accumulates this stage's gradients and returns the gradient for the
  // previous stage (empty on the first). With `deferred`, the linear layers' weight gradients are
  // appended to it instead of computed (the first half of a split backward). With `ready` (and no
  // `deferred`: the step's last backward of this stage), each parameter is handed to it as soon as
  // its gradient is complete, from the head down to the embedding; the tied embedding's copies are
  // not (their gradients are summed between the stages after the step).
  Boundary backward_stage(Context& ctx, const Saved& saved, const Boundary* dy, double loss_scale,
                          DeferredWeightGradients* deferred = nullptr, const GradientReady<T, Space>* ready = nullptr) {
    if (deferred != nullptr) ready = nullptr;
    if (ready != nullptr && !*ready) ready = nullptr;
    const Parameter<T, Space>* tied_copy = tied_embedding_copy();
    auto done = [&](auto& part) {
      if (ready == nullptr) return;
      part.for_each_parameter([&](Parameter<T, Space>& p) {
        if (&p != tied_copy) (*ready)(p);
      });
    };
    Boundary dx;
    if (stage_.has_head) {
      check_fused_scale(saved, loss_scale);
      dx = final_norm_->backward(ctx, saved.final_norm, fused_head_gradient(ctx, saved));
      for (auto& d : mtp_) done(*d);
      done(*final_norm_);
      if constexpr (!TiedOutput) done(*output_);  // its gradient came with the fused forward
    } else {
      if (dy == nullptr) fail<ShapeError>("backward_stage of layers [", stage_.layers.begin, ", ", stage_.layers.end,
                                          "): a stage without the head needs the next stage's gradient");
      dx = *dy;  // shared, read only
    }
    dx = backward_with_recompute(ctx, std::move(dx), saved, deferred, ready);
    if (!stage_.has_embedding) return dx;
    embedding_dropout_backward(ctx, dx, embedding_dropout_key(saved.dropout_key));
    if (positions_) {
      positions_->backward(ctx, dx);
      done(*positions_);
    }
    embedding_->backward(ctx, saved.embedding, dx);
    done(*embedding_);
    return {};
  }

  // Forward only (validation): this stage's output for the next stage, or on the last stage the
  // loss sum (chunked, as evaluate); nothing is kept for a backward and no gradient is touched.
  std::pair<Boundary, LossSum<Space>> evaluate_stage(Context& ctx, const Boundary* input, const Tensor<std::int32_t>& tokens,
                                                     const Tensor<std::int32_t>& labels, const Tensor<float>& loss_mask,
                                                     std::uint64_t dropout_key = 0, ClassifierChunks chunks = {}) const {
    check_batch(ctx, tokens, labels, loss_mask);
    chunks.check();
    const RouterStatistics kept = router_statistics(ctx);  // put back when this returns
    Boundary x;
    if (stage_.has_embedding) {
      x = embedding_->forward(ctx, sequence_major(ctx, tokens, /*are_labels=*/false)).first;
      if (positions_) positions_->forward(ctx, x);
    } else {
      if (input == nullptr) fail<ShapeError>("evaluate_stage: a stage without the embedding needs the previous stage's output");
      x = *input;
    }
    for (std::size_t i = 0; i < layers_.size(); ++i)  // forward only: no attention dropout
      x = layers_[i].forward(ctx, x, layer_key(dropout_key, i), ForwardMode::evaluation).first;
    if (!stage_.has_head) return {std::move(x), {}};
    const auto h = final_norm_->forward(ctx, x).first;
    const auto losses = chunked_classifier_loss(ctx, *output_, loss_, h, sequence_major(ctx, labels, /*are_labels=*/true), chunks);
    return {Boundary{}, masked_loss_sum(ctx, losses, sequence_major_mask(ctx, loss_mask), loss_mask)};
  }

  // The word embedding when this stage holds one of two copies (the first or the last stage of a
  // pipeline with a tied output layer or multi-token prediction), else nullptr: the pipeline sums
  // their gradients.
  Parameter<T, Space>* tied_embedding_copy() {
    if (TiedOutput || config_.mtp_num_layers > 0)
      if (embedding_ && stage_.virtual_stages_total > 1) return &embedding_->weight();
    return nullptr;
  }

  // Accumulates every parameter's gradient of  loss_scale * sum(mask * loss)  (after a fused
  // forward: of every parameter but the output weight, whose share the forward added).
  void backward(Context& ctx, const Saved& saved, double loss_scale) {
    require_whole("model backward");
    Activation<T, Layout, Space> dh;  // d loss / d final norm output
    if (saved.fused_loss_scale) {
      check_fused_scale(saved, loss_scale);
      dh = fused_head_gradient(ctx, saved);
    } else {
      Tensor<A, Space> dloss = saved.mask.clone();
      ctx.device.template scale<A>(dloss.data(), dloss.numel(), loss_scale);
      if constexpr (mixture_of_experts) set_router_loss_scale(loss_scale * static_cast<double>(saved.mask.numel()));
      auto dlogits = loss_.backward(ctx, saved.loss, dloss, saved.logits_shape);
      dh = output_->backward(ctx, saved.output, dlogits);
    }
    auto dx = final_norm_->backward(ctx, saved.final_norm, dh);
    dx = backward_with_recompute(ctx, std::move(dx), saved, static_cast<DeferredWeightGradients*>(nullptr));
    embedding_dropout_backward(ctx, dx, embedding_dropout_key(saved.dropout_key));
    if constexpr (LearnedPositions) positions_->backward(ctx, dx);
    embedding_->backward(ctx, saved.embedding, dx);
  }

  // Forward only, for evaluation: the loss sum of forward (up to the rounding of the output GEMM over
  // blocks of rows), keeping nothing for a backward: each layer's saved tensors are dropped as soon
  // as the next layer has run, and the output layer and the loss run over blocks of rows (`chunks`),
  // so neither the activations of every layer nor the whole logits are held at once.
  LossSum<Space> evaluate(Context& ctx, const Tensor<std::int32_t>& tokens, const Tensor<std::int32_t>& labels,
                          const Tensor<float>& loss_mask, std::uint64_t dropout_key = 0, ClassifierChunks chunks = {}) const {
    require_whole("model evaluate");
    check_batch(ctx, tokens, labels, loss_mask);
    chunks.check();
    const RouterStatistics kept = router_statistics(ctx);  // put back when this returns
    auto x = embedding_->forward(ctx, sequence_major(ctx, tokens, /*are_labels=*/false)).first;
    if constexpr (LearnedPositions) positions_->forward(ctx, x);
    for (std::size_t i = 0; i < layers_.size(); ++i)  // forward only: no attention dropout
      x = layers_[i].forward(ctx, x, layer_key(dropout_key, i), ForwardMode::evaluation).first;
    const auto h = final_norm_->forward(ctx, x).first;
    const auto losses = chunked_classifier_loss(ctx, *output_, loss_, h, sequence_major(ctx, labels, /*are_labels=*/true), chunks);
    return masked_loss_sum(ctx, losses, sequence_major_mask(ctx, loss_mask), loss_mask);
  }

  // Forward only: the logits (real vocabulary, gathered from the tensor-parallel shards, identical
  // on every rank, read on the host) that predict the token after `position` of `tokens` [1, s].
  // Tokens after `position` do not influence them (causal attention), so a prompt may be padded to s.
  std::vector<double> next_token_logits(Context& ctx, const Tensor<std::int32_t>& tokens, index_t position) const {
    if (tokens.rank() != 2 || tokens.size(0) != 1 || position < 0 || position >= tokens.size(1))
      fail<ShapeError>("next_token_logits: tokens ", tokens.shape().str(), " must be [1, seq] and position ", position,
                       " inside it");
    if (ctx.cp.size() > 1)
      fail<ConfigError>("next_token_logits runs a whole sequence on one rank; build the model with "
                        "--context-parallel-size 1 for inference");
    check_sequence_parallel_length(ctx, tokens.size(1), "next_token_logits");
    require_whole("next_token_logits");
    const RouterStatistics kept = router_statistics(ctx);  // put back when this returns
    auto x = embedding_->forward(ctx, sequence_major(ctx, tokens, /*are_labels=*/false)).first;
    if constexpr (LearnedPositions) positions_->forward(ctx, x);
    for (const auto& layer : layers_) x = layer.forward(ctx, x, 0, ForwardMode::evaluation).first;
    auto logits = output_->forward(ctx, final_norm_->forward(ctx, x).first).first;                    // (s, 1, V / tp)
    const Tensor<T> full = to_host(gather_from_tensor_parallel(ctx.device, ctx.tp, logits).tensor);  // (s, 1, V)
    const index_t width = full.shape().cols();
    std::vector<double> out(static_cast<std::size_t>(config_.vocab_size));
    for (index_t v = 0; v < config_.vocab_size; ++v)
      out[static_cast<std::size_t>(v)] = static_cast<double>(static_cast<A>(full[position * width + v]));
    return out;
  }

  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    if (embedding_) embedding_->for_each_parameter(visit);  // on the last stage: the tied copy
    if (positions_) positions_->for_each_parameter(visit);
    for (auto& layer : layers_) layer.for_each_parameter(visit);
    if (final_norm_) final_norm_->for_each_parameter(visit);
    if constexpr (!TiedOutput)
      if (output_) output_->for_each_parameter(visit);
    for (auto& d : mtp_) d->for_each_parameter(visit);
  }

  // ---- multi-token prediction ----

  int mtp_depths() const { return static_cast<int>(mtp_.size()); }
  // [2 D]: each depth's masked loss sum (lambda not applied), then its token count (the rolled
  // mask's sum), since the last reset_mtp_losses: this rank's share (sum it over dp as the main
  // loss); a device tensor, empty for D = 0.
  Tensor<double, Space> mtp_losses(Context& ctx) const {
    const index_t d = static_cast<index_t>(mtp_.size());
    if (d == 0) return {};
    auto out = Tensor<double, Space>::zeros(Shape{2 * d});
    ctx.device.template copy<double>(mtp_loss_sums_.data(), d, out.data());
    Tensor<double> tokens(Shape{d});
    for (index_t k = 0; k < d; ++k) tokens[k] = mtp_tokens_[static_cast<std::size_t>(k)];
    const auto uploaded = upload(tokens);
    ctx.device.template copy<double>(uploaded.data(), d, out.data() + d);
    return out;
  }
  void reset_mtp_losses(Context&) {
    if (mtp_.empty()) return;
    mtp_loss_sums_ = Tensor<double, Space>::zeros(mtp_loss_sums_.shape());
    mtp_tokens_.assign(mtp_.size(), 0.0);
  }

  const ModelConfig& config() const { return config_; }

  // Activation recompute from the next forward on (models/recompute.hpp).
  void set_recompute(const RecomputeConfig& recompute) {
    recompute.validate(config_.num_layers);
    // A recomputed MoE layer routes its tokens again, the same way (the same input, deterministic kernels);
    // what its router records (the aux and z losses, the expert-bias load) is put back after the backward
    // (backward_with_recompute; MoeMlp's own for the block's recompute, which also sets forced balance's
    // random logits back). Under full recompute forced balance would draw new random logits at the
    // layer's second forward and route differently: refused, before anything is set.
    if constexpr (mixture_of_experts)
      if (recompute.granularity == RecomputeGranularity::full)
        for (const Router* r : routers_)
          if (r->config().force_load_balancing)
            fail<ConfigError>("full activation recompute with forced load balancing (random router logits, drawn anew at "
                              "each forward): a recomputed MoE layer would route its tokens differently from its forward; "
                              "use selective recompute (the MoE block's, --recompute-modules moe, draws the same logits "
                              "again)");
    recompute_ = recompute;
    for (auto& layer : layers_) {
      layer.set_recompute_attention_core(recompute.selective(recompute.attention_core));
      layer.set_recompute_moe_activation(recompute.selective(recompute.moe_activation));
      layer.set_recompute_moe_block(recompute.selective(recompute.moe_block));
    }
  }
  const RecomputeConfig& recompute() const { return recompute_; }

  // ---- mixture of experts (a MoeMlp block; empty or nothing for a dense model) ----

  // This stage's routers, one per MoE layer (config().moe_layer), in layer order.
  const std::vector<Router*>& routers() const { return routers_; }
  // Sets every router's loss scale: the factor its aux and z losses' gradients are multiplied by
  // (forward and backward set it from their loss_scale; see the note at the top).
  void set_router_loss_scale(double scale) {
    if constexpr (mixture_of_experts)
      for (Router* r : routers_) r->set_loss_scale(scale);
  }
  // [aux, z] summed over this stage's layers since the last reset_router_losses: this rank's share
  // (each rank adds its own tokens' part; the sum over ctx.tp_cp_dp and the pipeline stages is the
  // whole batch's, summed over the micro-batches and layers). A device tensor [2].
  Tensor<double, Space> router_losses(Context& ctx) const {
    auto sum = Tensor<double, Space>::zeros(Shape{2});
    if constexpr (mixture_of_experts)
      for (const Router* r : routers_) ctx.device.template add<double>(sum.data(), r->losses().data(), 2, sum.data());
    return sum;
  }
  void reset_router_losses(Context& ctx) {
    if constexpr (mixture_of_experts)
      for (Router* r : routers_) r->reset_losses(ctx);
  }
  // Once per step after the backward (aux-loss-free balancing): each router moves its expert bias.
  // Collective over ctx.tp_cp_dp; nothing without expert bias.
  void update_expert_bias(Context& ctx) {
    if constexpr (mixture_of_experts)
      for (Router* r : routers_) r->update_expert_bias(ctx);
  }
  // Tensors a checkpoint keeps besides the parameters: each router's expert bias (with expert
  // bias on), "<router>.expert_bias", replicated. visit(name, tensor).
  template <class Visitor>
  void for_each_persistent_tensor(Visitor&& visit) {
    if constexpr (mixture_of_experts)
      for (Router* r : routers_)
        if (r->config().expert_bias) {
          const std::string& weight = r->weight().name;  // "<router>.weight"
          visit(weight.substr(0, weight.rfind(".weight")) + ".expert_bias", r->expert_bias());
        }
  }

 private:
  // The routers' statistics, put back when the value is destroyed (a forward-only pass).
  class RouterStatistics {
   public:
    RouterStatistics(Context& ctx, const std::vector<Router*>& routers) {
      if constexpr (mixture_of_experts)
        for (const Router* r : routers)
          restore_.push_back([&ctx, r, kept = r->statistics()] { r->restore(ctx, kept); });
    }
    RouterStatistics(const RouterStatistics&) = delete;
    ~RouterStatistics() {
      for (auto& restore : restore_) restore();
    }

   private:
    std::vector<std::function<void()>> restore_;
  };
  RouterStatistics router_statistics(Context& ctx) const { return RouterStatistics(ctx, routers_); }

  // backward_layers over this stage's layers. Under full recompute a MoE layer's forward runs again
  // inside it, and its router adds its aux and z losses and its expert-bias load a second time: the
  // routers' statistics are taken before and put back after (the router's backward changes none of
  // them), so they hold what the forwards recorded, as without recompute.
  template <class Saved_, class Deferred, class Ready = std::nullptr_t>
  Boundary backward_with_recompute(Context& ctx, Boundary dx, const Saved_& saved, Deferred* deferred,
                                   const Ready* ready = nullptr) {
    std::optional<RouterStatistics> kept;
    if constexpr (mixture_of_experts)
      if (recompute_.granularity == RecomputeGranularity::full && !routers_.empty()) kept.emplace(ctx, routers_);
    return backward_layers(ctx, layers_, std::move(dx), saved.dropout_key, recompute_, saved.layers, saved.layer_inputs,
                           first_layer(), deferred, ready);
  }

  // The loss scale of a micro-batch of `tokens` [b, s]: loss_scale x b x s for the routers.
  void set_router_loss_scale(double loss_scale, const Tensor<std::int32_t>& tokens) {
    if constexpr (mixture_of_experts) set_router_loss_scale(loss_scale * static_cast<double>(tokens.numel()));
  }

  // The MLP block's configuration of layer `layer`: the dense Mlp's, or the MoeMlp's (config.moe),
  // which records its router in routers_; a layer config.moe.layers marks dense (--moe-layer-freq)
  // is a MoeMlp holding a dense Mlp of ffn_hidden_size.
  auto mlp_config(const ModelConfig& config, bool linear_bias, int layer) {
    const MlpConfig dense{config.hidden_size, config.ffn(), linear_bias, config.activation, config.activation_clamp,
                          config.glu_linear_offset};
    if constexpr (mixture_of_experts) {
      MoeMlpConfigWithRouters<Policy> c;
      const MoeModelConfig& m = config.moe;
      if (!m.enabled())
        fail<ConfigError>("a mixture-of-experts model needs moe.num_experts > 0 (--num-experts), got ", m.num_experts);
      if (!config.moe_layer(layer)) {
        c.config.hidden_size = config.hidden_size;
        c.config.dense = dense;
        return c;
      }
      c.config.hidden_size = config.hidden_size;
      c.config.num_experts = m.num_experts;
      c.config.topk = m.topk;
      c.config.expert_ffn_hidden_size = config.expert_ffn();
      c.config.shared_expert_ffn_hidden_size = m.shared_expert_ffn_hidden_size;
      c.config.shared_expert_gate = m.shared_expert_gate;
      c.config.dispatcher = m.token_dispatcher;
      c.config.activation = config.activation;
      c.config.glu_clamp = config.activation_clamp;
      c.config.glu_linear_offset = config.glu_linear_offset;
      c.config.bias = linear_bias;
      RouterConfig& r = c.config.router;
      r.routing = m.routing;
      r.load_balancing = m.load_balancing;
      r.aux_loss_coeff = m.aux_loss_coeff;
      r.z_loss_coeff = m.z_loss_coeff;
      r.expert_bias = m.expert_bias;
      r.expert_bias_update_rate = m.expert_bias_update_rate;
      r.capacity_factor = m.capacity_factor;
      r.drop_policy = m.drop_policy;
      r.pad_to_capacity = m.pad_to_capacity;
      r.force_load_balancing = m.force_load_balancing;
      c.routers = &routers_;
      return c;
    } else {
      (void)layer;
      return dense;
    }
  }

  static AttentionConfig attention_config(const ModelConfig& config, bool linear_bias, int layer) {
    AttentionConfig c{config.hidden_size, config.num_attention_heads, config.num_query_groups,
                      config.rope_base,   linear_bias,                config.attention_dropout};
    c.kv_channels = config.kv_channels;
    c.qkv_bias = config.add_qkv_bias;
    if (config.qk_layernorm)  // the model's own norm, as Megatron's --qk-layernorm
      c.qk_norm = std::is_same_v<Norm<Policy>, RmsNorm<Policy>> ? QkNorm::rmsnorm : QkNorm::layernorm;
    c.qk_norm_epsilon = config.norm_epsilon;
    c.qk_norm_zero_centered = config.apply_layernorm_1p;
    c.rope = config.rope_variant(c.rope);
    c.softmax = config.softmax_type;  // --softmax-type (attention sinks)
    c.window = config.layer_window(layer);  // --window-size, on the layers --window-attn-skip-freq gives it
    if (config.multi_latent_attention) {  // --qk-layernorm is the latents' RMSNorms there, as in Megatron
      c.latent = LatentAttentionConfig{config.q_lora_rank,         config.kv_lora_rank, config.qk_head_dim,
                                       config.qk_pos_emb_head_dim, config.v_head_dim,   config.norm_epsilon,
                                       config.qk_layernorm};
      c.qk_norm = QkNorm::none;
    }
    return c;
  }

  // The depths of multi-token prediction (see the top), named "mtp.<k - 1>.*".
  void build_mtp(Context& ctx, const ModelConfig& config, bool linear_bias, const pipeline::StageLayers& stage) {
    const int depths = config.mtp_num_layers;
    if constexpr (LearnedPositions)
      fail<ConfigError>("mtp_num_layers=", depths, " (--mtp-num-layers): multi-token prediction is built for RoPE models "
                        "(Llama's set, with or without experts) so far; GPT's learned positions would need their own rule for "
                        "the shifted tokens");
    if (!stage.has_head) return;  // the depths live on the last stage (with a copy of the word embedding)
    for (int k = 0; k < depths; ++k)
      // The layer is one of the model's kind, with the last layer's attention options and MLP (a MoE
      // layer's router joins routers(): its aux and z losses and expert bias count as the others').
      mtp_.push_back(std::make_unique<MtpDepth>(ctx, "mtp." + std::to_string(k), config,
                                                attention_config(config, linear_bias, config.num_layers - 1),
                                                mlp_config(config, linear_bias, config.num_layers - 1)));
    mtp_loss_sums_ = Tensor<double, Space>::zeros(Shape{static_cast<index_t>(depths)});
    mtp_tokens_.assign(static_cast<std::size_t>(depths), 0.0);
  }

  // `ids` [b, s] rolled left by `k` along the sequence (position i takes i + k, the last k wrap).
  template <class X>
  static Tensor<X> rolled(const Tensor<X>& ids, index_t k) {
    const index_t b = ids.size(0), s = ids.size(1);
    Tensor<X> out = Tensor<X>::empty(ids.shape());
    for (index_t r = 0; r < b; ++r)
      for (index_t i = 0; i < s; ++i) out[r * s + i] = ids[r * s + (i + k) % s];
    return out;
  }

  // The depths' forward on the final norm's output h (fused output layer and loss per depth, with
  // the output weight's gradient accumulated now); their Saved go to saved.mtp.
  void mtp_forward(Context& ctx, const Activation<T, Layout, Space>& h, const Tensor<std::int32_t>& tokens,
                   const Tensor<std::int32_t>& labels, const Tensor<float>& loss_mask, std::uint64_t dropout_key,
                   const FusedLoss& fused, Saved& saved) {
    if (mtp_.empty()) return;
    const index_t depths = static_cast<index_t>(mtp_.size()), b = tokens.size(0), s = tokens.size(1);
    const double scale = fused.loss_scale * config_.mtp_loss_scaling_factor / static_cast<double>(depths);
    Activation<T, Layout, Space> previous = h;  // shared, read only
    saved.mtp.clear();
    for (index_t k = 1; k <= depths; ++k) {
      MtpDepth& d = *mtp_[static_cast<std::size_t>(k - 1)];
      MtpSaved m;
      const Tensor<std::int32_t> tokens_k = rolled(tokens, k), labels_k = rolled(labels, k);
      Tensor<float> mask_k = rolled(loss_mask, k);
      for (index_t r = 0; r < b; ++r)
        for (index_t i = s - k; i < s; ++i) mask_k[r * s + i] = 0.0f;  // no token k places past the end
      auto [e, emb] = embedding_->forward(ctx, sequence_major(ctx, tokens_k, /*are_labels=*/false));
      m.embedding = std::move(emb);
      dropout_forward(ctx, e, config_.hidden_dropout, mtp_embedding_dropout_key(dropout_key, k));
      auto [en, ens] = d.enorm.forward(ctx, e);
      auto [hn, hns] = d.hnorm.forward(ctx, previous);
      auto [pe, pes] = d.proj_e.forward(ctx, en);  // [s, b, h / tp]; ours: the other half goes in place
      auto [ph, phs] = d.proj_h.forward(ctx, hn);
      ctx.device.template add<T>(pe.data(), ph.data(), pe.tensor.numel(), pe.data());
      m.enorm = std::move(ens), m.hnorm = std::move(hns), m.proj_e = std::move(pes), m.proj_h = std::move(phs);
      auto [y, ls] = d.layer.forward(ctx, mtp_layer_input(ctx, pe), rng::mix(dropout_key, static_cast<std::uint64_t>(config_.num_layers + k - 1)));
      m.layer = std::move(ls);
      auto [hk, fns] = d.final_norm.forward(ctx, y);
      m.final_norm = std::move(fns);
      Tensor<A, Space> mask = sequence_major_mask(ctx, mask_k);
      Tensor<A, Space> dloss = mask.clone();
      ctx.device.template scale<A>(dloss.data(), dloss.numel(), scale);
      auto result = chunked_classifier(ctx, *output_, loss_, hk, sequence_major(ctx, labels_k, /*are_labels=*/true), dloss,
                                       fused.chunks);
      m.output_gradient = std::move(result.input_gradient);
      const LossSum<Space> depth_loss = masked_loss_sum(ctx, result.losses, mask, mask_k);
      ctx.device.template add<double>(mtp_loss_sums_.data() + (k - 1), depth_loss.sum.data(), 1, mtp_loss_sums_.data() + (k - 1));
      mtp_tokens_[static_cast<std::size_t>(k - 1)] += depth_loss.tokens;
      previous = std::move(hk);
      saved.mtp.push_back(std::move(m));
    }
  }

  // The projection's output [s, b, h / tp] to the residual layout: gathered over tp, and under
  // sequence parallelism this rank's sequence shard.
  Activation<T, Layout, Space> mtp_layer_input(Context& ctx, const Activation<T, layout::sharded<-1>, Space>& x) const {
    auto whole = gather_from_tensor_parallel(ctx.device, ctx.tp, x);
    if constexpr (Policy::sequence_parallel) return scatter_to_sequence_parallel(ctx.device, ctx.tp, whole);
    else return whole;
  }

  // d objective / d final norm output after a fused forward: the output layer's share (kept by the
  // forward) and, with depths, theirs (their backward runs here).
  Activation<T, Layout, Space> fused_head_gradient(Context& ctx, const Saved& saved) {
    if (saved.mtp.empty()) return saved.final_norm_output_gradient;  // shared, read only
    Activation<T, Layout, Space> dh = mtp_backward(ctx, saved);     // ours: the head's share goes in place
    ctx.device.template add<T>(dh.data(), saved.final_norm_output_gradient.data(), dh.tensor.numel(), dh.data());
    return dh;
  }

  // The depths' backward, D down to 1; accumulates their gradients (and the word embedding's) and
  // returns d objective / d h_0 from the depths (the main head's share is not in it).
  Activation<T, Layout, Space> mtp_backward(Context& ctx, const Saved& saved) {
    Activation<T, Layout, Space> carry;  // d / d h_k from depth k + 1
    for (std::size_t j = saved.mtp.size(); j-- > 0;) {
      MtpDepth& d = *mtp_[j];
      const MtpSaved& m = saved.mtp[j];
      Activation<T, Layout, Space> dh = m.output_gradient;
      if (!carry.tensor.empty()) {
        dh = Activation<T, Layout, Space>(m.output_gradient.tensor.clone());
        ctx.device.template add<T>(dh.data(), carry.data(), dh.tensor.numel(), dh.data());
      }
      auto dy = d.final_norm.backward(ctx, m.final_norm, dh);
      auto dx = d.layer.backward(ctx, m.layer, dy);
      Activation<T, layout::replicated, Space> whole;
      if constexpr (Policy::sequence_parallel) whole = scatter_to_sequence_parallel_backward(ctx.device, ctx.tp, dx);
      else whole = dx;
      const auto dp = gather_from_tensor_parallel_backward(ctx.device, ctx.tp, whole);
      auto den = d.proj_e.backward(ctx, m.proj_e, dp);
      auto dhn = d.proj_h.backward(ctx, m.proj_h, dp);
      auto de = d.enorm.backward(ctx, m.enorm, den);
      embedding_dropout_backward(ctx, de, mtp_embedding_dropout_key(saved.dropout_key, static_cast<index_t>(j) + 1));
      embedding_->backward(ctx, m.embedding, de);
      carry = d.hnorm.backward(ctx, m.hnorm, dhn);
    }
    return carry;
  }
  static std::uint64_t mtp_embedding_dropout_key(std::uint64_t dropout_key, index_t k) {
    return rng::mix(embedding_dropout_key(dropout_key), static_cast<std::uint64_t>(k));
  }

  // Checks the batch, runs the embedding, the layers and the final norm (their Saved go to `saved`),
  // returns the final norm's output [s, b, h] in the residual layout.
  Activation<T, Layout, Space> forward_to_final_norm(Context& ctx, const Tensor<std::int32_t>& tokens,
                                                     const Tensor<std::int32_t>& labels, const Tensor<float>& loss_mask,
                                                     std::uint64_t dropout_key, Saved& saved) const {
    check_batch(ctx, tokens, labels, loss_mask);
    auto [x, emb] = embedding_->forward(ctx, sequence_major(ctx, tokens, /*are_labels=*/false));
    saved.embedding = std::move(emb);
    if constexpr (LearnedPositions) positions_->forward(ctx, x);
    dropout_forward(ctx, x, config_.hidden_dropout, embedding_dropout_key(dropout_key));
    run_layers(ctx, x, dropout_key, saved);
    auto [h, fn] = final_norm_->forward(ctx, x);
    saved.final_norm = std::move(fn);
    return std::move(h);
  }

  // Megatron's embedding dropout: --hidden-dropout on the embedding's output (words + positions),
  // with a key of its own (layer keys mix in the layer index, far below this constant).
  static std::uint64_t embedding_dropout_key(std::uint64_t dropout_key) { return rng::mix(dropout_key, 0x656d626564646e67ull); }
  // The backward of the embedding output's dropout drawn with `key` (embedding_dropout_key, or a
  // depth's mtp_embedding_dropout_key).
  void embedding_dropout_backward(Context& ctx, Activation<T, Layout, Space>& dx, std::uint64_t key) const {
    if (config_.hidden_dropout <= 0) return;
    dx = Activation<T, Layout, Space>(dx.tensor.clone());  // dropout_backward works in place: on our own copy
    dropout_backward(ctx, dx, config_.hidden_dropout, key);
  }

  // The dropout key of local layer i: keyed by the global layer index, so a stage draws the masks
  // the whole model draws.
  std::uint64_t layer_key(std::uint64_t dropout_key, std::size_t i) const {
    return rng::mix(dropout_key, static_cast<std::uint64_t>(stage_.layers.begin) + i);
  }

  // x := the layers' output; their Saved go to `saved`.
  // (recompute.hpp: under activation recompute some layers keep only their input.)
  template <class BeforeLayer = NoLayerHook>
  void run_layers(Context& ctx, Activation<T, Layout, Space>& x, std::uint64_t dropout_key, Saved& saved,
                  const BeforeLayer& before_layer = {}) const {
    saved.dropout_key = dropout_key;
    x = forward_layers(ctx, layers_, std::move(x), dropout_key, recompute_, saved.layers, saved.layer_inputs, first_layer(),
                       before_layer);
  }
  std::uint64_t first_layer() const { return static_cast<std::uint64_t>(stage_.layers.begin); }

  // The output layer and the loss fused over blocks of rows (the training path); fills the head's
  // part of `saved` and returns the loss sum.
  LossSum<Space> fused_head(Context& ctx, const Activation<T, Layout, Space>& h, const Tensor<std::int32_t>& labels,
                            const Tensor<float>& loss_mask, const FusedLoss& fused, Saved& saved) {
    if (!std::isfinite(fused.loss_scale))
      fail<ConfigError>("model forward: FusedLoss::loss_scale=", fused.loss_scale,
                        " must be a finite number (1 / tokens of the global batch)");
    saved.mask = sequence_major_mask(ctx, loss_mask);
    Tensor<A, Space> dloss = saved.mask.clone();  // [s, b]: mask * loss_scale, as backward makes it
    ctx.device.template scale<A>(dloss.data(), dloss.numel(), fused.loss_scale);
    auto result = chunked_classifier(ctx, *output_, loss_, h, sequence_major(ctx, labels, /*are_labels=*/true), dloss,
                                     fused.chunks);
    saved.final_norm_output_gradient = std::move(result.input_gradient);
    saved.fused_loss_scale = fused.loss_scale;
    return masked_loss_sum(ctx, result.losses, saved.mask, loss_mask);
  }

  static void check_fused_scale(const Saved& saved, double loss_scale) {
    if (!saved.fused_loss_scale) return;
    if (*saved.fused_loss_scale != loss_scale)
      fail<ConfigError>("model backward: loss_scale=", std::setprecision(17), loss_scale,
                        " differs from the loss_scale=", *saved.fused_loss_scale,
                        " the fused forward (FusedLoss) computed the output layer's gradients with; pass the same "
                        "scale to both");
  }

  void require_whole(const char* who) const {
    if (!stage_.has_embedding || !stage_.has_head)
      fail<ConfigError>(who, " needs the whole model, but this one is the pipeline stage of layers [", stage_.layers.begin, ", ",
                        stage_.layers.end, ")", stage_.has_embedding ? " with the embedding" : "",
                        stage_.has_head ? " with the head" : "", "; run a pipeline stage with forward_stage / backward_stage");
  }

  static ParallelConfig without_pipeline(ParallelConfig c) {
    c.pp = 1;  // the stage split is checked by check_stage (pipeline::stage_layers_of made it)
    return c;
  }
  static bool check_stage(const ModelConfig& config, const pipeline::StageLayers& s) {
    if (s.layers.begin < 0 || s.layers.end > config.num_layers || s.layers.empty())
      fail<ConfigError>("pipeline stage of layers [", s.layers.begin, ", ", s.layers.end, ") is not a non-empty range of the ",
                        config.num_layers, " layers; make it with pipeline::stage_layers_of");
    return true;
  }

  void check_batch(const Context& ctx, const Tensor<std::int32_t>& tokens, const Tensor<std::int32_t>& labels,
                   const Tensor<float>& loss_mask) const {
    if (tokens.rank() != 2 || !(tokens.shape() == labels.shape()) || !(tokens.shape() == loss_mask.shape()))
      fail<ShapeError>("model forward: tokens ", tokens.shape().str(), ", labels ", labels.shape().str(), " and loss mask ",
                       loss_mask.shape().str(), " must all be [batch, seq]");
    if (tokens.size(1) > config_.seq_length)
      fail<ConfigError>("model forward: sequence of ", tokens.size(1), " tokens exceeds seq_length=", config_.seq_length);
    check_sequence_parallel_length(ctx, tokens.size(1), "model forward");
  }

  // The mask: [b, s] floats on the host -> [s, b] in A, on the backend.
  Tensor<A, Space> sequence_major_mask(Context& ctx, const Tensor<float>& whole_mask) const {
    const Tensor<float> loss_mask = local_sequence(whole_mask, ctx.cp.size(), ctx.cp.rank(), "model forward");
    const index_t b = loss_mask.size(0), s = loss_mask.size(1);
    auto mask_bs = upload(loss_mask);
    auto mask_sb = Tensor<float, Space>::empty(Shape{s, b});
    ctx.device.template transpose<float>(mask_bs.data(), b, s, mask_sb.data());
    auto mask = Tensor<A, Space>::empty(Shape{s, b});
    ctx.device.template convert<float, A>(mask_sb.data(), s * b, mask.data());
    return mask;
  }

  // sum(mask * loss) on the backend; the token count on the host (this rank's tokens under context
  // parallelism: the sums over the cp group are the whole sequence's).
  LossSum<Space> masked_loss_sum(Context& ctx, const Tensor<A, Space>& losses, const Tensor<A, Space>& mask,
                                 const Tensor<float>& whole_mask) const {
    const Tensor<float> loss_mask = local_sequence(whole_mask, ctx.cp.size(), ctx.cp.rank(), "model forward");
    LossSum<Space> result;
    result.sum = Tensor<double, Space>::empty(Shape{1});
    ctx.device.template masked_loss_sum<A>(losses.data(), mask.data(), losses.numel(), result.sum.data());
    for (index_t i = 0; i < loss_mask.numel(); ++i) result.tokens += loss_mask[i];
    return result;
  }

  // Sequence parallelism splits every sequence over the tensor-parallel ranks: a batch shorter than
  // seq_length must still be a multiple of tp. Checked here, before the layers, so the error names
  // the lengths rather than a layout conversion deep inside.
  void check_sequence_parallel_length(const Context& ctx, index_t length, const char* who) const {
    if (ctx.cp.size() > 1) {  // the lengths every rank holds: two chunks of 2 cp
      (void)context_parallel_split(length, ctx.cp.size(), ctx.cp.rank(), who);
      if constexpr (Policy::sequence_parallel) {
        const index_t local = length / ctx.cp.size();
        if (local % ctx.tp.size() != 0)
          fail<ConfigError>(who, ": sequence parallelism splits each context-parallel rank's ", local, " tokens (", length,
                            " tokens over cp=", ctx.cp.size(), ") over the tp=", ctx.tp.size(),
                            " ranks; use a sequence length that is a multiple of ", 2 * ctx.cp.size() * ctx.tp.size());
      }
      return;
    }
    if constexpr (Policy::sequence_parallel) {
      const int tp = ctx.tp.size();
      if (length % tp != 0)
        fail<ConfigError>(who, ": sequence parallelism splits each sequence over the tp=", tp, " ranks, but this batch has ",
                          length, " tokens per sequence (seq_length=", config_.seq_length, "), not a multiple of ", tp,
                          "; pad the batch to a multiple of tp or run without sequence parallelism");
    }
  }

  template <class X>
  static Tensor<X, Space> upload(const Tensor<X>& host) {
    if constexpr (std::is_same_v<Space, space::host>) return host;
    else return to_device<Space>(host);
  }

  // Host ids [b, s] -> [s, b] in the backend's space. Device-bound ids are checked on the host first
  // (host ones are checked by the embedding and the loss themselves).
  // Under context parallelism: this rank's two chunks of each sequence (shard/context_parallel.hpp).
  Tensor<std::int32_t, Space> sequence_major(Context& ctx, const Tensor<std::int32_t>& whole_ids, bool are_labels) const {
    const Tensor<std::int32_t> ids = local_sequence(whole_ids, ctx.cp.size(), ctx.cp.rank(), "model forward");
    const index_t b = ids.size(0), s = ids.size(1);
    if constexpr (!std::is_same_v<Space, space::host>) {
      if (are_labels) VocabParallelCrossEntropy<Policy>::check_labels(ids, config_.vocab_size);
      else check_token_ids(ids, embedding_->real_vocab_size(), "VocabParallelEmbedding " + embedding_->name());
    }
    auto bs = upload(ids);
    auto sb = Tensor<std::int32_t, Space>::empty(Shape{s, b});
    ctx.device.template transpose<std::int32_t>(bs.data(), b, s, sb.data());
    return sb;
  }

  ModelConfig config_;
  pipeline::StageLayers stage_;
  std::optional<VocabParallelEmbedding<Policy>> embedding_;  // first stage, or the tied copy on the last
  std::optional<PositionEmbedding<Policy>> positions_;
  std::vector<Layer> layers_;
  std::optional<Norm<Policy>> final_norm_;
  std::optional<Output> output_;
  VocabParallelCrossEntropy<Policy> loss_;
  RecomputeConfig recompute_{};
  std::vector<Router*> routers_;  // MoE: the routers of layers_, in order (held by address: layers_ never moves)
  std::vector<std::unique_ptr<MtpDepth>> mtp_;  // multi-token prediction depths (empty: none)
  Tensor<double, Space> mtp_loss_sums_;         // [D]: see mtp_losses
  std::vector<double> mtp_tokens_;              // [D]: their token counts, on the host
};

}  // namespace models
STRATA_NAMESPACE_END
