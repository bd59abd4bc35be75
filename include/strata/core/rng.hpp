// strata/core/rng.hpp: counter-based random numbers (Philox-4x32-10).
//
// A value is a pure function of (key, counter): no state is carried from one draw to the next.
// Parameters are initialized with key = (seed, hash of the parameter's name) and counter = the
// element's index in the *global* (unsharded) tensor, so a shard's values are the same slice of
// the unsharded init whatever the tensor-parallel size. Dropout masks use the same generator with
// a key that includes the step and, where activations are sharded, the rank.
#pragma once

#include <array>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <string_view>

#include "config.hpp"

STRATA_NAMESPACE_BEGIN
namespace rng {

using Block = std::array<std::uint32_t, 4>;

STRATA_HOST_DEVICE constexpr Block philox4x32(Block counter, std::uint64_t key64) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::uint32_t k0 = static_cast<std::uint32_t>(key64), k1 = static_cast<std::uint32_t>(key64 >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * counter[0];
    std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * counter[2];
    counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ k0, static_cast<std::uint32_t>(p1),
               static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ k1, static_cast<std::uint32_t>(p0)};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return counter;
}

// FNV-1a: names a parameter as a 64-bit number.
constexpr std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Mixes two 64-bit numbers into one key (splitmix64 finalizer of a combination).
STRATA_HOST_DEVICE constexpr std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The four 32-bit words for counter `index` under `key`.
STRATA_HOST_DEVICE constexpr Block bits(std::uint64_t key, std::uint64_t index, std::uint32_t stream = 0) {
  return philox4x32({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), stream, 0u}, key);
}

// Uniform double in (0, 1): 53 random bits, never exactly 0 or 1.
STRATA_HOST_DEVICE constexpr double uniform(std::uint64_t key, std::uint64_t index, std::uint32_t stream = 0) {
  Block b = bits(key, index, stream);
  std::uint64_t r = (static_cast<std::uint64_t>(b[0]) << 21) ^ b[1];
  r &= (1ull << 53) - 1;
  return (static_cast<double>(r) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on two uniforms from the same counter).
STRATA_HOST_DEVICE inline double normal(std::uint64_t key, std::uint64_t index, std::uint32_t stream = 0) {
  Block b = bits(key, index, stream);
  std::uint64_t r0 = ((static_cast<std::uint64_t>(b[0]) << 21) ^ b[1]) & ((1ull << 53) - 1);
  std::uint64_t r1 = ((static_cast<std::uint64_t>(b[2]) << 21) ^ b[3]) & ((1ull << 53) - 1);
  double u0 = (static_cast<double>(r0) + 0.5) * (1.0 / 9007199254740992.0);
  double u1 = (static_cast<double>(r1) + 0.5) * (1.0 / 9007199254740992.0);
  return ::sqrt(-2.0 * ::log(u0)) * ::cos(6.283185307179586476925 * u1);  // global names: device versions exist
}

// The key that initializes parameter `name` under `seed`.
constexpr std::uint64_t parameter_key(std::uint64_t seed, std::string_view name) { return mix(seed, hash_name(name)); }

}  // namespace rng
STRATA_NAMESPACE_END
