// strata/core/dtype.hpp: the 16-bit floating types `bf16` and `fp16`, and `accumulate_t`.
//
// Both are storage types: arithmetic converts to float (round-to-nearest-even on the way back),
// which is what a CPU reference for tensor-core math wants. `accumulate_t<T>` names the type sums
// over T are carried in (float for the 16-bit types, T itself otherwise).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "config.hpp"

STRATA_NAMESPACE_BEGIN

// bfloat16: the top 16 bits of an IEEE float.
struct bf16 {
  std::uint16_t bits = 0;

  constexpr bf16() = default;
  STRATA_HOST_DEVICE explicit constexpr bf16(float value) : bits(from_float(value)) {}
  STRATA_HOST_DEVICE explicit constexpr bf16(double value) : bf16(static_cast<float>(value)) {}
  STRATA_HOST_DEVICE explicit constexpr bf16(int value) : bf16(static_cast<float>(value)) {}
  STRATA_HOST_DEVICE constexpr operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

  STRATA_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t raw) {
    bf16 out;
    out.bits = raw;
    return out;
  }
  STRATA_HOST_DEVICE static constexpr std::uint16_t from_float(float value) {
    std::uint32_t u = std::bit_cast<std::uint32_t>(value);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return 0x7fc0;  // NaN
    std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                          // to nearest even
    return static_cast<std::uint16_t>((u + rounding) >> 16);
  }
  STRATA_HOST_DEVICE bf16& operator+=(float v) { return *this = bf16(float(*this) + v); }
  STRATA_HOST_DEVICE bf16& operator-=(float v) { return *this = bf16(float(*this) - v); }
  STRATA_HOST_DEVICE bf16& operator*=(float v) { return *this = bf16(float(*this) * v); }
};
static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

// IEEE 754 binary16.
struct fp16 {
  std::uint16_t bits = 0;

  constexpr fp16() = default;
  STRATA_HOST_DEVICE explicit constexpr fp16(float value) : bits(from_float(value)) {}
  STRATA_HOST_DEVICE explicit constexpr fp16(double value) : fp16(static_cast<float>(value)) {}
  STRATA_HOST_DEVICE explicit constexpr fp16(int value) : fp16(static_cast<float>(value)) {}
  STRATA_HOST_DEVICE constexpr operator float() const { return to_float(bits); }

  STRATA_HOST_DEVICE static constexpr fp16 from_bits(std::uint16_t raw) {
    fp16 out;
    out.bits = raw;
    return out;
  }
  STRATA_HOST_DEVICE static constexpr std::uint16_t from_float(float value) {
    std::uint32_t u = std::bit_cast<std::uint32_t>(value);
    std::uint32_t sign = (u >> 16) & 0x8000u;
    std::uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow to inf
    if (abs < 0x38800000u) {                                                     // subnormal or zero
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);
      std::uint32_t mant = (abs & 0x007fffffu) | 0x00800000u;
      int shift = 126 - static_cast<int>(abs >> 23);  // 113 - exponent + 13 mantissa bits
      std::uint32_t half = mant >> shift;
      std::uint32_t rem = mant & ((1u << shift) - 1u);
      std::uint32_t halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
      return static_cast<std::uint16_t>(sign | half);
    }
    std::uint32_t rounded = abs + 0x0fffu + ((abs >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  STRATA_HOST_DEVICE static constexpr float to_float(std::uint16_t h) {
    std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      if (mant == 0) return std::bit_cast<float>(sign);
      float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
      return sign ? -v : v;
    }
    return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};
static_assert(sizeof(fp16) == 2 && std::is_trivially_copyable_v<fp16>);

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

template <class T>
using accumulate_t = std::conditional_t<is_half_v<T>, float, T>;

// The element types a Tensor may hold for computation.
template <class T>
concept Element = std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_v<T>;

template <class T>
constexpr std::string_view dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, bf16>) return "bfloat16";
  else if constexpr (std::is_same_v<T, fp16>) return "float16";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "uint8";
  else return "unknown";
}

STRATA_NAMESPACE_END
