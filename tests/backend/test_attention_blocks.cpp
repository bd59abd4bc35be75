// Context parallelism's blocks in the CPU kernels (backend/attention_options.hpp): a sequence cut
// into chunks, each query chunk's attention run as blocks against every key chunk at or before it
// (the diagonal causal, with the sink; the others non-causal at their global offsets, without it),
// merged with attention_merge, equals the attention of the whole sequence; and the blocks'
// backward from the merged out and lse sums to the whole backward (dq, dk, dv, the sinks'
// gradient). With sliding windows narrower than a chunk, every block is run, even those wholly
// before every window: rows that see no key of a block give out 0 and lse -inf and change nothing
// in the merge. With and without dropout and sinks, grouped heads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <strata/backend/cpu.hpp>
#include <strata/core.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_attention_blocks_cases {

namespace {

using strata::AttentionDropout;
using strata::AttentionOptions;
using strata::index_t;
using strata::SoftmaxType;

constexpr index_t kChunks = 4, kC = 5, kS = kChunks * kC, kB = 2, kHeads = 4, kGroups = 2, kD = 3;
constexpr index_t kQ = kS * kB * kHeads * kD, kKv = kS * kB * kGroups * kD, kLse = kB * kHeads * kS;
constexpr index_t kQChunk = kC * kB * kHeads * kD, kKvChunk = kC * kB * kGroups * kD, kLseChunk = kB * kHeads * kC;

std::vector<double> random_values(index_t n, std::uint64_t key, double scale = 1.0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = scale * (2.0 * strata::rng::uniform(key, i) - 1.0);
  return v;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// lse [b, heads, s] of the whole sequence <-> [b, heads, c] of chunk `chunk`.
std::vector<double> lse_of_chunk(const std::vector<double>& whole, index_t chunk) {
  std::vector<double> part(static_cast<std::size_t>(kLseChunk));
  for (index_t r = 0; r < kB * kHeads; ++r)
    for (index_t i = 0; i < kC; ++i) part[static_cast<std::size_t>(r * kC + i)] = whole[static_cast<std::size_t>(r * kS + chunk * kC + i)];
  return part;
}

struct Case {
  index_t window;
  SoftmaxType softmax;
  AttentionDropout dropout;
  std::string str() const {
    return "window=" + std::to_string(window) + (softmax == SoftmaxType::learnable ? " learnable sinks" : "") +
           (dropout.active() ? " dropout" : "");
  }
};

void expect_blocks_equal_whole(const Case& x) {
  using namespace strata;
  const double scale = 1.0 / std::sqrt(double(kD));
  const auto q = random_values(kQ, 1, 1.5), k = random_values(kKv, 2, 1.5), v = random_values(kKv, 3),
             dout = random_values(kQ, 4), sinks = random_values(kHeads, 5, 2.0);
  AttentionOptions whole_options{AttentionStrides{}, x.dropout};
  whole_options.window = x.window;
  whole_options.softmax = x.softmax;
  if (x.softmax == SoftmaxType::learnable) whole_options.sinks = sinks.data();
  std::vector<double> sink_grad(static_cast<std::size_t>(kHeads), 0.0);
  whole_options.sink_gradient = sink_grad.data();

  std::vector<double> out(kQ), lse(kLse), dq(kQ), dk(kKv), dv(kKv);
  cpu::attention_forward<double>(q.data(), k.data(), v.data(), kS, kB, kHeads, kGroups, kD, scale, out.data(), lse.data(),
                                 whole_options);
  cpu::attention_backward<double>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), kS, kB, kHeads,
                                  kGroups, kD, scale, dq.data(), dk.data(), dv.data(), whole_options);

