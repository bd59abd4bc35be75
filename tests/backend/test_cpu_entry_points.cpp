// Unit tests for the CPU twins of the backend entry points that layers call instead of touching
// elements: element-wise and data movement, GEMM with bias, bias gradient, embeddings, the
// cross-entropy pieces, dropout, initialization at a global index, AdamW, reductions, and the
// vectorized exp under GELU. Each against a direct double computation (or finite differences).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <vector>

#include <strata/backend/cpu.hpp>
#include <strata/core.hpp>
#include <strata/shard/shard_spec.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_cpu_entry_points_cases {

namespace {

using strata::bf16;
using strata::index_t;
using B = strata::cpu::backend;

static_assert(strata::Backend<B>, "cpu::backend models the Backend concept.");
static_assert(std::is_same_v<B::space, strata::space::host>, "cpu::backend works in host memory.");

std::vector<double> random_values(index_t n, std::uint64_t key, double scale = 1.0) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = scale * strata::rng::normal(key, static_cast<std::uint64_t>(i));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Element-wise and data movement

TEST(Elementwise, FillCopyConvertAddScale) {
  std::vector<float> x(7);
  B::fill<float>(x.data(), 7, 2.5);
  for (float v : x) EXPECT_EQ(v, 2.5f);
  std::vector<std::int32_t> ids(3);
  B::fill<std::int32_t>(ids.data(), 3, 7.0);
  EXPECT_EQ(ids[2], 7);
  std::vector<float> y(7);
  const auto a = random_values(7, 1), b = random_values(7, 2);
  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
  B::copy<float>(af.data(), 7, y.data());
  EXPECT_EQ(y, af);
  B::add<float>(af.data(), bf.data(), 7, y.data());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(y[i], af[i] + bf[i]);
  B::add<float>(y.data(), bf.data(), 7, y.data());  // out aliases a
  for (int i = 0; i < 7; ++i) EXPECT_EQ(y[i], (af[i] + bf[i]) + bf[i]);
  std::vector<bf16> h(7);
  B::convert<float, bf16>(af.data(), 7, h.data());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(h[i].bits, bf16(af[i]).bits);
  std::vector<bf16> hs = h;
  B::add<bf16>(h.data(), h.data(), 7, hs.data());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(float(hs[i]), float(bf16(float(h[i]) + float(h[i]))));
  std::vector<double> d(a);
  B::scale<double>(d.data(), 7, -0.75);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(d[i], a[i] * -0.75);
  const double factor = 0.5;
  B::scale_by<double>(d.data(), 7, &factor);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(d[i], a[i] * -0.75 * 0.5);
}

TEST(Elementwise, TransposeSliceAndUnstack) {
  const index_t rows = 3, cols = 5;
  std::vector<std::int32_t> in(rows * cols), out(rows * cols);
  for (index_t i = 0; i < rows * cols; ++i) in[i] = static_cast<std::int32_t>(i);
  B::transpose<std::int32_t>(in.data(), rows, cols, out.data());
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) EXPECT_EQ(out[c * rows + r], in[r * cols + c]);
  std::vector<std::int32_t> slice(rows * 2);
  B::slice_columns<std::int32_t>(in.data(), rows, cols, 2, 2, slice.data());
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < 2; ++j) EXPECT_EQ(slice[r * 2 + j], in[r * cols + 2 + j]);
  // columns 1..3 of `in` into columns 2..4 of a [rows, 6] matrix whose other columns keep their values
  std::vector<std::int32_t> wide(rows * 6, -1);
  B::copy_columns<std::int32_t>(in.data() + 1, cols, rows, 3, wide.data() + 2, 6);
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < 6; ++j) EXPECT_EQ(wide[r * 6 + j], j >= 2 && j < 5 ? in[r * cols + 1 + (j - 2)] : -1);
  // [parts, rows, width] -> [rows, parts * width]
  const index_t parts = 3, width = 2;
  std::vector<float> stacked(parts * rows * width), joined(parts * rows * width);
  for (std::size_t i = 0; i < stacked.size(); ++i) stacked[i] = static_cast<float>(i);
  B::unstack_columns<float>(stacked.data(), parts, rows, width, joined.data());
  for (index_t p = 0; p < parts; ++p)
    for (index_t r = 0; r < rows; ++r)
      for (index_t j = 0; j < width; ++j)
        EXPECT_EQ(joined[r * parts * width + p * width + j], stacked[(p * rows + r) * width + j]);
}

