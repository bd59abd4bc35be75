// Compile-only checks of strata/shard/rank_generator.hpp against groups that Megatron-Core's
// RankGenerator.get_ranks produces for the same layouts.
#include <strata/shard/rank_generator.hpp>

#include <array>

namespace {
using strata::Coordinates;
using strata::ParallelConfig;
using strata::RankGenerator;

// True when group g of `axes` is exactly `expected`.
template <std::size_t N>
constexpr bool group_is(const RankGenerator& gen, std::string_view axes, int g, const int (&expected)[N]) {
  if (gen.group_size(axes) != static_cast<int>(N)) return false;
  for (std::size_t i = 0; i < N; ++i)
    if (gen.group_member(axes, g, static_cast<int>(i)) != expected[i]) return false;
  return true;
}

// 16 ranks, tp=2, pp=4, dp=2 (Megatron's documented example).
constexpr RankGenerator kA(ParallelConfig{.tp = 2, .pp = 4, .dp = 2});
static_assert(kA.group_count("tp") == 8 && kA.group_count("pp") == 4 && kA.group_count("dp") == 8);
static_assert(group_is(kA, "tp", 0, {0, 1}) && group_is(kA, "tp", 7, {14, 15}));
static_assert(group_is(kA, "pp", 0, {0, 4, 8, 12}) && group_is(kA, "pp", 3, {3, 7, 11, 15}));
static_assert(group_is(kA, "dp", 0, {0, 2}) && group_is(kA, "dp", 1, {1, 3}) && group_is(kA, "dp", 2, {4, 6}) &&
              group_is(kA, "dp", 7, {13, 15}));
static_assert(group_is(kA, "tp-pp", 1, {2, 3, 6, 7, 10, 11, 14, 15}));
static_assert(kA.coordinates(13) == Coordinates{.tp = 1, .cp = 0, .ep = 0, .dp = 0, .pp = 3});
static_assert(kA.rank_of(Coordinates{.tp = 1, .dp = 1, .pp = 2}) == 11);
static_assert(kA.group_index_of(9, "dp") == 5 && kA.position_in_group(9, "dp") == 0);
static_assert(kA.group_index_of(9, "pp") == 1 && kA.position_in_group(9, "pp") == 2);
static_assert(kA.next_pipeline_rank(9) == 13 && kA.next_pipeline_rank(13) == 1);
static_assert(kA.prev_pipeline_rank(1) == 13 && kA.prev_pipeline_rank(5) == 1);

// 8 ranks, tp=2, cp=2, dp=2.
constexpr RankGenerator kB(ParallelConfig{.tp = 2, .dp = 2, .cp = 2});
static_assert(group_is(kB, "cp", 0, {0, 2}) && group_is(kB, "cp", 3, {5, 7}));
static_assert(group_is(kB, "dp", 2, {2, 6}));
static_assert(group_is(kB, "dp-cp", 0, {0, 2, 4, 6}) && group_is(kB, "cp-dp", 1, {1, 3, 5, 7}));
static_assert(group_is(kB, "tp-cp", 1, {4, 5, 6, 7}));

// Experts: 8 ranks, tp=2, dp=4, ep=2, etp=2 (Megatron's default etp = tp).
constexpr RankGenerator kC(ParallelConfig{.tp = 2, .dp = 4, .ep = 2, .etp = 2});
static_assert(group_is(kC, "ep", 0, {0, 2}) && group_is(kC, "ep", 3, {5, 7}));
static_assert(group_is(kC, "edp", 2, {2, 6}));
static_assert(group_is(kC, "etp", 3, {6, 7}) && group_is(kC, "etp-ep", 1, {4, 5, 6, 7}));
static_assert(kC.coordinates(6).ep == 1 && kC.coordinates(6).dp == 3);
static_assert(kC.expert_coordinates(6) == strata::ExpertCoordinates{.etp = 0, .ep = 1, .edp = 1, .pp = 0});

// Experts spanning the tensor-parallel ranks: tp=2, dp=4, ep=4, etp=1.
constexpr RankGenerator kD(ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 1});
static_assert(group_is(kD, "ep", 1, {4, 5, 6, 7}) && group_is(kD, "edp", 3, {3, 7}));

// Another order: tp-pp-dp.
constexpr RankGenerator kF(ParallelConfig{.tp = 2, .pp = 2, .dp = 2, .etp = 2}, "tp-pp-dp");
static_assert(group_is(kF, "pp", 1, {1, 3}) && group_is(kF, "dp", 3, {3, 7}));
static_assert(kF.next_pipeline_rank(2) == 0);

// The runtime listing works in a constant expression too (transient allocation).
static_assert(kA.groups("pp")[2][1] == 6 && kA.group_of(9, "tp-pp").size() == 8);

// Static in, static out.
std::array<int, kA.group_size("tp-pp")> model_parallel_buffer{};
static_assert(model_parallel_buffer.size() == 8);
template <int Peer>
struct SendTo {
  static constexpr int peer = Peer;
};
static_assert(SendTo<kA.next_pipeline_rank(3)>::peer == 7);
}  // namespace
