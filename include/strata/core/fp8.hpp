// strata/core/fp8.hpp: the 8-bit floating types of Hopper's tensor cores, `fp8_e4m3` and
// `fp8_e5m2`, and their conversions from and to float.
//
//   E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity; S.1111.111 is NaN;
//                largest finite 448 (0x7e), smallest subnormal 2^-9.
//   E5M2:        1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like: S.11111.00 is
//                infinity, S.11111.xx (xx != 0) NaN; largest finite 57344 (0x7b), smallest
//                subnormal 2^-16.
//
// From float: round to nearest, ties to even, then saturate to the largest finite value (infinity
// included), NaN to NaN (0x7f) -- the semantics of Hopper's `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`,
// i.e. `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)`. The conversion is integer arithmetic on the
// float's bits, so host and device give the same codes. To float: exact (every FP8 value is a
// float). Both types are storage types, like bf16 and fp16.
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "config.hpp"

STRATA_NAMESPACE_BEGIN

enum class Fp8Format : std::uint8_t { e4m3, e5m2 };

inline constexpr std::string_view fp8_format_name(Fp8Format format) { return format == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

namespace detail {

// The constants of one format: mantissa bits, exponent bias, the largest finite code (positive).
struct Fp8Layout {
  int mantissa_bits;
  int bias;
  std::uint32_t max_code;
};
STRATA_HOST_DEVICE constexpr Fp8Layout fp8_layout(Fp8Format format) {
  return format == Fp8Format::e4m3 ? Fp8Layout{3, 7, 0x7eu} : Fp8Layout{2, 15, 0x7bu};
}

// Round-to-nearest-even, saturating conversion of a float to the code of `format`.
STRATA_HOST_DEVICE constexpr std::uint8_t fp8_from_float(float value, Fp8Format format) {
  const Fp8Layout layout = fp8_layout(format);
  const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7fu;                  // NaN (canonical, positive)
  if (abs < 0x00800000u) return static_cast<std::uint8_t>(sign);  // zero or float subnormal: far below 2^-17
  const int m = layout.mantissa_bits;
  const int exponent = static_cast<int>(abs >> 23) - 127;  // value = 1.f * 2^exponent
  const int min_exponent = 1 - layout.bias;                // of the normal FP8 numbers
  std::uint32_t code = 0;
  if (exponent < min_exponent) {
    // Subnormal FP8: the value in units of the quantum 2^(min_exponent - m), rounded to an integer.
    const std::uint32_t significand = (abs & 0x007fffffu) | 0x00800000u;  // value = significand * 2^(exponent - 23)
    const int shift = 23 + min_exponent - m - exponent;                   // > 23 - m
    if (shift > 31) return static_cast<std::uint8_t>(sign);
    std::uint32_t units = significand >> shift;
    const std::uint32_t remainder = significand & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (units & 1u))) ++units;
    code = units;  // 1 << m (rounded up to the smallest normal) is that normal's code
  } else {
    const int drop = 23 - m;  // mantissa bits dropped
    const std::uint32_t rounded = (abs + ((1u << (drop - 1)) - 1u) + ((abs >> drop) & 1u)) >> drop;
    const std::uint32_t rebias = static_cast<std::uint32_t>(127 - layout.bias) << m;
    code = rounded - rebias;  // exponent field re-biased; a carry out of the mantissa bumps the exponent
  }
  if (code > layout.max_code) code = layout.max_code;  // saturate (infinity included)
  return static_cast<std::uint8_t>(sign | code);
}

// The exact float value of a code of `format` (NaN for NaN codes, +-infinity for E5M2's).
STRATA_HOST_DEVICE constexpr float fp8_to_float(std::uint8_t code, Fp8Format format) {
  const Fp8Layout layout = fp8_layout(format);
  const int m = layout.mantissa_bits, e = 7 - m;
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t exponent = (code >> m) & ((1u << e) - 1u);
  const std::uint32_t mantissa = code & ((1u << m) - 1u);
  if (format == Fp8Format::e4m3 && (code & 0x7fu) == 0x7fu) return std::bit_cast<float>(0x7fc00000u | sign);
  if (format == Fp8Format::e5m2 && exponent == 0x1fu)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 21));  // infinity, or NaN (mantissa != 0)
  if (exponent == 0) {
    // mantissa * 2^(1 - bias - m): exact in float
    const float unit = std::bit_cast<float>(static_cast<std::uint32_t>(127 + 1 - layout.bias - m) << 23);
    const float v = static_cast<float>(mantissa) * unit;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exponent + static_cast<std::uint32_t>(127 - layout.bias)) << 23) | (mantissa << (23 - m)));
}

}  // namespace detail

// The largest finite value of a format (448, 57344).
STRATA_HOST_DEVICE constexpr float fp8_max(Fp8Format format) { return format == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

template <Fp8Format Format>
struct fp8 {
  static constexpr Fp8Format format = Format;
  std::uint8_t bits = 0;

  constexpr fp8() = default;
  STRATA_HOST_DEVICE explicit constexpr fp8(float value) : bits(detail::fp8_from_float(value, Format)) {}
  STRATA_HOST_DEVICE constexpr operator float() const { return detail::fp8_to_float(bits, Format); }
  STRATA_HOST_DEVICE static constexpr fp8 from_bits(std::uint8_t raw) {
    fp8 out;
    out.bits = raw;
    return out;
  }
};
using fp8_e4m3 = fp8<Fp8Format::e4m3>;
using fp8_e5m2 = fp8<Fp8Format::e5m2>;
static_assert(sizeof(fp8_e4m3) == 1 && std::is_trivially_copyable_v<fp8_e4m3>);
static_assert(sizeof(fp8_e5m2) == 1 && std::is_trivially_copyable_v<fp8_e5m2>);

// Run-time format: the code of `value` (saturating, round to nearest even) and back.
STRATA_HOST_DEVICE constexpr std::uint8_t fp8_encode(float value, Fp8Format format) { return detail::fp8_from_float(value, format); }
STRATA_HOST_DEVICE constexpr float fp8_decode(std::uint8_t code, Fp8Format format) { return detail::fp8_to_float(code, format); }

static_assert(fp8_decode(0x7e, Fp8Format::e4m3) == 448.0f && fp8_decode(0x7b, Fp8Format::e5m2) == 57344.0f);
static_assert(fp8_encode(1.0f, Fp8Format::e4m3) == 0x38 && fp8_encode(1.0f, Fp8Format::e5m2) == 0x3c);
static_assert(fp8_encode(1e9f, Fp8Format::e4m3) == 0x7e && fp8_encode(-1e9f, Fp8Format::e5m2) == 0xfb);

STRATA_NAMESPACE_END