TEST(Elementwise, QkvSplitPlacesHeadsAndMergeInvertsIt) {
  const index_t rows = 4, groups = 2, hpg = 3, d = 5, block = (hpg + 2) * d;
  std::vector<double> qkv(rows * groups * block);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<double>(i);
  std::vector<double> q(rows * groups * hpg * d), k(rows * groups * d), v(rows * groups * d);
  B::qkv_split<double>(qkv.data(), rows, groups, hpg, d, q.data(), k.data(), v.data());
  for (index_t r = 0; r < rows; ++r)
    for (index_t g = 0; g < groups; ++g) {
      for (index_t h = 0; h < hpg; ++h)
        for (index_t e = 0; e < d; ++e)
          EXPECT_EQ(q[((r * groups + g) * hpg + h) * d + e], qkv[(r * groups + g) * block + h * d + e]);
      for (index_t e = 0; e < d; ++e) {
        EXPECT_EQ(k[(r * groups + g) * d + e], qkv[(r * groups + g) * block + hpg * d + e]);
        EXPECT_EQ(v[(r * groups + g) * d + e], qkv[(r * groups + g) * block + (hpg + 1) * d + e]);
      }
    }
  std::vector<double> back(qkv.size(), -1.0);
  B::qkv_merge<double>(q.data(), k.data(), v.data(), rows, groups, hpg, d, back.data());
  EXPECT_EQ(back, qkv);
}

// ---------------------------------------------------------------------------------------------
// GEMM with bias; bias add and gradient

TEST(GemmBias, BiasIsAddedToEveryRowWhenNotAccumulating) {
  const index_t m = 5, n = 4, k = 3;
  const auto a = random_values(m * k, 3), b = random_values(n * k, 4), bias = random_values(n, 5);
  std::vector<double> c(m * n, 99.0);
  B::gemm<double>(false, true, m, n, k, a.data(), b.data(), c.data(), false, bias.data());
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double want = bias[j];
      for (index_t l = 0; l < k; ++l) want += a[i * k + l] * b[j * k + l];
      EXPECT_NEAR(c[i * n + j], want, 1e-14);
    }
  std::vector<bf16> ah(a.size()), bh(b.size()), biash(bias.size()), ch(m * n);
  for (std::size_t i = 0; i < a.size(); ++i) ah[i] = bf16(a[i]);
  for (std::size_t i = 0; i < b.size(); ++i) bh[i] = bf16(b[i]);
  for (std::size_t i = 0; i < bias.size(); ++i) biash[i] = bf16(bias[i]);
  B::gemm<bf16>(false, true, m, n, k, ah.data(), bh.data(), ch.data(), false, biash.data());
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      float want = float(biash[j]);
      for (index_t l = 0; l < k; ++l) want += float(ah[i * k + l]) * float(bh[j * k + l]);
      EXPECT_NEAR(float(ch[i * n + j]), want, std::fabs(want) * 0x1p-8 + 1e-6) << "rounded once";
    }
}

TEST(GemmBias, BiasAddAndBiasGradient) {
  const index_t rows = 6, cols = 3;
  const auto y0 = random_values(rows * cols, 6), bias = random_values(cols, 7);
  std::vector<double> y = y0;
  B::bias_add<double>(y.data(), bias.data(), rows, cols);
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) EXPECT_EQ(y[r * cols + c], y0[r * cols + c] + bias[c]);
  std::vector<double> db(cols, 1.0);  // accumulates
  B::bias_grad<double>(y0.data(), rows, cols, db.data());
  for (index_t c = 0; c < cols; ++c) {
    double want = 1.0;
    for (index_t r = 0; r < rows; ++r) want += y0[r * cols + c];
    EXPECT_EQ(db[c], want);
  }
}

