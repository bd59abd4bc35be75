// Unit tests for backend/cpu/: GEMM, LayerNorm/RMSNorm, GELU/SwiGLU, causal attention and RoPE,
// each against a plain double-precision reference or central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include <strata/backend/cpu.hpp>
#include <strata/core.hpp>

namespace {

using strata::bf16;
using strata::fp16;
using strata::index_t;

template <class T>
std::vector<T> random_values(index_t n, std::uint64_t key, double scale = 1.0) {
  std::vector<T> out(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<T>(scale * strata::rng::normal(key, static_cast<std::uint64_t>(i)));
  return out;
}

template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<strata::accumulate_t<T>>(v[i]));
  return out;
}

// Central finite difference of loss() with respect to x[i].
double finite_difference(std::vector<double>& x, std::size_t i, const std::function<double()>& loss, double h = 1e-5) {
  const double saved = x[i];
  x[i] = saved + h;
  const double up = loss();
  x[i] = saved - h;
  const double down = loss();
  x[i] = saved;
  return (up - down) / (2 * h);
}

double weighted_sum(const std::vector<double>& w, const std::vector<double>& y) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
  return s;
}

// Every analytic gradient entry within `tolerance` (relative to max(1, |fd|)) of finite differences.
void expect_gradient(const std::vector<double>& analytic, std::vector<double>& x, const std::function<double()>& loss,
                     double tolerance, const std::string& what) {
  ASSERT_EQ(analytic.size(), x.size()) << what;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double fd = finite_difference(x, i, loss);
    EXPECT_NEAR(analytic[i], fd, tolerance * std::max(1.0, std::fabs(fd))) << what << "[" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM

struct GemmSize {
  index_t m, n, k;
};
constexpr GemmSize kGemmSizes[] = {{7, 5, 3}, {1, 1, 1}, {33, 17, 9}, {4, 6, 0}, {16, 1, 31}, {1, 12, 8}};

// C = (accumulate ? C0 : 0) + alpha * op(A) op(B), in double. `scale` receives |alpha| sum|a b| + |C0|,
// the magnitude that rounding errors are relative to.
void gemm_reference(bool ta, bool tb, index_t m, index_t n, index_t k, const std::vector<double>& a,
                    const std::vector<double>& b, const std::vector<double>& c0, bool accumulate, double alpha,
                    std::vector<double>& c, std::vector<double>& scale) {
  c.assign(static_cast<std::size_t>(m * n), 0.0);
  scale.assign(static_cast<std::size_t>(m * n), 0.0);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double sum = 0, mag = 0;
      for (index_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
        mag += std::fabs(av * bv);
      }
      const std::size_t o = static_cast<std::size_t>(i * n + j);
      c[o] = alpha * sum + (accumulate ? c0[o] : 0.0);
      scale[o] = std::fabs(alpha) * mag + (accumulate ? std::fabs(c0[o]) : 0.0);
    }
}

// Runs every transpose combination, accumulate on/off and alpha 1 / -0.75 on every size, and checks
// |got - want| <= relative * scale + output_rounding * |want|.
template <class T, class C>
void check_gemm(double relative, double output_rounding) {
  std::uint64_t key = 100;
  for (const GemmSize& sz : kGemmSizes) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool accumulate : {false, true})
          for (double alpha : {1.0, -0.75}) {
            const auto a = random_values<T>(sz.m * sz.k, ++key);
            const auto b = random_values<T>(sz.k * sz.n, ++key);
            auto c = random_values<C>(sz.m * sz.n, ++key);
            // Overwriting must not read C: start from NaN.
            if (!accumulate) std::fill(c.begin(), c.end(), static_cast<C>(std::numeric_limits<float>::quiet_NaN()));
            std::vector<double> want, scale;
            gemm_reference(ta, tb, sz.m, sz.n, sz.k, widen(a), widen(b), widen(c), accumulate, alpha, want, scale);
            strata::cpu::gemm<T, C>(ta, tb, sz.m, sz.n, sz.k, a.data(), b.data(), c.data(), accumulate,
                                    static_cast<strata::accumulate_t<T>>(alpha));
            const auto got = widen(c);
            for (std::size_t i = 0; i < got.size(); ++i)
              ASSERT_NEAR(got[i], want[i], relative * scale[i] + output_rounding * std::fabs(want[i]))
                  << "m=" << sz.m << " n=" << sz.n << " k=" << sz.k << " ta=" << ta << " tb=" << tb
                  << " accumulate=" << accumulate << " alpha=" << alpha << " element " << i;
          }
  }
}

