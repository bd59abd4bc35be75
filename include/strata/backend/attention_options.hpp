// strata/backend/attention_options.hpp: `AttentionOptions`, the trailing argument of
// attention_forward / attention_backward / prepare_attention: where q, k, v lie in memory
// (`AttentionStrides`, backend/attention_strides.hpp) and the dropout on the attention
// probabilities (`AttentionDropout`). `AttentionOptions{}` (or a bare AttentionStrides, which
// converts) is attention without dropout.
//
// Dropout (Megatron's --attention-dropout) draws no state and stores no mask: whether the
// probability of query i for key j in head h of sequence `batch` is kept is a pure function of
//
//   word = philox4x32(counter {j, i, head_offset + h, batch}, key)[0]       (core/rng.hpp)
//   kept = word >= threshold,   threshold = round(p 2^32)                   (an integer compare)
//
// so the forward, the backward and a recomputed forward draw one mask, the CPU and the GPU draw it
// bit for bit, and a tensor-parallel rank whose local head h is global head head_offset + h draws
// the single-rank mask. With Z = kept / (1 - p) (inverted dropout) and P the undropped softmax:
//
//   forward   O_i = sum_j P_ij Z_ij v_j;   lse_i = log sum_j e^(S_ij), that of the undropped
//             softmax (as flash attention saves it)
//   backward  dV_j = sum_i P_ij Z_ij dO_i;   dP_ij = Z_ij (dO_i . v_j);   D_i = dO_i . O_i (with the
//             dropped O, = sum_j P_ij dP_ij);   dS_ij = P_ij (dP_ij - D_i);   dQ, dK from dS as
//             without dropout
//
// Sliding-window attention (AttentionOptions::window): query i sees keys i - window .. i only, by
// global positions: in a block at offsets (context parallelism), local query i (global
// query_offset + i) sees local key j (global key_offset + j) when
//   key_offset + j >= query_offset + i - window,   and j <= i in a causal (diagonal) block,
// so a block wholly in the past sees a band of its keys, and a query row may see none of them: such
// a row's output is 0 and its lse is -inf (the block adds nothing to the merge).
//
// Context parallelism (AttentionOptions::causal, query_offset, key_offset) draws the word of
// global positions {key_offset + j, query_offset + i}, so every block of a ring draws the mask of
// the whole sequence's attention.
//
// probability = 0 draws nothing: the arithmetic, and every bit of the results, of attention
// without dropout.
//
// Attention sinks (AttentionOptions::softmax, Megatron's --softmax-type; gpt-oss): the softmax of
// query i in head h gets one more logit s_h in its denominator, whose value vector is zero:
//   p_ij = e^(S_ij) / (e^(s_h) + sum_j e^(S_ij)),   O_i = sum_j p_ij v_j   (sum of p_ij below 1)
//   vanilla: no sink;  off_by_one: s_h = 0 (Evan Miller's softmax_1);  learnable: s_h read from
//   `sinks` ([heads] of the call's element type, one per local query head).
// lse_i = log(e^(s_h) + sum_j e^(S_ij)) includes the sink, so the backward's recomputed p_ij are
// those of the forward, and D_i = dO_i . O_i is unchanged. The sink's own probability
// p_sink = e^(s_h - lse_i) gets dS = p_sink (0 - D_i) (its value is zero), so
//   d s_h = - sum over (batch, query i) of e^(s_h - lse_i) (dO_i . O_i),
// added (+=) in the accumulate type into `sink_gradient` ([heads]) by the learnable backward.
// Context parallelism splits a row's keys into blocks and merges them; the sink must join one block
// of each query row only (the ring gives it to the diagonal block), or the merge counts it once per
// block. Any block may carry it: its lse then includes the sink, and the merged lse does too.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/shape.hpp"
#include "attention_strides.hpp"

STRATA_NAMESPACE_BEGIN

struct AttentionDropout {
  double probability = 0.0;  // of dropping one attention probability, in [0, 1); 0: no dropout
  std::uint64_t key = 0;     // the mask's key (one per layer and micro-batch)
  index_t head_offset = 0;   // global index of local query head 0 (tensor parallel: rank * heads per rank)

  constexpr bool active() const { return probability > 0.0; }
  friend constexpr bool operator==(const AttentionDropout&, const AttentionDropout&) = default;
};

// Megatron's --softmax-type.
enum class SoftmaxType : std::uint8_t { vanilla, off_by_one, learnable };

struct AttentionOptions {
  AttentionStrides strides{};
  AttentionDropout dropout{};
  // Context parallelism attends a chunk of queries to a chunk of keys of the same length:
  // `causal` false lets every query see every key (a key chunk wholly in the past); query_offset
  // and key_offset are the global positions of query 0 and key 0, which the dropout mask is keyed
  // by (so the mask is the whole sequence's). A causal call with offsets needs them equal (a
  // diagonal block).
  bool causal = true;
  index_t query_offset = 0;
  index_t key_offset = 0;
  // Sliding-window attention (Megatron's --window-size, its left bound; Mistral, gpt-oss): query i
  // sees keys j with i - window <= j <= i, in global positions (the note above). Negative: no window.
  index_t window = -1;
  // Attention sinks (see the note above). `sinks` points to [heads] values of the call's element
  // type T (learnable only); `sink_gradient` to [heads] values of accumulate_t<T> that the
  // learnable backward adds d s_h to (null: not wanted).
  SoftmaxType softmax = SoftmaxType::vanilla;
  const void* sinks = nullptr;
  void* sink_gradient = nullptr;

