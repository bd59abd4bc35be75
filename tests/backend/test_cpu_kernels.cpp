// Unit tests for backend/cpu/: GEMM, LayerNorm/RMSNorm, GELU/SwiGLU, causal attention and RoPE,
// each against a plain double-precision reference or central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
  // Parameter gradients are written (=): start from other values.
  std::vector<double> dgamma(kHidden, 0.5), dbeta(kHidden, -0.25);  // written, whatever they held
  strata::cpu::layernorm_backward<double>(w.data(), x.data(), gamma.data(), mean.data(), rstd.data(), kRows, kHidden,
                                          dx.data(), dgamma.data(), dbeta.data());
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

  std::vector<double> y(x.size()), rstd(kRows), dx(x.size(), 99.0), dgamma(kHidden, 1.0);  // dgamma is written
  strata::cpu::rmsnorm_forward<double>(x.data(), gamma.data(), kRows, kHidden, eps, y.data(), rstd.data());
  strata::cpu::rmsnorm_backward<double>(w.data(), x.data(), gamma.data(), rstd.data(), kRows, kHidden, dx.data(),
                                        dgamma.data());
  expect_gradient(dx, x, loss, 1e-7, "dx");
  expect_gradient(dgamma, gamma, loss, 1e-7, "dgamma");
}

// The residual add fused into the norms: the same bits as adding first (forward) or after
// (backward), in place too (sum = x, dx = dresidual). float: one rounding either way, so equal.
template <class T, bool layer>
void check_norm_fuses_residual() {
  using A = strata::accumulate_t<T>;
  const A eps = A(1e-5);
  const auto x = random_values<T>(kRows * kHidden, 31), residual = random_values<T>(kRows * kHidden, 32);
  const auto gamma = random_values<T>(kHidden, 33), beta = random_values<T>(kHidden, 34);
  const auto dy = random_values<T>(kRows * kHidden, 35), dres = random_values<T>(kRows * kHidden, 36);
  const std::size_t n = x.size();
  auto forward = [&](const T* in, const T* res, T* sum, T* y, A* mean, A* rstd) {
    if constexpr (layer) strata::cpu::layernorm_forward<T>(in, gamma.data(), beta.data(), kRows, kHidden, eps, y, mean, rstd, res, sum);
    else strata::cpu::rmsnorm_forward<T>(in, gamma.data(), kRows, kHidden, eps, y, rstd, res, sum);
  };
  auto backward = [&](const T* in, const A* mean, const A* rstd, T* dx, A* dg, A* db, const T* dr) {
    if constexpr (layer) strata::cpu::layernorm_backward<T>(dy.data(), in, gamma.data(), mean, rstd, kRows, kHidden, dx, dg, db, dr);
    else strata::cpu::rmsnorm_backward<T>(dy.data(), in, gamma.data(), rstd, kRows, kHidden, dx, dg, dr);
  };
  // Unfused: sum = x + residual, norm(sum); dx = norm backward, then + dres.
  std::vector<T> sum(n), y(n), dx(n);
  std::vector<A> mean(kRows), rstd(kRows), dg(kHidden), db(kHidden);
  for (std::size_t i = 0; i < n; ++i) sum[i] = T(A(x[i]) + A(residual[i]));
  forward(sum.data(), nullptr, nullptr, y.data(), mean.data(), rstd.data());
  backward(sum.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(), nullptr);
  for (std::size_t i = 0; i < n; ++i) dx[i] = T(A(dx[i]) + A(dres[i]));
  // Fused, in place: the sum overwrites x, dx overwrites dres.
  std::vector<T> fx = x, fy(n), fdx = dres;
  std::vector<A> fmean(kRows), frstd(kRows), fdg(kHidden), fdb(kHidden);
  forward(fx.data(), residual.data(), fx.data(), fy.data(), fmean.data(), frstd.data());
  backward(fx.data(), fmean.data(), frstd.data(), fdx.data(), fdg.data(), fdb.data(), fdx.data());
  EXPECT_EQ(fx, sum);
  EXPECT_EQ(fy, y);
  EXPECT_EQ(frstd, rstd);
  EXPECT_EQ(fdx, dx);
  EXPECT_EQ(fdg, dg);
  if constexpr (layer) {
    EXPECT_EQ(fmean, mean);
    EXPECT_EQ(fdb, db);
  }
}

