// The CPU kernels of the architecture options (rotary variants, gated activations with clamp and
// offset, squared ReLU, zero-centred norm weights) against plain references written from the
// formulas, and their backward passes against central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include <strata/backend/cpu.hpp>
#include <strata/core.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_cpu_architecture_kernels_cases {

namespace {

using strata::index_t;

std::vector<double> random_values(index_t n, std::uint64_t key, double scale = 1.0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = scale * (2.0 * strata::rng::uniform(key, i) - 1.0);
  return v;
}

// ---------------------------------------------------------------------------------------------
// RoPE: x [s, n, d]

constexpr index_t kSeq = 5, kRows = 3, kDim = 12;
constexpr double kBase = 500.0;

// The reference: Megatron's description written out. rotary_dim dimensions turn, inv_freq(i) =
// base^(-2i/rotary_dim) (scaled when llama3), pairs (i, i + rotary_dim/2) or (2i, 2i + 1).
std::vector<double> rope_reference(const std::vector<double>& x, index_t offset, index_t rotary_dim, bool interleaved,
                                   double factor = 0, double low = 1, double high = 4, double original = 8192) {
  std::vector<double> y = x;
  const index_t half = rotary_dim / 2;
  for (index_t t = 0; t < kSeq; ++t)
    for (index_t r = 0; r < kRows; ++r)
      for (index_t i = 0; i < half; ++i) {
        double freq = 1.0 / std::pow(kBase, static_cast<double>(2 * i) / static_cast<double>(rotary_dim));
        if (factor > 0) {
          const double wavelength = 2 * std::numbers::pi / freq;
          if (wavelength > original / low) {
            freq /= factor;
          } else if (wavelength >= original / high) {
            const double smooth = (original / wavelength - low) / (high - low);
            freq = (1 - smooth) * freq / factor + smooth * freq;
          }
        }
        const double angle = static_cast<double>(offset + t) * freq;
        const std::size_t row = static_cast<std::size_t>((t * kRows + r) * kDim);
        const std::size_t a = row + static_cast<std::size_t>(interleaved ? 2 * i : i);
        const std::size_t b = row + static_cast<std::size_t>(interleaved ? 2 * i + 1 : i + half);
        y[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
        y[b] = x[b] * std::cos(angle) + x[a] * std::sin(angle);
      }
  return y;
}

void expect_rope(strata::RopeOptions options, const std::vector<double>& expected, const std::vector<double>& x,
                 index_t offset) {
  auto y = x;
  strata::cpu::rope_forward<double>(y.data(), kSeq, kRows, kDim, kBase, offset, options);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-13) << i;
  strata::cpu::rope_backward<double>(y.data(), kSeq, kRows, kDim, kBase, offset, options);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-13) << "backward undoes forward at " << i;
}

TEST(RopeVariants, DefaultOptionsAreTheWholeHeadRotateHalf) {
  const auto x = random_values(kSeq * kRows * kDim, 1);
  expect_rope({}, rope_reference(x, 3, kDim, false), x, 3);
}

TEST(RopeVariants, RotaryPercentTurnsTheFirstDimensionsAndLeavesTheRest) {
  const auto x = random_values(kSeq * kRows * kDim, 2);
  strata::RopeOptions o;
  o.rotary_dim = 8;  // rotary_percent 2/3 of 12
  const auto expected = rope_reference(x, 4, 8, false);
  for (index_t row = 0; row < kSeq * kRows; ++row)
    for (index_t c = 8; c < kDim; ++c) EXPECT_EQ(expected[row * kDim + c], x[row * kDim + c]);
  expect_rope(o, expected, x, 4);
}

TEST(RopeVariants, InterleavedTurnsAdjacentPairs) {
  const auto x = random_values(kSeq * kRows * kDim, 3);
  strata::RopeOptions o;
  o.interleaved = true;
  expect_rope(o, rope_reference(x, 2, kDim, true), x, 2);
  o.rotary_dim = 6;
  expect_rope(o, rope_reference(x, 2, 6, true), x, 2);
}

