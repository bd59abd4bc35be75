// strata/core/fp8_recipe.hpp: FP8 training recipes (Megatron's --fp8-* flags) and the scaling
// state each FP8 linear layer keeps.
//
// Formats:  e4m3    every tensor E4M3
//           hybrid  forward tensors (input, weight) E4M3, gradients E5M2
// Recipes:  delayed     per-tensor scales from an amax history (Transformer Engine's
//                       DelayedScaling): each cast during a step folds the tensor's amax into
//                       history[0]; after the optimizer step the histories are reduced (max) over
//                       the ranks of a pipeline stage (tp x cp x dp), the amax is taken from the
//                       history (algo max: the largest of the window; most_recent: history[0]),
//                       scale = (fp8_max / amax) / 2^margin (kept when amax is 0 or not finite), and
//                       the window is rolled: roll by -1, then history[0] = 0 (so it holds the
//                       last L steps). The first step's scale is 1.
//           tensorwise  current scaling: the amax of the tensor now (reduced over the tensor-
//                       parallel ranks that share a sharded tensor), scale = fp8_max / amax.
//           blockwise   DeepSeek-V3's recipe (Transformer Engine's Float8BlockScaling): current
//                       scaling per block, 1 x 128 runs along the GEMM's inner dimension for
//                       inputs and output gradients, 128 x 128 tiles for weights; each block's
//                       scale is the power of two at or below fp8_max / amax (1 for an amax of 0
//                       or not finite), so decoding a code times 1 / scale is exact. No history,
//                       no collective: a block never straddles two tensor-parallel shards
//                       (checked when the layer is built). The block length is
//                       Fp8Options::block (128; the CPU backend takes any length, for tests).
//           mxfp8: refused by validate() with a sentence (Blackwell).
//
// A scaling state holds, per tensor role (input, weight, output gradient), one row
// [history(L) | scale | scale_inv] of floats in the backend's memory, so the casts read the
// scale and write the amax without the host. Beside it, the weight cache: the layer's weight cast
// once per optimizer step (Transformer Engine's weight caching), in both layouts, W [out, in] for
// the forward and W^T [in, out] for the input gradient, made by one fp8_cast_transpose pass that
// folds (delayed) or takes and reduces (tensorwise) the weight's amax once. A step's weight scale
// does not change within the step and max is idempotent, so the cached codes are those a cast per
// GEMM would make, bit for bit. Whatever changes the weights (or the weight's scale) must drop the
// cache: the optimizer step (fp8_after_optimizer_step), checkpoint and Hugging Face loading, init,
// and a user's own writes (Fp8Scaling::drop_weight_caches / fp8_drop_weight_caches).
//
// `Fp8Scaling` (the state registry) is what a ParallelContext points to when FP8 is on: its
// options, the states of the layers built under it in construction order (the checkpoint's and the
// step update's order), and which layers run FP8 (Megatron's --first-last-layers-bf16 keeps the
// first and last transformer layers in bf16; the output layer and the embedding never run FP8).
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "error.hpp"
#include "fp8.hpp"
#include "space.hpp"
#include "tensor.hpp"

STRATA_NAMESPACE_BEGIN

enum class Fp8Formats : std::uint8_t { e4m3, hybrid };
enum class Fp8RecipeKind : std::uint8_t { delayed, tensorwise, blockwise, mxfp8 };
enum class Fp8AmaxAlgo : std::uint8_t { max, most_recent };

// The three tensors of a linear layer's GEMMs, each with its own scale.
enum class Fp8Role : int { input = 0, weight = 1, grad_output = 2 };
inline constexpr int kFp8Roles = 3;

// What a fused cast computes before it casts (backend fp8_cast_transpose_fused): the tensor as it is
// (copy), GELU of it (gelu: the input of the linear layer after the activation), the output
// gradient times GELU's derivative at the pre-activation (gelu_backward: the output gradient of the
// linear layer before the activation), or the same two of SwiGLU: swiglu makes [rows, cols] from the
// pre-activation x = [gate | up] [rows, 2 cols]; swiglu_backward makes [d gate | d up] [rows, cols]
// from the activation's gradient x [rows, cols / 2] and the pre-activation pre [rows, cols]. Each
// rounded to the element type as the backend's own gelu_forward / gelu_backward / swiglu_forward /
// swiglu_backward round it, so the codes are those of a cast of their result.
enum class Fp8Producer : std::uint8_t { copy, gelu, gelu_backward, swiglu, swiglu_backward };

