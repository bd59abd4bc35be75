// Must fail to compile: a table built in a constant expression for zero micro-batches stops in
// raise_if (schedule_problem's sentence), so it never reaches run time. With
// STRATA_FAILTEST_CONTROL: two micro-batches, which compiles.
#include <strata/pipeline.hpp>

#ifdef STRATA_FAILTEST_CONTROL
constexpr int kMicroBatches = 2;
#else
constexpr int kMicroBatches = 0;
#endif

constexpr std::size_t kActions =
    strata::pipeline::rank_actions({strata::pipeline::ScheduleKind::gpipe, 2, kMicroBatches, 1}, 0).size();
static_assert(kActions == 2 * kMicroBatches, "GPipe runs a forward and a backward per micro-batch.");