// ---------------------------------------------------------------------------------------------
// Embeddings

TEST(Embedding, GatherHeldRowsZeroOthersAndScatterAddGradient) {
  const index_t vocab_local = 4, h = 3, row_begin = 4;  // this rank holds ids [4, 8)
  const auto weight = random_values(vocab_local * h, 8);
  const std::vector<std::int32_t> tokens = {5, 1, 7, 5, 4};
  std::vector<double> out(tokens.size() * h, 99.0);
  B::embedding_forward<double>(tokens.data(), 5, weight.data(), row_begin, vocab_local, h, out.data());
  for (index_t i = 0; i < 5; ++i)
    for (index_t c = 0; c < h; ++c) {
      const index_t row = tokens[i] - row_begin;
      EXPECT_EQ(out[i * h + c], row >= 0 && row < vocab_local ? weight[row * h + c] : 0.0);
    }
  const auto dout = random_values(5 * h, 9);
  std::vector<double> dweight(vocab_local * h, 0.5);
  B::embedding_backward<double>(tokens.data(), 5, dout.data(), row_begin, vocab_local, h, dweight.data());
  for (index_t c = 0; c < h; ++c) {
    EXPECT_EQ(dweight[1 * h + c], 0.5 + dout[0 * h + c] + dout[3 * h + c]);  // id 5, positions 0 and 3 in order
    EXPECT_EQ(dweight[3 * h + c], 0.5 + dout[2 * h + c]);
    EXPECT_EQ(dweight[0 * h + c], 0.5 + dout[4 * h + c]);
    EXPECT_EQ(dweight[2 * h + c], 0.5);
  }
}

TEST(Embedding, PositionAddAndGradient) {
  const index_t s = 3, b = 2, h = 4, first = 2, max_positions = 6;
  const auto weight = random_values(max_positions * h, 10), x0 = random_values(s * b * h, 11);
  auto x = x0;
  B::position_add<double>(x.data(), weight.data(), s, b, h, first);
  for (index_t t = 0; t < s; ++t)
    for (index_t j = 0; j < b; ++j)
      for (index_t c = 0; c < h; ++c)
        EXPECT_EQ(x[(t * b + j) * h + c], x0[(t * b + j) * h + c] + weight[(first + t) * h + c]);
  std::vector<double> dweight(max_positions * h, 0.0);
  B::position_grad<double>(x0.data(), s, b, h, first, dweight.data());
  for (index_t p = 0; p < max_positions; ++p)
    for (index_t c = 0; c < h; ++c) {
      double want = 0;
      if (p >= first && p < first + s)
        for (index_t j = 0; j < b; ++j) want += x0[((p - first) * b + j) * h + c];
      EXPECT_EQ(dweight[p * h + c], want);
    }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy pieces

// Per-row loss in double over the first `used` columns (label smoothing a over K = used entries).
double cross_entropy_reference(const std::vector<double>& z, index_t r, index_t local, index_t used, index_t label,
                               double a) {
  double m = -std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < used; ++j) m = std::max(m, z[r * local + j]);
  double sum = 0, mean_log_p = 0;
  for (index_t j = 0; j < used; ++j) sum += std::exp(z[r * local + j] - m);
  const double lse = m + std::log(sum);
  for (index_t j = 0; j < used; ++j) mean_log_p += (z[r * local + j] - lse) / used;
  const double nll = lse - z[r * local + label];
  const double s = a * used / (used - 1.0);
  return (1 - s) * nll - s * mean_log_p;
}