TEST(Gemm, DoubleMatchesNaiveLoopForAllTransposes) { check_gemm<double, double>(1e-12, 0.0); }

TEST(Gemm, FloatMatchesNaiveLoopForAllTransposes) { check_gemm<float, float>(1e-5, 0.0); }

TEST(Gemm, Bf16WithFloatOutputMatchesRoundedInputs) {
  // Products of bf16 values are exact in float; only the float summation rounds.
  check_gemm<bf16, float>(1e-6, 0.0);
}

TEST(Gemm, Bf16RoundsTheFloatResultOnce) {
  // Against the rounded inputs; the output itself is one bf16 rounding (half an ulp, at most 2^-8 relative) away.
  check_gemm<bf16, bf16>(1e-6, 0x1p-8);
}

TEST(Gemm, Fp16RoundsTheFloatResultOnce) { check_gemm<fp16, fp16>(1e-6, 0x1p-11); }

TEST(Gemm, EmptyReductionZeroesOrKeepsTheOutput) {
  std::vector<float> c(6, 3.0f);
  strata::cpu::gemm<float>(false, false, 2, 3, 0, nullptr, nullptr, c.data(), true);
  for (float v : c) EXPECT_EQ(v, 3.0f);
  strata::cpu::gemm<float>(true, true, 2, 3, 0, nullptr, nullptr, c.data(), false, 2.0f);
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

TEST(Gemm, Bf16OutputIsTheRoundedFloatResult) {
  // Exactly representable data: the float result is exact, so the output is that value rounded once.
  const std::vector<bf16> a = {bf16(1.0f), bf16(3.0f), bf16(-2.0f), bf16(0.5f)};   // [2,2]
  const std::vector<bf16> b = {bf16(256.0f), bf16(1.0f), bf16(1.0f), bf16(0.25f)};  // [2,2]
  std::vector<bf16> c(4);
  strata::cpu::gemm<bf16>(false, false, 2, 2, 2, a.data(), b.data(), c.data(), false);
  EXPECT_EQ(static_cast<float>(c[0]), 260.0f);   // 259: a tie between 258 and 260, to even
  EXPECT_EQ(static_cast<float>(c[1]), 1.75f);    // exact
  EXPECT_EQ(static_cast<float>(c[2]), -512.0f);  // -511.5: nearest of -510 and -512
  EXPECT_EQ(static_cast<float>(c[3]), -1.875f);  // exact
  std::vector<float> c32(4);
  strata::cpu::gemm<bf16, float>(false, false, 2, 2, 2, a.data(), b.data(), c32.data(), false);
  EXPECT_EQ(c32, (std::vector<float>{259.0f, 1.75f, -511.5f, -1.875f}));
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm

constexpr index_t kRows = 3, kHidden = 7;

std::vector<double> layernorm_reference(const std::vector<double>& x, const std::vector<double>& gamma,
                                        const std::vector<double>& beta, index_t rows, index_t h, double eps) {
  std::vector<double> y(x.size());
  for (index_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (index_t i = 0; i < h; ++i) mu += x[r * h + i];
    mu /= static_cast<double>(h);
    for (index_t i = 0; i < h; ++i) var += (x[r * h + i] - mu) * (x[r * h + i] - mu);
    var /= static_cast<double>(h);
    for (index_t i = 0; i < h; ++i) y[r * h + i] = (x[r * h + i] - mu) / std::sqrt(var + eps) * gamma[i] + beta[i];
  }
  return y;
}

std::vector<double> rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& gamma, index_t rows,
                                      index_t h, double eps) {
  std::vector<double> y(x.size());
  for (index_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (index_t i = 0; i < h; ++i) ms += x[r * h + i] * x[r * h + i];
    ms /= static_cast<double>(h);
    for (index_t i = 0; i < h; ++i) y[r * h + i] = x[r * h + i] / std::sqrt(ms + eps) * gamma[i];
  }
  return y;
}

template <class T>
void check_layernorm_forward(double tolerance) {
  const double eps = 1e-5;
  auto x = random_values<T>(kRows * kHidden, 1, 2.0);
  x[3] = static_cast<T>(40.0f);  // an offset the mean must remove
  const auto gamma = random_values<T>(kHidden, 2), beta = random_values<T>(kHidden, 3);
  std::vector<T> y(x.size());
  std::vector<strata::accumulate_t<T>> mean(kRows), rstd(kRows);
  strata::cpu::layernorm_forward<T>(x.data(), gamma.data(), beta.data(), kRows, kHidden,
                                    static_cast<strata::accumulate_t<T>>(eps), y.data(), mean.data(), rstd.data());
  const auto xd = widen(x);
  const auto want = layernorm_reference(xd, widen(gamma), widen(beta), kRows, kHidden, eps);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(static_cast<double>(y[i]), want[i], tolerance) << i;
  for (index_t r = 0; r < kRows; ++r) {
    double mu = 0, var = 0;
    for (index_t i = 0; i < kHidden; ++i) mu += xd[r * kHidden + i] / kHidden;
    for (index_t i = 0; i < kHidden; ++i) var += (xd[r * kHidden + i] - mu) * (xd[r * kHidden + i] - mu) / kHidden;
    EXPECT_NEAR(mean[r], mu, tolerance * std::fabs(mu) + tolerance);
    EXPECT_NEAR(rstd[r], 1 / std::sqrt(var + eps), tolerance / std::sqrt(var + eps));
  }
}

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  check_layernorm_forward<double>(1e-12);
  check_layernorm_forward<float>(1e-5);
}

