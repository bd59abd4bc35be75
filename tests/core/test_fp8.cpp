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

// The blockwise recipe's scale: the power of two at or below max / amax, 1 for 0 and non-finite
// amaxes, so 1 / scale is exact.
TEST(Fp8Blocks, ScaleIsThePowerOfTwoBelowMaxOverAmax) {
  for (const float amax : {1.0f, 3.0f, 448.0f, 0.001f, 1e-30f, 5e30f, 1e-44f}) {
    const float scale = strata::fp8_block_scale(amax, 448.0f);
    int exponent = 0;
    EXPECT_EQ(std::frexp(scale, &exponent), 0.5f) << amax;  // a power of two
    EXPECT_LE(double(amax) * scale, 448.0 * (1 + 1e-7)) << amax;
    if (scale < std::ldexp(1.0f, 127)) EXPECT_GT(double(amax) * scale * 2, 448.0 * (1 - 1e-7)) << amax;
    EXPECT_EQ(double(1.0f / scale) * scale, 1.0) << amax;
  }
  EXPECT_EQ(strata::fp8_block_scale(0.0f, 448.0f), 1.0f);
  EXPECT_EQ(strata::fp8_block_scale(std::numeric_limits<float>::infinity(), 448.0f), 1.0f);
  EXPECT_EQ(strata::fp8_block_scale(std::numeric_limits<float>::quiet_NaN(), 448.0f), 1.0f);
}

// fp8_cast_blocks and fp8_cast_tiles against a reference written here: each block's amax, its
// scale, the codes of x times the scale; the transposed outputs hold the same codes as runs of the
// other dimension; partial blocks at the edges; every block's largest value lands in the top
// binade of the format (the scale uses the range).
TEST(Fp8Blocks, CastsMatchTheBlockReference) {
  using strata::index_t;
  const index_t rows = 7, cols = 10, block = 4;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (index_t i = 0; i < rows * cols; ++i) x[static_cast<std::size_t>(i)] = normal(gen) * std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
  for (index_t c = 4; c < 8; ++c) x[static_cast<std::size_t>(2 * cols + c)] = 0.0f;  // an all-zero run: scale 1
  for (const Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const float max = strata::fp8_max(format);
    auto reference = [&](auto index_of, index_t n) {  // codes and 1 / scale of one block of n elements
      float amax = 0;
      for (index_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(index_of(i))]));
      const float scale = strata::fp8_block_scale(amax, max);
      if (amax > 0) EXPECT_GE(amax * scale, max / 2);
      std::vector<std::uint8_t> codes;
      for (index_t i = 0; i < n; ++i) codes.push_back(strata::fp8_encode(x[static_cast<std::size_t>(index_of(i))] * scale, format));
      return std::pair{codes, 1.0f / scale};
    };
    const index_t row_runs = (cols + block - 1) / block, col_runs = (rows + block - 1) / block;
    std::vector<std::uint8_t> q(x.size()), qt(x.size());
    std::vector<float> q_inv(static_cast<std::size_t>(row_runs * rows)), qt_inv(static_cast<std::size_t>(col_runs * cols));
    strata::cpu::fp8_cast_blocks<float>(x.data(), rows, cols, format, block, q.data(), q_inv.data(), qt.data(), qt_inv.data());
    for (index_t r = 0; r < rows; ++r)
      for (index_t kb = 0; kb < row_runs; ++kb) {
        const index_t c0 = kb * block, n = std::min(block, cols - c0);
        const auto [codes, inverse] = reference([&](index_t i) { return r * cols + c0 + i; }, n);
        EXPECT_EQ(q_inv[static_cast<std::size_t>(kb * rows + r)], inverse) << r << " " << kb;
        for (index_t i = 0; i < n; ++i) EXPECT_EQ(q[static_cast<std::size_t>(r * cols + c0 + i)], codes[static_cast<std::size_t>(i)]);
      }
    for (index_t c = 0; c < cols; ++c)
      for (index_t rb = 0; rb < col_runs; ++rb) {
        const index_t r0 = rb * block, n = std::min(block, rows - r0);
        const auto [codes, inverse] = reference([&](index_t i) { return (r0 + i) * cols + c; }, n);
        EXPECT_EQ(qt_inv[static_cast<std::size_t>(rb * cols + c)], inverse) << c << " " << rb;
        for (index_t i = 0; i < n; ++i) EXPECT_EQ(qt[static_cast<std::size_t>(c * rows + r0 + i)], codes[static_cast<std::size_t>(i)]);
      }
    EXPECT_EQ(q_inv[static_cast<std::size_t>(1 * rows + 2)], 1.0f) << "the zero run's scale";
    // tiles
    const index_t tile_rows = col_runs, tile_cols = row_runs;
    std::vector<std::uint8_t> tq(x.size()), tqt(x.size());
    std::vector<float> t_inv(static_cast<std::size_t>(tile_rows * tile_cols)), t_inv_t(t_inv.size());
    strata::cpu::fp8_cast_tiles<float>(x.data(), rows, cols, format, block, tq.data(), tqt.data(), t_inv.data(), t_inv_t.data());
    for (index_t tr = 0; tr < tile_rows; ++tr)
      for (index_t tc = 0; tc < tile_cols; ++tc) {
        const index_t r0 = tr * block, c0 = tc * block, nr = std::min(block, rows - r0), nc = std::min(block, cols - c0);
        const auto [codes, inverse] = reference([&](index_t i) { return (r0 + i / nc) * cols + c0 + i % nc; }, nr * nc);
        EXPECT_EQ(t_inv[static_cast<std::size_t>(tr * tile_cols + tc)], inverse);
        EXPECT_EQ(t_inv_t[static_cast<std::size_t>(tc * tile_rows + tr)], inverse);
        for (index_t i = 0; i < nr * nc; ++i) {
          const index_t r = r0 + i / nc, c = c0 + i % nc;
          EXPECT_EQ(tq[static_cast<std::size_t>(r * cols + c)], codes[static_cast<std::size_t>(i)]);
          EXPECT_EQ(tqt[static_cast<std::size_t>(c * rows + r)], codes[static_cast<std::size_t>(i)]);
        }
      }
  }
}

