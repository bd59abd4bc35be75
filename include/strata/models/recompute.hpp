// strata/models/recompute.hpp: activation recompute over a stack of transformer layers (Megatron's
// --recompute-granularity, --recompute-method, --recompute-num-layers), built on the layer
// contract: a recomputed layer's `saved` is dropped after its forward and made again, by running
// its forward a second time, inside the backward.
//
//   granularity none       every layer keeps its Saved
//   granularity selective  every layer keeps its Saved, except the tensors of the modules named:
//                          the attention core's (`attention_core`, the default;
//                          SelfAttention::set_recompute_core) and the routed experts' activation
//                          (`moe_activation`, Megatron's moe_act; GroupedExperts::
//                          set_recompute_activation) or the whole MoE block (`moe_block`,
//                          Megatron's moe: the block keeps its input; MoeMlp::set_recompute_block),
//                          each made again inside the backward
//   granularity full, method uniform, n layers
//                          the layers form chunks of n ([0, n), [n, 2n), ...); only each chunk's
//                          input is kept; the backward of a chunk first runs its forward again
//                          (keeping its Saved for that chunk only), then its backward
//   granularity full, method block, n layers
//                          the first n layers keep only their input, and are recomputed one by one;
//                          the others keep their Saved
//
// A layer's forward draws its dropout masks from the counter-based RNG under the key it is given
// (rng::mix(dropout_key, global layer index): layers[i] is the model's layer first_layer + i, so a
// pipeline stage draws the masks the whole model draws), and every kernel is deterministic, so the recomputed Saved
// is bit for bit the one that was dropped and gradients equal those without recompute exactly.
// Collectives inside a recomputed forward (sequence-parallel all-gathers) run again, on every rank
// of the group alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"

STRATA_NAMESPACE_BEGIN
namespace models {

enum class RecomputeGranularity { none, selective, full };
enum class RecomputeMethod { uniform, block };

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::none;
  RecomputeMethod method = RecomputeMethod::uniform;
  int num_layers = 1;
  // selective: which modules (Megatron's --recompute-modules core_attn, moe_act, moe)
  bool attention_core = true;
  bool moe_activation = false;
  bool moe_block = false;
  bool selective(bool module) const { return granularity == RecomputeGranularity::selective && module; }

  void validate(int model_layers) const {
    if (granularity == RecomputeGranularity::full && (num_layers < 1 || num_layers > model_layers))
      fail<ConfigError>("full activation recompute: recompute_num_layers=", num_layers, " must lie in [1, ", model_layers,
                        "] (the model's layers); with method uniform it is the chunk size, with block the number of "
                        "recomputed layers");
  }
  // Whether layer i drops its Saved in the forward.
  bool recomputed(int i) const {
    if (granularity != RecomputeGranularity::full) return false;
    return method == RecomputeMethod::uniform || i < num_layers;
  }
  // The first layer of the chunk layer i (recomputed) belongs to.
  int chunk_start(int i) const { return method == RecomputeMethod::uniform ? i / num_layers * num_layers : i; }
};

inline RecomputeGranularity parse_recompute_granularity(const std::string& s) {
  if (s == "none" || s.empty()) return RecomputeGranularity::none;
  if (s == "selective") return RecomputeGranularity::selective;
  if (s == "full") return RecomputeGranularity::full;
  fail<ConfigError>("recompute granularity '", s, "' is not one of none, selective, full");
}
inline RecomputeMethod parse_recompute_method(const std::string& s) {
  if (s == "uniform") return RecomputeMethod::uniform;
  if (s == "block") return RecomputeMethod::block;
  fail<ConfigError>("recompute method '", s, "' is not one of uniform, block");
}

// Runs layers[0..L) forward on x under `config`: saved[i] is layer i's Saved, or empty when it is
// recomputed; inputs[i] holds the input of each chunk's first recomputed layer. Returns the output.
// before_layer(i), when given, runs right before layer i (the ParameterNeeded hook's place).
struct NoLayerHook {
  void operator()(std::size_t) const {}
};
template <class Context, class Layers, class Act, class LayerSaved, class BeforeLayer = NoLayerHook>
Act forward_layers(Context& ctx, const Layers& layers, Act x, std::uint64_t dropout_key, const RecomputeConfig& config,
                   std::vector<std::optional<LayerSaved>>& saved, std::vector<std::optional<Act>>& inputs,
                   std::uint64_t first_layer = 0, const BeforeLayer& before_layer = {}) {
  const int count = static_cast<int>(layers.size());
  saved.assign(static_cast<std::size_t>(count), std::nullopt);
  inputs.assign(static_cast<std::size_t>(count), std::nullopt);
  for (int i = 0; i < count; ++i) {
    const std::size_t k = static_cast<std::size_t>(i);
    before_layer(k);
    if (config.recomputed(i) && config.chunk_start(i) == i) inputs[k] = x;
    auto [y, s] = layers[k].forward(ctx, x, rng::mix(dropout_key, first_layer + k));
    if (!config.recomputed(i)) saved[k] = std::move(s);
    x = std::move(y);
  }
  return x;
}

// The backward of forward_layers: returns d loss / d input. A recomputed chunk runs its forward
// again from its kept input (the same dropout keys) before its backward. `deferred`: the layers'
// weight gradients go there (the pipeline's split backward), as TransformerLayer::backward says.
// `ready` (with no `deferred`): called for each parameter of a layer once that layer's backward is
// done, when this is the step's last backward through these layers.
template <class Context, class Layers, class Act, class LayerSaved, class Deferred, class Ready = std::nullptr_t>
Act backward_layers(Context& ctx, Layers& layers, Act dx, std::uint64_t dropout_key, const RecomputeConfig& config,
                    const std::vector<std::optional<LayerSaved>>& saved, const std::vector<std::optional<Act>>& inputs,
                    std::uint64_t first_layer, Deferred* deferred, const Ready* ready = nullptr) {
  auto layer_done = [&](std::size_t k) {
    if constexpr (!std::is_same_v<Ready, std::nullptr_t>)
      if (ready != nullptr && *ready && deferred == nullptr) layers[k].for_each_parameter(*ready);
  };
  int i = static_cast<int>(layers.size()) - 1;
  while (i >= 0) {
    const std::size_t k = static_cast<std::size_t>(i);
    if (saved[k]) {
      dx = layers[k].backward(ctx, *saved[k], dx, deferred);
      layer_done(k);
      --i;
      continue;
    }
    const int first = config.chunk_start(i);
    const auto& input = inputs[static_cast<std::size_t>(first)];
    if (!input)
      fail<Error>("activation recompute: layer ", first, " kept no input to recompute layers ", first, "..", i,
                  " from; the Saved does not come from forward_layers with this configuration");
    std::vector<LayerSaved> chunk;  // layers first..i, recomputed
    Act x = *input;
    for (int j = first; j <= i; ++j) {
      const std::size_t m = static_cast<std::size_t>(j);
      auto [y, s] = layers[m].forward(ctx, x, rng::mix(dropout_key, first_layer + m));
      chunk.push_back(std::move(s));
      x = std::move(y);
    }
    for (int j = i; j >= first; --j) {
      dx = layers[static_cast<std::size_t>(j)].backward(ctx, chunk[static_cast<std::size_t>(j - first)], dx, deferred);
      layer_done(static_cast<std::size_t>(j));
    }
    i = first - 1;
  }
  return dx;
}

}  // namespace models
STRATA_NAMESPACE_END
