// Must not compile: a group of an axis that does not exist ("xp"), asked for in a constant
// expression. With STRATA_FAILTEST_CONTROL the axis is "tp" and the file compiles.
#include <strata/shard/rank_generator.hpp>

#ifdef STRATA_FAILTEST_CONTROL
constexpr std::string_view kAxes = "tp-dp";
#else
constexpr std::string_view kAxes = "xp-dp";
#endif

constexpr strata::RankGenerator kRanks(strata::ParallelConfig{.tp = 2, .dp = 2});
static_assert(kRanks.group_size(kAxes) == 4);
