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
};
static_assert(std::is_trivially_copyable_v<RopeOptions>, "RopeOptions is passed to kernels by value.");

// The rotated width of a head of d dimensions.
STRATA_HOST_DEVICE inline index_t rope_rotary_dim(const RopeOptions& o, index_t d) {
  return o.rotary_dim > 0 ? o.rotary_dim : d;
}

// inv_freq(i) of pair i (see the note above), in double.
STRATA_HOST_DEVICE inline double rope_inverse_frequency(index_t i, index_t rotary_dim, double base, const RopeOptions& o) {
  const double freq = ::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
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