  constexpr bool has_sink() const { return softmax != SoftmaxType::vanilla; }

  constexpr AttentionOptions() = default;
  // A bare AttentionStrides is the options without dropout.
  constexpr AttentionOptions(AttentionStrides strides_in, AttentionDropout dropout_in = {})  // NOLINT: converts
      : strides(strides_in), dropout(dropout_in) {}
  friend constexpr bool operator==(const AttentionOptions&, const AttentionOptions&) = default;
};
static_assert(std::is_trivially_copyable_v<AttentionDropout> && std::is_trivially_copyable_v<AttentionOptions>,
              "AttentionOptions is copied into kernel arguments, so it must be trivially copyable.");

// What a kernel needs to draw the mask: the key, the integer threshold, the head offset and the
// scale 1 / (1 - p) of kept probabilities in the accumulate type A.
template <class A>
struct AttentionDropoutMask {
  std::uint64_t key = 0;
  std::uint64_t threshold = 0;  // kept iff the 32-bit word >= threshold (in [0, 2^32])
  index_t head_offset = 0;
  A keep_scale = A(1);

  // Whether query i keeps key j in local query head h of sequence `batch`.
  STRATA_HOST_DEVICE constexpr bool kept(index_t batch, index_t h, index_t i, index_t j) const {
    const rng::Block word = rng::philox4x32({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(i),
                                             static_cast<std::uint32_t>(head_offset + h), static_cast<std::uint32_t>(batch)},
                                            key);
    return static_cast<std::uint64_t>(word[0]) >= threshold;
  }
  // Z_ij: keep_scale or 0.
  STRATA_HOST_DEVICE constexpr A factor(index_t batch, index_t h, index_t i, index_t j) const {
    return kept(batch, h, i, j) ? keep_scale : A(0);
  }
};
static_assert(std::is_trivially_copyable_v<AttentionDropoutMask<float>>,
              "AttentionDropoutMask is passed to kernels by value, so it must be trivially copyable.");

// The mask of `dropout` (checked: a probability outside [0, 1), or NaN, is a ConfigError naming
// `who`); meaningful only when dropout.active().
template <class A>
AttentionDropoutMask<A> attention_dropout_mask(const char* who, const AttentionDropout& dropout) {
  const double p = dropout.probability;
  if (!(p >= 0.0 && p < 1.0))
    fail<ConfigError>(who, ": attention dropout probability ", p, " must be in [0, 1) (0 disables dropout)");
  if (dropout.head_offset < 0) fail<ConfigError>(who, ": attention dropout head_offset ", dropout.head_offset, " is negative");
  AttentionDropoutMask<A> mask;
  mask.key = dropout.key;
  mask.threshold = static_cast<std::uint64_t>(std::llround(p * 4294967296.0));  // p 2^32, at most 2^32
  mask.head_offset = dropout.head_offset;
  mask.keep_scale = A(1.0 / (1.0 - p));
  return mask;
}

// The keys first .. last (local positions) query i sees in a block of s keys under the causal flag
// and the window, whose query 0 lies `delta` = query_offset - key_offset positions after key 0
// (0 in a causal block). first > last: the row sees no key of the block.
struct AttentionKeyRange {
  index_t first, last;
};
STRATA_HOST_DEVICE constexpr AttentionKeyRange attention_keys_of(bool causal, index_t window, index_t delta, index_t s,
                                                                 index_t i) {
  const index_t last = causal ? i : s - 1;
  const index_t from = window < 0 ? 0 : i + delta - window;
  return {from > 0 ? from : 0, last};
}
// Whether query i sees key j (local positions), as attention_keys_of says.
STRATA_HOST_DEVICE constexpr bool attention_sees(bool causal, index_t window, index_t delta, index_t s, index_t i,
                                                 index_t j) {
  const AttentionKeyRange keys = attention_keys_of(causal, window, delta, s, i);
  return j >= keys.first && j <= keys.last;
}

// The offsets checked: non-negative, and equal for a causal block.
inline void check_attention_block(const char* who, const AttentionOptions& options) {
  if (options.query_offset < 0 || options.key_offset < 0)
    fail<ConfigError>(who, ": attention query_offset=", options.query_offset, " and key_offset=", options.key_offset,
                      " must not be negative");
  if (options.causal && options.query_offset != options.key_offset)
    fail<ConfigError>(who, ": a causal attention block needs query_offset=", options.query_offset, " equal to key_offset=",
                      options.key_offset, " (a diagonal block); run a block wholly in the past with causal=false");
  if (options.softmax == SoftmaxType::learnable && options.sinks == nullptr)
    fail<ConfigError>(who, ": a learnable softmax (--softmax-type learnable) needs the sink logits (AttentionOptions::sinks)");
}

STRATA_NAMESPACE_END