TEST(LayerNorm, ForwardWithoutBetaIsZeroBeta) {
  const auto x = random_values<double>(kRows * kHidden, 4), gamma = random_values<double>(kHidden, 5);
  const std::vector<double> zero(kHidden, 0.0);
  std::vector<double> y1(x.size()), y2(x.size()), mean(kRows), rstd(kRows);
  strata::cpu::layernorm_forward<double>(x.data(), gamma.data(), nullptr, kRows, kHidden, 1e-5, y1.data(), mean.data(),
                                         rstd.data());
  strata::cpu::layernorm_forward<double>(x.data(), gamma.data(), zero.data(), kRows, kHidden, 1e-5, y2.data(),
                                         mean.data(), rstd.data());
  EXPECT_EQ(y1, y2);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const double eps = 1e-5;
  auto x = random_values<double>(kRows * kHidden, 6);
  auto gamma = random_values<double>(kHidden, 7), beta = random_values<double>(kHidden, 8);
  const auto w = random_values<double>(kRows * kHidden, 9);
  auto loss = [&] { return weighted_sum(w, layernorm_reference(x, gamma, beta, kRows, kHidden, eps)); };

  std::vector<double> y(x.size()), mean(kRows), rstd(kRows), dx(x.size(), 99.0);
  strata::cpu::layernorm_forward<double>(x.data(), gamma.data(), beta.data(), kRows, kHidden, eps, y.data(),
                                         mean.data(), rstd.data());
  // Parameter gradients accumulate: start from a known value and subtract it.
  std::vector<double> dgamma(kHidden, 0.5), dbeta(kHidden, -0.25);
  strata::cpu::layernorm_backward<double>(w.data(), x.data(), gamma.data(), mean.data(), rstd.data(), kRows, kHidden,
                                          dx.data(), dgamma.data(), dbeta.data());
  for (auto& g : dgamma) g -= 0.5;
  for (auto& g : dbeta) g += 0.25;
  expect_gradient(dx, x, loss, 1e-7, "dx");
  expect_gradient(dgamma, gamma, loss, 1e-7, "dgamma");
  expect_gradient(dbeta, beta, loss, 1e-7, "dbeta");
}

