// Attention sinks (Megatron's --softmax-type; backend/attention_options.hpp) in the CPU kernels:
// the forward (output and the log-sum-exp that includes the sink) against a naive softmax written
// out in double, the backward's dq, dk, dv and the sink logits' gradient against central
// differences, with grouped heads, a sliding window and dropout; off-by-one is a learnable sink of
// zeros; vanilla leaves the bits of attention as they were; what cannot be is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <strata/backend/cpu.hpp>
#include <strata/core.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_attention_sinks_cases {

namespace {

using strata::index_t;
using strata::SoftmaxType;

constexpr index_t kS = 6, kB = 2, kHeads = 4, kGroups = 2, kD = 5;

std::vector<double> random_values(index_t n, std::uint64_t key, double scale = 1.0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = scale * (2.0 * strata::rng::uniform(key, i) - 1.0);
  return v;
}

struct Inputs {
  std::vector<double> q = random_values(kS * kB * kHeads * kD, 1, 1.5), k = random_values(kS * kB * kGroups * kD, 2, 1.5),
                      v = random_values(kS * kB * kGroups * kD, 3), sinks = random_values(kHeads, 4, 2.0),
                      weights = random_values(kS * kB * kHeads * kD, 5);  // the loss: sum(out * weights)
};

// The softmax over [sink, keys j visible to i] written out: out [s, b, heads, d], lse [b, heads, s].
void naive_forward(const Inputs& x, SoftmaxType softmax, index_t window, std::vector<double>& out, std::vector<double>& lse) {
  const double scale = 1.0 / std::sqrt(double(kD));
  out.assign(x.q.size(), 0.0);
  lse.assign(static_cast<std::size_t>(kB * kHeads * kS), 0.0);
  for (index_t b = 0; b < kB; ++b)
    for (index_t h = 0; h < kHeads; ++h) {
      const index_t g = h / (kHeads / kGroups);
      for (index_t i = 0; i < kS; ++i) {
        std::vector<double> logits, weights;
        std::vector<index_t> keys;
        for (index_t j = 0; j <= i; ++j) {
          if (window >= 0 && i - j > window) continue;
          double dot = 0;
          for (index_t e = 0; e < kD; ++e)
            dot += x.q[((i * kB + b) * kHeads + h) * kD + e] * x.k[((j * kB + b) * kGroups + g) * kD + e];
          logits.push_back(scale * dot);
          keys.push_back(j);
        }
        double denominator = softmax == SoftmaxType::vanilla ? 0.0
                             : softmax == SoftmaxType::off_by_one ? 1.0
                                                                  : std::exp(x.sinks[h]);
        for (double z : logits) denominator += std::exp(z);
        for (std::size_t n = 0; n < keys.size(); ++n)
          for (index_t e = 0; e < kD; ++e)
            out[((i * kB + b) * kHeads + h) * kD + e] +=
                std::exp(logits[n]) / denominator * x.v[((keys[n] * kB + b) * kGroups + g) * kD + e];
        lse[(b * kHeads + h) * kS + i] = std::log(denominator);
      }
    }
}

strata::AttentionOptions options_for(const Inputs& x, SoftmaxType softmax, index_t window, double dropout = 0) {
  strata::AttentionOptions o;
  o.softmax = softmax;
  o.window = window;
  if (softmax == SoftmaxType::learnable) o.sinks = x.sinks.data();
  o.dropout = strata::AttentionDropout{dropout, 0x5eed, 0};
  return o;
}

double loss_of(const Inputs& x, SoftmaxType softmax, index_t window, double dropout) {
  std::vector<double> out(x.q.size()), lse(static_cast<std::size_t>(kB * kHeads * kS));
  strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD,
                                         1.0 / std::sqrt(double(kD)), out.data(), lse.data(),
                                         options_for(x, softmax, window, dropout));
  double loss = 0;
  for (std::size_t n = 0; n < out.size(); ++n) loss += out[n] * x.weights[n];
  return loss;
}

TEST(AttentionSinks, ForwardEqualsTheNaiveSoftmaxWithTheSinkInTheDenominator) {
  const Inputs x;
  for (const SoftmaxType softmax : {SoftmaxType::vanilla, SoftmaxType::off_by_one, SoftmaxType::learnable})
    for (const index_t window : {index_t{-1}, index_t{2}}) {
      std::vector<double> out(x.q.size()), lse(static_cast<std::size_t>(kB * kHeads * kS)), want_out, want_lse;
      strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD,
                                             1.0 / std::sqrt(double(kD)), out.data(), lse.data(),
                                             options_for(x, softmax, window));
      naive_forward(x, softmax, window, want_out, want_lse);
      const std::string what = "softmax " + std::to_string(int(softmax)) + " window " + std::to_string(window);
      for (std::size_t n = 0; n < out.size(); ++n) EXPECT_NEAR(out[n], want_out[n], 1e-14) << what << " out " << n;
      for (std::size_t n = 0; n < lse.size(); ++n) EXPECT_NEAR(lse[n], want_lse[n], 1e-14) << what << " lse " << n;
    }
}

