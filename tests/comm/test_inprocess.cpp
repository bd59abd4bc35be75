// Runtime tests of the in-process communicator: every collective against a serial computation on
// random data, sub-groups, point to point, determinism under random thread timing, and the ways a
// run fails (timeouts, a throwing rank, ranks that disagree, buffers of the wrong size).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <strata/comm.hpp>

namespace {

using strata::bf16;
using strata::CommError;
using strata::fp16;
using strata::ReduceOp;
using strata::ShapeError;
namespace inprocess = strata::inprocess;
using Comm = inprocess::communicator;

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg};

template <class T>
T random_value(std::mt19937_64& rng) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(std::uniform_int_distribution<int>(-1000, 1000)(rng));
  else
    return static_cast<T>(std::uniform_real_distribution<double>(-1.0, 1.0)(rng));
}

template <class T>
std::vector<T> random_vector(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  for (auto& x : v) x = random_value<T>(rng);
  return v;
}

std::size_t random_size(std::size_t lo, std::size_t hi, std::mt19937_64& rng) {
  return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
}

// Counts per rank, about a third of them zero.
std::vector<std::size_t> random_counts(int ranks, std::mt19937_64& rng) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(ranks));
  for (auto& c : counts) c = random_size(0, 2, rng) == 0 ? 0 : random_size(1, 9, rng);
  return counts;
}

template <class T>
double as_double(T v) {
  return static_cast<double>(static_cast<strata::accumulate_t<T>>(v));
}

// The serial reference: element i of the result combines inputs[0][offset + i], inputs[1][...],
// ... in rank order, in accumulate_t<T>, rounded to T once.
template <class T>
std::vector<T> reduce_reference(const std::vector<std::vector<T>>& inputs, std::size_t offset, std::size_t n,
                                ReduceOp op) {
  using A = strata::accumulate_t<T>;
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    A acc = static_cast<A>(inputs[0][offset + i]);
    for (std::size_t p = 1; p < inputs.size(); ++p) {
      A v = static_cast<A>(inputs[p][offset + i]);
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: acc = acc + v; break;
        case ReduceOp::max: acc = std::max(acc, v); break;
        case ReduceOp::min: acc = std::min(acc, v); break;
      }
    }
    if (op == ReduceOp::avg) acc = acc / static_cast<A>(inputs.size());
    out[i] = static_cast<T>(acc);
  }
  return out;
}

template <class T>
void expect_bitwise_equal(const std::vector<T>& actual, const std::vector<T>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << as_double(actual[i]) << ", expected "
                    << as_double(expected[i]);
      return;
    }
  }
}

std::string label(int world, int rank, std::size_t test_case) {
  return "world size " + std::to_string(world) + ", rank " + std::to_string(rank) + ", case " +
         std::to_string(test_case);
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

inprocess::RunOptions short_timeout(double seconds) {
  inprocess::RunOptions options;
  options.timeout = std::chrono::duration<double>(seconds);
  return options;
}

template <class T>
class InprocessCollectives : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, bf16, fp16, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(InprocessCollectives, ElementTypes);

TYPED_TEST(InprocessCollectives, AllReduceEqualsSerialReductionInRankOrder) {
  using T = TypeParam;
  std::mt19937_64 rng(11);
  for (int world = 1; world <= 6; ++world) {
    struct Case {
      ReduceOp op;
      std::vector<std::vector<T>> inputs;
    };
    std::vector<Case> cases;
    for (ReduceOp op : kOps)
      for (int k = 0; k < 3; ++k) {
        std::size_t n = k == 0 ? 0 : random_size(1, 301, rng);
        Case c{op, {}};
        for (int r = 0; r < world; ++r) c.inputs.push_back(random_vector<T>(n, rng));
        cases.push_back(std::move(c));
      }
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      std::vector<std::vector<T>> out;
      for (const Case& c : cases) {
        std::vector<T> buffer = c.inputs[static_cast<std::size_t>(comm.rank())];
        comm.all_reduce(std::span<T>(buffer), c.op);
        out.push_back(std::move(buffer));
      }
      return out;
    });
    for (int r = 0; r < world; ++r)
      for (std::size_t k = 0; k < cases.size(); ++k)
        expect_bitwise_equal(results[static_cast<std::size_t>(r)][k],
                             reduce_reference(cases[k].inputs, 0, cases[k].inputs[0].size(), cases[k].op),
                             label(world, r, k) + " (" + std::string(strata::reduce_op_name(cases[k].op)) + ")");
  }
}

