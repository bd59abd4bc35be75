// strata/backend/rope_options.hpp: the variants of rotary position embedding (backend entry points
// rope_forward / rope_backward; CPU twin cpu/rope.hpp, CUDA cuda/kernels/rope.cuh).
//
// Of a head of d dimensions the first rotary_dim (Megatron: kv_channels x --rotary-percent) are
// rotated, the rest pass through. Pair i < rotary_dim / 2 turns by position x inv_freq(i):
//   inv_freq(i) = base^(-2i / rotary_dim)
// rotated as the pair (x[i], x[i + rotary_dim/2]) (rotate-half, Llama / GPT-NeoX), or with
// `interleaved` (Megatron's --rotary-interleaved, GPT-J) as (x[2i], x[2i+1]).
//
// Llama 3.1's frequency scaling (Megatron's --use-rope-scaling, --rope-scaling-factor; Hugging Face's
// rope_type "llama3"), on each inv_freq with wavelength w = 2 pi / inv_freq and the original context
// L = original_max_positions:
//   w < L / high_freq_factor:  inv_freq                      (high frequencies kept)
//   w > L / low_freq_factor:   inv_freq / factor             (low frequencies slowed)
//   between:                   (1 - s) inv_freq / factor + s inv_freq,
//                              s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
// Megatron's defaults: factor 8, low 1, high 4, L 8192.
//
// YaRN (Megatron's --position-embedding-type yarn with --rotary-scaling-factor s,
// --yarn-original-max-position-embeddings L, --yarn-beta-fast, --yarn-beta-slow, --mscale,
// --mscale-all-dim, --[no-]yarn-correction-range-round-to-int; Hugging Face's rope_type "yarn";
// gpt-oss, DeepSeek-V3, Qwen3 long context). With D = rotary_dim and the dimension at which a
// frequency turns r times over L,
//   dim(r) = D ln(L / (2 pi r)) / (2 ln base),
//   low = dim(beta_fast), high = dim(beta_slow)   (floor and ceil when rounding, the default),
//   clamped to [0, D - 1], and high += 0.001 when low == high;
//   ramp(i) = clamp((i - low) / (high - low), 0, 1)  for pair i < D / 2,
//   inv_freq(i) = (1 - ramp) base^(-2i/D) + ramp base^(-2i/D) / s
// so fast pairs (i < low) keep their frequency and slow ones (i > high) are interpolated by s.
// cos and sin are multiplied by the attention factor ("concentration", mscale)
//   m = g(s, mscale) / g(s, mscale_all_dim),   g(s, k) = 1 if s <= 1, else 0.1 k ln s + 1,
// which with Megatron's defaults (1, 0) is 0.1 ln s + 1. Everything in double, as transformers'
// _compute_yarn_parameters (whose float32 arithmetic rounds the same formulas).
#pragma once

#include <cmath>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN

struct RopeOptions {
  index_t rotary_dim = 0;     // dimensions of a head that turn (even); 0: all of them
  bool interleaved = false;   // pairs (2i, 2i+1) instead of (i, i + rotary_dim / 2)
  double scaling_factor = 0;  // Llama 3.1 scaling: 0 off, else the factor (Megatron's default 8)
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192.0;
  // YaRN: 0 off, else the factor s (Megatron's --rotary-scaling-factor); exclusive with scaling_factor.
  double yarn_factor = 0;
  double yarn_original_max_positions = 4096.0;  // L (--yarn-original-max-position-embeddings)
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  double yarn_mscale = 1.0;          // --mscale
  double yarn_mscale_all_dim = 0.0;  // --mscale-all-dim
  bool yarn_round_to_int = true;     // --yarn-correction-range-round-to-int (Megatron's and transformers' default)

  constexpr bool yarn() const { return yarn_factor > 0; }
};
static_assert(std::is_trivially_copyable_v<RopeOptions>, "RopeOptions is passed to kernels by value.");

// The rotated width of a head of d dimensions.
STRATA_HOST_DEVICE inline index_t rope_rotary_dim(const RopeOptions& o, index_t d) {
  return o.rotary_dim > 0 ? o.rotary_dim : d;
}

// YaRN's ramp of pair i of a rotary width `rotary_dim` (0: the frequency kept, 1: divided by the factor).
STRATA_HOST_DEVICE inline double rope_yarn_ramp(index_t i, index_t rotary_dim, double base, const RopeOptions& o) {
  const double pi = 3.14159265358979323846, width = static_cast<double>(rotary_dim);
  auto correction_dim = [&](double rotations) {
    return width * ::log(o.yarn_original_max_positions / (rotations * 2.0 * pi)) / (2.0 * ::log(base));
  };
  double low = correction_dim(o.yarn_beta_fast), high = correction_dim(o.yarn_beta_slow);
  if (o.yarn_round_to_int) low = ::floor(low), high = ::ceil(high);
  low = low > 0.0 ? low : 0.0;
  high = high < width - 1.0 ? high : width - 1.0;
  if (low == high) high += 0.001;
  const double linear = (static_cast<double>(i) - low) / (high - low);
  return linear < 0.0 ? 0.0 : (linear > 1.0 ? 1.0 : linear);
}

// YaRN's g(s, k) (see the note above).
STRATA_HOST_DEVICE inline double rope_yarn_mscale(double factor, double k) {
  return factor <= 1.0 ? 1.0 : 0.1 * k * ::log(factor) + 1.0;
}

// The factor cos and sin are multiplied by: YaRN's concentration, 1 otherwise.
STRATA_HOST_DEVICE inline double rope_attention_factor(const RopeOptions& o) {
  if (!o.yarn()) return 1.0;
  return rope_yarn_mscale(o.yarn_factor, o.yarn_mscale) / rope_yarn_mscale(o.yarn_factor, o.yarn_mscale_all_dim);
}

// inv_freq(i) of pair i (see the note above), in double.
STRATA_HOST_DEVICE inline double rope_inverse_frequency(index_t i, index_t rotary_dim, double base, const RopeOptions& o) {
  const double freq = ::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
  if (o.yarn()) {
    const double ramp = rope_yarn_ramp(i, rotary_dim, base, o);
    return (1.0 - ramp) * freq + ramp * (freq / o.yarn_factor);
  }
  if (!(o.scaling_factor > 0)) return freq;
  const double pi = 3.14159265358979323846;
  const double wavelength = 2.0 * pi / freq;
  const double low_wavelength = o.original_max_positions / o.low_freq_factor;
  const double high_wavelength = o.original_max_positions / o.high_freq_factor;
  if (wavelength < high_wavelength) return freq;
  if (wavelength > low_wavelength) return freq / o.scaling_factor;
  const double smooth = (o.original_max_positions / wavelength - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor);
  return (1.0 - smooth) * freq / o.scaling_factor + smooth * freq;
}

STRATA_NAMESPACE_END