// Central differences of sum(out * weights) for every input element and every sink logit, with the
// sink on its own, with a window and with dropout (a fixed counter-based mask).
TEST(AttentionSinks, BackwardGradientsIncludingTheSinkLogitsMatchCentralDifferences) {
  for (const SoftmaxType softmax : {SoftmaxType::off_by_one, SoftmaxType::learnable})
    for (const auto& [window, dropout] : {std::pair{index_t{-1}, 0.0}, std::pair{index_t{2}, 0.0}, std::pair{index_t{-1}, 0.3}}) {
      Inputs x;
      std::vector<double> out(x.q.size()), lse(static_cast<std::size_t>(kB * kHeads * kS));
      std::vector<double> dq(x.q.size()), dk(x.k.size()), dv(x.v.size()), dsinks(kHeads, 0.25);  // added to
      auto options = options_for(x, softmax, window, dropout);
      const double scale = 1.0 / std::sqrt(double(kD));
      strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD, scale,
                                             out.data(), lse.data(), options);
      options.sink_gradient = dsinks.data();
      strata::cpu::attention_backward<double>(x.weights.data(), x.q.data(), x.k.data(), x.v.data(), out.data(), lse.data(),
                                              kS, kB, kHeads, kGroups, kD, scale, dq.data(), dk.data(), dv.data(), options);
      const std::string what = "softmax " + std::to_string(int(softmax)) + " window " + std::to_string(window) +
                               " dropout " + std::to_string(dropout);
      auto check = [&](std::vector<double>& values, const std::vector<double>& grads, double offset, const char* name) {
        for (std::size_t n = 0; n < values.size(); ++n) {
          const double saved = values[n], eps = 1e-6;
          values[n] = saved + eps;
          const double plus = loss_of(x, softmax, window, dropout);
          values[n] = saved - eps;
          const double minus = loss_of(x, softmax, window, dropout);
          values[n] = saved;
          EXPECT_NEAR(grads[n] - offset, (plus - minus) / (2 * eps), 1e-8) << what << " " << name << "[" << n << "]";
        }
      };
      check(x.q, dq, 0, "dq");
      check(x.k, dk, 0, "dk");
      check(x.v, dv, 0, "dv");
      if (softmax == SoftmaxType::learnable) {
        check(x.sinks, dsinks, 0.25, "dsink");  // added to what was there
        for (double g : dsinks) EXPECT_NE(g, 0.25) << "every sink logit has a gradient";
      } else {
        for (double g : dsinks) EXPECT_EQ(g, 0.25) << "off-by-one has no parameter";
      }
    }
}

// off-by-one is a learnable sink whose logits are 0, bit for bit; vanilla is attention as before.
TEST(AttentionSinks, OffByOneIsAZeroSinkAndVanillaIsPlainAttention) {
  Inputs x;
  std::vector<double> a(x.q.size()), b(x.q.size()), lse_a(kB * kHeads * kS), lse_b(kB * kHeads * kS);
  const double scale = 1.0 / std::sqrt(double(kD));
  strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD, scale, a.data(),
                                         lse_a.data(), options_for(x, SoftmaxType::off_by_one, -1));
  x.sinks.assign(kHeads, 0.0);
  strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD, scale, b.data(),
                                         lse_b.data(), options_for(x, SoftmaxType::learnable, -1));
  EXPECT_EQ(a, b);
  EXPECT_EQ(lse_a, lse_b);
  strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD, scale, a.data(),
                                         lse_a.data(), options_for(x, SoftmaxType::vanilla, -1));
  strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD, scale, b.data(),
                                         lse_b.data(), strata::AttentionOptions{});
  EXPECT_EQ(a, b);
  EXPECT_EQ(lse_a, lse_b);
}

std::string refusal(const strata::AttentionOptions& options) {
  const Inputs x;
  std::vector<double> out(x.q.size()), lse(kB * kHeads * kS);
  try {
    strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), kS, kB, kHeads, kGroups, kD, 1.0, out.data(),
                                           lse.data(), options);
  } catch (const strata::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(AttentionSinks, MissingLogitsAreRefused) {
  strata::AttentionOptions missing;
  missing.softmax = SoftmaxType::learnable;
  EXPECT_NE(refusal(missing).find("sink logits"), std::string::npos) << refusal(missing);
}

}  // namespace
}  // namespace test_attention_sinks_cases
