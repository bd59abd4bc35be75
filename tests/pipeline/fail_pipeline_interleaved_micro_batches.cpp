// Must fail to compile: the interleaved schedule with two chunks per rank and 6 micro-batches on
// pp=4 (Megatron needs a multiple of pp). With STRATA_FAILTEST_CONTROL: 8 micro-batches, which compiles.
#include <strata/pipeline.hpp>

#ifdef STRATA_FAILTEST_CONTROL
constexpr int kMicroBatches = 8;
#else
constexpr int kMicroBatches = 6;
#endif

using Checked = strata::pipeline::ProvenSchedule<strata::pipeline::ScheduleKind::interleaved, 4, kMicroBatches, 2>;
static_assert(Checked::report.ok(), "The checked schedule must be proved.");
