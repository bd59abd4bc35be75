#include "model_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_llama_cases {

namespace {

strata::models::ModelConfig tiny_llama() {
  strata::models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;  // grouped-query attention, 2 query heads per group
  c.ffn_hidden_size = 48;
  c.vocab_size = 96;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 8;
  c.rope_base = 500.0;
  return c;
}

TEST(Llama, ShardedEqualsUnshardedDouble) {
  strata_test::expect_model_equivalence<strata::models::Llama, double>(tiny_llama());
}
TEST(Llama, ShardedEqualsUnshardedFloat) {
  strata_test::expect_model_equivalence<strata::models::Llama, float>(tiny_llama());
}
// With dropout: the masks are drawn per global element, so every tp size, with and without
// sequence parallelism, still follows the single-rank run.
TEST(Llama, WithDropoutShardedEqualsUnsharded) {
  auto c = tiny_llama();
  c.hidden_dropout = 0.2;
  strata_test::expect_model_equivalence<strata::models::Llama, double>(c);
}

TEST(Llama, FiniteDifferenceGradients) {
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(tiny_llama());
}

TEST(Llama, FewerQueryGroupsThanTpIsRejected) {
  using namespace strata;
  auto c = tiny_llama();
  c.num_query_groups = 2;
  try {
    inprocess::run(4, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 4});
      models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, c);
    });
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("query"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {
TEST(Llama, NextTokenLogitsMatchTheLossAndAllTpSizes) {
  strata_test::expect_next_token_logits_consistent<strata::models::Llama>(tiny_llama());
}
}  // namespace

namespace {

// The fused chunked classifier with Llama's own (untied) output weight equals the unfused path.
TEST(Llama, FusedClassifierEqualsUnfusedDouble) {
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Llama, double>(tiny_llama(), {1, 2, 4});
}
TEST(Llama, FusedClassifierEqualsUnfusedFloat) {
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Llama, float>(tiny_llama(), {1, 2, 4});
}
// Odd shapes at tp = 3: 18 rows, 6 query heads in 3 groups, and a vocabulary of 100 padded to 108,
// with label smoothing.
TEST(Llama, FusedClassifierEqualsUnfusedOddShapesPaddedVocabularyAndLabelSmoothing) {
  auto c = tiny_llama();
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.num_query_groups = 3;
  c.ffn_hidden_size = 36;
  c.vocab_size = 100;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 9;
  c.label_smoothing = 0.1;
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Llama, double>(c, {1, 3});
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Llama, float>(c, {3});
}

}  // namespace
}  // namespace test_llama_cases