TYPED_TEST(InprocessCollectives, AllGatherConcatenatesRankMajor) {
  using T = TypeParam;
  std::mt19937_64 rng(12);
  for (int world = 1; world <= 6; ++world) {
    std::vector<std::vector<std::vector<T>>> cases;  // [case][rank]
    for (int k = 0; k < 6; ++k) {
      std::size_t n = k == 0 ? 0 : random_size(1, 37, rng);
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(random_vector<T>(n, rng));
      cases.push_back(std::move(inputs));
    }
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      std::vector<std::vector<T>> out;
      const auto me = static_cast<std::size_t>(comm.rank());
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const std::vector<T>& in = cases[k][me];
        std::vector<T> gathered(in.size() * static_cast<std::size_t>(comm.size()));
        if (k % 2 == 0) {
          comm.all_gather(std::span<const T>(in), std::span<T>(gathered));
        } else {  // in place: the input already sits in this rank's block of the output
          std::copy(in.begin(), in.end(), gathered.begin() + static_cast<std::ptrdiff_t>(me * in.size()));
          std::span<T> whole(gathered);
          comm.all_gather(whole.subspan(me * in.size(), in.size()), whole);
        }
        out.push_back(std::move(gathered));
      }
      return out;
    });
    for (std::size_t k = 0; k < cases.size(); ++k) {
      std::vector<T> expected;
      for (const auto& in : cases[k]) expected.insert(expected.end(), in.begin(), in.end());
      for (int r = 0; r < world; ++r) expect_bitwise_equal(results[static_cast<std::size_t>(r)][k], expected, label(world, r, k));
    }
  }
}

TYPED_TEST(InprocessCollectives, AllGatherVConcatenatesUnevenBlocks) {
  using T = TypeParam;
  std::mt19937_64 rng(13);
  for (int world = 1; world <= 6; ++world) {
    std::vector<std::vector<std::size_t>> counts;
    std::vector<std::vector<std::vector<T>>> cases;
    for (int k = 0; k < 5; ++k) {
      counts.push_back(random_counts(world, rng));
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(random_vector<T>(counts.back()[static_cast<std::size_t>(r)], rng));
      cases.push_back(std::move(inputs));
    }
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      std::vector<std::vector<T>> out;
      for (std::size_t k = 0; k < cases.size(); ++k) {
        std::vector<T> gathered(strata::detail::sum_of_counts(counts[k]));
        comm.all_gather_v(std::span<const T>(cases[k][static_cast<std::size_t>(comm.rank())]), std::span<T>(gathered),
                          std::span<const std::size_t>(counts[k]));
        out.push_back(std::move(gathered));
      }
      return out;
    });
    for (std::size_t k = 0; k < cases.size(); ++k) {
      std::vector<T> expected;
      for (const auto& in : cases[k]) expected.insert(expected.end(), in.begin(), in.end());
      for (int r = 0; r < world; ++r) expect_bitwise_equal(results[static_cast<std::size_t>(r)][k], expected, label(world, r, k));
    }
  }
}

TYPED_TEST(InprocessCollectives, ReduceScatterGivesRankItsReducedBlock) {
  using T = TypeParam;
  std::mt19937_64 rng(14);
  for (int world = 1; world <= 6; ++world) {
    struct Case {
      ReduceOp op;
      std::size_t block;
      std::vector<std::vector<T>> inputs;
    };
    std::vector<Case> cases;
    for (ReduceOp op : kOps)
      for (int k = 0; k < 2; ++k) {
        Case c{op, random_size(0, 29, rng), {}};
        for (int r = 0; r < world; ++r) c.inputs.push_back(random_vector<T>(c.block * static_cast<std::size_t>(world), rng));
        cases.push_back(std::move(c));
      }
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      std::vector<std::vector<T>> out;
      const auto me = static_cast<std::size_t>(comm.rank());
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        if (k % 2 == 0) {
          std::vector<T> block(c.block);
          comm.reduce_scatter(std::span<const T>(c.inputs[me]), std::span<T>(block), c.op);
          out.push_back(std::move(block));
        } else {  // in place: the output is this rank's block of the input
          std::vector<T> in = c.inputs[me];
          std::span<T> whole(in);
          comm.reduce_scatter(std::span<const T>(whole), whole.subspan(me * c.block, c.block), c.op);
          out.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(me * c.block),
                           whole.begin() + static_cast<std::ptrdiff_t>((me + 1) * c.block));
        }
      }
      return out;
    });
    for (int r = 0; r < world; ++r)
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        expect_bitwise_equal(results[static_cast<std::size_t>(r)][k],
                             reduce_reference(c.inputs, static_cast<std::size_t>(r) * c.block, c.block, c.op),
                             label(world, r, k));
      }
  }
}

TYPED_TEST(InprocessCollectives, ReduceScatterVGivesRankItsUnevenBlock) {
  using T = TypeParam;
  std::mt19937_64 rng(15);
  for (int world = 1; world <= 6; ++world) {
    struct Case {
      ReduceOp op;
      std::vector<std::size_t> counts;
      std::vector<std::vector<T>> inputs;
    };
    std::vector<Case> cases;
    for (ReduceOp op : kOps) {
      Case c{op, random_counts(world, rng), {}};
      for (int r = 0; r < world; ++r) c.inputs.push_back(random_vector<T>(strata::detail::sum_of_counts(c.counts), rng));
      cases.push_back(std::move(c));
    }
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      std::vector<std::vector<T>> out;
      for (const Case& c : cases) {
        std::vector<T> block(c.counts[static_cast<std::size_t>(comm.rank())]);
        comm.reduce_scatter_v(std::span<const T>(c.inputs[static_cast<std::size_t>(comm.rank())]), std::span<T>(block),
                              std::span<const std::size_t>(c.counts), c.op);
        out.push_back(std::move(block));
      }
      return out;
    });
    for (int r = 0; r < world; ++r)
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        std::size_t offset = strata::detail::offset_of_block(c.counts, static_cast<std::size_t>(r));
        expect_bitwise_equal(results[static_cast<std::size_t>(r)][k],
                             reduce_reference(c.inputs, offset, c.counts[static_cast<std::size_t>(r)], c.op),
                             label(world, r, k));
      }
  }
}