TEST(RopeVariants, Llama31ScalingSlowsLowFrequenciesKeepsHighOnesAndBlendsBetween) {
  const auto x = random_values(kSeq * kRows * kDim, 4);
  strata::RopeOptions o;
  // A small original context so that, with base 500 and 6 frequencies, all three regimes occur.
  o.scaling_factor = 8;
  o.original_max_positions = 64;
  o.low_freq_factor = 1;
  o.high_freq_factor = 4;
  int kept = 0, slowed = 0, blended = 0;
  for (index_t i = 0; i < kDim / 2; ++i) {
    const double plain = std::pow(kBase, -2.0 * i / kDim), scaled = strata::rope_inverse_frequency(i, kDim, kBase, o);
    if (scaled == plain) ++kept;
    else if (std::abs(scaled - plain / 8) < 1e-18) ++slowed;
    else ++blended;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(slowed, 0);
  EXPECT_GT(blended, 0);
  expect_rope(o, rope_reference(x, 7, kDim, false, 8, 1, 4, 64), x, 7);
}

// YaRN (Hugging Face's rope_type "yarn", Megatron's --position-embedding-type yarn): the inverse
// frequencies and the attention factor against numbers computed by hand from transformers'
// _compute_yarn_parameters in float64 (its formulas, written out in Python's math module).
TEST(RopeVariants, YarnFrequenciesAndAttentionFactorEqualTheHandComputedReference) {
  auto close = [](double got, double want) { EXPECT_NEAR(got, want, 1e-14 * std::abs(want)) << want; };
  // gpt-oss: head 64, rope_theta 150000, factor 32, original 4096, beta 32 / 1, truncate false
  strata::RopeOptions gpt_oss;
  gpt_oss.yarn_factor = 32;
  gpt_oss.yarn_original_max_positions = 4096;
  gpt_oss.yarn_round_to_int = false;
  const std::pair<index_t, double> gpt_oss_frequencies[] = {
      {0, 1.0},  {8, 0.050813274815461475},  {9, 0.03170569618466377},      {12, 0.006794959489732219},
      {17, 0.00012931870124506317}, {18, 3.8308812373753384e-05}, {31, 3.0235114281192144e-07}};
  for (const auto& [i, want] : gpt_oss_frequencies) close(strata::rope_inverse_frequency(i, 64, 150000.0, gpt_oss), want);
  close(strata::rope_attention_factor(gpt_oss), 1.3465735902799727);  // 0.1 ln 32 + 1
  EXPECT_EQ(strata::rope_yarn_ramp(8, 64, 150000.0, gpt_oss), 0.0);  // low = 8.0928 (unrounded): kept
  EXPECT_EQ(strata::rope_yarn_ramp(18, 64, 150000.0, gpt_oss), 1.0);  // high = 17.398: divided by 32
  // Qwen3 long context: head 128, rope_theta 1e6, factor 4, original 32768 (rounded range 23 .. 40)
  strata::RopeOptions qwen3;
  qwen3.yarn_factor = 4;
  qwen3.yarn_original_max_positions = 32768;
  const std::pair<index_t, double> qwen3_frequencies[] = {
      {0, 1.0}, {20, 0.01333521432163324}, {40, 4.445698525097307e-05}, {63, 3.102344401879299e-07}};
  for (const auto& [i, want] : qwen3_frequencies) close(strata::rope_inverse_frequency(i, 128, 1e6, qwen3), want);
  close(strata::rope_attention_factor(qwen3), 1.138629436111989);
  EXPECT_EQ(strata::rope_yarn_ramp(23, 128, 1e6, qwen3), 0.0);
  EXPECT_EQ(strata::rope_yarn_ramp(40, 128, 1e6, qwen3), 1.0);
  close(strata::rope_yarn_ramp(30, 128, 1e6, qwen3), 7.0 / 17.0);
  // DeepSeek-V3's mscale = mscale_all_dim: the attention factor is 1
  strata::RopeOptions deepseek;
  deepseek.yarn_factor = 40;
  deepseek.yarn_mscale = deepseek.yarn_mscale_all_dim = 0.707;
  close(strata::rope_attention_factor(deepseek), 1.0);
  // Megatron's defaults mscale 1, mscale_all_dim 0 are transformers' default (no mscale keys)
  strata::RopeOptions plain;
  plain.yarn_factor = 40;
  close(strata::rope_attention_factor(plain), 0.1 * std::log(40.0) + 1.0);
  plain.yarn_factor = 1;  // a factor of 1 is plain RoPE
  for (index_t i = 0; i < 32; ++i) close(strata::rope_inverse_frequency(i, 64, 150000.0, plain), std::pow(150000.0, -i / 32.0));
  close(strata::rope_attention_factor(plain), 1.0);
}

// The rotation with YaRN's frequencies and its attention factor m on cos and sin: the forward is
// m times the rotation by YaRN's angles, and the backward its transpose (m^2 times the input back).
TEST(RopeVariants, YarnRotatesByItsFrequenciesAndScalesByTheAttentionFactor) {
  const auto x = random_values(kSeq * kRows * kDim, 5);
  strata::RopeOptions o;
  o.yarn_factor = 8;
  o.yarn_original_max_positions = 64;  // the correction range at these sizes: pairs 0 .. 3 of 6
  const double m = strata::rope_attention_factor(o);
  EXPECT_GT(m, 1.2);
  auto y = x;
  strata::cpu::rope_forward<double>(y.data(), kSeq, kRows, kDim, kBase, 3, o);
  for (index_t t = 0; t < kSeq; ++t)
    for (index_t r = 0; r < kRows; ++r)
      for (index_t i = 0; i < kDim / 2; ++i) {
        const double angle = static_cast<double>(3 + t) * strata::rope_inverse_frequency(i, kDim, kBase, o);
        const std::size_t row = static_cast<std::size_t>((t * kRows + r) * kDim);
        const std::size_t a = row + static_cast<std::size_t>(i), b = a + kDim / 2;
        EXPECT_NEAR(y[a], m * (x[a] * std::cos(angle) - x[b] * std::sin(angle)), 1e-13);
        EXPECT_NEAR(y[b], m * (x[b] * std::cos(angle) + x[a] * std::sin(angle)), 1e-13);
      }
  strata::cpu::rope_backward<double>(y.data(), kSeq, kRows, kDim, kBase, 3, o);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], m * m * x[i], 1e-13) << i;
}