// Where a kernel that makes a tensor writes it as FP8 codes instead of in the element type (the
// norms' backend entry points layernorm_forward_fp8 / rmsnorm_forward_fp8): codes[i] = the code of
// float(T(value_i)) * scale[0] in `format`, |T(value_i)| folded into amax[0] (max) when amax is set;
// the codes and the amax a cast of the tensor written in T would make (backend fp8_cast).
struct Fp8Output {
  Fp8Format format = Fp8Format::e4m3;
  const float* scale = nullptr;
  std::uint8_t* codes = nullptr;
  float* amax = nullptr;
};

// The row length of the x a producer reads when it makes rows of `cols` values.
constexpr index_t fp8_producer_input_cols(Fp8Producer p, index_t cols) {
  return p == Fp8Producer::swiglu ? 2 * cols : p == Fp8Producer::swiglu_backward ? cols / 2 : cols;
}

// How an FP8 GEMM's tensor cores accumulate on Hopper. split: the partial sums are promoted to fp32
// at intervals along k (cuBLASLt's default). fast: they stay in the tensor cores' own narrower
// accumulator (CUBLASLT_MATMUL_DESC_FAST_ACCUM); Transformer Engine runs the forward GEMM so and the
// gradient GEMMs split, as torchao's float8 does. On an H100 with cuBLASLt 13.1 fast gained nothing
// (GPT 1.41B: the same tokens/s) and erred ten times more (1.1e-3 against 1.1e-4 of a float output
// at k = 8192), so split is the default. The CPU twin accumulates every product exactly either way,
// so the choice changes GPU results only, within the GEMM's bound.
enum class Fp8Accumulation : std::uint8_t { split, fast };

struct Fp8Options {
  Fp8Formats format = Fp8Formats::hybrid;
  Fp8RecipeKind recipe = Fp8RecipeKind::delayed;  // Megatron's default
  int margin = 0;
  int amax_history_len = 1;                        // Megatron's default (Transformer Engine's is 1024)
  Fp8AmaxAlgo amax_compute_algo = Fp8AmaxAlgo::most_recent;
  bool first_last_layers_bf16 = false;
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
  // Cast each weight once per optimizer step and keep its codes (2 bytes per weight element) until
  // the weights change; off: cast per GEMM (the same codes; for tests and for memory).
  bool cache_weights = true;
  // With cache_weights: keep the forward's layout W as well as W^T (1 byte per weight element each).
  // Off: the cache keeps W^T alone and a forward after the step's first casts W again (the same
  // codes): a byte per weight saved for nothing where the step has one forward per layer (one
  // micro-batch, no full recompute: the trainers choose this then).
  bool cache_forward_weights = true;
  // Per-tensor recipes: the attention's output projection keeps no codes of its input^T for the weight
  // gradient; it holds the attention's output, which the attention keeps for its own backward anyway
  // (no copy), and casts it again in the backward (the same codes: the same values and scale). Saves
  // a byte per element of that input per layer for one more cast per layer and micro-batch.
  bool recast_attention_output = false;
  // Delayed recipe: a norm whose output only a linear layer's FP8 GEMMs read (the attention's qkv,
  // a dense MLP's fc1) writes that output as the layer's FP8 codes, with their amax, instead of in
  // T (backend layernorm_forward_fp8 / rmsnorm_forward_fp8): the cast's pass over the output goes
  // away, and x^T's codes come from a transpose of the bytes. The same codes. Off: the norm writes T
  // and the linear layer casts it (to measure the difference).
  bool norm_writes_codes = true;
  // Delayed recipe: the attention's merge of dq, dk, dv (with RoPE's backward: SelfAttention with
  // RoPE, no q/k norm, a qkv projection without bias) writes the qkv projection's output-gradient codes
  // instead of the packed gradient in T (backend qkv_merge_rope_fp8); x^T's codes by a transpose of the
  // bytes. The same codes. Off: the merge writes T and the layer casts it.
  bool attention_writes_grad_codes = true;
  // Delayed recipe, a dense MLP whose activation runs inside the casts (GELU, SwiGLU without clamp or
  // offset): fc2's forward casts its input's codes in fc2's layout alone, and keeps no codes of
  // input^T for its weight gradient; fc1's output-gradient cast in the backward, which reads fc1's
  // output anyway, writes them (the same values, scale and rounding: the same codes), and fc2's weight
  // gradient runs after it. A byte per element of the activation per layer and micro-batch not kept
  // from the forward to the backward, for no extra pass. Off (the default): the forward casts both
  // layouts and keeps x^T's codes. Off by default while its CUDA kernels have not run on a GPU (on CPU
  // threads the run is the run without it, bit for bit; docs/FP8.md).
  bool activation_codes_in_backward = false;
  // Delayed recipe: a MoE layer's experts run their GEMMs in FP8 too (layers/moe/experts.hpp); off,
  // they stay in the element type (the other recipes always leave them there).
  bool experts = true;
  // blockwise: the length of a block (1 x block runs, block x block tiles); cuBLASLt's block-scaled
  // GEMMs take 128, the CPU backend any length >= 1.
  int block = 128;
  // The forward GEMM's accumulation on the GPU (Fp8Accumulation); the gradient GEMMs always split.
  Fp8Accumulation forward_accumulation = Fp8Accumulation::split;