TEST(LayerNorm, FusedResidualAddEqualsAddingApart) {
  check_norm_fuses_residual<double, true>();
  check_norm_fuses_residual<float, true>();
}

TEST(RmsNorm, FusedResidualAddEqualsAddingApart) {
  check_norm_fuses_residual<double, false>();
  check_norm_fuses_residual<float, false>();
}

// accumulate = true adds the parameter-gradient sums to what the outputs hold, with the bits of
// writing them into scratch and adding after (what the layers did before); dx is unchanged.
template <class T, bool layer>
void check_norm_accumulates() {
  using A = strata::accumulate_t<T>;
  const auto x = random_values<T>(kRows * kHidden, 41), gamma = random_values<T>(kHidden, 42);
  const auto dy = random_values<T>(kRows * kHidden, 43);
  std::vector<A> mean(kRows, A(0.1)), rstd(kRows, A(1.3));
  const auto held_g = random_values<A>(kHidden, 44), held_b = random_values<A>(kHidden, 45);
  auto backward = [&](T* dx, A* dg, A* db, bool accumulate) {
    if constexpr (layer)
      strata::cpu::layernorm_backward<T>(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), kRows, kHidden, dx,
                                         dg, db, nullptr, accumulate);
    else
      strata::cpu::rmsnorm_backward<T>(dy.data(), x.data(), gamma.data(), rstd.data(), kRows, kHidden, dx, dg, nullptr,
                                       accumulate);
  };
  std::vector<T> dx(x.size()), adx(x.size());
  std::vector<A> dg(kHidden), db(kHidden);
  backward(dx.data(), dg.data(), db.data(), false);
  std::vector<A> want_g = held_g, want_b = held_b;
  for (std::size_t i = 0; i < want_g.size(); ++i) {
    want_g[i] += dg[i];
    want_b[i] += db[i];
  }
  std::vector<A> adg = held_g, adb = held_b;
  backward(adx.data(), adg.data(), layer ? adb.data() : nullptr, true);
  EXPECT_EQ(adx, dx);
  EXPECT_EQ(adg, want_g);
  if constexpr (layer) {
    EXPECT_EQ(adb, want_b);
  }
}

TEST(LayerNorm, AccumulateAddsTheSumsWithTheBitsOfAddingAfter) {
  check_norm_accumulates<double, true>();
  check_norm_accumulates<float, true>();
  check_norm_accumulates<strata::bf16, true>();
}

TEST(RmsNorm, AccumulateAddsTheSumsWithTheBitsOfAddingAfter) {
  check_norm_accumulates<double, false>();
  check_norm_accumulates<float, false>();
  check_norm_accumulates<strata::bf16, false>();
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
// Causal attention (saves the log-sum-exp; q, out [s, b, nq, d], k, v [s, b, nkv, d])

struct AttentionSize {
  index_t batch, nq, nkv, s, d;
  index_t q_size() const { return batch * nq * s * d; }
  index_t kv_size() const { return batch * nkv * s * d; }
};

// [s, b, n, d] -> [b, n, s, d] (the head-major layout of the references below) and back.
std::vector<double> to_head_major(const std::vector<double>& x, index_t s, index_t b, index_t n, index_t d) {
  std::vector<double> out(x.size());
  for (index_t t = 0; t < s; ++t)
    for (index_t j = 0; j < b; ++j)
      for (index_t h = 0; h < n; ++h)
        for (index_t e = 0; e < d; ++e) out[((j * n + h) * s + t) * d + e] = x[((t * b + j) * n + h) * d + e];
  return out;
}
std::vector<double> to_sequence_major(const std::vector<double>& x, index_t s, index_t b, index_t n, index_t d) {
  std::vector<double> out(x.size());
  for (index_t t = 0; t < s; ++t)
    for (index_t j = 0; j < b; ++j)
      for (index_t h = 0; h < n; ++h)
        for (index_t e = 0; e < d; ++e) out[((t * b + j) * n + h) * d + e] = x[((j * n + h) * s + t) * d + e];
  return out;
}

// out[b,h,i,:] = sum_{j<=i} softmax_j(scale q_i . k_j) v_j, key/value head h / (nq / nkv); in double,
// head-major [b, n, s, d]; lse[b,h,i] = log sum_{j<=i} e^(scale q_i . k_j).
std::vector<double> attention_reference(const AttentionSize& z, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v, double scale,
                                        std::vector<double>* lse = nullptr) {
  std::vector<double> out(static_cast<std::size_t>(z.q_size()), 0.0);
  if (lse) lse->assign(static_cast<std::size_t>(z.batch * z.nq * z.s), 0.0);
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
        if (lse) (*lse)[qh * z.s + i] = mx + std::log(sum);
        for (index_t j = 0; j <= i; ++j) {
          const double p = score[j] / sum;
          for (index_t c = 0; c < z.d; ++c) out[(qh * z.s + i) * z.d + c] += p * v[(kh * z.s + j) * z.d + c];
        }
      }
    }
  return out;
}

