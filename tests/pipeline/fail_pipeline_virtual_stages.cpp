// Must fail to compile: 1F1B asked to run two model chunks per rank (only the interleaved schedule
// does). With STRATA_FAILTEST_CONTROL: one chunk, which compiles.
#include <strata/pipeline.hpp>

#ifdef STRATA_FAILTEST_CONTROL
constexpr int kVirtualStages = 1;
#else
constexpr int kVirtualStages = 2;
#endif

using Checked = strata::pipeline::ProvenSchedule<strata::pipeline::ScheduleKind::one_f_one_b, 2, 4, kVirtualStages>;
static_assert(Checked::report.ok(), "The checked schedule must be proved.");