TEST(RmsNorm, ForwardMatchesDoubleReference) {
  const double eps = 1e-6;
  const auto x = random_values<double>(kRows * kHidden, 10, 3.0), gamma = random_values<double>(kHidden, 11);
  std::vector<double> y(x.size()), rstd(kRows);
  strata::cpu::rmsnorm_forward<double>(x.data(), gamma.data(), kRows, kHidden, eps, y.data(), rstd.data());
  const auto want = rmsnorm_reference(x, gamma, kRows, kHidden, eps);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-12) << i;

  const auto xf = random_values<float>(kRows * kHidden, 10, 3.0), gf = random_values<float>(kHidden, 11);
  std::vector<float> yf(xf.size()), rf(kRows);
  strata::cpu::rmsnorm_forward<float>(xf.data(), gf.data(), kRows, kHidden, 1e-6f, yf.data(), rf.data());
  const auto wantf = rmsnorm_reference(widen(xf), widen(gf), kRows, kHidden, 1e-6);
  for (std::size_t i = 0; i < yf.size(); ++i) EXPECT_NEAR(yf[i], wantf[i], 1e-5) << i;
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const double eps = 1e-6;
  auto x = random_values<double>(kRows * kHidden, 12);
  auto gamma = random_values<double>(kHidden, 13);
  const auto w = random_values<double>(kRows * kHidden, 14);
  auto loss = [&] { return weighted_sum(w, rmsnorm_reference(x, gamma, kRows, kHidden, eps)); };

  std::vector<double> y(x.size()), rstd(kRows), dx(x.size(), 99.0), dgamma(kHidden, 1.0);
  strata::cpu::rmsnorm_forward<double>(x.data(), gamma.data(), kRows, kHidden, eps, y.data(), rstd.data());
  strata::cpu::rmsnorm_backward<double>(w.data(), x.data(), gamma.data(), rstd.data(), kRows, kHidden, dx.data(),
                                        dgamma.data());
  for (auto& g : dgamma) g -= 1.0;
  expect_gradient(dx, x, loss, 1e-7, "dx");
  expect_gradient(dgamma, gamma, loss, 1e-7, "dgamma");
}

// ---------------------------------------------------------------------------------------------
// GELU and SwiGLU

double gelu_reference(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, ForwardKnownValues) {
  const std::vector<double> x = {0.0, 1.0, -1.0, 2.0, 10.0, -10.0};
  std::vector<double> y(x.size());
  strata::cpu::gelu_forward<double>(x.data(), static_cast<index_t>(x.size()), y.data());
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 0.8411919906, 1e-10);
  EXPECT_NEAR(y[2], -0.1588080094, 1e-10);
  EXPECT_NEAR(y[3], 1.9545976940, 1e-9);
  EXPECT_NEAR(y[4], 10.0, 1e-12);
  EXPECT_NEAR(y[5], 0.0, 1e-12);
  EXPECT_NEAR(y[1] - y[2], 1.0, 1e-15);  // gelu(x) - gelu(-x) = x for the tanh form
}

TEST(Gelu, ForwardMatchesFormula) {
  const auto x = random_values<double>(64, 20, 3.0);
  std::vector<double> y(x.size());
  strata::cpu::gelu_forward<double>(x.data(), 64, y.data());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], gelu_reference(x[i]), 1e-14) << x[i];
  const auto xf = random_values<float>(64, 20, 3.0);
  std::vector<float> yf(xf.size());
  strata::cpu::gelu_forward<float>(xf.data(), 64, yf.data());
  for (std::size_t i = 0; i < xf.size(); ++i) EXPECT_NEAR(yf[i], gelu_reference(xf[i]), 1e-6) << xf[i];
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  auto x = random_values<double>(64, 21, 2.0);
  x[0] = 0.0;
  const auto w = random_values<double>(64, 22);
  std::vector<double> dx(x.size());
  strata::cpu::gelu_backward<double>(w.data(), x.data(), 64, dx.data());
  auto loss = [&] {
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = gelu_reference(x[i]);
    return weighted_sum(w, y);
  };
  expect_gradient(dx, x, loss, 1e-8, "dx");
  const double one = 1.0, zero = 0.0;
  double d0 = 0;
  strata::cpu::gelu_backward<double>(&one, &zero, 1, &d0);
  EXPECT_DOUBLE_EQ(d0, 0.5);  // gelu'(0) = 1/2
}

std::vector<double> swiglu_reference(const std::vector<double>& gate_up, index_t rows, index_t f) {
  std::vector<double> y(static_cast<std::size_t>(rows * f));
  for (index_t r = 0; r < rows; ++r)
    for (index_t i = 0; i < f; ++i) {
      const double g = gate_up[r * 2 * f + i], u = gate_up[r * 2 * f + f + i];
      y[r * f + i] = g / (1 + std::exp(-g)) * u;
    }
  return y;
}