// The previous O(T^2) kernels, which stored the probabilities [b * nq, s, s] (head-major layout):
// the backward of the new kernel must agree with theirs.
namespace previous {
void forward(const AttentionSize& z, const double* q, const double* k, const double* v, double scale, double* out,
             double* probs) {
  const index_t group = z.nq / z.nkv, s = z.s, d = z.d;
  for (index_t b = 0; b < z.batch; ++b)
    for (index_t h = 0; h < z.nq; ++h) {
      const index_t qi = b * z.nq + h, ki = b * z.nkv + h / group;
      double* p = probs + qi * s * s;
      strata::cpu::gemm<double>(false, true, s, s, d, q + qi * s * d, k + ki * s * d, p, false, scale);
      for (index_t i = 0; i < s; ++i) {
        double* row = p + i * s;
        double mx = row[0];
        for (index_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        double sum = 0;
        for (index_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - mx));
        for (index_t j = 0; j <= i; ++j) row[j] /= sum;
        for (index_t j = i + 1; j < s; ++j) row[j] = 0;
      }
      strata::cpu::gemm<double>(false, false, s, d, s, p, v + ki * s * d, out + qi * s * d, false);
    }
}
void backward(const AttentionSize& z, const double* dout, const double* q, const double* k, const double* v,
              const double* probs, double scale, double* dq, double* dk, double* dv) {
  const index_t group = z.nq / z.nkv, s = z.s, d = z.d;
  std::vector<double> dp(static_cast<std::size_t>(s * s));
  std::fill(dk, dk + z.kv_size(), 0.0);
  std::fill(dv, dv + z.kv_size(), 0.0);
  for (index_t b = 0; b < z.batch; ++b)
    for (index_t h = 0; h < z.nq; ++h) {
      const index_t qi = b * z.nq + h, ki = b * z.nkv + h / group;
      const double* p = probs + qi * s * s;
      const double* dov = dout + qi * s * d;
      strata::cpu::gemm<double>(true, false, s, d, s, p, dov, dv + ki * s * d, true);
      strata::cpu::gemm<double>(false, true, s, s, d, dov, v + ki * s * d, dp.data(), false);
      for (index_t i = 0; i < s; ++i) {
        double* row = dp.data() + i * s;
        const double* prow = p + i * s;
        double dot = 0;
        for (index_t j = 0; j <= i; ++j) dot += row[j] * prow[j];
        for (index_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot);
        for (index_t j = i + 1; j < s; ++j) row[j] = 0;
      }
      strata::cpu::gemm<double>(false, false, s, d, s, dp.data(), k + ki * s * d, dq + qi * s * d, false, scale);
      strata::cpu::gemm<double>(true, false, s, d, s, dp.data(), q + qi * s * d, dk + ki * s * d, true, scale);
    }
}
}  // namespace previous

// Random q, k, v in the kernel's layout, run forward; out and lse returned.
struct AttentionRun {
  std::vector<double> q, k, v, out, lse;
};
AttentionRun run_attention(const AttentionSize& z, std::uint64_t seed, double scale, double magnitude = 1.0) {
  AttentionRun r;
  r.q = random_values<double>(z.q_size(), seed, magnitude);
  r.k = random_values<double>(z.kv_size(), seed + 1, magnitude);
  r.v = random_values<double>(z.kv_size(), seed + 2);
  r.out.assign(static_cast<std::size_t>(z.q_size()), 99.0);
  r.lse.assign(static_cast<std::size_t>(z.batch * z.nq * z.s), 99.0);
  strata::cpu::attention_forward<double>(r.q.data(), r.k.data(), r.v.data(), z.s, z.batch, z.nq, z.nkv, z.d, scale,
                                         r.out.data(), r.lse.data());
  return r;
}

