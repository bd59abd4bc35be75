// FP8 conversions (core/fp8.hpp) against a reference built here from first principles: every
// finite value of a format is enumerated from its definition (sign, exponent, mantissa), and the
// expected code of a float is the nearest finite value, ties to the code with an even mantissa,
// with anything beyond the largest finite value (infinity included) saturated to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <strata/backend/cpu/fp8.hpp>
#include <strata/core/fp8.hpp>

using strata::Fp8Format;

namespace {

struct Representable {
  double value;
  std::uint8_t code;
};

// The finite non-negative values of a format from the definition (independent of core/fp8.hpp).
std::vector<Representable> finite_values(Fp8Format format) {
  const int mantissa_bits = format == Fp8Format::e4m3 ? 3 : 2;
  const int exponent_bits = 7 - mantissa_bits;
  const int bias = format == Fp8Format::e4m3 ? 7 : 15;
  std::vector<Representable> out;
  for (int e = 0; e < (1 << exponent_bits); ++e)
    for (int m = 0; m < (1 << mantissa_bits); ++m) {
      const int code = (e << mantissa_bits) | m;
      if (format == Fp8Format::e4m3 && code == 0x7f) continue;                 // NaN
      if (format == Fp8Format::e5m2 && e == (1 << exponent_bits) - 1) continue;  // inf, NaN
      const double value = e == 0 ? std::ldexp(m, 1 - bias - mantissa_bits)
                                  : std::ldexp(1.0 + std::ldexp(m, -mantissa_bits), e - bias);
      out.push_back({value, static_cast<std::uint8_t>(code)});
    }
  return out;
}

// The code a saturating round-to-nearest-even conversion gives for finite or infinite x.
std::uint8_t reference_code(double x, const std::vector<Representable>& table) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  if (a >= table.back().value) return sign | table.back().code;  // saturate
  auto above = std::lower_bound(table.begin(), table.end(), a, [](const Representable& r, double v) { return r.value < v; });
  if (above->value == a) return sign | above->code;
  auto below = above - 1;
  const double to_below = a - below->value, to_above = above->value - a;
  if (to_below < to_above) return sign | below->code;
  if (to_above < to_below) return sign | above->code;
  return sign | ((below->code & 1) == 0 ? below->code : above->code);  // tie: even mantissa
}

class Fp8Conversion : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8Conversion, EveryCodeRoundTrips) {
  const Fp8Format format = GetParam();
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = strata::fp8_decode(code, format);
    if (std::isnan(v)) {
      EXPECT_EQ(strata::fp8_encode(v, format), 0x7f) << "code " << c;
      continue;
    }
    if (std::isinf(v)) {  // E5M2's infinities saturate to the largest finite value
      EXPECT_EQ(strata::fp8_encode(v, format), (code & 0x80) | 0x7b) << "code " << c;
      continue;
    }
    EXPECT_EQ(strata::fp8_encode(v, format), code) << "code " << c << " value " << v;
  }
}

TEST_P(Fp8Conversion, DecodesTheDefinitionsValues) {
  const Fp8Format format = GetParam();
  for (const Representable& r : finite_values(format)) {
    EXPECT_EQ(static_cast<double>(strata::fp8_decode(r.code, format)), r.value) << "code " << int(r.code);
    EXPECT_EQ(static_cast<double>(strata::fp8_decode(r.code | 0x80, format)), -r.value) << "code " << int(r.code);
  }
  EXPECT_EQ(strata::fp8_max(format), finite_values(format).back().value);
  if (format == Fp8Format::e4m3) {
    EXPECT_TRUE(std::isnan(strata::fp8_decode(0x7f, format)));
    EXPECT_TRUE(std::isnan(strata::fp8_decode(0xff, format)));
  } else {
    EXPECT_EQ(strata::fp8_decode(0x7c, format), std::numeric_limits<float>::infinity());
    EXPECT_EQ(strata::fp8_decode(0xfc, format), -std::numeric_limits<float>::infinity());
    for (int c : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) EXPECT_TRUE(std::isnan(strata::fp8_decode(c, format)));
  }
}

