#include "model_equivalence.hpp"

namespace {

strata::models::ModelConfig tiny_gpt() {
  strata::models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 64;
  c.vocab_size = 96;
  c.make_vocab_size_divisible_by = 4;  // 96 for tp = 1, 2, 4: the same global shapes
  c.seq_length = 8;
  return c;
}

TEST(Gpt, ShardedEqualsUnshardedDouble) {
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(tiny_gpt());
}
TEST(Gpt, ShardedEqualsUnshardedFloat) {
  strata_test::expect_model_equivalence<strata::models::Gpt, float>(tiny_gpt());
}
TEST(Gpt, ShardedEqualsUnshardedWithDropoutAndLabelSmoothing) {
  auto c = tiny_gpt();
  c.hidden_dropout = 0.2;  // masks are drawn per global element, so they match across tp
  c.label_smoothing = 0.1;
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(c);
}
TEST(Gpt, ShardedEqualsUnshardedWithPaddedVocabulary) {
  auto c = tiny_gpt();
  c.vocab_size = 90;                   // padded to 96 for tp = 1, 2, 4: six padded columns
  c.make_vocab_size_divisible_by = 8;  // that the loss must leave out of the softmax
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(c);
}
TEST(Gpt, FiniteDifferenceGradients) { strata_test::expect_finite_difference_gradients<strata::models::Gpt>(tiny_gpt()); }

TEST(Gpt, InvalidConfigRejectedBeforeAllocation) {
  using namespace strata;
  auto c = tiny_gpt();
  c.num_attention_heads = 3;  // does not divide hidden 32, nor tp 2
  EXPECT_THROW(inprocess::run(2, [&](inprocess::communicator& world) {
                 auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2});
                 models::Gpt<strata_test::ModelPolicy<double, false>> model(ctx, c);
               }),
               ConfigError);
}

}  // namespace

namespace {

// bf16 parameters and activations at tp=2 with sequence parallelism against the float run at tp=1:
// loss and gradients within 1e-2 relative (norm of difference over norm of reference).
TEST(Gpt, Bf16ShardedFollowsFloatReference) {
  auto c = tiny_gpt();
  const auto reference = strata_test::run_model<strata::models::Gpt, float, false>(1, c);
  const auto bf16 = strata_test::run_model<strata::models::Gpt, strata::bf16, true>(2, c);
  ASSERT_EQ(bf16.grads.size(), reference.grads.size());
  for (const auto& [name, g] : reference.grads)
    EXPECT_LE(strata_test::relative_error(bf16.grads.at(name), g), 1e-2) << "gradient of " << name;
  for (std::size_t i = 0; i < reference.outputs.size(); ++i)
    EXPECT_LE(strata_test::relative_error(bf16.outputs[i], reference.outputs[i]), 1e-2) << "loss " << i;
}

}  // namespace

namespace {

TEST(ModelConfig, PresetsValidateAtCommonTensorParallelSizes) {
  using strata::models::ModelConfig;
  for (const ModelConfig& c : {ModelConfig::gpt2_124m(), ModelConfig::gpt2_350m(), ModelConfig::llama2_7b(), ModelConfig::llama3_8b()})
    for (int tp : {1, 2, 4})
      for (bool sp : {false, true}) EXPECT_NO_THROW(strata::models::validate(c, strata::ParallelConfig{.tp = tp}, sp)) << tp;
  EXPECT_EQ(ModelConfig::gpt2_124m().padded_vocab(1), 50304);  // Megatron's padding of GPT-2's 50257
  EXPECT_EQ(ModelConfig::gpt2_124m().padded_vocab(8), 51200);
  try {
    strata::models::validate(ModelConfig::gpt2_124m(), strata::ParallelConfig{.tp = 5}, false);
    FAIL() << "tp=5 must be refused for 12 heads";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tp=5"), std::string::npos) << e.what();
  }
  // Llama 3 8B has 8 key/value groups: tp=16 cannot give each rank a whole group.
  EXPECT_THROW(strata::models::validate(ModelConfig::llama3_8b(), strata::ParallelConfig{.tp = 16}, false), strata::ConfigError);
}

}  // namespace

namespace {
TEST(Gpt, NextTokenLogitsMatchTheLossAndAllTpSizes) {
  auto c = tiny_gpt();
  c.vocab_size = 90;  // with padded columns, which the logits leave out
  c.make_vocab_size_divisible_by = 8;
  strata_test::expect_next_token_logits_consistent<strata::models::Gpt>(c);
}
}  // namespace