TEST(SwiGlu, ForwardKnownValuesAndFormula) {
  const index_t rows = 3, f = 5;
  auto gate_up = random_values<double>(rows * 2 * f, 23, 2.0);
  gate_up[0] = 0.0;   // silu(0) = 0
  gate_up[1] = 1.0;   // silu(1) = sigmoid(1)
  gate_up[f + 1] = 1.0;
  std::vector<double> y(static_cast<std::size_t>(rows * f));
  strata::cpu::swiglu_forward<double>(gate_up.data(), rows, f, y.data());
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 0.7310585786300049, 1e-14);
  const auto want = swiglu_reference(gate_up, rows, f);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-14) << i;
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  const index_t rows = 3, f = 5;
  auto gate_up = random_values<double>(rows * 2 * f, 24, 2.0);
  const auto w = random_values<double>(rows * f, 25);
  std::vector<double> dgate_up(gate_up.size(), 99.0);
  strata::cpu::swiglu_backward<double>(w.data(), gate_up.data(), rows, f, dgate_up.data());
  expect_gradient(dgate_up, gate_up, [&] { return weighted_sum(w, swiglu_reference(gate_up, rows, f)); }, 1e-8,
                  "dgate_up");
}

// ---------------------------------------------------------------------------------------------
// Causal attention

struct AttentionSize {
  index_t batch, nq, nkv, s, d;
  index_t q_size() const { return batch * nq * s * d; }
  index_t kv_size() const { return batch * nkv * s * d; }
};

// out[b,h,i,:] = sum_{j<=i} softmax_j(scale q_i . k_j) v_j, key/value head h / (nq / nkv); in double.
std::vector<double> attention_reference(const AttentionSize& z, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v, double scale,
                                        std::vector<double>* probs = nullptr) {
  std::vector<double> out(static_cast<std::size_t>(z.q_size()), 0.0);
  if (probs) probs->assign(static_cast<std::size_t>(z.batch * z.nq * z.s * z.s), 0.0);
  const index_t group = z.nq / z.nkv;
  for (index_t b = 0; b < z.batch; ++b)
    for (index_t h = 0; h < z.nq; ++h) {
      const index_t qh = b * z.nq + h, kh = b * z.nkv + h / group;
      for (index_t i = 0; i < z.s; ++i) {
        std::vector<double> score(static_cast<std::size_t>(i + 1));
        double mx = -std::numeric_limits<double>::infinity();
        for (index_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (index_t c = 0; c < z.d; ++c) dot += q[(qh * z.s + i) * z.d + c] * k[(kh * z.s + j) * z.d + c];
          score[j] = scale * dot;
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (auto& e : score) sum += (e = std::exp(e - mx));
        for (index_t j = 0; j <= i; ++j) {
          const double p = score[j] / sum;
          if (probs) (*probs)[(qh * z.s + i) * z.s + j] = p;
          for (index_t c = 0; c < z.d; ++c) out[(qh * z.s + i) * z.d + c] += p * v[(kh * z.s + j) * z.d + c];
        }
      }
    }
  return out;
}

struct AttentionRun {
  std::vector<double> out, probs;
};

AttentionRun run_attention(const AttentionSize& z, const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v, double scale) {
  AttentionRun r;
  r.out.assign(static_cast<std::size_t>(z.q_size()), 99.0);
  r.probs.assign(static_cast<std::size_t>(z.batch * z.nq * z.s * z.s), 99.0);
  strata::cpu::causal_attention_forward<double>(q.data(), k.data(), v.data(), z.batch, z.nq, z.nkv, z.s, z.d, scale,
                                                r.out.data(), r.probs.data());
  return r;
}

void check_attention_forward(const AttentionSize& z) {
  const double scale = 1 / std::sqrt(static_cast<double>(z.d));
  const auto q = random_values<double>(z.q_size(), 30), k = random_values<double>(z.kv_size(), 31),
             v = random_values<double>(z.kv_size(), 32);
  const AttentionRun got = run_attention(z, q, k, v, scale);
  std::vector<double> want_probs;
  const auto want = attention_reference(z, q, k, v, scale, &want_probs);
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got.out[i], want[i], 1e-12) << "out " << i;
  for (std::size_t i = 0; i < want_probs.size(); ++i) ASSERT_NEAR(got.probs[i], want_probs[i], 1e-12) << "probs " << i;
}