// The plain serial definition the reductions must match bit for bit: for each element, rank 0's
// value, then ranks 1, 2, ... combined in accumulate_t<T> (integers wrap; max and min take the
// later value when it is greater, smaller, or NaN; a sum keeps the first NaN in rank order,
// quieted), divided by the number of ranks for avg, converted to T once.
template <class T>
std::vector<T> serial_rank_order_reduction(const std::vector<std::vector<T>>& inputs, std::size_t offset,
                                           std::size_t n, ReduceOp op) {
  using A = strata::accumulate_t<T>;
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    A acc = static_cast<A>(inputs[0][offset + i]);
    for (std::size_t p = 1; p < inputs.size(); ++p) {
      const A v = static_cast<A>(inputs[p][offset + i]);
      if (op == ReduceOp::sum || op == ReduceOp::avg) {
        if constexpr (std::is_integral_v<A>)
          acc = static_cast<A>(static_cast<std::make_unsigned_t<A>>(acc) + static_cast<std::make_unsigned_t<A>>(v));
        else
          acc = acc != acc ? acc + acc : acc + v;  // with acc a NaN, acc + v could be either NaN
      } else if (op == ReduceOp::max) {
        if (v > acc || v != v) acc = v;
      } else {
        if (v < acc || v != v) acc = v;
      }
    }
    if (op == ReduceOp::avg) acc = acc / static_cast<A>(inputs.size());
    out[i] = static_cast<T>(acc);
  }
  return out;
}

// Values that reach the edge cases: for floating types random bit patterns (NaN, infinities,
// subnormals, signed zeros) one time in four, otherwise numbers spread over many magnitudes; for
// integers values near the limits one time in four, so sums wrap.
template <class T>
std::vector<T> edge_case_vector(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  for (auto& x : v) {
    const bool edge = rng() % 4 == 0;
    if constexpr (std::is_integral_v<T>) {
      const auto step = static_cast<T>(rng() % 3);
      if (!edge) x = random_value<T>(rng);
      else x = rng() % 2 ? static_cast<T>(std::numeric_limits<T>::max() - step) : static_cast<T>(std::numeric_limits<T>::min() + step);
    } else if (edge) {
      if constexpr (strata::is_half_v<T>) x = T::from_bits(static_cast<std::uint16_t>(rng()));
      else if constexpr (sizeof(T) == 4) x = std::bit_cast<T>(static_cast<std::uint32_t>(rng()));
      else x = std::bit_cast<T>(static_cast<std::uint64_t>(rng()));
    } else {
      const int exponent = static_cast<int>(rng() % 24) - 12;
      x = static_cast<T>(std::ldexp(std::uniform_real_distribution<double>(-1.0, 1.0)(rng), exponent));
    }
  }
  return v;
}

// all_reduce, reduce_scatter (out of place and in place) and reduce_scatter_v on odd sizes on both
// sides of the size where all_reduce switches from every rank reducing the whole buffer to
// reduce-scatter + all-gather, against the serial definition above, for every operation.
TYPED_TEST(InprocessCollectives, ReductionsMatchASerialRankOrderReductionBitForBit) {
  using T = TypeParam;
  std::mt19937_64 rng(16);
  const std::size_t switch_at = inprocess::detail::kWholeReduceBytes / sizeof(T);
  const std::size_t sizes[] = {1, 7, 1023, 1025, 2049, switch_at - 1, switch_at + 1, 3 * switch_at + 17};
  for (int world : {1, 2, 3, 5}) {
    const auto ranks = static_cast<std::size_t>(world);
    struct Case {
      ReduceOp op;
      std::size_t n;
      std::vector<std::vector<T>> inputs;
      std::vector<std::size_t> counts;  // reduce_scatter_v: uneven and odd, summing to n
    };
    std::vector<Case> cases;
    for (ReduceOp op : kOps)
      for (std::size_t n : sizes) {
        Case c{op, n, {}, {}};
        for (int r = 0; r < world; ++r) c.inputs.push_back(edge_case_vector<T>(n, rng));
        std::size_t left = n;
        for (int r = 0; r + 1 < world; ++r) {
          c.counts.push_back(random_size(0, left, rng) | 1);
          c.counts.back() = std::min(c.counts.back(), left);
          left -= c.counts.back();
        }
        c.counts.push_back(left);
        cases.push_back(std::move(c));
      }
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      std::vector<std::vector<T>> out;  // per case: all_reduce, reduce_scatter, in place, reduce_scatter_v
      const auto me = static_cast<std::size_t>(comm.rank());
      for (const Case& c : cases) {
        std::vector<T> buffer = c.inputs[me];
        comm.all_reduce(std::span<T>(buffer), c.op);
        out.push_back(std::move(buffer));

        const std::size_t block = c.n / ranks;
        const std::span<const T> in(c.inputs[me].data(), block * ranks);
        std::vector<T> mine(block);
        comm.reduce_scatter(in, std::span<T>(mine), c.op);
        out.push_back(std::move(mine));

        std::vector<T> whole(in.begin(), in.end());
        comm.reduce_scatter(std::span<const T>(whole), std::span<T>(whole).subspan(me * block, block), c.op);
        out.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(me * block),
                         whole.begin() + static_cast<std::ptrdiff_t>((me + 1) * block));

        std::vector<T> uneven(c.counts[me]);
        comm.reduce_scatter_v(std::span<const T>(c.inputs[me]), std::span<T>(uneven), std::span<const std::size_t>(c.counts),
                              c.op);
        out.push_back(std::move(uneven));
      }
      return out;
    });
    for (std::size_t r = 0; r < ranks; ++r)
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        const std::size_t block = c.n / ranks;
        const std::string what = "world size " + std::to_string(world) + ", rank " + std::to_string(r) + ", " +
                                 std::string(strata::reduce_op_name(c.op)) + ", " + std::to_string(c.n) + " elements";
        const auto& got = results[r];
        expect_bitwise_equal(got[4 * k], serial_rank_order_reduction(c.inputs, 0, c.n, c.op), "all_reduce, " + what);
        const auto expected_block = serial_rank_order_reduction(c.inputs, r * block, block, c.op);
        expect_bitwise_equal(got[4 * k + 1], expected_block, "reduce_scatter, " + what);
        expect_bitwise_equal(got[4 * k + 2], expected_block, "reduce_scatter in place, " + what);
        expect_bitwise_equal(got[4 * k + 3],
                             serial_rank_order_reduction(c.inputs, strata::detail::offset_of_block(c.counts, r),
                                                         c.counts[r], c.op),
                             "reduce_scatter_v, " + what);
      }
  }
}

