// Compile-only proof of the pipeline schedules: for pp in {2, 4}, micro-batches in {pp, 2 pp, an
// odd count} and virtual stages in {1, 2} (interleaved only, and with v = 2 only where pp divides
// the micro-batches), every table passes verify_schedule: each backward after its own forward (W
// after its Bi), every send meets its receive, the blocking send/recv simulation finishes on every
// rank, and the peak of micro-batch chunks in flight per rank equals claimed_peak_in_flight.
// Also the bubble of the timing model: 1F1B's is (pp - 1) / (m + pp - 1); the interleaved and the
// zero-bubble schedules' are smaller.
#include <strata/pipeline.hpp>

namespace {

using namespace strata::pipeline;

template <ScheduleKind Kind, int PP, int M, int V = 1>
constexpr bool proved() {
  return ProvenSchedule<Kind, PP, M, V>::report.ok();
}

template <int PP, int M>
constexpr bool every_schedule_proved() {
  bool all = proved<ScheduleKind::gpipe, PP, M>() && proved<ScheduleKind::one_f_one_b, PP, M>() &&
             proved<ScheduleKind::interleaved, PP, M, 1>() && proved<ScheduleKind::zero_bubble, PP, M>();
  if constexpr (M % PP == 0) all = all && proved<ScheduleKind::interleaved, PP, M, 2>();
  return all;
}

static_assert(every_schedule_proved<2, 2>(), "Every schedule with pp=2 and 2 micro-batches must pass its proof.");
static_assert(every_schedule_proved<2, 4>(), "Every schedule with pp=2 and 4 micro-batches must pass its proof.");
static_assert(every_schedule_proved<2, 3>(), "Every schedule with pp=2 and 3 micro-batches must pass its proof.");
static_assert(every_schedule_proved<4, 4>(), "Every schedule with pp=4 and 4 micro-batches must pass its proof.");
static_assert(every_schedule_proved<4, 8>(), "Every schedule with pp=4 and 8 micro-batches must pass its proof.");
static_assert(every_schedule_proved<4, 5>(), "Every schedule with pp=4 and 5 micro-batches must pass its proof.");
static_assert(every_schedule_proved<4, 7>(), "Every schedule with pp=4 and 7 micro-batches must pass its proof.");
// Fewer micro-batches than stages still schedules (except interleaved with virtual stages).
static_assert(every_schedule_proved<4, 1>(), "Every schedule with pp=4 and one micro-batch must pass its proof.");
static_assert(every_schedule_proved<4, 3>(), "Every schedule with pp=4 and 3 micro-batches must pass its proof.");
// More virtual stages.
static_assert(proved<ScheduleKind::interleaved, 2, 4, 4>(), "Interleaved with 4 chunks per rank must pass its proof.");
static_assert(proved<ScheduleKind::interleaved, 4, 12, 3>(), "Interleaved with 3 chunks per rank must pass its proof.");

// The claims, spelled out for one configuration (pp=4, m=8).
constexpr ScheduleShape one_f_one_b{ScheduleKind::one_f_one_b, 4, 8, 1};
static_assert(verify_schedule(one_f_one_b).peak_in_flight[0] == 4 && verify_schedule(one_f_one_b).peak_in_flight[3] == 1,
              "1F1B holds pp - rank micro-batches at its peak.");
constexpr ScheduleShape gpipe{ScheduleKind::gpipe, 4, 8, 1};
static_assert(verify_schedule(gpipe).peak_in_flight[3] == 8, "GPipe holds every micro-batch at its peak.");
constexpr ScheduleShape zero_bubble{ScheduleKind::zero_bubble, 4, 8, 1};
static_assert(verify_schedule(zero_bubble).peak_in_flight[0] == 4 && verify_schedule(zero_bubble).peak_in_flight[3] == 4,
              "ZB-H1 holds pp micro-batches on every rank, the peak of 1F1B's first rank.");
constexpr ScheduleShape interleaved{ScheduleKind::interleaved, 4, 8, 2};
static_assert(verify_schedule(interleaved).peak_in_flight[0] == 11 && verify_schedule(interleaved).peak_in_flight[3] == 5,
              "Interleaved 1F1B holds 2 (pp - rank - 1) + (v - 1) pp + 1 chunks at its peak.");

// Bubbles of the timing model (forward 1, fused backward 2, split halves 1 and 1).
template <int PP, int M>
constexpr bool one_f_one_b_bubble_is_textbook() {
  const ScheduleReport r = verify_schedule({ScheduleKind::one_f_one_b, PP, M, 1});
  return (r.makespan - r.work) * (M + PP - 1) == r.makespan * (PP - 1);  // idle / total = (pp - 1) / (m + pp - 1)
}
static_assert(one_f_one_b_bubble_is_textbook<2, 4>() && one_f_one_b_bubble_is_textbook<4, 8>() &&
                  one_f_one_b_bubble_is_textbook<4, 5>(),
              "The 1F1B bubble must be (pp - 1) / (m + pp - 1).");
static_assert(verify_schedule(gpipe).makespan == verify_schedule(one_f_one_b).makespan,
              "GPipe and 1F1B have the same bubble (1F1B only holds fewer micro-batches).");
static_assert(3 * (verify_schedule(zero_bubble).makespan - verify_schedule(zero_bubble).work) ==
                  verify_schedule(one_f_one_b).makespan - verify_schedule(one_f_one_b).work,
              "ZB-H1 idles a third of 1F1B's time when forward, input and weight gradients cost the same.");
static_assert(verify_schedule(interleaved).bubble_fraction() < verify_schedule(one_f_one_b).bubble_fraction(),
              "Interleaving two chunks per rank must shrink the bubble.");

// The tables themselves: 1F1B on the last rank alternates from the start; ZB-H1's first rank runs
// each W right after its Bi.
static_assert(rank_actions(one_f_one_b, 3)[0] == Action{Op::forward, 0, 0} &&
                  rank_actions(one_f_one_b, 3)[1] == Action{Op::backward, 0, 0},
              "1F1B's last rank has no warm-up.");
static_assert(rank_actions(zero_bubble, 0)[4] == Action{Op::backward_input, 0, 0} &&
                  rank_actions(zero_bubble, 0)[5] == Action{Op::backward_weight, 0, 0},
              "ZB-H1's first rank runs W right after Bi.");

}  // namespace