void check_attention_forward(const AttentionSize& z) {
  const double scale = 1 / std::sqrt(static_cast<double>(z.d));
  const AttentionRun r = run_attention(z, 30, scale);
  std::vector<double> want_lse;
  const auto want = to_sequence_major(attention_reference(z, to_head_major(r.q, z.s, z.batch, z.nq, z.d),
                                                          to_head_major(r.k, z.s, z.batch, z.nkv, z.d),
                                                          to_head_major(r.v, z.s, z.batch, z.nkv, z.d), scale, &want_lse),
                                      z.s, z.batch, z.nq, z.d);
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(r.out[i], want[i], 1e-12) << "out " << i;
  for (std::size_t i = 0; i < want_lse.size(); ++i) ASSERT_NEAR(r.lse[i], want_lse[i], 1e-12) << "lse " << i;
}

TEST(CausalAttention, MultiHeadForwardMatchesNaiveReference) { check_attention_forward({2, 3, 3, 6, 4}); }

TEST(CausalAttention, GroupedQueryForwardMatchesNaiveReference) { check_attention_forward({2, 4, 2, 5, 3}); }

TEST(CausalAttention, ForwardMatchesPreviousProbabilityKernel) {
  const AttentionSize z{2, 4, 2, 9, 5};
  const double scale = 0.45;
  const AttentionRun r = run_attention(z, 60, scale, 2.0);
  std::vector<double> out(r.out.size()), probs(static_cast<std::size_t>(z.batch * z.nq * z.s * z.s));
  previous::forward(z, to_head_major(r.q, z.s, z.batch, z.nq, z.d).data(),
                    to_head_major(r.k, z.s, z.batch, z.nkv, z.d).data(),
                    to_head_major(r.v, z.s, z.batch, z.nkv, z.d).data(), scale, out.data(), probs.data());
  const auto want = to_sequence_major(out, z.s, z.batch, z.nq, z.d);
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(r.out[i], want[i], 1e-13) << i;
}

TEST(CausalAttention, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueHeads) {
  const AttentionSize gqa{2, 4, 2, 5, 3}, mha{2, 4, 4, 5, 3};
  const double scale = 0.7;
  const AttentionRun a = run_attention(gqa, 33, scale);
  std::vector<double> k_rep(static_cast<std::size_t>(mha.kv_size())), v_rep(k_rep.size());  // head h gets h / 2
  for (index_t t = 0; t < 5; ++t)
    for (index_t j = 0; j < 2; ++j)
      for (index_t h = 0; h < 4; ++h)
        for (index_t e = 0; e < 3; ++e) {
          k_rep[((t * 2 + j) * 4 + h) * 3 + e] = a.k[((t * 2 + j) * 2 + h / 2) * 3 + e];
          v_rep[((t * 2 + j) * 4 + h) * 3 + e] = a.v[((t * 2 + j) * 2 + h / 2) * 3 + e];
        }
  std::vector<double> out(a.out.size()), lse(a.lse.size());
  strata::cpu::attention_forward<double>(a.q.data(), k_rep.data(), v_rep.data(), 5, 2, 4, 4, 3, scale, out.data(),
                                         lse.data());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(a.out[i], out[i]) << i;
  for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_EQ(a.lse[i], lse[i]) << i;
}

TEST(CausalAttention, LaterKeysDoNotChangeEarlierQueries) {
  const AttentionSize z{2, 2, 1, 7, 4};
  AttentionRun r = run_attention(z, 70, 0.5, 3.0);
  const index_t cut = 3;  // change keys and values of positions > cut
  auto k2 = r.k, v2 = r.v;
  for (std::size_t i = static_cast<std::size_t>((cut + 1) * z.batch * z.nkv * z.d); i < k2.size(); ++i) {
    k2[i] += 5.0;
    v2[i] -= 3.0;
  }
  std::vector<double> out(r.out.size()), lse(r.lse.size());
  strata::cpu::attention_forward<double>(r.q.data(), k2.data(), v2.data(), z.s, z.batch, z.nq, z.nkv, z.d, 0.5,
                                         out.data(), lse.data());
  const std::size_t prefix = static_cast<std::size_t>((cut + 1) * z.batch * z.nq * z.d);
  for (std::size_t i = 0; i < prefix; ++i) EXPECT_EQ(out[i], r.out[i]) << i;
  EXPECT_NE(out[prefix], r.out[prefix]);
  for (index_t bh = 0; bh < z.batch * z.nq; ++bh)
    for (index_t t = 0; t <= cut; ++t) EXPECT_EQ(lse[bh * z.s + t], r.lse[bh * z.s + t]);
}