// ---------------------------------------------------------------------------------------------
// Gated activations: gate_up [rows, 2f]

constexpr index_t kGluRows = 4, kGluWidth = 5;

double glu_reference(double gate, double up, const strata::GluActivation& a) {
  const double alpha = a.kind == strata::GluKind::quick_gelu ? 1.702 : 1.0;
  if (a.clamp > 0) {
    gate = std::min(gate, a.clamp);
    up = std::clamp(up, -a.clamp, a.clamp);
  }
  return gate / (1 + std::exp(-alpha * gate)) * (up + a.linear_offset);
}

void expect_glu(const strata::GluActivation& a) {
  // scale 3 with clamp 1.5: some inputs beyond each bound
  const auto gu = random_values(kGluRows * 2 * kGluWidth, 10, 3.0), dy = random_values(kGluRows * kGluWidth, 11);
  std::vector<double> y(dy.size()), dgu(gu.size());
  strata::cpu::glu_forward<double>(gu.data(), kGluRows, kGluWidth, a, y.data());
  for (index_t r = 0; r < kGluRows; ++r)
    for (index_t j = 0; j < kGluWidth; ++j)
      EXPECT_NEAR(y[r * kGluWidth + j], glu_reference(gu[r * 2 * kGluWidth + j], gu[r * 2 * kGluWidth + kGluWidth + j], a),
                  1e-14);
  strata::cpu::glu_backward<double>(dy.data(), gu.data(), kGluRows, kGluWidth, a, dgu.data());
  for (index_t r = 0; r < kGluRows; ++r)
    for (index_t j = 0; j < 2 * kGluWidth; ++j) {
      const std::size_t at = static_cast<std::size_t>(r * 2 * kGluWidth + j);
      const index_t out = r * kGluWidth + j % kGluWidth;
      const double eps = 1e-6;
      auto f = [&](double v) {
        auto p = gu;
        p[at] = v;
        return glu_reference(p[r * 2 * kGluWidth + j % kGluWidth], p[r * 2 * kGluWidth + kGluWidth + j % kGluWidth], a);
      };
      const double numeric = dy[out] * (f(gu[at] + eps) - f(gu[at] - eps)) / (2 * eps);
      EXPECT_NEAR(dgu[at], numeric, 1e-8) << "row " << r << " column " << j;
    }
}