TEST(CrossEntropy, PiecesGiveTheLossAndTheLogSumExp) {
  const index_t rows = 4, local = 7, used = 5;  // 2 padded columns
  auto z = random_values(rows * local, 12, 3.0);
  for (index_t r = 0; r < rows; ++r) z[r * local + 5] = z[r * local + 6] = 1e3;  // padding is never read
  const std::vector<std::int32_t> labels = {0, 4, 2, 3};
  for (double a : {0.0, 0.1}) {
    std::vector<double> row_max(rows), sums(3 * rows), loss(rows), lse(rows);
    B::cross_entropy_max<double>(z.data(), rows, local, used, row_max.data());
    B::cross_entropy_sums<double>(z.data(), rows, local, used, row_max.data(), labels.data(), 0, sums.data());
    const double s = a > 0 ? a * used / (used - 1.0) : 0.0;
    B::cross_entropy_loss<double>(sums.data(), row_max.data(), rows, used, s, loss.data(), lse.data());
    for (index_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(loss[r], cross_entropy_reference(z, r, local, used, labels[r], a), 1e-13) << r;
      double direct = 0;
      for (index_t j = 0; j < used; ++j) direct += std::exp(z[r * local + j]);
      EXPECT_NEAR(lse[r], std::log(direct), 1e-13) << r;
    }
  }
  std::vector<double> none(rows);
  B::cross_entropy_max<double>(z.data(), rows, local, 0, none.data());
  EXPECT_EQ(none[0], -std::numeric_limits<double>::infinity());
}

TEST(CrossEntropy, LabelHeldElsewhereContributesZeroTargetLogit) {
  const index_t rows = 2, local = 3;
  const auto z = random_values(rows * local, 13);
  const std::vector<std::int32_t> labels = {1, 4};  // this rank holds [3, 6)
  std::vector<double> row_max(rows), sums(3 * rows);
  B::cross_entropy_max<double>(z.data(), rows, local, local, row_max.data());
  B::cross_entropy_sums<double>(z.data(), rows, local, local, row_max.data(), labels.data(), 3, sums.data());
  EXPECT_EQ(sums[1], 0.0);
  EXPECT_EQ(sums[3 + 1], z[local + 1]);
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesAndZeroesPadding) {
  const index_t rows = 3, local = 6, used = 5;
  auto z = random_values(rows * local, 14, 2.0);
  const std::vector<std::int32_t> labels = {1, 4, 0};
  const auto dloss = random_values(rows, 15);
  const double a = 0.1, s = a * used / (used - 1.0);
  std::vector<double> row_max(rows), sums(3 * rows), loss(rows), lse(rows), dz(rows * local, 99.0);
  B::cross_entropy_max<double>(z.data(), rows, local, used, row_max.data());
  B::cross_entropy_sums<double>(z.data(), rows, local, used, row_max.data(), labels.data(), 0, sums.data());
  B::cross_entropy_loss<double>(sums.data(), row_max.data(), rows, used, s, loss.data(), lse.data());
  B::cross_entropy_backward<double>(z.data(), lse.data(), labels.data(), 0, rows, local, used, used, s, dloss.data(),
                                    dz.data());
  for (index_t r = 0; r < rows; ++r) {
    EXPECT_EQ(dz[r * local + 5], 0.0);
    for (index_t j = 0; j < used; ++j) {
      const double h = 1e-6, saved = z[r * local + j];
      z[r * local + j] = saved + h;
      const double up = cross_entropy_reference(z, r, local, used, labels[r], a);
      z[r * local + j] = saved - h;
      const double down = cross_entropy_reference(z, r, local, used, labels[r], a);
      z[r * local + j] = saved;
      EXPECT_NEAR(dz[r * local + j], dloss[r] * (up - down) / (2 * h), 1e-8) << r << ", " << j;
    }
  }
}

// The chunked classifier writes d logits over the logits: the backward in place gives the bits of
// the backward into another buffer.
TEST(CrossEntropy, BackwardInPlaceEqualsBackwardIntoAnotherBuffer) {
  const index_t rows = 4, local = 7, used = 6, begin = 7, vocab = 13;  // rank 1 of 2, one padded column
  const auto z = random_values(rows * local, 17, 3.0);
  const std::vector<std::int32_t> labels = {8, 2, 12, 7};
  const auto dloss = random_values(rows, 18);
  const double s = 0.1 * vocab / (vocab - 1.0);
  std::vector<double> lse(rows);
  for (index_t r = 0; r < rows; ++r) lse[r] = 1.5 + 0.25 * r;  // any values: both calls read the same
  std::vector<double> into(rows * local, 99.0), in_place = z;
  B::cross_entropy_backward<double>(z.data(), lse.data(), labels.data(), begin, rows, local, used, vocab, s, dloss.data(),
                                    into.data());
  B::cross_entropy_backward<double>(in_place.data(), lse.data(), labels.data(), begin, rows, local, used, vocab, s,
                                    dloss.data(), in_place.data());
  EXPECT_EQ(in_place, into);
  EXPECT_EQ(into[local - 1], 0.0);  // padding
}