TEST(CausalAttention, FirstQueryCopiesTheFirstValue) {
  const AttentionSize z{1, 2, 2, 4, 3};
  const AttentionRun r = run_attention(z, 80, 1.0, 3.0);
  for (index_t h = 0; h < z.nq; ++h)
    for (index_t e = 0; e < z.d; ++e) EXPECT_NEAR(r.out[h * z.d + e], r.v[h * z.d + e], 1e-15);
}

TEST(CausalAttention, BackwardMatchesPreviousKernelAndFiniteDifferences) {
  for (const AttentionSize& z : {AttentionSize{1, 2, 2, 4, 3}, AttentionSize{2, 4, 2, 5, 3}, AttentionSize{2, 6, 3, 8, 4}}) {
    const double scale = 1 / std::sqrt(static_cast<double>(z.d));
    AttentionRun r = run_attention(z, 40, scale);
    const auto w = random_values<double>(z.q_size(), 43);
    std::vector<double> dq(r.q.size(), 99.0), dk(r.k.size(), 99.0), dv(r.v.size(), 99.0);  // all written
    strata::cpu::attention_backward<double>(w.data(), r.q.data(), r.k.data(), r.v.data(), r.out.data(), r.lse.data(),
                                            z.s, z.batch, z.nq, z.nkv, z.d, scale, dq.data(), dk.data(), dv.data());
    const std::string what = "nq=" + std::to_string(z.nq) + " nkv=" + std::to_string(z.nkv) + " s=" + std::to_string(z.s) + " ";
    // previous kernel, head-major
    const auto qh = to_head_major(r.q, z.s, z.batch, z.nq, z.d), kh = to_head_major(r.k, z.s, z.batch, z.nkv, z.d),
               vh = to_head_major(r.v, z.s, z.batch, z.nkv, z.d), wh = to_head_major(w, z.s, z.batch, z.nq, z.d);
    std::vector<double> out(qh.size()), probs(static_cast<std::size_t>(z.batch * z.nq * z.s * z.s));
    previous::forward(z, qh.data(), kh.data(), vh.data(), scale, out.data(), probs.data());
    std::vector<double> pdq(qh.size()), pdk(kh.size()), pdv(vh.size());
    previous::backward(z, wh.data(), qh.data(), kh.data(), vh.data(), probs.data(), scale, pdq.data(), pdk.data(), pdv.data());
    const auto want_dq = to_sequence_major(pdq, z.s, z.batch, z.nq, z.d),
               want_dk = to_sequence_major(pdk, z.s, z.batch, z.nkv, z.d),
               want_dv = to_sequence_major(pdv, z.s, z.batch, z.nkv, z.d);
    for (std::size_t i = 0; i < dq.size(); ++i) ASSERT_NEAR(dq[i], want_dq[i], 1e-12) << what << "dq " << i;
    for (std::size_t i = 0; i < dk.size(); ++i) ASSERT_NEAR(dk[i], want_dk[i], 1e-12) << what << "dk " << i;
    for (std::size_t i = 0; i < dv.size(); ++i) ASSERT_NEAR(dv[i], want_dv[i], 1e-12) << what << "dv " << i;
    // finite differences of the double reference, in the kernel's layout
    auto loss = [&] {
      return weighted_sum(w, to_sequence_major(attention_reference(z, to_head_major(r.q, z.s, z.batch, z.nq, z.d),
                                                                   to_head_major(r.k, z.s, z.batch, z.nkv, z.d),
                                                                   to_head_major(r.v, z.s, z.batch, z.nkv, z.d), scale),
                                               z.s, z.batch, z.nq, z.d));
    };
    if (z.s <= 5) {
      expect_gradient(dq, r.q, loss, 1e-7, what + "dq");
      expect_gradient(dk, r.k, loss, 1e-7, what + "dk");
      expect_gradient(dv, r.v, loss, 1e-7, what + "dv");
    }
  }
}