TEST(GatedActivation, SiluWithoutOptionsEqualsSwiglu) {
  const auto gu = random_values(kGluRows * 2 * kGluWidth, 12, 2.0), dy = random_values(kGluRows * kGluWidth, 13);
  std::vector<double> y(dy.size()), y_swiglu(dy.size()), d(gu.size()), d_swiglu(gu.size());
  strata::cpu::glu_forward<double>(gu.data(), kGluRows, kGluWidth, {}, y.data());
  strata::cpu::swiglu_forward<double>(gu.data(), kGluRows, kGluWidth, y_swiglu.data());
  strata::cpu::glu_backward<double>(dy.data(), gu.data(), kGluRows, kGluWidth, {}, d.data());
  strata::cpu::swiglu_backward<double>(dy.data(), gu.data(), kGluRows, kGluWidth, d_swiglu.data());
  EXPECT_EQ(y, y_swiglu);
  EXPECT_EQ(d, d_swiglu);
}
TEST(GatedActivation, QuickGegluMatchesItsFormulaAndDifferences) { expect_glu({strata::GluKind::quick_gelu, 0, 0}); }
TEST(GatedActivation, GptOssClampAndOffsetMatchTheirFormulaAndDifferences) {
  expect_glu({strata::GluKind::quick_gelu, 1.5, 1.0});
  expect_glu({strata::GluKind::silu, 1.5, 0.5});
}

TEST(SquaredRelu, MatchesItsFormulaAndDerivative) {
  const auto x = random_values(40, 20), dy = random_values(40, 21);
  std::vector<double> y(40), dx(40);
  strata::cpu::squared_relu_forward<double>(x.data(), 40, y.data());
  strata::cpu::squared_relu_backward<double>(dy.data(), x.data(), 40, dx.data());
  for (std::size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(y[i], x[i] > 0 ? x[i] * x[i] : 0.0);
    EXPECT_EQ(dx[i], x[i] > 0 ? 2 * x[i] * dy[i] : 0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// Zero-centred norm weights: weight_offset 1 on gamma - 1 equals the norm with gamma.

TEST(NormWeightOffset, LayerNormAndRmsNormWithOffsetEqualTheNormOfGammaPlusOne) {
  constexpr index_t rows = 3, h = 16;
  const auto x = random_values(rows * h, 30), dy = random_values(rows * h, 31), w = random_values(h, 32, 0.1),
             beta = random_values(h, 33);
  std::vector<double> gamma(h);
  for (index_t i = 0; i < h; ++i) gamma[i] = w[i] + 1.0;
  std::vector<double> y1(rows * h), y2(rows * h), dx1(rows * h), dx2(rows * h), mean(rows), rstd(rows), dg1(h), dg2(h),
      db1(h), db2(h);
  strata::cpu::layernorm_forward<double>(x.data(), gamma.data(), beta.data(), rows, h, 1e-5, y1.data(), mean.data(), rstd.data());
  strata::cpu::layernorm_backward<double>(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), rows, h, dx1.data(),
                                          dg1.data(), db1.data());
  strata::cpu::layernorm_forward<double>(x.data(), w.data(), beta.data(), rows, h, 1e-5, y2.data(), mean.data(), rstd.data(),
                                         nullptr, nullptr, 1.0);
  strata::cpu::layernorm_backward<double>(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, h, dx2.data(),
                                          dg2.data(), db2.data(), nullptr, false, static_cast<double*>(nullptr), 1.0);
  for (std::size_t i = 0; i < y1.size(); ++i) {
    EXPECT_NEAR(y2[i], y1[i], 1e-14);
    EXPECT_NEAR(dx2[i], dx1[i], 1e-14);
  }
  for (index_t i = 0; i < h; ++i) {
    EXPECT_NEAR(dg2[i], dg1[i], 1e-14);
    EXPECT_EQ(db2[i], db1[i]);
  }
  strata::cpu::rmsnorm_forward<double>(x.data(), gamma.data(), rows, h, 1e-5, y1.data(), rstd.data());
  strata::cpu::rmsnorm_backward<double>(dy.data(), x.data(), gamma.data(), rstd.data(), rows, h, dx1.data(), dg1.data());
  strata::cpu::rmsnorm_forward<double>(x.data(), w.data(), rows, h, 1e-5, y2.data(), rstd.data(), nullptr, nullptr, 1.0);
  strata::cpu::rmsnorm_backward<double>(dy.data(), x.data(), w.data(), rstd.data(), rows, h, dx2.data(), dg2.data(), nullptr,
                                        false, 1.0);
  for (std::size_t i = 0; i < y1.size(); ++i) {
    EXPECT_NEAR(y2[i], y1[i], 1e-14);
    EXPECT_NEAR(dx2[i], dx1[i], 1e-14);
  }
  for (index_t i = 0; i < h; ++i) EXPECT_NEAR(dg2[i], dg1[i], 1e-14);
}

}  // namespace
}  // namespace test_cpu_architecture_kernels_cases