// ---------------------------------------------------------------------------------------------
// Reductions

TEST(Reduce, MaskedLossSumSumOfSquaresAndClipFactor) {
  const auto loss = random_values(9, 16), mask = std::vector<double>{1, 0, 1, 1, 0, 1, 1, 1, 0};
  double out = 99;
  B::masked_loss_sum<double>(loss.data(), mask.data(), 9, &out);
  double want = 0;
  for (int i = 0; i < 9; ++i) want += mask[i] * loss[i];
  EXPECT_EQ(out, want);
  std::vector<float> g = {3.0f, 4.0f};
  double acc = 11.0;  // accumulates
  B::sum_of_squares<float>(g.data(), 2, &acc);
  EXPECT_EQ(acc, 36.0);
  double norm = 0, factor = 0, square = 25.0;
  B::clip_factor(&square, 1.0, &norm, &factor);
  EXPECT_EQ(norm, 5.0);
  EXPECT_DOUBLE_EQ(factor, 1.0 / (5.0 + 1e-6));
  B::clip_factor(&square, 10.0, &norm, &factor);
  EXPECT_EQ(factor, 1.0);  // below the threshold: no clipping
  B::clip_factor(&square, 0.0, &norm, &factor);
  EXPECT_EQ(factor, 1.0);  // disabled
}

// The multi-tensor forms give the same bits as the one-tensor calls in list order (empty tensors
// included), for float and double.
template <class X>
void check_many_equals_one_by_one() {
  const std::vector<index_t> sizes{5, 0, 1, 1000, 77};
  std::vector<std::vector<X>> one, many;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto values = random_values(sizes[t], 40 + t);
    one.emplace_back(values.begin(), values.end());
  }
  many = one;
  std::vector<strata::SquaresTensor<X>> read;
  std::vector<strata::TensorRef<X>> write;
  for (auto& v : many) {
    read.push_back({v.data(), static_cast<index_t>(v.size())});
    write.push_back({v.data(), static_cast<index_t>(v.size())});
  }
  double acc_one = 0.25, acc_many = 0.25;
  for (auto& v : one) B::sum_of_squares<X>(v.data(), static_cast<index_t>(v.size()), &acc_one);
  B::sum_of_squares_many<X>(std::span<const strata::SquaresTensor<X>>(read), &acc_many);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(acc_one), std::bit_cast<std::uint64_t>(acc_many));
  const double factor = 0.3;
  for (auto& v : one) B::scale_by<X>(v.data(), static_cast<index_t>(v.size()), &factor);
  B::scale_by_many<X>(std::span<const strata::TensorRef<X>>(write), &factor);
  for (std::size_t t = 0; t < one.size(); ++t)
    for (std::size_t i = 0; i < one[t].size(); ++i) ASSERT_EQ(one[t][i], many[t][i]) << "scale_by_many: tensor " << t << " element " << i;
  B::fill_many<X>(std::span<const strata::TensorRef<X>>(write), 0.0);
  for (const auto& v : many)
    for (X x : v) ASSERT_EQ(x, X(0)) << "fill_many left an element unset";
}

TEST(Reduce, MultiTensorFormsEqualOneByOne) {
  check_many_equals_one_by_one<float>();
  check_many_equals_one_by_one<double>();
}

// ---------------------------------------------------------------------------------------------
// Dropout, GlobalIndexMap and ShardIndexMap