  Fp8Format format_of(Fp8Role role) const {
    return format == Fp8Formats::hybrid && role == Fp8Role::grad_output ? Fp8Format::e5m2 : Fp8Format::e4m3;
  }
  // The history length the state keeps (tensorwise keeps one slot: the current amax).
  int history() const { return recipe == Fp8RecipeKind::delayed ? amax_history_len : 1; }

  // Throws ConfigError with a sentence for a recipe or value this build cannot run.
  void validate() const {
    if (recipe == Fp8RecipeKind::mxfp8)
      fail<ConfigError>("--fp8-recipe mxfp8: MXFP8 block scaling needs Blackwell tensor cores (sm_100); on Hopper use "
                        "--fp8-recipe delayed or tensorwise");
    if (recipe == Fp8RecipeKind::blockwise && block < 1)
      fail<ConfigError>("--fp8-recipe blockwise: a block of ", block, " elements; blocks hold at least one (128 as DeepSeek-V3)");
    if (amax_history_len < 1)
      fail<ConfigError>("--fp8-amax-history-len ", amax_history_len, ": the history needs at least one step; give 1 or more");
    if (margin < 0 || margin > 64)
      fail<ConfigError>("--fp8-margin ", margin, ": the margin is a power of two between 0 and 64");
    if (num_layers_at_start_in_bf16 < 0 || num_layers_at_end_in_bf16 < 0)
      fail<ConfigError>("--num-layers-at-start-in-bf16 ", num_layers_at_start_in_bf16, " / --num-layers-at-end-in-bf16 ",
                        num_layers_at_end_in_bf16, ": layer counts cannot be negative");
  }
};

inline std::string_view fp8_formats_name(Fp8Formats f) { return f == Fp8Formats::e4m3 ? "e4m3" : "hybrid"; }
inline std::string_view fp8_recipe_name(Fp8RecipeKind r) {
  switch (r) {
    case Fp8RecipeKind::delayed: return "delayed";
    case Fp8RecipeKind::tensorwise: return "tensorwise";
    case Fp8RecipeKind::blockwise: return "blockwise";
    case Fp8RecipeKind::mxfp8: return "mxfp8";
  }
  return "?";
}

// The scale that maps amax to fp8_max / 2^margin; `previous` when amax is 0 or not finite.
// (Bit tests instead of <cmath>, so the CUDA kernel runs the same code.)
STRATA_HOST_DEVICE inline bool fp8_finite(float x) { return (std::bit_cast<std::uint32_t>(x) & 0x7f800000u) != 0x7f800000u; }
STRATA_HOST_DEVICE inline float fp8_scale_from_amax(float amax, float max, int margin, float previous) {
  if (!(amax > 0.0f) || !fp8_finite(amax)) return previous;
  const float power = std::bit_cast<float>(static_cast<std::uint32_t>(127 + margin) << 23);  // 2^margin, margin in [0, 64]
  float scale = (max / amax) / power;
  if (!fp8_finite(scale)) scale = 3.4028234663852886e38f;  // amax tiny: the largest float
  return scale;
}