// fp8_gemm_blocks: C = A B^T of the decoded codes, each times its block's 1 / scale, for runs and
// tiles on either side, written and accumulated, against the sum written out here.
TEST(Fp8Blocks, GemmIsTheSumOfTheDecodedBlocks) {
  using strata::index_t;
  const index_t m = 6, n = 9, k = 11, block = 4;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](index_t count) {
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = normal(gen);
    return v;
  };
  const std::vector<float> a = random(m * k), b = random(n * k);
  auto cast = [&](const std::vector<float>& x, index_t rows, bool tiles, Fp8Format f) {
    std::vector<std::uint8_t> q(x.size());
    const index_t runs = (k + block - 1) / block;
    std::vector<float> inverse(static_cast<std::size_t>(tiles ? ((rows + block - 1) / block) * runs : runs * rows));
    if (tiles) strata::cpu::fp8_cast_tiles<float>(x.data(), rows, k, f, block, q.data(), nullptr, inverse.data(), nullptr);
    else strata::cpu::fp8_cast_blocks<float>(x.data(), rows, k, f, block, q.data(), inverse.data(), nullptr, nullptr);
    std::vector<double> decoded(x.size());
    for (index_t r = 0; r < rows; ++r)
      for (index_t i = 0; i < k; ++i) {
        const float s = tiles ? inverse[static_cast<std::size_t>((r / block) * runs + i / block)]
                              : inverse[static_cast<std::size_t>((i / block) * rows + r)];
        decoded[static_cast<std::size_t>(r * k + i)] = double(strata::fp8_decode(q[static_cast<std::size_t>(r * k + i)], f)) * s;
      }
    return std::tuple{q, inverse, decoded};
  };
  for (const bool a_tiles : {false, true})
    for (const bool b_tiles : {false, true}) {
      const auto [qa, sa, da] = cast(a, m, a_tiles, Fp8Format::e4m3);
      const auto [qb, sb, db] = cast(b, n, b_tiles, Fp8Format::e5m2);
      std::vector<double> c(static_cast<std::size_t>(m * n), 1.0);
      strata::cpu::fp8_gemm_blocks<double>(m, n, k, qa.data(), Fp8Format::e4m3, sa.data(), a_tiles, qb.data(), Fp8Format::e5m2,
                                           sb.data(), b_tiles, block, c.data(), /*accumulate=*/true);
      double worst = 0, distance = 0;
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
          double want = 1.0, exact = 1.0;
          for (index_t p = 0; p < k; ++p) {
            want += da[static_cast<std::size_t>(i * k + p)] * db[static_cast<std::size_t>(j * k + p)];
            exact += double(a[static_cast<std::size_t>(i * k + p)]) * b[static_cast<std::size_t>(j * k + p)];
          }
          worst = std::max(worst, std::fabs(c[static_cast<std::size_t>(i * n + j)] - want));
          distance = std::max(distance, std::fabs(want - exact));
        }
      EXPECT_LT(worst, 1e-12) << a_tiles << b_tiles;
      EXPECT_GT(distance, 1e-4) << "FP8 rounding changed nothing";
      EXPECT_LT(distance, 0.5) << "the blocks' scales are wrong";
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Conversion, ::testing::Values(Fp8Format::e4m3, Fp8Format::e5m2),
                         [](const auto& info) { return std::string(strata::fp8_format_name(info.param)); });

}  // namespace