TYPED_TEST(InprocessCollectives, BroadcastCopiesRootBufferFromEveryRoot) {
  using T = TypeParam;
  std::mt19937_64 rng(16);
  for (int world = 1; world <= 6; ++world) {
    std::vector<std::vector<std::vector<T>>> cases;  // one per root
    for (int root = 0; root < world; ++root) {
      std::size_t n = random_size(0, 41, rng);
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(random_vector<T>(n, rng));
      cases.push_back(std::move(inputs));
    }
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      std::vector<std::vector<T>> out;
      for (int root = 0; root < comm.size(); ++root) {
        std::vector<T> buffer = cases[static_cast<std::size_t>(root)][static_cast<std::size_t>(comm.rank())];
        comm.broadcast(std::span<T>(buffer), root);
        out.push_back(std::move(buffer));
      }
      return out;
    });
    for (int r = 0; r < world; ++r)
      for (int root = 0; root < world; ++root)
        expect_bitwise_equal(results[static_cast<std::size_t>(r)][static_cast<std::size_t>(root)],
                             cases[static_cast<std::size_t>(root)][static_cast<std::size_t>(root)],
                             label(world, r, static_cast<std::size_t>(root)));
  }
}

TYPED_TEST(InprocessCollectives, AllToAllRoutesUnevenBlocksIncludingEmptyOnes) {
  using T = TypeParam;
  std::mt19937_64 rng(17);
  for (int world = 1; world <= 6; ++world) {
    const auto n = static_cast<std::size_t>(world);
    for (int k = 0; k < 3; ++k) {
      std::vector<std::vector<std::size_t>> sends(n);  // sends[s][d]: elements rank s sends rank d
      for (auto& row : sends) row = random_counts(world, rng);
      std::vector<std::vector<std::size_t>> recvs(n, std::vector<std::size_t>(n));
      for (std::size_t s = 0; s < n; ++s)
        for (std::size_t d = 0; d < n; ++d) recvs[d][s] = sends[s][d];
      std::vector<std::vector<T>> inputs;
      for (std::size_t s = 0; s < n; ++s) inputs.push_back(random_vector<T>(strata::detail::sum_of_counts(sends[s]), rng));
      auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
        const auto me = static_cast<std::size_t>(comm.rank());
        std::vector<T> out(strata::detail::sum_of_counts(recvs[me]));
        comm.all_to_all(std::span<const T>(inputs[me]), std::span<const std::size_t>(sends[me]), std::span<T>(out),
                        std::span<const std::size_t>(recvs[me]));
        return out;
      });
      for (std::size_t d = 0; d < n; ++d) {
        std::vector<T> expected;
        for (std::size_t s = 0; s < n; ++s) {
          auto begin = inputs[s].begin() + static_cast<std::ptrdiff_t>(strata::detail::offset_of_block(sends[s], d));
          expected.insert(expected.end(), begin, begin + static_cast<std::ptrdiff_t>(sends[s][d]));
        }
        expect_bitwise_equal(results[d], expected, label(world, static_cast<int>(d), static_cast<std::size_t>(k)));
      }
    }
  }
}