// The blockwise recipe's scale of a block whose amax is `amax`: the power of two at or below
// max / amax (so 1 / scale is exact), 1 when amax is 0 or not finite, 2^127 at most.
STRATA_HOST_DEVICE inline float fp8_block_scale(float amax, float max) {
  if (!(amax > 0.0f) || !fp8_finite(amax)) return 1.0f;
  const float ratio = max / amax;
  if (!fp8_finite(ratio)) return std::bit_cast<float>(0x7f000000u);                  // 2^127
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(ratio) & 0x7f800000u);  // its power of two (ratio >= 2^-126)
}

// The step update of one role's row [history(L) | scale | scale_inv] (see the design note): amax
// from the history, new scale and its inverse, then (roll) the window moves by one step and
// history[0] becomes 0. Shared by the CPU twin and the CUDA kernel.
struct Fp8UpdateArgs {
  int history = 1;
  Fp8AmaxAlgo algo = Fp8AmaxAlgo::most_recent;
  int margin = 0;
  bool roll = true;
};
STRATA_HOST_DEVICE inline void fp8_update_row(float* row, float max, const Fp8UpdateArgs& args) {
  const int length = args.history;
  float amax = row[0];
  if (args.algo == Fp8AmaxAlgo::max)
    for (int i = 1; i < length; ++i) amax = row[i] > amax || row[i] != row[i] ? row[i] : amax;  // NaN wins
  const float scale = fp8_scale_from_amax(amax, max, args.margin, row[length]);
  row[length] = scale;
  row[length + 1] = 1.0f / scale;
  if (args.roll) {
    const float first = row[0];
    for (int i = 0; i + 1 < length; ++i) row[i] = row[i + 1];
    row[length - 1] = first;
    row[0] = 0.0f;
  }
}

// The largest finite value of each role's format (Fp8Options::format_of), for fp8_update_scales.
struct Fp8RoleMaxes {
  float value[kFp8Roles] = {};
};

// A layer's weight in FP8 for the current optimizer step (see the design note). The buffers stay
// allocated once made; dropping the cache only marks it stale, and the next use casts again.
template <class Space>
struct Fp8WeightCache {
  Tensor<std::uint8_t, Space> codes;             // W [out, in]: the forward GEMM's operand (empty: not cached)
  Tensor<std::uint8_t, Space> codes_transposed;  // W^T [in, out]: the input gradient GEMM's operand
  Tensor<float, Space> scale;                    // [scale_inv] of the cast, alone: 16-byte aligned for cuBLASLt;
                                                 // blockwise: the tiles' 1 / scale of W, [ceil(out/B), ceil(in/B)]
  Tensor<float, Space> scale_transposed;         // blockwise: those of W^T, [ceil(in/B), ceil(out/B)]
  // Per-tensor recipes: each role's 1 / scale at [4 * role] of [3 * 4], 16-byte aligned as cuBLASLt's
  // scale pointers must be, copied from the rows in one pass when the cache is filled (the weight's
  // is the one its codes were cast with; under delayed scaling the others hold for the whole step).
  Tensor<float, Space> gemm_scales;
  bool valid = false;
};

