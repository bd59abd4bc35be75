// Must not compile: a layout of 2 x 2 ranks checked against a world of 8 in a constant expression.
// With STRATA_FAILTEST_CONTROL the world has 4 ranks and the file compiles.
#include <strata/shard/parallel_config.hpp>

#ifdef STRATA_FAILTEST_CONTROL
constexpr int kWorld = 4;
#else
constexpr int kWorld = 8;
#endif

constexpr strata::ParallelConfig kLayout = strata::checked(strata::ParallelConfig{.tp = 2, .pp = 2}, kWorld);
static_assert(kLayout.tp == 2);