TYPED_TEST(InprocessCollectives, SendRecvRingDeliversMessagesInOrder) {
  using T = TypeParam;
  std::mt19937_64 rng(18);
  for (int world = 1; world <= 6; ++world) {
    const auto n = static_cast<std::size_t>(world);
    std::vector<std::vector<std::vector<T>>> messages(n);  // messages[source][i]
    for (auto& list : messages)
      for (int i = 0; i < 4; ++i) list.push_back(random_vector<T>(random_size(0, 23, rng), rng));
    auto results = inprocess::run_and_collect(world, [&](Comm& comm) {
      const int next = (comm.rank() + 1) % comm.size();
      const int previous = (comm.rank() + comm.size() - 1) % comm.size();
      const auto& mine = messages[static_cast<std::size_t>(comm.rank())];
      const auto& theirs = messages[static_cast<std::size_t>(previous)];
      std::vector<std::vector<T>> received;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        if (i % 2 == 0)
          comm.send(std::span<const T>(mine[i]), next);
        else {
          std::vector<T> copy = mine[i];
          comm.send(std::span<T>(copy), next);  // a span of non-const works too
        }
      }
      for (std::size_t i = 0; i < theirs.size(); ++i) {
        std::vector<T> buffer(theirs[i].size());
        comm.recv(std::span<T>(buffer), previous);
        received.push_back(std::move(buffer));
      }
      return received;
    });
    for (std::size_t r = 0; r < n; ++r) {
      std::size_t previous = (r + n - 1) % n;
      for (std::size_t i = 0; i < messages[previous].size(); ++i)
        expect_bitwise_equal(results[r][i], messages[previous][i], label(world, static_cast<int>(r), i));
    }
  }
}

TEST(InprocessCommunicator, ModelsTheCommunicatorConcept) {
  static_assert(strata::Communicator<Comm>);
  static_assert(strata::is_communicator_v<Comm>);
  static_assert(!strata::is_communicator_v<int>);
  static_assert(std::is_nothrow_move_constructible_v<Comm>);
  Comm empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_THROW(empty.barrier(), CommError);
}