TEST(CausalAttention, MultiHeadForwardMatchesNaiveReference) { check_attention_forward({2, 3, 3, 6, 4}); }

TEST(CausalAttention, GroupedQueryForwardMatchesNaiveReference) { check_attention_forward({2, 4, 2, 5, 3}); }

TEST(CausalAttention, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueHeads) {
  const AttentionSize gqa{2, 4, 2, 5, 3}, mha{2, 4, 4, 5, 3};
  const double scale = 0.7;
  const auto q = random_values<double>(gqa.q_size(), 33), k = random_values<double>(gqa.kv_size(), 34),
             v = random_values<double>(gqa.kv_size(), 35);
  std::vector<double> k_rep, v_rep;  // [batch, nq, s, d]: head h gets key/value head h / 2
  const index_t block = gqa.s * gqa.d;
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 4; ++h) {
      const auto from = static_cast<std::ptrdiff_t>((b * 2 + h / 2) * block);
      k_rep.insert(k_rep.end(), k.begin() + from, k.begin() + from + block);
      v_rep.insert(v_rep.end(), v.begin() + from, v.begin() + from + block);
    }
  const auto a = run_attention(gqa, q, k, v, scale), b = run_attention(mha, q, k_rep, v_rep, scale);
  for (std::size_t i = 0; i < a.out.size(); ++i) EXPECT_NEAR(a.out[i], b.out[i], 1e-14) << i;
}

TEST(CausalAttention, ProbabilityRowsSumToOneAndAreZeroAboveDiagonal) {
  const AttentionSize z{2, 4, 2, 7, 3};
  const auto q = random_values<double>(z.q_size(), 36, 3.0), k = random_values<double>(z.kv_size(), 37, 3.0),
             v = random_values<double>(z.kv_size(), 38);
  const AttentionRun r = run_attention(z, q, k, v, 1.0);
  for (index_t row = 0; row < z.batch * z.nq * z.s; ++row) {
    const index_t i = row % z.s;
    double sum = 0;
    for (index_t j = 0; j < z.s; ++j) {
      const double p = r.probs[row * z.s + j];
      if (j > i) {
        ASSERT_EQ(p, 0.0) << "row " << row << " column " << j;
      } else {
        ASSERT_GE(p, 0.0);
      }
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-14) << "row " << row;
    if (i == 0) {
      EXPECT_EQ(r.probs[row * z.s], 1.0);  // the first query sees only itself
    }
  }
}

TEST(CausalAttention, BackwardMatchesFiniteDifferences) {
  for (const AttentionSize& z : {AttentionSize{1, 2, 2, 4, 3}, AttentionSize{2, 4, 2, 5, 3}}) {
    const double scale = 1 / std::sqrt(static_cast<double>(z.d));
    auto q = random_values<double>(z.q_size(), 40), k = random_values<double>(z.kv_size(), 41),
         v = random_values<double>(z.kv_size(), 42);
    const auto w = random_values<double>(z.q_size(), 43);
    const AttentionRun fwd = run_attention(z, q, k, v, scale);
    std::vector<double> dq(q.size(), 99.0), dk(k.size(), 99.0), dv(v.size(), 99.0);  // dk, dv must be reset
    strata::cpu::causal_attention_backward<double>(w.data(), q.data(), k.data(), v.data(), fwd.probs.data(), z.batch,
                                                   z.nq, z.nkv, z.s, z.d, scale, dq.data(), dk.data(), dv.data());
    auto loss = [&] { return weighted_sum(w, attention_reference(z, q, k, v, scale)); };
    const std::string what = "nq=" + std::to_string(z.nq) + " nkv=" + std::to_string(z.nkv) + " ";
    expect_gradient(dq, q, loss, 1e-7, what + "dq");
    expect_gradient(dk, k, loss, 1e-7, what + "dk");
    expect_gradient(dv, v, loss, 1e-7, what + "dv");
  }
}

// ---------------------------------------------------------------------------------------------
// Rotary position embedding

constexpr index_t kRopeRows = 2, kRopeSeq = 6, kRopeDim = 8;
constexpr double kRopeBase = 10000.0;