// One layer's scaling state: rows for input, weight and output gradient in the backend's memory,
// and the weight cache.
template <class Space>
struct Fp8State {
  std::string name;  // the layer's name (checkpoint key prefix)
  int history = 1;
  Tensor<float, Space> rows;  // [3, history + 2]
  Fp8WeightCache<Space> weight_cache;
  std::int64_t weight_casts = 0;  // how many times the weight was cast (with or without the cache)
  std::int64_t inputs_written = 0;  // forwards whose input codes their producer wrote (Fp8Options::norm_writes_codes)
  std::int64_t grads_written = 0;   // backwards whose output-gradient codes their producer wrote (attention_writes_grad_codes)
  index_t row_length() const { return history + 2; }
  float* row(Fp8Role role) { return rows.data() + static_cast<int>(role) * row_length(); }
  float* scale(Fp8Role role) { return row(role) + history; }
  float* scale_inv(Fp8Role role) { return row(role) + history + 1; }
  float* amax(Fp8Role role) { return row(role); }  // history[0]: the current step's amax
  // The aligned copy of role's 1 / scale (Fp8WeightCache::gemm_scales; allocated at the first call,
  // written when the weight cache is filled).
  float* gemm_scale_inv(Fp8Role role) {
    if (weight_cache.gemm_scales.data() == nullptr) weight_cache.gemm_scales = Tensor<float, Space>::empty(Shape{kFp8Roles * 4});
    return weight_cache.gemm_scales.data() + 4 * static_cast<int>(role);
  }
  // Under the FP8 parameter gather (GradBufferOptions::fp8_param_gather): W's codes [out, in] in the
  // gradient buffer's code buckets, which the distributed optimizer casts from its shard of the
  // weight and all-gathers after each step (DistributedOptimizer::finish_step). `gathered_current`:
  // they are this step's (the cache then takes W from there and makes W^T by a transpose of the
  // codes); `awaiting_gather`: the optimizer stepped and has not gathered yet, so neither the codes
  // nor the weight's values outside this rank's shard may be read.
  const std::uint8_t* gathered_codes = nullptr;
  bool gathered_current = false;
  bool awaiting_gather = false;
  // Whether weight_cache.gemm_scales already hold the rows' 1 / scale (the delayed recipe's step
  // update writes them with the rows, fp8_after_optimizer_step); otherwise the cache's fill copies them.
  bool gemm_scales_current = false;
  // The weight (or its scale) changed: the next use casts it again.
  void drop_weight_cache() {
    weight_cache.valid = false;
    gathered_current = false;
    gemm_scales_current = false;
  }
};

// What a context points to when FP8 is on (see the design note).
template <class Space>
struct Fp8Scaling {
  Fp8Options options;
  int num_layers = 0;          // transformer layers of the whole model (for the bf16 first / last layers)
  int current_layer = -1;      // the transformer layer being built, -1 outside one
  std::vector<std::shared_ptr<Fp8State<Space>>> states;  // in construction order
  // The delayed recipe's step update packs every state's rows into one buffer [states, 3, history + 2]
  // and their aligned 1 / scale copies into another [states, 3, 4] (each state's rows and gemm_scales
  // then alias them), so the update is one reduction and one launch for the whole model.
  Tensor<float, Space> packed_rows, packed_gemm_scales;
  std::size_t packed_states = 0;  // how many states (the first ones) the packed buffers hold

  Fp8Scaling(Fp8Options o, int layers) : options(o), num_layers(layers) { options.validate(); }

  // Every layer's weight cache is stale: call after anything that writes weights or scaling rows.
  void drop_weight_caches() {
    for (auto& state : states) state->drop_weight_cache();
  }

  // Whether a linear layer built now runs FP8: inside a transformer layer that is not kept in bf16.
  bool fp8_here() const {
    if (current_layer < 0) return false;
    if (!options.first_last_layers_bf16) return true;
    return current_layer >= options.num_layers_at_start_in_bf16 && current_layer < num_layers - options.num_layers_at_end_in_bf16;
  }
};

// Marks the transformer layer being built (a model's constructor), so the linear layers built in it
// know their index; restores "outside a layer" when it goes out of scope.
template <class Space>
class Fp8LayerScope {
 public:
  Fp8LayerScope(const std::shared_ptr<Fp8Scaling<Space>>& scaling, int layer) : scaling_(scaling.get()) {
    if (scaling_) scaling_->current_layer = layer;
  }
  ~Fp8LayerScope() {
    if (scaling_) scaling_->current_layer = -1;
  }
  Fp8LayerScope(const Fp8LayerScope&) = delete;
  Fp8LayerScope& operator=(const Fp8LayerScope&) = delete;

 private:
  Fp8Scaling<Space>* scaling_;
};

STRATA_NAMESPACE_END
