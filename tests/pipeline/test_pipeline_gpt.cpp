// GPT-2 (tied embeddings, learned positions, GELU, biases) cut into pipeline stages: every
// schedule equals the single-rank run, on tp 1 and 2 with and without sequence parallelism.
#include "pipeline_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_pipeline_gpt_cases {

namespace {

using strata::pipeline::ScheduleKind;

strata::models::ModelConfig tiny_gpt() {
  strata::models::ModelConfig c = strata_test::tiny_gpt(8);  // pp=4 x 2 chunks
  c.hidden_dropout = 0.1;  // masks keyed by the global layer index: the same on every split
  return c;
}

TEST(PipelineGpt, GpipeEqualsSingleRank) { strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 1, ScheduleKind::gpipe); }
TEST(PipelineGpt, OneFOneBEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 1, ScheduleKind::one_f_one_b);
}
TEST(PipelineGpt, InterleavedEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 1, ScheduleKind::interleaved);
}
TEST(PipelineGpt, ZeroBubbleEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 1, ScheduleKind::zero_bubble);
}
TEST(PipelineGpt, TensorParallelGpipeEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 2, ScheduleKind::gpipe);
}
TEST(PipelineGpt, TensorParallelOneFOneBEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 2, ScheduleKind::one_f_one_b);
}
TEST(PipelineGpt, TensorParallelInterleavedEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 2, ScheduleKind::interleaved);
}
TEST(PipelineGpt, TensorParallelZeroBubbleEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Gpt, double>(tiny_gpt(), 2, ScheduleKind::zero_bubble);
}

}  // namespace
}  // namespace test_pipeline_gpt_cases
