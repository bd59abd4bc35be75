// Llama (untied output layer, RoPE, RMSNorm, SwiGLU, grouped-query attention) cut into pipeline stages: every
// schedule equals the single-rank run, on tp 1 and 2 with and without sequence parallelism.
#include "pipeline_equivalence.hpp"

namespace {

using strata::pipeline::ScheduleKind;

strata::models::ModelConfig tiny_llama() {
  strata::models::ModelConfig c;
  c.num_layers = 8;  // pp=4 x 2 chunks
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 32;
  c.vocab_size = 32;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 4;
  return c;
}

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
