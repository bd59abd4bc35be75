// The experts' grouped GEMMs with their group sizes in the backend's memory, on the CPU backend (the
// twins the CUDA kernels are tested against): grouped_gemm_rows against one gemm per group by hand
// (both layouts of B, empty groups, rows past the counts' total set to zero, no group at all), and
// grouped_gemm_weights against the sum over each group's rows by hand (accumulating and writing,
// empty groups zero or untouched); counts that are negative or exceed the rows are refused, naming
// the numbers.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <strata/backend/cpu/backend.hpp>


// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_grouped_gemm_cases {

namespace {

using namespace strata;
using B = cpu::backend;

std::vector<double> random_values(std::size_t n, std::uint64_t key) {
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = 2 * rng::uniform(key, i) - 1;
  return out;
}

TEST(GroupedGemmRows, EachGroupIsItsOwnProductAndTheRowsPastTheCountsAreZero) {
  const index_t n = 5, k = 3, extra = 4;
  const std::vector<std::int32_t> counts = {2, 0, 3, 1};
  const index_t groups = 4, total = 6, rows = total + extra;
  for (bool transpose_b : {true, false}) {
    const auto a = random_values(static_cast<std::size_t>(rows * k), 1);
    std::vector<std::vector<double>> b;
    std::vector<const double*> pb;
    for (index_t g = 0; g < groups; ++g) b.push_back(random_values(static_cast<std::size_t>(n * k), 10 + g));
    for (auto& v : b) pb.push_back(v.data());
    std::vector<double> c(static_cast<std::size_t>(rows * n), 7.0);  // every value must be written
    B::grouped_gemm_rows<double>(transpose_b, groups, counts.data(), rows, n, k, a.data(), pb.data(), c.data());
    index_t row = 0;
    for (index_t g = 0; g < groups; ++g)
      for (index_t r = 0; r < counts[g]; ++r, ++row)
        for (index_t j = 0; j < n; ++j) {
          double want = 0;
          for (index_t i = 0; i < k; ++i)
            want += a[row * k + i] * (transpose_b ? b[g][j * k + i] : b[g][i * n + j]);
          EXPECT_NEAR(c[row * n + j], want, 1e-14) << "group " << g << " row " << r << " col " << j << " tb " << transpose_b;
        }
    for (index_t i = total * n; i < rows * n; ++i) EXPECT_EQ(c[i], 0.0) << "element " << i << " past the counts";
  }
}

TEST(GroupedGemmRows, NoRoutedRowAtAllGivesZeros) {
  const std::vector<std::int32_t> counts = {0, 0};
  const std::vector<double> a(8, 1.0), b(6, 1.0);
  const std::vector<const double*> pb = {b.data(), b.data()};
  std::vector<double> c(12, 3.0);
  B::grouped_gemm_rows<double>(true, 2, counts.data(), 4, 3, 2, a.data(), pb.data(), c.data());
  for (double v : c) EXPECT_EQ(v, 0.0);
}

TEST(GroupedGemmWeights, EachGroupSumsOverItsOwnRows) {
  const index_t m = 4, n = 3;
  const std::vector<std::int32_t> counts = {3, 0, 2};
  const index_t groups = 3, rows = 7;  // 2 rows past the counts: never read
  const auto a = random_values(static_cast<std::size_t>(rows * m), 2);
  const auto b = random_values(static_cast<std::size_t>(rows * n), 3);
  for (bool accumulate : {true, false}) {
    std::vector<std::vector<double>> c(static_cast<std::size_t>(groups), std::vector<double>(m * n, 0.5));
    std::vector<double*> pc;
    for (auto& v : c) pc.push_back(v.data());
    B::grouped_gemm_weights<double, double>(groups, counts.data(), rows, m, n, a.data(), b.data(), pc.data(), accumulate);
    index_t first = 0;
    for (index_t g = 0; g < groups; ++g) {
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
          double want = accumulate ? 0.5 : 0.0;
          for (index_t r = first; r < first + counts[g]; ++r) want += a[r * m + i] * b[r * n + j];
          EXPECT_NEAR(c[g][i * n + j], want, 1e-14) << "group " << g << " accumulate " << accumulate;
        }
      first += counts[g];
    }
  }
}

// f must throw E with every one of `parts` in its message.
template <class E, class F>
void expect_refused(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const E& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(GroupedGemm, CountsThatAreNegativeOrExceedTheRowsAreRefused) {
  const std::vector<double> a(64, 1.0), b(64, 1.0);
  std::vector<double> c(64, 0.0);
  const std::vector<const double*> pb = {b.data(), b.data()};
  std::vector<double*> pc = {c.data(), c.data()};
  const std::vector<std::int32_t> too_many = {3, 4}, negative = {2, -1};
  expect_refused<ShapeError>([&] { B::grouped_gemm_rows<double>(true, 2, too_many.data(), 6, 2, 2, a.data(), pb.data(), c.data()); },
                             {"sum to 7 rows", "6 given"});
  expect_refused<ShapeError>(
      [&] { B::grouped_gemm_weights<double, double>(2, negative.data(), 6, 2, 2, a.data(), b.data(), pc.data(), true); },
      {"group 1", "negative row count -1"});
}

}  // namespace

}  // namespace test_moe_grouped_gemm_cases