TEST(InprocessCommunicator, RunAndCollectReturnsEachRanksValueAndGroupFacts) {
  auto facts = inprocess::run_and_collect(4, [](Comm& world) {
    return std::vector<int>{world.rank(), world.size(), world.world_rank(), world.world_size(),
                            world.name() == "world" ? 1 : 0};
  });
  ASSERT_EQ(facts.size(), 4u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(facts[static_cast<std::size_t>(r)], (std::vector<int>{r, 4, r, 4, 1}));
  auto doubled = inprocess::run_and_collect<long>(3, [](Comm& world) { return 2 * world.rank(); });
  EXPECT_EQ(doubled, (std::vector<long>{0, 2, 4}));
}

TEST(InprocessCommunicator, Bf16IsReducedInFloatAndRoundedOnce) {
  // 1 + 2^-8 + 2^-8: rounding after each addition would give 1 (ties to even); in float it is
  // 1 + 2^-7, which bf16 holds exactly.
  auto results = inprocess::run_and_collect(3, [](Comm& comm) {
    bf16 value(comm.rank() == 0 ? 1.0f : 0.00390625f);
    comm.all_reduce(std::span<bf16>(&value, 1), ReduceOp::sum);
    return static_cast<float>(value);
  });
  for (float v : results) EXPECT_EQ(v, 1.0078125f);
}

TEST(InprocessCommunicator, SplitFormsTpAndDpGroupsThatRunCollectivesAtTheSameTime) {
  // 6 ranks as tp = 2 (fastest) x dp = 3: tp groups {0,1} {2,3} {4,5}, dp groups {0,2,4} {1,3,5}.
  std::mt19937_64 rng(19);
  constexpr int kWorld = 6, kTp = 2;
  std::vector<std::vector<double>> inputs;
  for (int r = 0; r < kWorld; ++r) inputs.push_back(random_vector<double>(257, rng));
  struct Result {
    int tp_rank, tp_size, dp_rank, dp_size, reversed_rank;
    std::string tp_name, dp_name, default_name;
    std::vector<double> tp_sum, dp_max, tp_then_dp;
  };
  auto results = inprocess::run_and_collect(kWorld, [&](Comm& world) {
    const int r = world.rank();
    Comm tp = world.split(r / kTp, r, "tp");
    Comm dp = world.split(r % kTp, r, "dp");
    Comm reversed = world.split(0, -r);
    Result out{tp.rank(), tp.size(), dp.rank(), dp.size(), reversed.rank(), std::string(tp.name()),
               std::string(dp.name()), std::string(reversed.name()), {}, {}, {}};
    for (int i = 0; i < 3; ++i) {  // interleave the two kinds of groups
      out.tp_sum = inputs[static_cast<std::size_t>(r)];
      tp.all_reduce(std::span<double>(out.tp_sum), ReduceOp::sum);
      out.dp_max = inputs[static_cast<std::size_t>(r)];
      dp.all_reduce(std::span<double>(out.dp_max), ReduceOp::max);
    }
    out.tp_then_dp = out.tp_sum;
    dp.all_reduce(std::span<double>(out.tp_then_dp), ReduceOp::sum);
    EXPECT_EQ(tp.world_rank_of(tp.rank()), r);
    return out;
  });
  std::vector<double> total = reduce_reference(
      std::vector<std::vector<double>>{reduce_reference(std::vector<std::vector<double>>{inputs[0], inputs[1]}, 0, 257, ReduceOp::sum),
                                       reduce_reference(std::vector<std::vector<double>>{inputs[2], inputs[3]}, 0, 257, ReduceOp::sum),
                                       reduce_reference(std::vector<std::vector<double>>{inputs[4], inputs[5]}, 0, 257, ReduceOp::sum)},
      0, 257, ReduceOp::sum);
  for (int r = 0; r < kWorld; ++r) {
    const Result& res = results[static_cast<std::size_t>(r)];
    EXPECT_EQ(res.tp_rank, r % kTp);
    EXPECT_EQ(res.tp_size, kTp);
    EXPECT_EQ(res.dp_rank, r / kTp);
    EXPECT_EQ(res.dp_size, kWorld / kTp);
    EXPECT_EQ(res.reversed_rank, kWorld - 1 - r);
    EXPECT_EQ(res.tp_name, "tp");
    EXPECT_EQ(res.dp_name, "dp");
    EXPECT_EQ(res.default_name, "world.split");
    const int tp0 = r / kTp * kTp;
    expect_bitwise_equal(res.tp_sum,
                         reduce_reference(std::vector<std::vector<double>>{inputs[static_cast<std::size_t>(tp0)],
                                                                           inputs[static_cast<std::size_t>(tp0 + 1)]},
                                          0, 257, ReduceOp::sum),
                         "tp sum on rank " + std::to_string(r));
    std::vector<std::vector<double>> dp_inputs;
    for (int q = r % kTp; q < kWorld; q += kTp) dp_inputs.push_back(inputs[static_cast<std::size_t>(q)]);
    expect_bitwise_equal(res.dp_max, reduce_reference(dp_inputs, 0, 257, ReduceOp::max), "dp max on rank " + std::to_string(r));
    expect_bitwise_equal(res.tp_then_dp, total, "tp then dp sum on rank " + std::to_string(r));
  }
}

TEST(InprocessCommunicator, AllReduceIsBitIdenticalWhateverTheThreadTiming) {
  constexpr int kWorld = 5;
  constexpr std::size_t kSize = 4099;
  std::mt19937_64 rng(20);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<float> v = random_vector<float>(kSize, rng);
    for (std::size_t i = 0; i < kSize; ++i) v[i] *= std::ldexp(1.0f, static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 13) % 40) - 20);
    inputs.push_back(std::move(v));
  }
  const std::vector<float> expected = reduce_reference(inputs, 0, kSize, ReduceOp::sum);
  // The data is sensitive to order: summing in reverse rank order changes some element.
  std::vector<std::vector<float>> reversed(inputs.rbegin(), inputs.rend());
  ASSERT_NE(std::memcmp(expected.data(), reduce_reference(reversed, 0, kSize, ReduceOp::sum).data(), kSize * sizeof(float)), 0);

  constexpr int kRepeats = 40;
  for (int run = 0; run < 3; ++run) {
    auto results = inprocess::run_and_collect(kWorld, [&](Comm& comm) {
      std::mt19937_64 jitter(static_cast<std::uint64_t>(run * 100 + comm.rank()));
      std::vector<std::vector<float>> out;
      for (int i = 0; i < kRepeats; ++i) {
        switch (jitter() % 3) {
          case 0: std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 300)); break;
          case 1: std::this_thread::yield(); break;
          default: break;
        }
        std::vector<float> buffer = inputs[static_cast<std::size_t>(comm.rank())];
        comm.all_reduce(std::span<float>(buffer), ReduceOp::sum);
        out.push_back(std::move(buffer));
      }
      return out;
    });
    for (int r = 0; r < kWorld; ++r)
      for (int i = 0; i < kRepeats; ++i)
        expect_bitwise_equal(results[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)], expected,
                             "run " + std::to_string(run) + ", rank " + std::to_string(r) + ", repeat " + std::to_string(i));
  }
}

// The same for a buffer large enough that all_reduce runs in two steps (each rank reduces one
// block, then copies the others' blocks), interleaved with one-step collectives.
TEST(InprocessCommunicator, TwoStepAllReduceIsBitIdenticalWhateverTheThreadTiming) {
  constexpr int kWorld = 3;
  const std::size_t size = 3 * inprocess::detail::kWholeReduceBytes / sizeof(double) + 11;
  std::mt19937_64 rng(21);
  std::vector<std::vector<double>> inputs;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<double> v = random_vector<double>(size, rng);
    for (std::size_t i = 0; i < size; ++i) v[i] *= std::ldexp(1.0, static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 13) % 80) - 40);
    inputs.push_back(std::move(v));
  }
  const std::vector<double> expected = reduce_reference(inputs, 0, size, ReduceOp::sum);
  const std::vector<double> expected_small = reduce_reference(inputs, 0, 5, ReduceOp::sum);

  constexpr int kRepeats = 12;
  auto results = inprocess::run_and_collect(kWorld, [&](Comm& comm) {
    std::mt19937_64 jitter(static_cast<std::uint64_t>(comm.rank()));
    std::vector<std::vector<double>> out;
    for (int i = 0; i < kRepeats; ++i) {
      switch (jitter() % 3) {
        case 0: std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 300)); break;
        case 1: std::this_thread::yield(); break;
        default: break;
      }
      std::vector<double> buffer = inputs[static_cast<std::size_t>(comm.rank())];
      comm.all_reduce(std::span<double>(buffer), ReduceOp::sum);
      out.push_back(std::move(buffer));
      std::vector<double> small(inputs[static_cast<std::size_t>(comm.rank())].begin(),
                                inputs[static_cast<std::size_t>(comm.rank())].begin() + 5);
      comm.all_reduce(std::span<double>(small), ReduceOp::sum);
      out.push_back(std::move(small));
    }
    return out;
  });
  for (int r = 0; r < kWorld; ++r)
    for (int i = 0; i < kRepeats; ++i) {
      const auto& got = results[static_cast<std::size_t>(r)];
      const std::string what = "rank " + std::to_string(r) + ", repeat " + std::to_string(i);
      expect_bitwise_equal(got[2 * static_cast<std::size_t>(i)], expected, what);
      expect_bitwise_equal(got[2 * static_cast<std::size_t>(i) + 1], expected_small, what + ", small");
    }
}

