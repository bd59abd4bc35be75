// Compile-only checks of the expert groups a ParallelContext carves out (etp, ep, edp, etp-ep,
// etp-ep-pp) and the dense products the MoE layers use (tp-cp, tp-cp-dp), against the groups
// Megatron-Core's two rank generators build for the same layouts (written out by hand).
#include <strata/shard/rank_generator.hpp>

namespace {
using strata::ParallelConfig;
using strata::RankGenerator;

template <std::size_t N>
constexpr bool group_is(const RankGenerator& gen, std::string_view axes, int g, const int (&expected)[N]) {
  if (gen.group_size(axes) != static_cast<int>(N)) return false;
  for (std::size_t i = 0; i < N; ++i)
    if (gen.group_member(axes, g, static_cast<int>(i)) != expected[i]) return false;
  return true;
}

// World 8, tp=2 dp=4, ep=4 etp=1: experts span the tensor-parallel pairs (edp = 2).
constexpr RankGenerator kWideEp(ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 1});
static_assert(kWideEp.group_count("etp") == 8 && kWideEp.group_size("edp") == 2);
static_assert(group_is(kWideEp, "ep", 0, {0, 1, 2, 3}) && group_is(kWideEp, "ep", 1, {4, 5, 6, 7}));
static_assert(group_is(kWideEp, "edp", 0, {0, 4}) && group_is(kWideEp, "edp", 3, {3, 7}));
static_assert(group_is(kWideEp, "etp-ep", 1, {4, 5, 6, 7}) && group_is(kWideEp, "etp-ep-pp", 0, {0, 1, 2, 3}));
static_assert(group_is(kWideEp, "tp-cp", 2, {4, 5}) && group_is(kWideEp, "tp-cp-dp", 0, {0, 1, 2, 3, 4, 5, 6, 7}));

// World 8, tp=2 dp=4, etp=2 ep=2 (Megatron's default etp = tp).
constexpr RankGenerator kTpExperts(ParallelConfig{.tp = 2, .dp = 4, .ep = 2, .etp = 2});
static_assert(group_is(kTpExperts, "etp", 1, {2, 3}) && group_is(kTpExperts, "ep", 1, {1, 3}) &&
              group_is(kTpExperts, "ep", 2, {4, 6}));
static_assert(group_is(kTpExperts, "edp", 1, {1, 5}) && group_is(kTpExperts, "etp-ep", 0, {0, 1, 2, 3}));

// World 8 with pipeline stages: tp=2 pp=2 dp=2, ep=2 etp=1. Experts regroup each stage's 4 ranks.
constexpr RankGenerator kStages(ParallelConfig{.tp = 2, .pp = 2, .dp = 2, .ep = 2, .etp = 1});
static_assert(group_is(kStages, "ep", 0, {0, 1}) && group_is(kStages, "ep", 3, {6, 7}));
static_assert(group_is(kStages, "edp", 0, {0, 2}) && group_is(kStages, "edp", 3, {5, 7}));
static_assert(group_is(kStages, "etp-ep-pp", 0, {0, 1, 4, 5}) && group_is(kStages, "etp-ep-pp", 1, {2, 3, 6, 7}));
static_assert(group_is(kStages, "pp", 2, {2, 6}) && group_is(kStages, "tp-cp-dp", 1, {4, 5, 6, 7}));
static_assert(kStages.expert_coordinates(6) == strata::ExpertCoordinates{.etp = 0, .ep = 0, .edp = 1, .pp = 1});

// World 8 with context parallelism: tp=2 cp=2 dp=2, etp=2 ep=2 (the expert generator has cp = 1).
constexpr RankGenerator kContext(ParallelConfig{.tp = 2, .dp = 2, .cp = 2, .ep = 2, .etp = 2});
static_assert(group_is(kContext, "tp-cp", 0, {0, 1, 2, 3}) && group_is(kContext, "tp-cp", 1, {4, 5, 6, 7}));
static_assert(group_is(kContext, "ep", 0, {0, 2}) && group_is(kContext, "edp", 0, {0, 4}));

// Layouts whose experts do not divide a stage do not make a generator.
static_assert(!strata::validate(ParallelConfig{.tp = 2, .dp = 2, .ep = 4, .etp = 2}).ok());
static_assert(!strata::validate(ParallelConfig{.tp = 2, .pp = 2, .dp = 1, .ep = 4, .etp = 1}).ok());
}  // namespace
