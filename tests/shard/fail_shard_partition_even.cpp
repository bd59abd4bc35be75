// Must not compile: partition_even of 10 elements into 3 parts in a constant expression. With
// STRATA_FAILTEST_CONTROL it cuts 10 elements into 5 parts and compiles.
#include <strata/shard/partition.hpp>

#ifdef STRATA_FAILTEST_CONTROL
constexpr int kParts = 5;
#else
constexpr int kParts = 3;
#endif

constexpr strata::Range kPiece = strata::partition_even(10, kParts, 0);
static_assert(kPiece.begin == 0);