  std::vector<double> block_out(kQ), block_lse(kLse), block_dq(kQ, 0.0), block_dk(kKv, 0.0), block_dv(kKv, 0.0);
  std::vector<double> block_sink_grad(static_cast<std::size_t>(kHeads), 0.0);
  std::vector<double> scratch_out(kQChunk), scratch_lse(kLseChunk), scratch_dq(kQChunk), scratch_dk(kKvChunk),
      scratch_dv(kKvChunk);
  int empty_rows = 0;  // rows of run blocks that saw no key
  auto block_options = [&](index_t query_chunk, index_t key_chunk) {
    AttentionOptions o = whole_options;
    o.causal = key_chunk == query_chunk;
    o.query_offset = query_chunk * kC, o.key_offset = key_chunk * kC;
    if (!o.causal) o.softmax = SoftmaxType::vanilla, o.sinks = nullptr;  // the sink joins the diagonal only
    o.sink_gradient = block_sink_grad.data();
    return o;
  };
  for (index_t qc = 0; qc < kChunks; ++qc) {
    std::vector<double> chunk_lse(static_cast<std::size_t>(kLseChunk));
    double* chunk_out = block_out.data() + qc * kQChunk;
    for (index_t kc = qc; kc >= 0; --kc) {  // the diagonal first: it writes
      const AttentionOptions o = block_options(qc, kc);
      const bool writes = kc == qc;
      cpu::attention_forward<double>(q.data() + qc * kQChunk, k.data() + kc * kKvChunk, v.data() + kc * kKvChunk, kC, kB,
                                     kHeads, kGroups, kD, scale, writes ? chunk_out : scratch_out.data(),
                                     writes ? chunk_lse.data() : scratch_lse.data(), o);
      if (writes) continue;
      for (const double l : scratch_lse) empty_rows += l == -std::numeric_limits<double>::infinity();
      for (std::size_t r = 0; r < scratch_lse.size(); ++r)  // a row that saw no key: out 0
        if (scratch_lse[r] == -std::numeric_limits<double>::infinity())
          for (index_t i = 0; i < kD; ++i) {
            const index_t row = static_cast<index_t>(r) % kC, bh = static_cast<index_t>(r) / kC;
            ASSERT_EQ(scratch_out[static_cast<std::size_t>(row * kB * kHeads * kD + bh * kD + i)], 0.0) << x.str();
          }
      cpu::attention_merge<double>(chunk_out, chunk_lse.data(), scratch_out.data(), scratch_lse.data(), kC, kB, kHeads, kD);
    }
    for (index_t r = 0; r < kB * kHeads; ++r)
      for (index_t i = 0; i < kC; ++i)
        block_lse[static_cast<std::size_t>(r * kS + qc * kC + i)] = chunk_lse[static_cast<std::size_t>(r * kC + i)];
  }
  EXPECT_LE(max_difference(block_out, out), 1e-14) << x.str();
  EXPECT_LE(max_difference(block_lse, lse), 1e-14) << x.str();
  if (x.window >= 0 && x.window < kC) {
    EXPECT_GT(empty_rows, 0) << x.str() << ": no block row was wholly outside the window";
  }

  for (index_t qc = 0; qc < kChunks; ++qc) {
    const std::vector<double> chunk_lse = lse_of_chunk(block_lse, qc);
    for (index_t kc = 0; kc <= qc; ++kc) {
      cpu::attention_backward<double>(dout.data() + qc * kQChunk, q.data() + qc * kQChunk, k.data() + kc * kKvChunk,
                                      v.data() + kc * kKvChunk, block_out.data() + qc * kQChunk, chunk_lse.data(), kC, kB,
                                      kHeads, kGroups, kD, scale, scratch_dq.data(), scratch_dk.data(), scratch_dv.data(),
                                      block_options(qc, kc));
      for (index_t i = 0; i < kQChunk; ++i) block_dq[static_cast<std::size_t>(qc * kQChunk + i)] += scratch_dq[static_cast<std::size_t>(i)];
      for (index_t i = 0; i < kKvChunk; ++i) {
        block_dk[static_cast<std::size_t>(kc * kKvChunk + i)] += scratch_dk[static_cast<std::size_t>(i)];
        block_dv[static_cast<std::size_t>(kc * kKvChunk + i)] += scratch_dv[static_cast<std::size_t>(i)];
      }
    }
  }
  EXPECT_LE(max_difference(block_dq, dq), 1e-13) << x.str();
  EXPECT_LE(max_difference(block_dk, dk), 1e-13) << x.str();
  EXPECT_LE(max_difference(block_dv, dv), 1e-13) << x.str();
  EXPECT_LE(max_difference(block_sink_grad, sink_grad), 1e-13) << x.str();
  if (x.softmax == SoftmaxType::learnable) {
    double total = 0;
    for (const double g : sink_grad) total += std::abs(g);
    EXPECT_GT(total, 1e-3) << x.str() << ": the sinks have no gradient";
  }
}

TEST(AttentionBlocks, MergeToTheWholeSequence) {
  const AttentionDropout dropout{0.3, 0xb10c, 1};
  for (const index_t window : {index_t{-1}, index_t{0}, index_t{2}, index_t{4}, index_t{7}, index_t{kS}})
    for (const SoftmaxType softmax : {SoftmaxType::vanilla, SoftmaxType::learnable, SoftmaxType::off_by_one})
      for (const AttentionDropout& d : {AttentionDropout{}, dropout}) expect_blocks_equal_whole({window, softmax, d});
}

// The merge of two rows that saw no key leaves the row as it was (no NaN); a row that saw none
// takes the other block's row whole.
TEST(AttentionBlocks, MergeOfEmptyRows) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> out = {1.0, 2.0, 0.0, 0.0}, lse = {0.5, -inf};
  const std::vector<double> block_out = {0.0, 0.0, 3.0, 4.0}, block_lse = {-inf, -inf};
  strata::cpu::attention_merge<double>(out.data(), lse.data(), block_out.data(), block_lse.data(), 2, 1, 1, 2);
  EXPECT_EQ(out, (std::vector<double>{1.0, 2.0, 0.0, 0.0}));
  EXPECT_EQ(lse[0], 0.5);
  EXPECT_EQ(lse[1], -inf);
  const std::vector<double> other_lse = {-inf, 1.25};
  strata::cpu::attention_merge<double>(out.data(), lse.data(), block_out.data(), other_lse.data(), 2, 1, 1, 2);
  EXPECT_EQ(out, (std::vector<double>{1.0, 2.0, 3.0, 4.0}));
  EXPECT_EQ(lse[1], 1.25);
}

}  // namespace
}  // namespace test_attention_blocks_cases