TEST(InprocessCommunicator, TimeoutNamesGroupRankOperationAndTheMissingRank) {
  // In tp group {0, 1}, rank 0 never calls the all_reduce rank 1 waits in.
  auto started = std::chrono::steady_clock::now();
  auto errors = inprocess::run_collect(
      4,
      [](Comm& world) {
        Comm tp = world.split(world.rank() / 2, world.rank(), "tp");
        if (world.rank() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          return;
        }
        if (world.rank() == 1) {
          std::vector<float> buffer(8, 1.0f);
          tp.all_reduce(std::span<float>(buffer), ReduceOp::sum);
        } else {
          tp.barrier();
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // so rank 1 is the first to time out
          world.barrier();  // stopped by the abort once rank 1 fails
        }
      },
      short_timeout(0.2));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_FALSE(errors[0]);
  ASSERT_TRUE(errors[1]);
  EXPECT_EQ(message_of(errors[1]),
            "inprocess communicator: rank 1 of group 'tp' (world rank 1) timed out after 0.2 s in all_reduce waiting "
            "for rank 0");
  for (int r : {2, 3}) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]);
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), inprocess::AbortedError);
    EXPECT_NE(message_of(errors[static_cast<std::size_t>(r)]).find("aborted because world rank 1 failed"), std::string::npos)
        << message_of(errors[static_cast<std::size_t>(r)]);
  }
}

TEST(InprocessCommunicator, TimeoutComesFromTheEnvironmentWhenNotGiven) {
  ASSERT_EQ(setenv("STRATA_COMM_TIMEOUT_SECONDS", "0.15", 1), 0);
  try {
    inprocess::run(2, [](Comm& world) {
      if (world.rank() == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
      else
        world.barrier();
    });
    ADD_FAILURE() << "the barrier did not time out";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "inprocess communicator: rank 1 of group 'world' timed out after 0.15 s in barrier waiting for rank 0");
  }
  ASSERT_EQ(setenv("STRATA_COMM_TIMEOUT_SECONDS", "soon", 1), 0);
  EXPECT_THROW(inprocess::run(1, [](Comm&) {}), strata::ConfigError);
  ASSERT_EQ(unsetenv("STRATA_COMM_TIMEOUT_SECONDS"), 0);
  EXPECT_DOUBLE_EQ(inprocess::default_timeout().count(), 300.0);
}

TEST(InprocessCommunicator, ARankThatReturnsEarlyFailsItsPeersAtOnce) {
  auto started = std::chrono::steady_clock::now();
  try {
    inprocess::run(3, [](Comm& world) {
      if (world.rank() != 2) world.barrier();
    });
    ADD_FAILURE() << "the barrier completed without rank 2";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("in barrier: rank 2 has already returned from its function"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

TEST(InprocessCommunicator, AThrowingRankStopsThePeersAndRunRethrowsTheOriginal) {
  // Default timeout (300 s): the peers must be woken by the failure, not by their timeout.
  auto started = std::chrono::steady_clock::now();
  std::atomic<int> waiting{0};
  auto body = [&](Comm& world) {
    Comm tp = world.split(world.rank() / 2, world.rank(), "tp");
    if (world.rank() == 3) {
      while (waiting.load() < 3) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      throw std::runtime_error("rank 3 ran out of patience");
    }
    ++waiting;
    std::vector<double> buffer(16, 1.0);
    if (world.rank() == 2)
      tp.all_reduce(std::span<double>(buffer), ReduceOp::sum);  // tp group {2, 3}
    else
      world.all_reduce(std::span<double>(buffer), ReduceOp::sum);
  };
  try {
    inprocess::run(4, body);
    ADD_FAILURE() << "run did not rethrow";
  } catch (const CommError& e) {
    ADD_FAILURE() << "run rethrew a secondary error: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 3 ran out of patience");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));

  waiting = 0;
  auto errors = inprocess::run_collect(4, body);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_THROW(std::rethrow_exception(errors[3]), std::runtime_error);
  EXPECT_EQ(message_of(errors[2]),
            "inprocess communicator: rank 0 of group 'tp' (world rank 2) in all_reduce: aborted because world rank 3 "
            "failed: rank 3 ran out of patience");
  for (int r : {0, 1}) {
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), inprocess::AbortedError);
    EXPECT_EQ(message_of(errors[static_cast<std::size_t>(r)]),
              "inprocess communicator: rank " + std::to_string(r) +
                  " of group 'world' in all_reduce: aborted because world rank 3 failed: rank 3 ran out of patience");
  }
}