TEST(CausalAttention, FloatAndBf16FollowDouble) {
  const AttentionSize z{2, 4, 2, 6, 8};
  const double scale = 1 / std::sqrt(8.0);
  const AttentionRun r = run_attention(z, 90, scale);
  auto narrow = [](const std::vector<double>& x, auto zero) {
    std::vector<decltype(zero)> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<decltype(zero)>(x[i]);
    return out;
  };
  const auto qf = narrow(r.q, 0.0f), kf = narrow(r.k, 0.0f), vf = narrow(r.v, 0.0f);
  std::vector<float> out(qf.size()), lse(r.lse.size());
  strata::cpu::attention_forward<float>(qf.data(), kf.data(), vf.data(), z.s, z.batch, z.nq, z.nkv, z.d, float(scale),
                                        out.data(), lse.data());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], r.out[i], 1e-5) << i;
  const auto qb = narrow(r.q, bf16{}), kb = narrow(r.k, bf16{}), vb = narrow(r.v, bf16{});
  std::vector<bf16> outb(qb.size());
  strata::cpu::attention_forward<bf16>(qb.data(), kb.data(), vb.data(), z.s, z.batch, z.nq, z.nkv, z.d, float(scale),
                                       outb.data(), lse.data());
  for (std::size_t i = 0; i < outb.size(); ++i) EXPECT_NEAR(float(outb[i]), r.out[i], 3e-2) << i;
}

// Strided views (backend/attention_strides.hpp): attention reading q, k, v from the packed qkv
// projection [s, b, groups, hpg + 2, d] and writing dq, dk, dv into a packed gradient gives the
// same bits as the contiguous twin on the split copies (and the merged gradients).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void check_packed_view(index_t s, index_t b, index_t groups, index_t hpg, index_t d, std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  const index_t heads = groups * hpg, rows = s * b, width = groups * (hpg + 2) * d;
  const std::string what = std::string("s=") + std::to_string(s) + " b=" + std::to_string(b) +
                           " groups=" + std::to_string(groups) + " hpg=" + std::to_string(hpg) + " d=" + std::to_string(d);
  const strata::PackedQkvView view = strata::packed_qkv_view(groups, hpg, d);
  ASSERT_TRUE(view.is_view) << what;
  const auto packed = random_values<T>(rows * width, seed);
  const auto dout = random_values<T>(rows * heads * d, seed + 1);
  const A scale = A(1) / std::sqrt(A(d));
  // the contiguous twin on split copies
  std::vector<T> q(static_cast<std::size_t>(rows * heads * d)), k(static_cast<std::size_t>(rows * groups * d)), v(k.size());
  strata::cpu::qkv_split<T>(packed.data(), rows, groups, hpg, d, q.data(), k.data(), v.data());
  std::vector<T> out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  std::vector<A> lse(static_cast<std::size_t>(b * heads * s));
  strata::cpu::attention_forward<T>(q.data(), k.data(), v.data(), s, b, heads, groups, d, scale, out.data(), lse.data());
  strata::cpu::attention_backward<T>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), s, b, heads,
                                     groups, d, scale, dq.data(), dk.data(), dv.data());
  std::vector<T> want_dpacked(packed.size());
  strata::cpu::qkv_merge<T>(dq.data(), dk.data(), dv.data(), rows, groups, hpg, d, want_dpacked.data());
  // the strided twin on views, outputs NaN-filled first (each element must be written)
  const T nan = T(std::numeric_limits<float>::quiet_NaN());
  std::vector<T> view_out(out.size(), nan), dpacked(packed.size(), nan);
  std::vector<A> view_lse(lse.size(), std::numeric_limits<A>::quiet_NaN());
  const T* p = packed.data();
  strata::cpu::attention_forward<T>(p, p + view.k_offset, p + view.v_offset, s, b, heads, groups, d, scale,
                                    view_out.data(), view_lse.data(), view.strides);
  strata::cpu::attention_backward<T>(dout.data(), p, p + view.k_offset, p + view.v_offset, view_out.data(),
                                     view_lse.data(), s, b, heads, groups, d, scale, dpacked.data(),
                                     dpacked.data() + view.k_offset, dpacked.data() + view.v_offset, view.strides);
  EXPECT_TRUE(same_bits(view_out, out)) << what << " out";
  EXPECT_TRUE(same_bits(view_lse, lse)) << what << " lse";
  EXPECT_TRUE(same_bits(dpacked, want_dpacked)) << what << " dqkv";
}

