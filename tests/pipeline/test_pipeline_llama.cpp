// Llama (untied output layer, RoPE, RMSNorm, SwiGLU, grouped-query attention) cut into pipeline stages: every
// schedule equals the single-rank run, on tp 1 and 2 with and without sequence parallelism.
#include "pipeline_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_pipeline_llama_cases {

namespace {

using strata::pipeline::ScheduleKind;

using strata_test::tiny_llama;

TEST(PipelineLlama, GpipeEqualsSingleRank) { strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 1, ScheduleKind::gpipe); }
TEST(PipelineLlama, OneFOneBEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 1, ScheduleKind::one_f_one_b);
}
TEST(PipelineLlama, InterleavedEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 1, ScheduleKind::interleaved);
}
TEST(PipelineLlama, ZeroBubbleEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 1, ScheduleKind::zero_bubble);
}
TEST(PipelineLlama, TensorParallelGpipeEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 2, ScheduleKind::gpipe);
}
TEST(PipelineLlama, TensorParallelOneFOneBEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 2, ScheduleKind::one_f_one_b);
}
TEST(PipelineLlama, TensorParallelInterleavedEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 2, ScheduleKind::interleaved);
}
TEST(PipelineLlama, TensorParallelZeroBubbleEqualsSingleRank) {
  strata_test::expect_pipeline_equivalence<strata::models::Llama, double>(tiny_llama(), 2, ScheduleKind::zero_bubble);
}

}  // namespace
}  // namespace test_pipeline_llama_cases
