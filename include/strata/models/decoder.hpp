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
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../layers.hpp"
#include "config.hpp"

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

  struct Saved {
    typename VocabParallelEmbedding<Policy>::Saved embedding;
    std::vector<typename Layer::Saved> layers;
    typename Norm<Policy>::Saved final_norm;
    typename Output::Saved output;
    typename VocabParallelCrossEntropy<Policy>::Saved loss;
    Tensor<A, Space> mask;  // [s, b]
    Shape logits_shape;
  };

  DecoderModel(Context& ctx, const ModelConfig& config, bool linear_bias)
      : config_((validate(config, ctx.config, Policy::sequence_parallel, ctx.world.size()), config)),
        embedding_(ctx, "embedding.word", config.padded_vocab(ctx.tp.size()), config.hidden_size),
        final_norm_(ctx, "final_norm", config.hidden_size, config.norm_epsilon),
        loss_(config.label_smoothing, config.vocab_size) {
    if constexpr (LearnedPositions) positions_.emplace(ctx, "embedding.position", config.seq_length, config.hidden_size);
    layers_.reserve(static_cast<std::size_t>(config.num_layers));
    for (int i = 0; i < config.num_layers; ++i)
      layers_.emplace_back(ctx, "layers." + std::to_string(i),
                           TransformerLayerConfig{config.hidden_size, config.norm_epsilon, config.hidden_dropout},
                           AttentionConfig{config.hidden_size, config.num_attention_heads, config.num_query_groups,
                                           config.rope_base, linear_bias},
                           MlpConfig{config.hidden_size, config.ffn(), linear_bias});
    if constexpr (TiedOutput) output_.emplace(embedding_.weight());
    else output_.emplace(ctx, "output", config.hidden_size, config.padded_vocab(ctx.tp.size()), false);
  }
  DecoderModel(const DecoderModel&) = delete;  // the tied output layer points at the embedding

  // Megatron's init: N(0, std) everywhere, output projections of each layer N(0, std / sqrt(2 L)).
  void init(Context& ctx, std::uint64_t seed) {
    const double std = config_.init_method_std, scaled = std / std::sqrt(2.0 * config_.num_layers);
    embedding_.init(ctx, seed, std);
    if constexpr (LearnedPositions) positions_->init(ctx, seed, std);
    for (auto& layer : layers_) layer.init(ctx, seed, std, scaled);
    if constexpr (!TiedOutput) output_->init(ctx, seed, std);
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
    if (tokens.rank() != 2 || !(tokens.shape() == labels.shape()) || !(tokens.shape() == loss_mask.shape()))
      fail<ShapeError>("model forward: tokens ", tokens.shape().str(), ", labels ", labels.shape().str(), " and loss mask ",
                       loss_mask.shape().str(), " must all be [batch, seq]");
    if (tokens.size(1) > config_.seq_length)
      fail<ConfigError>("model forward: sequence of ", tokens.size(1), " tokens exceeds seq_length=", config_.seq_length);
    check_sequence_parallel_length(ctx, tokens.size(1), "model forward");
    Saved saved;
    auto [x, emb] = embedding_.forward(ctx, sequence_major(ctx, tokens, /*are_labels=*/false));
    saved.embedding = std::move(emb);
    if constexpr (LearnedPositions) positions_->forward(ctx, x);
    saved.layers.reserve(layers_.size());
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      auto [y, s] = layers_[i].forward(ctx, x, rng::mix(dropout_key, i));
      x = std::move(y);
      saved.layers.push_back(std::move(s));
    }
    auto [h, fn] = final_norm_.forward(ctx, x);
    saved.final_norm = std::move(fn);
    auto [logits, out] = output_->forward(ctx, h);
    saved.output = std::move(out);
    saved.logits_shape = logits.shape();
    auto [losses, ls] = loss_.forward(ctx, logits, sequence_major(ctx, labels, /*are_labels=*/true));
    saved.loss = std::move(ls);
    // the mask: [b, s] floats -> [s, b] in A, on the backend; the token count on the host
    const index_t b = loss_mask.size(0), s = loss_mask.size(1);
    auto mask_bs = upload(loss_mask);
    auto mask_sb = Tensor<float, Space>::empty(Shape{s, b});
    ctx.device.template transpose<float>(mask_bs.data(), b, s, mask_sb.data());
    saved.mask = Tensor<A, Space>::empty(Shape{s, b});
    ctx.device.template convert<float, A>(mask_sb.data(), s * b, saved.mask.data());
    LossSum<Space> result;
    result.sum = Tensor<double, Space>::empty(Shape{1});
    ctx.device.template masked_loss_sum<A>(losses.data(), saved.mask.data(), losses.numel(), result.sum.data());
    for (index_t i = 0; i < loss_mask.numel(); ++i) result.tokens += loss_mask[i];
    return {std::move(result), std::move(saved)};
  }

  // Accumulates every parameter's gradient of  loss_scale * sum(mask * loss).
  void backward(Context& ctx, const Saved& saved, double loss_scale) {
    Tensor<A, Space> dloss = saved.mask.clone();
    ctx.device.template scale<A>(dloss.data(), dloss.numel(), loss_scale);
    auto dlogits = loss_.backward(ctx, saved.loss, dloss, saved.logits_shape);
    auto dx = final_norm_.backward(ctx, saved.final_norm, output_->backward(ctx, saved.output, dlogits));
    for (std::size_t i = layers_.size(); i-- > 0;) dx = layers_[i].backward(ctx, saved.layers[i], dx);
    if constexpr (LearnedPositions) positions_->backward(ctx, dx);
    embedding_.backward(ctx, saved.embedding, dx);
  }

  // Forward only: the logits (real vocabulary, gathered from the tensor-parallel shards, identical
  // on every rank, read on the host) that predict the token after `position` of `tokens` [1, s].
  // Tokens after `position` do not influence them (causal attention), so a prompt may be padded to s.
  std::vector<double> next_token_logits(Context& ctx, const Tensor<std::int32_t>& tokens, index_t position) const {
    if (tokens.rank() != 2 || tokens.size(0) != 1 || position < 0 || position >= tokens.size(1))
      fail<ShapeError>("next_token_logits: tokens ", tokens.shape().str(), " must be [1, seq] and position ", position,
                       " inside it");
    check_sequence_parallel_length(ctx, tokens.size(1), "next_token_logits");
    auto x = embedding_.forward(ctx, sequence_major(ctx, tokens, /*are_labels=*/false)).first;
    if constexpr (LearnedPositions) positions_->forward(ctx, x);
    for (const auto& layer : layers_) x = layer.forward(ctx, x).first;
    auto logits = output_->forward(ctx, final_norm_.forward(ctx, x).first).first;                     // (s, 1, V / tp)
    const Tensor<T> full = to_host(gather_from_tensor_parallel(ctx.device, ctx.tp, logits).tensor);  // (s, 1, V)
    const index_t width = full.shape().cols();
    std::vector<double> out(static_cast<std::size_t>(config_.vocab_size));
    for (index_t v = 0; v < config_.vocab_size; ++v)
      out[static_cast<std::size_t>(v)] = static_cast<double>(static_cast<A>(full[position * width + v]));
    return out;
  }

  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    embedding_.for_each_parameter(visit);
    if constexpr (LearnedPositions) positions_->for_each_parameter(visit);
    for (auto& layer : layers_) layer.for_each_parameter(visit);
    final_norm_.for_each_parameter(visit);
    if constexpr (!TiedOutput) output_->for_each_parameter(visit);
  }

  const ModelConfig& config() const { return config_; }

 private:
  // Sequence parallelism splits every sequence over the tensor-parallel ranks: a batch shorter than
  // seq_length must still be a multiple of tp. Checked here, before the layers, so the error names
  // the lengths rather than a layout conversion deep inside.
  void check_sequence_parallel_length(const Context& ctx, index_t length, const char* who) const {
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
  Tensor<std::int32_t, Space> sequence_major(Context& ctx, const Tensor<std::int32_t>& ids, bool are_labels) const {
    const index_t b = ids.size(0), s = ids.size(1);
    if constexpr (!std::is_same_v<Space, space::host>) {
      if (are_labels) VocabParallelCrossEntropy<Policy>::check_labels(ids, config_.vocab_size);
      else check_token_ids(ids, embedding_.vocab_size(), "VocabParallelEmbedding " + embedding_.name());
    }
    auto bs = upload(ids);
    auto sb = Tensor<std::int32_t, Space>::empty(Shape{s, b});
    ctx.device.template transpose<std::int32_t>(bs.data(), b, s, sb.data());
    return sb;
  }

  ModelConfig config_;
  VocabParallelEmbedding<Policy> embedding_;
  std::optional<PositionEmbedding<Policy>> positions_;
  std::vector<Layer> layers_;
  Norm<Policy> final_norm_;
  std::optional<Output> output_;
  VocabParallelCrossEntropy<Policy> loss_;
};

}  // namespace models
STRATA_NAMESPACE_END