TEST(CausalAttention, MultiHeadViewsOfPackedQkvEqualContiguousBitForBit) {
  check_packed_view<double>(5, 2, 3, 1, 4, 200);
  check_packed_view<float>(7, 3, 4, 1, 8, 201);
  check_packed_view<bf16>(9, 1, 2, 1, 8, 202);
}

TEST(CausalAttention, OneGroupViewsOfPackedQkvEqualContiguousBitForBit) {
  check_packed_view<double>(5, 2, 1, 3, 4, 210);
  check_packed_view<float>(7, 3, 1, 4, 8, 211);
  check_packed_view<bf16>(9, 2, 1, 2, 8, 212);
  check_packed_view<float>(6, 2, 1, 1, 8, 213);  // one head: both layouts at once
}

TEST(CausalAttention, PackedQkvIsNoViewForSeveralGroupsOfSeveralHeads) {
  EXPECT_FALSE(strata::packed_qkv_view(2, 2, 8).is_view);
  const strata::AttentionStrides mha = strata::packed_qkv_view(4, 1, 8).strides;
  EXPECT_EQ(mha, (strata::AttentionStrides{96, 24, 96, 24}));  // 4 groups of [q | k | v], 8 each
  const strata::AttentionStrides mqa = strata::packed_qkv_view(1, 4, 8).strides;
  EXPECT_EQ(mqa.q_row, 48);
  EXPECT_EQ(mqa.q_head, 8);
  EXPECT_EQ(mqa.kv_row, 48);
  EXPECT_TRUE(strata::AttentionStrides{}.is_contiguous(4, 2, 8));
  EXPECT_FALSE(mha.is_contiguous(4, 4, 8));
}

// Any strided layout, not only the packed ones: heads stored head-major [heads, s, b, d] (head
// stride s b d, row stride d) give the bits of the contiguous layout.
TEST(CausalAttention, HeadMajorStridesEqualContiguousBitForBit) {
  const index_t s = 6, b = 2, heads = 4, groups = 2, d = 5;
  const double scale = 0.4;
  const auto q = random_values<double>(s * b * heads * d, 220), k = random_values<double>(s * b * groups * d, 221),
             v = random_values<double>(s * b * groups * d, 222), dout = random_values<double>(s * b * heads * d, 223);
  auto head_major = [&](const std::vector<double>& x, index_t n) {  // [s, b, n, d] -> [n, s, b, d]
    std::vector<double> y(x.size());
    for (index_t r = 0; r < s * b; ++r)
      for (index_t h = 0; h < n; ++h)
        for (index_t e = 0; e < d; ++e) y[(h * s * b + r) * d + e] = x[(r * n + h) * d + e];
    return y;
  };
  std::vector<double> out(q.size()), lse(static_cast<std::size_t>(b * heads * s)), dq(q.size()), dk(k.size()),
      dv(k.size());
  strata::cpu::attention_forward<double>(q.data(), k.data(), v.data(), s, b, heads, groups, d, scale, out.data(), lse.data());
  strata::cpu::attention_backward<double>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), s, b, heads,
                                          groups, d, scale, dq.data(), dk.data(), dv.data());
  const auto qh = head_major(q, heads), kh = head_major(k, groups), vh = head_major(v, groups);
  const strata::AttentionStrides strides{d, s * b * d, d, s * b * d};
  std::vector<double> out2(out.size()), lse2(lse.size()), dq2(q.size()), dk2(k.size()), dv2(k.size());
  strata::cpu::attention_forward<double>(qh.data(), kh.data(), vh.data(), s, b, heads, groups, d, scale, out2.data(),
                                         lse2.data(), strides);
  strata::cpu::attention_backward<double>(dout.data(), qh.data(), kh.data(), vh.data(), out2.data(), lse2.data(), s, b,
                                          heads, groups, d, scale, dq2.data(), dk2.data(), dv2.data(), strides);
  EXPECT_TRUE(same_bits(out2, out));
  EXPECT_TRUE(same_bits(lse2, lse));
  EXPECT_TRUE(same_bits(dq2, head_major(dq, heads)));
  EXPECT_TRUE(same_bits(dk2, head_major(dk, groups)));
  EXPECT_TRUE(same_bits(dv2, head_major(dv, groups)));
}

