// Attention dropout in the CPU attention kernels (backend/attention_options.hpp): the op against a
// naive double-precision reference that builds the same mask from the counter-based generator
// itself (the s x s probabilities, dropped and scaled, then the textbook backward); gradients by
// central finite differences in double under a fixed mask; the fraction of dropped probabilities
// read off the op's own output; the head offset (what a tensor-parallel rank passes) drawing the
// heads of a larger run; strided views drawing the mask of the contiguous call; probability 0
// giving the bits of the call without options; bad probabilities refused. And the sliding window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <strata/backend/cpu.hpp>
#include <strata/core.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_attention_dropout_cases {

namespace {

using strata::AttentionDropout;
using strata::AttentionOptions;
using strata::AttentionStrides;
using strata::index_t;

struct Size {
  index_t s, b, heads, groups, d;
  std::size_t q() const { return static_cast<std::size_t>(s * b * heads * d); }
  std::size_t kv() const { return static_cast<std::size_t>(s * b * groups * d); }
  std::size_t lse() const { return static_cast<std::size_t>(b * heads * s); }
};

std::vector<double> random_values(std::size_t n, std::uint64_t key) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = strata::rng::normal(key, i);
  return v;
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The mask as the contract states it, written out here rather than taken from the library's
// AttentionDropoutMask: the first Philox word of counter {j, i, global head, batch} >= round(p 2^32).
bool reference_kept(const AttentionDropout& dropout, index_t batch, index_t h, index_t i, index_t j) {
  const auto word = strata::rng::philox4x32({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(i),
                                             static_cast<std::uint32_t>(dropout.head_offset + h),
                                             static_cast<std::uint32_t>(batch)},
                                            dropout.key);
  return static_cast<double>(word[0]) >= std::round(dropout.probability * 4294967296.0);
}

struct Gradients {
  std::vector<double> out, lse, dq, dk, dv;
};

// Straight from the definitions with whole s x s matrices: P = softmax(S) (causal), Z = kept / (1 - p),
// O = (P Z) V, lse undropped; dP = Z (dO V^T), D_i = sum_j P_ij dP_ij, dS = P (dP - D).
Gradients naive_reference(const Size& z, const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, const std::vector<double>& dout, double scale,
                          const AttentionDropout& dropout, index_t window = -1) {
  // keys j of row i: (window < 0 or i - j <= window) and j <= i; the rest of P stays 0
  auto from = [&](index_t i) { return window < 0 ? index_t{0} : std::max<index_t>(0, i - window); };
  const index_t s = z.s, b = z.b, H = z.heads, G = z.groups, d = z.d, per_group = H / G;
  auto qo = [&](index_t i, index_t bi, index_t h) { return static_cast<std::size_t>(((i * b + bi) * H + h) * d); };
  auto ko = [&](index_t j, index_t bi, index_t g) { return static_cast<std::size_t>(((j * b + bi) * G + g) * d); };
  Gradients r;
  r.out.assign(z.q(), 0.0), r.dq.assign(z.q(), 0.0), r.dk.assign(z.kv(), 0.0), r.dv.assign(z.kv(), 0.0);
  r.lse.assign(z.lse(), 0.0);
  const std::size_t ss = static_cast<std::size_t>(s * s);
  for (index_t bi = 0; bi < b; ++bi)
    for (index_t h = 0; h < H; ++h) {
      const index_t g = h / per_group;
      std::vector<double> P(ss, 0.0), Z(ss, 0.0), dP(ss, 0.0);
      for (index_t i = 0; i < s; ++i) {
        double mx = -INFINITY;
        for (index_t j = from(i); j <= i; ++j) {
          double dot = 0;
          for (index_t e = 0; e < d; ++e) dot += q[qo(i, bi, h) + e] * k[ko(j, bi, g) + e];
          P[i * s + j] = scale * dot;
          mx = std::max(mx, P[i * s + j]);
        }
        double sum = 0;
        for (index_t j = from(i); j <= i; ++j) sum += std::exp(P[i * s + j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[static_cast<std::size_t>((bi * H + h) * s + i)] = lse;
        for (index_t j = from(i); j <= i; ++j) {
          P[i * s + j] = std::exp(P[i * s + j] - lse);
          const bool kept = !dropout.active() || reference_kept(dropout, bi, h, i, j);
          Z[i * s + j] = kept ? 1.0 / (1.0 - dropout.probability) : 0.0;
        }
      }
      for (index_t i = 0; i < s; ++i)
        for (index_t j = 0; j <= i; ++j)
          for (index_t e = 0; e < d; ++e) r.out[qo(i, bi, h) + e] += P[i * s + j] * Z[i * s + j] * v[ko(j, bi, g) + e];
      for (index_t i = 0; i < s; ++i) {
        double delta = 0;
        for (index_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (index_t e = 0; e < d; ++e) dot += dout[qo(i, bi, h) + e] * v[ko(j, bi, g) + e];
          dP[i * s + j] = Z[i * s + j] * dot;
          delta += P[i * s + j] * dP[i * s + j];
        }
        for (index_t j = 0; j <= i; ++j) {
          const double ds = P[i * s + j] * (dP[i * s + j] - delta);
          for (index_t e = 0; e < d; ++e) {
            r.dq[qo(i, bi, h) + e] += scale * ds * k[ko(j, bi, g) + e];
            r.dk[ko(j, bi, g) + e] += scale * ds * q[qo(i, bi, h) + e];
            r.dv[ko(j, bi, g) + e] += P[i * s + j] * Z[i * s + j] * dout[qo(i, bi, h) + e];
          }
        }
      }
    }
  return r;
}

struct Inputs {
  std::vector<double> q, k, v, dout;
};
Inputs random_inputs(const Size& z, std::uint64_t seed) {
  return {random_values(z.q(), seed), random_values(z.kv(), seed + 1), random_values(z.kv(), seed + 2),
          random_values(z.q(), seed + 3)};
}

Gradients run_op(const Size& z, const Inputs& x, double scale, AttentionOptions options) {
  Gradients r;
  r.out.assign(z.q(), NAN), r.lse.assign(z.lse(), NAN);
  r.dq.assign(z.q(), NAN), r.dk.assign(z.kv(), NAN), r.dv.assign(z.kv(), NAN);
  strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), z.s, z.b, z.heads, z.groups, z.d, scale,
                                         r.out.data(), r.lse.data(), options);
  strata::cpu::attention_backward<double>(x.dout.data(), x.q.data(), x.k.data(), x.v.data(), r.out.data(),
                                          r.lse.data(), z.s, z.b, z.heads, z.groups, z.d, scale, r.dq.data(),
                                          r.dk.data(), r.dv.data(), options);
  return r;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

void expect_matches_reference(const Size& z, const AttentionDropout& dropout, std::uint64_t seed) {
  const Inputs x = random_inputs(z, seed);
  const double scale = 1.0 / std::sqrt(static_cast<double>(z.d));
  const Gradients got = run_op(z, x, scale, AttentionOptions{AttentionStrides{}, dropout});
  const Gradients want = naive_reference(z, x.q, x.k, x.v, x.dout, scale, dropout);
  EXPECT_LE(relative_error(got.out, want.out), 1e-12);
  EXPECT_LE(relative_error(got.lse, want.lse), 1e-12);
  EXPECT_LE(relative_error(got.dq, want.dq), 1e-12);
  EXPECT_LE(relative_error(got.dk, want.dk), 1e-12);
  EXPECT_LE(relative_error(got.dv, want.dv), 1e-12);
  // the mask did something: the undropped reference is far away
  const Gradients plain = naive_reference(z, x.q, x.k, x.v, x.dout, scale, AttentionDropout{});
  EXPECT_GT(relative_error(got.out, plain.out), 0.05);
  EXPECT_GT(relative_error(got.dq, plain.dq), 0.05);
  EXPECT_LE(relative_error(got.lse, plain.lse), 1e-12) << "lse must be that of the undropped softmax";
}

TEST(AttentionDropout, MultiHeadMatchesNaiveReference) {
  expect_matches_reference({9, 2, 3, 3, 4}, AttentionDropout{0.3, 0x1234, 0}, 10);
}
TEST(AttentionDropout, GroupedQueryWithHeadOffsetMatchesNaiveReference) {
  expect_matches_reference({11, 3, 4, 2, 5}, AttentionDropout{0.2, 0xabcdef, 6}, 20);
}
TEST(AttentionDropout, HighProbabilityMatchesNaiveReference) {
  expect_matches_reference({8, 2, 2, 1, 3}, AttentionDropout{0.75, 77, 1}, 30);
}

// Sliding-window attention (AttentionOptions::window): query i sees keys i - window .. i only,
// against the same reference with the keys outside the window left out, with and without dropout;
// a window of s - 1 or more is the plain causal call, bit for bit (windows on context parallelism's
// blocks: test_attention_blocks.cpp).
TEST(AttentionWindow, MatchesNaiveReferenceWithAndWithoutDropout) {
  const Size z{13, 2, 4, 2, 5};
  const double scale = 1.0 / std::sqrt(static_cast<double>(z.d));
  const Inputs x = random_inputs(z, 40);
  for (const index_t window : {index_t{0}, index_t{1}, index_t{4}})
    for (const AttentionDropout& dropout : {AttentionDropout{}, AttentionDropout{0.3, 99, 2}}) {
      AttentionOptions options{AttentionStrides{}, dropout};
      options.window = window;
      const Gradients got = run_op(z, x, scale, options);
      const Gradients want = naive_reference(z, x.q, x.k, x.v, x.dout, scale, dropout, window);
      const std::string what = "window " + std::to_string(window) + (dropout.active() ? " with dropout" : "");
      EXPECT_LE(relative_error(got.out, want.out), 1e-12) << what;
      EXPECT_LE(relative_error(got.lse, want.lse), 1e-12) << what;
      EXPECT_LE(relative_error(got.dq, want.dq), 1e-12) << what;
      EXPECT_LE(relative_error(got.dk, want.dk), 1e-12) << what;
      EXPECT_LE(relative_error(got.dv, want.dv), 1e-12) << what;
      const Gradients whole = naive_reference(z, x.q, x.k, x.v, x.dout, scale, dropout);
      EXPECT_GT(relative_error(got.out, whole.out), 0.05) << what << ": the window changed nothing";
    }
  AttentionOptions wide;
  wide.window = z.s - 1;
  const Gradients windowed = run_op(z, x, scale, wide), plain = run_op(z, x, scale, AttentionOptions{});
  EXPECT_TRUE(same_bits(windowed.out, plain.out) && same_bits(windowed.dq, plain.dq) && same_bits(windowed.dk, plain.dk))
      << "a window of s - 1 sees every causal key";
}

// L = sum(out * W): its gradient is the backward with dout = W. Each input element moved by
// +-h (the key, and so the mask, fixed) and L recomputed by the forward.
TEST(AttentionDropout, GradientsMatchFiniteDifferences) {
  const Size z{6, 2, 4, 2, 3};
  const AttentionDropout dropout{0.35, 0x5eed, 2};
  const AttentionOptions options{AttentionStrides{}, dropout};
  Inputs x = random_inputs(z, 40);
  const double scale = 0.7;
  const Gradients analytic = run_op(z, x, scale, options);
  auto loss = [&](const Inputs& in) {
    std::vector<double> out(z.q()), lse(z.lse());
    strata::cpu::attention_forward<double>(in.q.data(), in.k.data(), in.v.data(), z.s, z.b, z.heads, z.groups, z.d,
                                           scale, out.data(), lse.data(), options);
    double sum = 0;
    for (std::size_t i = 0; i < out.size(); ++i) sum += out[i] * in.dout[i];
    return sum;
  };
  const double h = 1e-6;
  auto numeric = [&](std::vector<double> Inputs::*member) {
    std::vector<double> grad((x.*member).size());
    for (std::size_t i = 0; i < grad.size(); ++i) {
      const double saved = (x.*member)[i];
      (x.*member)[i] = saved + h;
      const double up = loss(x);
      (x.*member)[i] = saved - h;
      const double down = loss(x);
      (x.*member)[i] = saved;
      grad[i] = (up - down) / (2 * h);
    }
    return grad;
  };
  const auto dq = numeric(&Inputs::q), dk = numeric(&Inputs::k), dv = numeric(&Inputs::v);
  EXPECT_LE(relative_error(analytic.dq, dq), 1e-7);
  EXPECT_LE(relative_error(analytic.dk, dk), 1e-7);
  EXPECT_LE(relative_error(analytic.dv, dv), 1e-7);
  // the check has teeth: the gradients without the mask (same key, no dropout) differ
  const Gradients plain = run_op(z, x, scale, AttentionOptions{});
  EXPECT_GT(relative_error(plain.dq, dq), 1e-2);
  EXPECT_GT(relative_error(plain.dv, dv), 1e-2);
}

// q = 0 makes every probability of query i equal to 1 / (i + 1); with d = s and v_j the unit vector
// e_j, out_i[j] = Z_ij / (i + 1), so the op's output is its mask.
struct MaskRead {
  std::vector<std::uint8_t> kept;  // [b, heads, i, j], j <= i, in that order
  bool scaled_exactly = true;      // every kept value is 1 / ((1 - p)(i + 1)), every dropped one 0
};
MaskRead read_mask(index_t s, index_t b, index_t heads, const AttentionDropout& dropout) {
  const index_t d = s;
  std::vector<double> q(static_cast<std::size_t>(s * b * heads * d), 0.0), kv(static_cast<std::size_t>(s * b * heads * d), 0.0);
  for (index_t j = 0; j < s; ++j)
    for (index_t bi = 0; bi < b; ++bi)
      for (index_t g = 0; g < heads; ++g) kv[static_cast<std::size_t>(((j * b + bi) * heads + g) * d + j)] = 1.0;
  std::vector<double> out(q.size()), lse(static_cast<std::size_t>(b * heads * s));
  strata::cpu::attention_forward<double>(q.data(), kv.data(), kv.data(), s, b, heads, heads, d, 1.0, out.data(),
                                         lse.data(), AttentionOptions{AttentionStrides{}, dropout});
  MaskRead r;
  for (index_t bi = 0; bi < b; ++bi)
    for (index_t h = 0; h < heads; ++h)
      for (index_t i = 0; i < s; ++i)
        for (index_t j = 0; j <= i; ++j) {
          const double value = out[static_cast<std::size_t>(((i * b + bi) * heads + h) * d + j)];
          const bool kept = value != 0.0;
          r.kept.push_back(kept);
          const double want = kept ? 1.0 / ((1.0 - dropout.probability) * static_cast<double>(i + 1)) : 0.0;
          if (std::abs(value - want) > 1e-14 * std::abs(want)) r.scaled_exactly = false;
        }
  return r;
}

TEST(AttentionDropout, DroppedFractionIsCloseToProbability) {
  const index_t s = 128, b = 2, heads = 4;
  for (double p : {0.1, 0.5}) {
    const MaskRead mask = read_mask(s, b, heads, AttentionDropout{p, 2024, 0});
    const double n = static_cast<double>(mask.kept.size());
    double dropped = 0;
    for (auto k : mask.kept) dropped += k ? 0 : 1;
    const double sigma = std::sqrt(p * (1 - p) / n);  // of the fraction over n = 66048 independent draws
    EXPECT_NEAR(dropped / n, p, 5 * sigma) << "p = " << p;
    EXPECT_TRUE(mask.scaled_exactly) << "kept probabilities are scaled by 1 / (1 - p), dropped ones are 0";
    // the op's mask is the contract's
    std::size_t at = 0, disagree = 0;
    for (index_t bi = 0; bi < b; ++bi)
      for (index_t h = 0; h < heads; ++h)
        for (index_t i = 0; i < s; ++i)
          for (index_t j = 0; j <= i; ++j) disagree += mask.kept[at++] != reference_kept(AttentionDropout{p, 2024, 0}, bi, h, i, j);
    EXPECT_EQ(disagree, 0u);
  }
}

// The mask depends on (key, global head, batch, query, key): a rank holding heads 2, 3 of a run of
// 4 (head_offset 2) draws exactly that run's heads 2, 3; another key, head or batch draws another.
TEST(AttentionDropout, HeadOffsetDrawsTheHeadsOfTheWholeRun) {
  const index_t s = 16, b = 2;
  const MaskRead whole = read_mask(s, b, 4, AttentionDropout{0.4, 99, 0});
  const MaskRead upper = read_mask(s, b, 2, AttentionDropout{0.4, 99, 2});
  const MaskRead other_key = read_mask(s, b, 4, AttentionDropout{0.4, 100, 0});
  const std::size_t per_head = static_cast<std::size_t>(s * (s + 1) / 2);
  for (index_t bi = 0; bi < b; ++bi)
    for (index_t h = 0; h < 2; ++h) {
      const auto from = whole.kept.begin() + static_cast<std::ptrdiff_t>((bi * 4 + h + 2) * per_head);
      const auto mine = upper.kept.begin() + static_cast<std::ptrdiff_t>((bi * 2 + h) * per_head);
      EXPECT_TRUE(std::equal(mine, mine + static_cast<std::ptrdiff_t>(per_head), from)) << "batch " << bi << " head " << h;
    }
  EXPECT_NE(whole.kept, other_key.kept);
  auto block = [&](const MaskRead& m, index_t bi, index_t h) {
    const auto from = m.kept.begin() + static_cast<std::ptrdiff_t>((bi * 4 + h) * per_head);
    return std::vector<std::uint8_t>(from, from + static_cast<std::ptrdiff_t>(per_head));
  };
  EXPECT_NE(block(whole, 0, 0), block(whole, 0, 1)) << "heads draw different masks";
  EXPECT_NE(block(whole, 0, 0), block(whole, 1, 0)) << "sequences draw different masks";
}

// q, k, v read as views of the packed projection draw the mask of the contiguous call on copies
// (the mask is a function of positions and heads, not addresses): the same bits.
TEST(AttentionDropout, PackedViewsGiveTheBitsOfSplitCopies) {
  for (auto [groups, per_group] : {std::pair<index_t, index_t>{4, 1}, {1, 3}}) {
    const index_t s = 7, b = 2, d = 4, heads = groups * per_group, rows = s * b;
    const strata::PackedQkvView view = strata::packed_qkv_view(groups, per_group, d);
    ASSERT_TRUE(view.is_view);
    const std::vector<double> packed = random_values(static_cast<std::size_t>(rows * groups * (per_group + 2) * d), 50);
    const std::vector<double> dout = random_values(static_cast<std::size_t>(rows * heads * d), 51);
    const AttentionDropout dropout{0.3, 4242, 4};
    const Size z{s, b, heads, groups, d};
    Inputs split{std::vector<double>(z.q()), std::vector<double>(z.kv()), std::vector<double>(z.kv()), dout};
    strata::cpu::qkv_split<double>(packed.data(), rows, groups, per_group, d, split.q.data(), split.k.data(), split.v.data());
    const Gradients copies = run_op(z, split, 0.5, AttentionOptions{AttentionStrides{}, dropout});
    std::vector<double> out(z.q()), lse(z.lse()), dpacked(packed.size(), NAN);
    const double* p = packed.data();
    strata::cpu::attention_forward<double>(p, p + view.k_offset, p + view.v_offset, s, b, heads, groups, d, 0.5,
                                           out.data(), lse.data(), AttentionOptions{view.strides, dropout});
    double* g = dpacked.data();
    strata::cpu::attention_backward<double>(dout.data(), p, p + view.k_offset, p + view.v_offset, out.data(), lse.data(),
                                            s, b, heads, groups, d, 0.5, g, g + view.k_offset, g + view.v_offset,
                                            AttentionOptions{view.strides, dropout});
    std::vector<double> merged(packed.size());
    strata::cpu::qkv_merge<double>(copies.dq.data(), copies.dk.data(), copies.dv.data(), rows, groups, per_group, d,
                                   merged.data());
    EXPECT_TRUE(same_bits(out, copies.out)) << "groups " << groups;
    EXPECT_TRUE(same_bits(lse, copies.lse)) << "groups " << groups;
    EXPECT_TRUE(same_bits(dpacked, merged)) << "groups " << groups;
  }
}

// Probability 0 (whatever the key) is the call without options, bit for bit; float and bf16 too.
template <class T>
void expect_zero_probability_is_plain() {
  using A = strata::accumulate_t<T>;
  const Size z{9, 2, 4, 2, 8};
  const Inputs x = random_inputs(z, 60);
  auto cast = [](const std::vector<double>& v) {
    std::vector<T> t(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) t[i] = T(v[i]);
    return t;
  };
  const auto q = cast(x.q), k = cast(x.k), v = cast(x.v), dout = cast(x.dout);
  auto run = [&](const AttentionOptions* options) {
    std::vector<T> out(z.q()), dq(z.q()), dk(z.kv()), dv(z.kv());
    std::vector<A> lse(z.lse());
    if (options) {
      strata::cpu::attention_forward<T>(q.data(), k.data(), v.data(), z.s, z.b, z.heads, z.groups, z.d, A(0.35),
                                        out.data(), lse.data(), *options);
      strata::cpu::attention_backward<T>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), z.s, z.b,
                                         z.heads, z.groups, z.d, A(0.35), dq.data(), dk.data(), dv.data(), *options);
    } else {
      strata::cpu::attention_forward<T>(q.data(), k.data(), v.data(), z.s, z.b, z.heads, z.groups, z.d, A(0.35),
                                        out.data(), lse.data());
      strata::cpu::attention_backward<T>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), z.s, z.b,
                                         z.heads, z.groups, z.d, A(0.35), dq.data(), dk.data(), dv.data());
    }
    std::vector<unsigned char> bytes;
    for (const auto* part : {&out, &dq, &dk, &dv}) {
      const auto* raw = reinterpret_cast<const unsigned char*>(part->data());
      bytes.insert(bytes.end(), raw, raw + part->size() * sizeof(T));
    }
    const auto* raw = reinterpret_cast<const unsigned char*>(lse.data());
    bytes.insert(bytes.end(), raw, raw + lse.size() * sizeof(A));
    return bytes;
  };
  const AttentionOptions zero{AttentionStrides{}, AttentionDropout{0.0, 12345, 3}};
  EXPECT_EQ(run(&zero), run(nullptr));
  const AttentionOptions dropping{AttentionStrides{}, AttentionDropout{0.1, 12345, 3}};
  EXPECT_NE(run(&dropping), run(nullptr));
}
TEST(AttentionDropout, ZeroProbabilityIsTheCallWithoutOptionsDouble) { expect_zero_probability_is_plain<double>(); }
TEST(AttentionDropout, ZeroProbabilityIsTheCallWithoutOptionsFloat) { expect_zero_probability_is_plain<float>(); }
TEST(AttentionDropout, ZeroProbabilityIsTheCallWithoutOptionsBf16) { expect_zero_probability_is_plain<strata::bf16>(); }

TEST(AttentionDropout, ProbabilityOutsideZeroToOneIsRefused) {
  const Size z{2, 1, 1, 1, 2};
  const Inputs x = random_inputs(z, 70);
  for (double p : {1.0, 1.5, -0.1, std::numeric_limits<double>::quiet_NaN()}) {
    std::vector<double> out(z.q()), lse(z.lse());
    EXPECT_THROW(strata::cpu::attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), z.s, z.b, z.heads, z.groups,
                                                        z.d, 1.0, out.data(), lse.data(),
                                                        AttentionOptions{AttentionStrides{}, AttentionDropout{p, 1, 0}}),
                 strata::ConfigError)
        << "p = " << p;
  }
}

}  // namespace
}  // namespace test_attention_dropout_cases