TEST(InprocessCommunicator, RanksCallingDifferentCollectivesRaiseCommError) {
  auto expect_mismatch = [](int world_size, auto body, const std::string& fragment) {
    auto errors = inprocess::run_collect(world_size, body, short_timeout(10));
    bool found = false;
    for (const auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const inprocess::AbortedError&) {
      } catch (const CommError& x) {
        found = true;
        EXPECT_NE(std::string(x.what()).find(fragment), std::string::npos) << x.what();
      }
    }
    EXPECT_TRUE(found) << "no rank raised a CommError of its own";
  };
  expect_mismatch(
      2,
      [](Comm& world) {
        std::vector<float> buffer(12);
        if (world.rank() == 0)
          world.all_reduce(std::span<float>(buffer), ReduceOp::sum);
        else
          world.barrier();
      },
      "rank 1 called barrier() while rank 0 called all_reduce<float32>(12 elements, sum); every rank of a group must "
      "call the same collectives in the same order");
  expect_mismatch(
      3,
      [](Comm& world) {
        std::vector<float> buffer(world.rank() == 2 ? 10 : 12);
        world.all_reduce(std::span<float>(buffer), ReduceOp::sum);
      },
      "rank 2 called all_reduce<float32>(10 elements, sum) while rank 0 called all_reduce<float32>(12 elements, sum)");
  expect_mismatch(
      2,
      [](Comm& world) {
        if (world.rank() == 0) {
          std::vector<double> buffer(4);
          world.broadcast(std::span<double>(buffer), 0);
        } else {
          std::vector<float> buffer(4);
          world.broadcast(std::span<float>(buffer), 0);
        }
      },
      "rank 1 called broadcast<float32>(4 elements, root 0) while rank 0 called broadcast<float64>(4 elements, root 0)");
  expect_mismatch(
      2,
      [](Comm& world) {
        std::vector<int> buffer(4);
        world.all_reduce(std::span<int>(buffer), world.rank() == 0 ? ReduceOp::sum : ReduceOp::max);
      },
      "rank 1 called all_reduce<int32>(4 elements, max) while rank 0 called all_reduce<int32>(4 elements, sum)");
  expect_mismatch(
      2,
      [](Comm& world) {
        std::vector<std::size_t> send{1, 2};
        std::vector<std::size_t> recv = world.rank() == 0 ? std::vector<std::size_t>{1, 3} : std::vector<std::size_t>{2, 2};
        std::vector<float> in(3), out(strata::detail::sum_of_counts(recv));
        world.all_to_all(std::span<const float>(in), std::span<const std::size_t>(send), std::span<float>(out),
                         std::span<const std::size_t>(recv));
      },
      "rank 0 expects recv_counts[1] = 3 elements from rank 1, but rank 1 sends it send_counts[0] = 1");
  expect_mismatch(
      2,
      [](Comm& world) {
        std::vector<float> buffer(world.rank() == 0 ? 3 : 5);
        if (world.rank() == 0)
          world.send(std::span<const float>(buffer), 1);
        else
          world.recv(std::span<float>(buffer), 0);
      },
      "rank 0 sent 3 float32 elements but this recv expects 5 float32 elements");
}

TEST(InprocessCommunicator, BuffersOfTheWrongSizeRaiseShapeErrorNamingTheCall) {
  auto expect_shape_error = [](auto body, const std::string& fragment) {
    try {
      inprocess::run(2, body);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_shape_error(
      [](Comm& world) {
        std::vector<float> in(3), out(5);
        world.all_gather(std::span<const float>(in), std::span<float>(out));
      },
      "inprocess communicator: rank 0 of group 'world' in all_gather: out has 5 elements but must have in.size() * "
      "size() = 3 * 2 = 6");
  expect_shape_error(
      [](Comm& world) {
        std::vector<float> in(7), out(3);
        world.reduce_scatter(std::span<const float>(in), std::span<float>(out), ReduceOp::sum);
      },
      "in reduce_scatter: in has 7 elements but must have out.size() * size() = 3 * 2 = 6");
  expect_shape_error(
      [](Comm& world) {
        std::vector<std::size_t> counts{1, 2, 3};
        std::vector<float> in(1), out(6);
        world.all_gather_v(std::span<const float>(in), std::span<float>(out), std::span<const std::size_t>(counts));
      },
      "in all_gather_v: counts has 3 entries but the group has 2 ranks");
  expect_shape_error(
      [](Comm& world) {
        std::vector<float> buffer(8);
        std::span<float> whole(buffer);
        world.all_to_all(std::span<const float>(whole.subspan(0, 4)), std::span<const std::size_t>(std::vector<std::size_t>{2, 2}),
                         whole.subspan(2, 4), std::span<const std::size_t>(std::vector<std::size_t>{2, 2}));
      },
      "in all_to_all: in and out overlap");
  try {
    inprocess::run(2, [](Comm& world) {
      std::vector<float> buffer(2);
      world.broadcast(std::span<float>(buffer), 2);
    });
    ADD_FAILURE() << "no error for a root outside the group";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("in broadcast: root 2 is not a rank of group 'world', which has 2 ranks"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