TEST(Dropout, MaskDependsOnGlobalIndexAndBackwardRecomputesIt) {
  const index_t rows = 40, cols = 8, tp = 2;
  const double p = 0.25;
  const std::uint64_t key = 1234;
  std::vector<double> full(rows * cols, 1.0);
  B::dropout_forward<double>(full.data(), rows * cols, strata::GlobalIndexMap::identity(cols), p, key);
  index_t kept = 0;
  for (double v : full) {
    EXPECT_TRUE(v == 0.0 || v == 1.0 / (1.0 - p));
    kept += v != 0.0;
  }
  EXPECT_NEAR(double(kept) / double(rows * cols), 1 - p, 0.08);
  for (int rank = 0; rank < tp; ++rank) {  // sharded<-1>: each rank's mask is its slice of the full one
    const index_t local = cols / tp;
    std::vector<double> shard(rows * local, 1.0), grad(rows * local, 2.0);
    const strata::GlobalIndexMap map{local, cols, rank * local};
    B::dropout_forward<double>(shard.data(), rows * local, map, p, key);
    B::dropout_backward<double>(grad.data(), rows * local, map, p, key);
    for (index_t r = 0; r < rows; ++r)
      for (index_t j = 0; j < local; ++j) {
        EXPECT_EQ(shard[r * local + j], full[r * cols + rank * local + j]);
        EXPECT_EQ(grad[r * local + j], 2.0 * full[r * cols + rank * local + j]);
      }
  }
}

TEST(ShardIndexMap, EqualsGlobalIndexForEverySpec) {
  const strata::Shape shapes[] = {{8, 6}, {12}, {4, 6, 8}, {6, 4}};
  for (const strata::Shape& global : shapes)
    for (int dim = 0; dim < global.rank(); ++dim)
      for (int parts : {1, 2}) 
        for (int stacks : {1, 2})
          for (int rank = 0; rank < parts; ++rank) {
            if (global[dim] % (parts * stacks) != 0) continue;
            const auto spec = strata::ShardSpec::split(dim, rank, parts, stacks);
            const strata::ShardIndexMap map(global, spec);
            const index_t n = strata::local_shape(global, spec).numel();
            for (index_t i = 0; i < n; ++i) ASSERT_EQ(map(i), strata::global_index(global, spec, i, rank)) << global.str() << " dim " << dim << " i " << i;
          }
  const strata::ShardIndexMap replicated(strata::Shape{3, 4}, strata::ShardSpec::replicated());
  for (index_t i = 0; i < 12; ++i) EXPECT_EQ(replicated(i), i);
}

TEST(Init, NormalAtTheGlobalIndexMakesShardsSlicesOfTheWhole) {
  const strata::Shape global{6, 8};
  const std::uint64_t key = strata::rng::parameter_key(7, "w");
  std::vector<float> whole(48);
  B::init_normal<float>(whole.data(), 48, strata::ShardIndexMap(global, strata::ShardSpec::replicated()), key, 0.02);
  for (index_t i = 0; i < 48; ++i) EXPECT_EQ(whole[i], static_cast<float>(0.02 * strata::rng::normal(key, i)));
  for (int rank = 0; rank < 2; ++rank) {
    const auto spec = strata::ShardSpec::split(1, rank, 2);
    std::vector<float> shard(24);
    B::init_normal<float>(shard.data(), 24, strata::ShardIndexMap(global, spec), key, 0.02);
    for (index_t r = 0; r < 6; ++r)
      for (index_t j = 0; j < 4; ++j) EXPECT_EQ(shard[r * 4 + j], whole[r * 8 + rank * 4 + j]);
  }
}

// ---------------------------------------------------------------------------------------------
// AdamW

