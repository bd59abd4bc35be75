// Runtime checks of the schedule proof: it rejects broken tables written by hand (so the
// compile-time proofs of static_pipeline_schedules.cpp are not vacuous), and invalid shapes throw
// ConfigError sentences at run time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <strata/pipeline.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_schedule_cases {

namespace {

using namespace strata::pipeline;

std::string problem_of(const ScheduleShape& shape, const std::vector<std::vector<Action>>& table) {
  return std::string(verify_table(shape, table).problem.message());
}

TEST(ScheduleCheck, GeneratedTablesPassAtRunTime) {
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble})
    for (int pp : {1, 2, 3, 4, 8})
      for (int m = 1; m <= 2 * pp + 1; ++m)
        for (int v : {1, 2, 3}) {
          const ScheduleShape shape{kind, pp, m, v};
          if (!schedule_problem(shape).ok()) continue;
          const ScheduleReport report = verify_schedule(shape);
          EXPECT_TRUE(report.ok()) << schedule_name(kind) << " pp=" << pp << " m=" << m << " v=" << v << ": "
                                   << report.problem.message();
        }
}

TEST(ScheduleCheck, DetectsDeadlockOfUnbatchedGpipeTurn) {
  // GPipe with its last forward and first backward joined into one step: rank 0 then waits for the
  // gradient of micro-batch 0 before sending the activation of micro-batch 1 that rank 1 needs first.
  const ScheduleShape shape{ScheduleKind::gpipe, 2, 2, 1};
  auto table = schedule_table(shape);
  table[0][2].joined = true;  // F1 B0 on rank 0
  EXPECT_NE(problem_of(shape, table).find("deadlock: rank"), std::string::npos) << problem_of(shape, table);
}

TEST(ScheduleCheck, DetectsMismatchedTransfers) {
  // rank 1 runs its forwards in the opposite order: its first receive expects micro-batch 1.
  const ScheduleShape shape{ScheduleKind::gpipe, 2, 2, 1};
  auto table = schedule_table(shape);
  std::swap(table[1][0], table[1][1]);
  EXPECT_NE(problem_of(shape, table).find("carries the activation of micro-batch 0"), std::string::npos)
      << problem_of(shape, table);
}

TEST(ScheduleCheck, DetectsBackwardBeforeForward) {
  const ScheduleShape shape{ScheduleKind::one_f_one_b, 2, 2, 1};
  auto table = schedule_table(shape);
  std::swap(table[1][0], table[1][1]);  // B0 before F0 on the last rank
  EXPECT_NE(problem_of(shape, table).find("before its forward"), std::string::npos) << problem_of(shape, table);
}

TEST(ScheduleCheck, DetectsWeightBeforeInputGradient) {
  const ScheduleShape shape{ScheduleKind::zero_bubble, 2, 2, 1};
  auto table = schedule_table(shape);
  auto& rank0 = table[0];  // F0 F1 Bi0 W0 Bi1 W1
  std::swap(rank0[2], rank0[3]);
  EXPECT_NE(problem_of(shape, table).find("before its backward_input"), std::string::npos) << problem_of(shape, table);
}

TEST(ScheduleCheck, DetectsMissingBackward) {
  const ScheduleShape shape{ScheduleKind::gpipe, 2, 2, 1};
  auto table = schedule_table(shape);
  table[0].pop_back();
  table[1].pop_back();
  EXPECT_NE(problem_of(shape, table).find("never completes micro-batch 1"), std::string::npos) << problem_of(shape, table);
}

TEST(ScheduleCheck, InvalidShapesThrowSentences) {
  try {
    (void)rank_actions({ScheduleKind::interleaved, 4, 6, 2}, 0);
    FAIL() << "an interleaved schedule of 6 micro-batches on pp=4 was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("micro_batches=6; use a multiple of pp, such as 8."), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)rank_actions({ScheduleKind::zero_bubble, 2, 4, 2}, 0), strata::ConfigError);
  EXPECT_THROW((void)rank_actions({ScheduleKind::one_f_one_b, 2, 0, 1}, 0), strata::ConfigError);
  EXPECT_THROW((void)rank_actions({ScheduleKind::one_f_one_b, 2, 2, 1}, 2), strata::ConfigError);
}

TEST(ScheduleCheck, ParsesTheTrainersNames) {
  ScheduleKind kind{};
  ASSERT_TRUE(parse_schedule_kind("zero-bubble", kind));
  EXPECT_EQ(kind, ScheduleKind::zero_bubble);
  ASSERT_TRUE(parse_schedule_kind("1f1b", kind));
  EXPECT_EQ(kind, ScheduleKind::one_f_one_b);
  EXPECT_FALSE(parse_schedule_kind("1F1B-typo", kind));
}

}  // namespace
}  // namespace test_schedule_cases