TEST(Rope, InverseUndoesForward) {
  const auto x = random_values<double>(kRopeRows * kRopeSeq * kRopeDim, 50);
  auto y = x;
  strata::cpu::rope_apply<double>(y.data(), kRopeRows, kRopeSeq, kRopeDim, kRopeBase, 3, false);
  EXPECT_NE(y, x);
  strata::cpu::rope_apply<double>(y.data(), kRopeRows, kRopeSeq, kRopeDim, kRopeBase, 3, true);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14) << i;
}

TEST(Rope, PreservesEachPairNorm) {
  const auto x = random_values<double>(kRopeRows * kRopeSeq * kRopeDim, 51);
  auto y = x;
  strata::cpu::rope_apply<double>(y.data(), kRopeRows, kRopeSeq, kRopeDim, kRopeBase, 100, false);
  const index_t half = kRopeDim / 2;
  for (index_t row = 0; row < kRopeRows * kRopeSeq; ++row)
    for (index_t i = 0; i < half; ++i) {
      const double* a = x.data() + row * kRopeDim;
      const double* b = y.data() + row * kRopeDim;
      EXPECT_NEAR(std::hypot(b[i], b[i + half]), std::hypot(a[i], a[i + half]), 1e-14) << row << ", " << i;
    }
}

TEST(Rope, PositionZeroIsIdentity) {
  const auto x = random_values<double>(kRopeRows * kRopeSeq * kRopeDim, 52);
  auto y = x;
  strata::cpu::rope_apply<double>(y.data(), kRopeRows, kRopeSeq, kRopeDim, kRopeBase, 0, false);
  for (index_t r = 0; r < kRopeRows; ++r)
    for (index_t c = 0; c < kRopeDim; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * kRopeSeq * kRopeDim + c);  // row t = 0 of each sequence
      EXPECT_EQ(y[i], x[i]);
    }
}

TEST(Rope, MatchesDirectRotationFormula) {
  const auto x = random_values<double>(kRopeRows * kRopeSeq * kRopeDim, 53);
  auto y = x;
  const index_t offset = 5;
  strata::cpu::rope_apply<double>(y.data(), kRopeRows, kRopeSeq, kRopeDim, kRopeBase, offset, false);
  const index_t half = kRopeDim / 2, r = 1, t = 3, i = 2;
  const std::size_t row = static_cast<std::size_t>((r * kRopeSeq + t) * kRopeDim);
  const double angle = static_cast<double>(offset + t) / std::pow(kRopeBase, 2.0 * i / kRopeDim);
  const double a = x[row + i], b = x[row + i + half];
  EXPECT_NEAR(y[row + i], a * std::cos(angle) - b * std::sin(angle), 1e-14);
  EXPECT_NEAR(y[row + i + half], b * std::cos(angle) + a * std::sin(angle), 1e-14);
}

TEST(Rope, OffsetContinuesTheSequence) {
  // Rows [2, 6) of a sequence rotated from position 0 equal those rows rotated alone from offset 2.
  const auto x = random_values<double>(kRopeSeq * kRopeDim, 54);
  auto whole = x;
  strata::cpu::rope_apply<double>(whole.data(), 1, kRopeSeq, kRopeDim, kRopeBase, 0, false);
  std::vector<double> tail(x.begin() + 2 * kRopeDim, x.end());
  strata::cpu::rope_apply<double>(tail.data(), 1, kRopeSeq - 2, kRopeDim, kRopeBase, 2, false);
  for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_NEAR(tail[i], whole[2 * kRopeDim + i], 1e-14) << i;
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const auto q = random_values<double>(kRopeDim, 55), k = random_values<double>(kRopeDim, 56);
  auto score = [&](index_t m, index_t n) {
    auto qr = q, kr = k;
    strata::cpu::rope_apply<double>(qr.data(), 1, 1, kRopeDim, kRopeBase, m, false);
    strata::cpu::rope_apply<double>(kr.data(), 1, 1, kRopeDim, kRopeBase, n, false);
    double dot = 0;
    for (index_t c = 0; c < kRopeDim; ++c) dot += qr[c] * kr[c];
    return dot;
  };
  EXPECT_NEAR(score(7, 3), score(4, 0), 1e-12);
  EXPECT_NEAR(score(20, 11), score(9, 0), 1e-12);
}

}  // namespace