TEST(AdamWStep, MatchesTheUpdateInDouble) {
  const index_t n = 16;
  const auto w0 = random_values(n, 17), g = random_values(n, 18), m0 = random_values(n, 19, 0.1),
             v0 = random_values(n, 20, 0.1);
  std::vector<double> w = w0, m = m0, v(n);
  for (index_t i = 0; i < n; ++i) v[i] = std::fabs(v0[i]);
  const std::vector<double> vstart = v;
  std::vector<bf16> value(n);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  const int t = 3;
  strata::AdamWStep<double> step{lr, b1, b2, 1 - b1, 1 - b2, eps, lr * wd, 1 - std::pow(b1, t), 1 - std::pow(b2, t)};
  std::vector<float> wf(w.begin(), w.end()), mf(m.begin(), m.end()), vf(v.begin(), v.end()), gf(g.begin(), g.end());
  strata::AdamWStep<float> stepf{float(lr), float(b1), float(b2), float(1 - b1), float(1 - b2), float(eps),
                                 float(lr * wd), float(step.bias_correction1), float(step.bias_correction2)};
  B::adamw_step<bf16>(wf.data(), mf.data(), vf.data(), gf.data(), value.data(), n, stepf);
  std::vector<double> dvalue(n);
  B::adamw_step<double>(w.data(), m.data(), v.data(), g.data(), dvalue.data(), n, step);
  for (index_t i = 0; i < n; ++i) {
    const double mm = b1 * m0[i] + (1 - b1) * g[i], vv = b2 * vstart[i] + (1 - b2) * g[i] * g[i];
    const double want = w0[i] * (1 - lr * wd) - lr * (mm / step.bias_correction1) / (std::sqrt(vv / step.bias_correction2) + eps);
    EXPECT_NEAR(w[i], want, 1e-15);
    EXPECT_EQ(dvalue[i], w[i]);
    EXPECT_NEAR(m[i], mm, 1e-16);
    EXPECT_NEAR(v[i], vv, 1e-16);
    EXPECT_NEAR(wf[i], want, 1e-6);
    EXPECT_EQ(value[i].bits, bf16(wf[i]).bits);  // value = T(main)
  }
}

// ---------------------------------------------------------------------------------------------
// The vectorized exp under GELU and SwiGLU

double float_ulp(double x) {
  const float f = static_cast<float>(std::fabs(x));
  return double(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
}

TEST(VectorExp, FloatWithinTwoUlpDoubleWithinFourHundredthsOfAPicoPercent) {
  double worst_float = 0, worst_double = 0;
  for (double x = -87.0; x <= 87.0; x += 0.00731) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(double(xf));
    worst_float = std::max(worst_float, std::fabs(strata::cpu::vector_exp<float>(xf) - want) / float_ulp(want));
    worst_double = std::max(worst_double, std::fabs(strata::cpu::vector_exp<double>(x * 8) - std::exp(x * 8)) / std::exp(x * 8));
  }
  EXPECT_LE(worst_float, 2.0);
  EXPECT_LE(worst_double, 4e-16);
  EXPECT_EQ(strata::cpu::vector_exp<float>(0.0f), 1.0f);
  EXPECT_EQ(strata::cpu::vector_exp<float>(-1e30f), strata::cpu::vector_exp<float>(-87.0f));  // clamped, finite
  EXPECT_TRUE(std::isfinite(strata::cpu::vector_exp<float>(std::numeric_limits<float>::infinity())));
}

TEST(VectorExp, FloatGeluWithinAFewUlpOfTheFormula) {
  // The reference is x * sigmoid(2u) in double; the error budget is the exp (2 ulp), the rounding
  // of u in float (relative error of a few eps, times |2u| after the exp) and the final roundings.
  double worst = 0;
  for (double x = -6.0; x <= 6.0; x += 0.00137) {
    const float xf = static_cast<float>(x);
    float y = 0;
    strata::cpu::gelu_forward<float>(&xf, 1, &y);
    const double xd = xf, c = std::sqrt(2 / std::numbers::pi);
    const double two_u = 2 * c * (xd + 0.044715 * xd * xd * xd);
    const double want = xd / (1 + std::exp(-two_u));  // = 0.5 x (1 + tanh(u)), without its cancellation
    const double budget = 4.0 + 2 * std::fabs(two_u);  // u takes a few float roundings relative to |u|
    if (std::fabs(want) > 1e-30) worst = std::max(worst, std::fabs(y - want) / float_ulp(want) / budget);
  }
  EXPECT_LE(worst, 1.0);
}

}  // namespace
}  // namespace test_cpu_entry_points_cases