TEST(CausalAttention, StrideShorterThanAHeadIsAShapeError) {
  std::vector<double> x(64), out(64), lse(8);
  try {
    strata::cpu::attention_forward<double>(x.data(), x.data(), x.data(), 2, 1, 2, 2, 4, 0.5, out.data(), lse.data(),
                                           strata::AttentionStrides{8, 3, 0, 0});
    FAIL() << "a head stride of 3 < d = 4 was accepted";
  } catch (const strata::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("q_head = 3"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Rotary position embedding (x [s, n, d])

constexpr index_t kRopeRows = 2, kRopeSeq = 6, kRopeDim = 8;
constexpr double kRopeBase = 10000.0;

TEST(Rope, InverseUndoesForward) {
  const auto x = random_values<double>(kRopeRows * kRopeSeq * kRopeDim, 50);
  auto y = x;
  strata::cpu::rope_forward<double>(y.data(), kRopeSeq, kRopeRows, kRopeDim, kRopeBase, 3);
  EXPECT_NE(y, x);
  strata::cpu::rope_backward<double>(y.data(), kRopeSeq, kRopeRows, kRopeDim, kRopeBase, 3);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14) << i;
}

TEST(Rope, PreservesEachPairNorm) {
  const auto x = random_values<double>(kRopeRows * kRopeSeq * kRopeDim, 51);
  auto y = x;
  strata::cpu::rope_forward<double>(y.data(), kRopeSeq, kRopeRows, kRopeDim, kRopeBase, 100);
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
  strata::cpu::rope_forward<double>(y.data(), kRopeSeq, kRopeRows, kRopeDim, kRopeBase, 0);
  for (std::size_t i = 0; i < static_cast<std::size_t>(kRopeRows * kRopeDim); ++i) EXPECT_EQ(y[i], x[i]);  // t = 0
  EXPECT_NE(y[kRopeRows * kRopeDim], x[kRopeRows * kRopeDim]);
}

TEST(Rope, MatchesDirectRotationFormula) {
  const auto x = random_values<double>(kRopeRows * kRopeSeq * kRopeDim, 53);
  auto y = x;
  const index_t offset = 5;
  strata::cpu::rope_forward<double>(y.data(), kRopeSeq, kRopeRows, kRopeDim, kRopeBase, offset);
  const index_t half = kRopeDim / 2;
  for (index_t t = 0; t < kRopeSeq; ++t)
    for (index_t r = 0; r < kRopeRows; ++r)
      for (index_t i = 0; i < half; ++i) {
        const std::size_t row = static_cast<std::size_t>((t * kRopeRows + r) * kRopeDim);  // (s, n, d)
        const double angle = static_cast<double>(offset + t) / std::pow(kRopeBase, 2.0 * i / kRopeDim);
        const double a = x[row + i], b = x[row + i + half];
        EXPECT_NEAR(y[row + i], a * std::cos(angle) - b * std::sin(angle), 1e-14);
        EXPECT_NEAR(y[row + i + half], b * std::cos(angle) + a * std::sin(angle), 1e-14);
      }
}

TEST(Rope, OffsetContinuesTheSequence) {
  // Positions [2, 6) of a sequence rotated from position 0 equal those positions rotated alone from offset 2.
  const auto x = random_values<double>(kRopeSeq * kRopeRows * kRopeDim, 54);
  auto whole = x;
  strata::cpu::rope_forward<double>(whole.data(), kRopeSeq, kRopeRows, kRopeDim, kRopeBase, 0);
  std::vector<double> tail(x.begin() + 2 * kRopeRows * kRopeDim, x.end());
  strata::cpu::rope_forward<double>(tail.data(), kRopeSeq - 2, kRopeRows, kRopeDim, kRopeBase, 2);
  for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_NEAR(tail[i], whole[2 * kRopeRows * kRopeDim + i], 1e-14) << i;
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const auto q = random_values<double>(kRopeDim, 55), k = random_values<double>(kRopeDim, 56);
  auto score = [&](index_t m, index_t n) {
    auto qr = q, kr = k;
    strata::cpu::rope_forward<double>(qr.data(), 1, 1, kRopeDim, kRopeBase, m);
    strata::cpu::rope_forward<double>(kr.data(), 1, 1, kRopeDim, kRopeBase, n);
    double dot = 0;
    for (index_t c = 0; c < kRopeDim; ++c) dot += qr[c] * kr[c];
    return dot;
  };
  EXPECT_NEAR(score(7, 3), score(4, 0), 1e-12);
  EXPECT_NEAR(score(20, 11), score(9, 0), 1e-12);
}

}  // namespace