// Midpoints between neighbours (ties to even), one float ulp either side of them, the subnormal
// range, the largest values and beyond (saturation), infinities and NaN.
TEST_P(Fp8Conversion, RoundingBoundariesMatchTheReference) {
  const Fp8Format format = GetParam();
  const auto table = finite_values(format);
  std::vector<float> probes = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min()};
  for (std::size_t i = 0; i < table.size(); ++i) {
    const float v = static_cast<float>(table[i].value);
    probes.push_back(v);
    probes.push_back(std::nextafter(v, 0.0f));
    probes.push_back(std::nextafter(v, 1e30f));
    const double next = i + 1 < table.size() ? table[i + 1].value : 2 * table[i].value - table[i - 1].value;  // past max
    const float mid = static_cast<float>((table[i].value + next) / 2);  // exact: a float
    ASSERT_EQ(static_cast<double>(mid), (table[i].value + next) / 2);
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, 0.0f));
    probes.push_back(std::nextafter(mid, 1e30f));
  }
  probes.push_back(static_cast<float>(table[1].value / 2));  // half the smallest subnormal: ties to zero
  probes.push_back(std::nextafter(static_cast<float>(table[1].value / 2), 1.0f));
  probes.push_back(static_cast<float>(table[1].value / 4));
  const std::size_t positives = probes.size();
  for (std::size_t i = 0; i < positives; ++i) probes.push_back(-probes[i]);
  int ties = 0;
  for (float p : probes) {
    EXPECT_EQ(strata::fp8_encode(p, format), reference_code(p, table)) << "value " << p;
    ties += std::fabs(p) < table.back().value && strata::fp8_decode(strata::fp8_encode(p, format), format) != p;
  }
  EXPECT_GT(ties, 100);  // the probes do exercise rounding
  EXPECT_EQ(strata::fp8_encode(std::numeric_limits<float>::quiet_NaN(), format), 0x7f);
  EXPECT_EQ(strata::fp8_encode(-std::numeric_limits<float>::quiet_NaN(), format), 0x7f);
}

TEST_P(Fp8Conversion, RandomFloatsMatchTheReference) {
  const Fp8Format format = GetParam();
  const auto table = finite_values(format);
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> exponent(-22, 18), mantissa(1, 2);
  for (int i = 0; i < 200000; ++i) {
    float x = static_cast<float>(std::ldexp(mantissa(gen), static_cast<int>(std::floor(exponent(gen)))));
    if (i & 1) x = -x;
    ASSERT_EQ(strata::fp8_encode(x, format), reference_code(x, table)) << "value " << x;
  }
}

TEST(Fp8Types, StorageTypesConvertThroughFloat) {
  EXPECT_EQ(float(strata::fp8_e4m3(0.3f)), 0.3125f);  // 0.3 between 0.28125 and 0.3125, nearer the latter
  EXPECT_EQ(float(strata::fp8_e5m2(0.3f)), 0.3125f);
  EXPECT_EQ(float(strata::fp8_e4m3(1000.0f)), 448.0f);
  EXPECT_EQ(float(strata::fp8_e5m2(-1e6f)), -57344.0f);
  EXPECT_EQ(strata::fp8_e4m3::from_bits(0x01).bits, 0x01);
  EXPECT_EQ(float(strata::fp8_e4m3::from_bits(0x01)), std::ldexp(1.0f, -9));
  EXPECT_EQ(float(strata::fp8_e5m2::from_bits(0x01)), std::ldexp(1.0f, -16));
}

// The amax of a tensor holding a NaN is the canonical quiet NaN (bits 0x7fc00000) whatever the
// NaN's sign and payload, and a NaN beats infinity: the GPU kernels give the same bits (the GPU
// suite compares them), where the hardware's fabs may return another NaN.
TEST(Fp8Amax, NanIsCanonicalAndWins) {
  for (std::uint32_t nan_bits : {0x7fc00000u, 0xffc00000u, 0x7fc00001u, 0x7f800001u, 0xffffffffu}) {
    const std::vector<float> x = {1.0f, -std::numeric_limits<float>::infinity(), std::bit_cast<float>(nan_bits), -3.0f};
    float amax = 0.5f, cast_amax = 0.0f;
    strata::cpu::fp8_amax<float>(x.data(), static_cast<strata::index_t>(x.size()), &amax);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(amax), 0x7fc00000u) << std::hex << nan_bits;
    std::vector<std::uint8_t> codes(x.size());
    const float scale = 1.0f;
    strata::cpu::fp8_cast<float>(x.data(), static_cast<strata::index_t>(x.size()), Fp8Format::e4m3, &scale, codes.data(),
                                 &cast_amax);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(cast_amax), 0x7fc00000u) << std::hex << nan_bits;
  }
  const std::vector<float> finite = {1.0f, -std::numeric_limits<float>::infinity(), -3.0f};
  float amax = 0.0f;
  strata::cpu::fp8_amax<float>(finite.data(), 3, &amax);
  EXPECT_EQ(amax, std::numeric_limits<float>::infinity());
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Conversion, ::testing::Values(Fp8Format::e4m3, Fp8Format::e5m2),
                         [](const auto& info) { return std::string(strata::fp8_format_name(info.param)); });

}  // namespace
