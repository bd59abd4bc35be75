#include "model_equivalence.hpp"

#include <cstdlib>
#include <new>

#include <strata/models/memory_estimate.hpp>

// Bytes allocated with operator new by each thread (this test program only).
namespace strata_test {
thread_local std::int64_t allocated_bytes_on_this_thread = 0;
}
void* operator new(std::size_t bytes) {
  strata_test::allocated_bytes_on_this_thread += static_cast<std::int64_t>(bytes);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
// Not inlined: GCC would otherwise see free() reach a pointer from a new-expression
// (-Wmismatched-new-delete), although this operator new is malloc.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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

// "Before allocation", observed: operator new of this test counts the bytes each thread allocates.
// Building the valid model allocates at least its parameter memory (so the counter sees the
// model); the invalid one throws having allocated less than a tenth of it (no parameter tensor).
TEST(Gpt, InvalidConfigRejectedBeforeAllocation) {
  using namespace strata;
  const auto valid = tiny_gpt();
  auto c = valid;
  c.num_attention_heads = 3;  // does not divide hidden 32, nor tp 2
  const std::int64_t parameter_bytes =
      models::parameters_per_rank(valid, models::DecoderShape::gpt(), 2) * static_cast<std::int64_t>(sizeof(double));
  std::vector<std::int64_t> valid_bytes(2), invalid_bytes(2);
  std::vector<std::string> messages(2);
  inprocess::run(2, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2});
    const auto rank = static_cast<std::size_t>(world.rank());
    strata_test::allocated_bytes_on_this_thread = 0;
    {
      models::Gpt<strata_test::ModelPolicy<double, false>> model(ctx, valid);
      valid_bytes[rank] = strata_test::allocated_bytes_on_this_thread;
    }
    strata_test::allocated_bytes_on_this_thread = 0;
    try {
      models::Gpt<strata_test::ModelPolicy<double, false>> model(ctx, c);
    } catch (const ConfigError& e) {
      messages[rank] = e.what();
    }
    invalid_bytes[rank] = strata_test::allocated_bytes_on_this_thread;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_NE(messages[r].find("num_attention_heads=3"), std::string::npos) << "rank " << r << ": " << messages[r];
    EXPECT_GE(valid_bytes[r], parameter_bytes) << "rank " << r << ": the counter missed the valid model's parameters";
    EXPECT_LT(invalid_bytes[r], parameter_bytes / 10) << "rank " << r << ": the invalid model allocated before refusing";
  }
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

namespace {

// The fused chunked classifier (output layer tied to the word embedding) equals the unfused path.
TEST(Gpt, FusedClassifierEqualsUnfusedDouble) {
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Gpt, double>(tiny_gpt(), {1, 2, 4});
}
TEST(Gpt, FusedClassifierEqualsUnfusedFloat) {
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Gpt, float>(tiny_gpt(), {1, 2, 4});
}
TEST(Gpt, FusedClassifierEqualsUnfusedWithDropoutAndLabelSmoothing) {
  auto c = tiny_gpt();
  c.hidden_dropout = 0.2;
  c.label_smoothing = 0.1;
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Gpt, double>(c, {1, 2, 4});
}
// Odd shapes at tp = 3: 18 rows (9 tokens x 2), and a vocabulary of 100 padded to 108 at tp = 3
// (make_vocab_size_divisible_by 4 x tp 3), so the last rank holds 28 real columns of 36.
strata::models::ModelConfig odd_gpt() {
  auto c = tiny_gpt();
  c.hidden_size = 24;
  c.num_attention_heads = 3;
  c.ffn_hidden_size = 36;
  c.vocab_size = 100;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 9;
  c.label_smoothing = 0.05;
  return c;
}
TEST(Gpt, FusedClassifierEqualsUnfusedOddShapesAndPaddedVocabulary) {
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Gpt, double>(odd_gpt(), {1, 3});
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Gpt, float>(odd_gpt(), {3});
}

// backward after a fused forward must be given the forward's loss scale; the error names both. A
// negative block size is refused.
TEST(Gpt, FusedBackwardRefusesAnotherLossScale) {
  using namespace strata;
  const auto c = tiny_gpt();
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Gpt<strata_test::ModelPolicy<double, false>> model(ctx, c);
    model.init(ctx, 1);
    auto batch = strata_test::random_batch(c.vocab_size, 2, c.seq_length, 3);
    auto saved = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 0, models::FusedLoss{0.25}).second;
    try {
      model.backward(ctx, saved, 0.5);
      FAIL() << "a loss scale other than the fused forward's must be refused";
    } catch (const ConfigError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("loss_scale=0.5"), std::string::npos) << message;
      EXPECT_NE(message.find("loss_scale=0.25"), std::string::npos) << message;
    }
    EXPECT_NO_THROW(model.backward(ctx, saved, 0.25));
    try {
      (void)model.forward(ctx, batch.tokens, batch.labels, batch.mask, 0, models::FusedLoss{0.25, {-1}});
      FAIL() << "a negative block size must be refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("rows=-1"), std::string::npos) << e.what();
    }
  });
}

// An input id at or above the real vocabulary names a padding row: refused at every tp (the bound is
// the vocabulary, not the padded one).
TEST(Gpt, InputTokenAtTheVocabularySizeIsRefusedAtEveryTensorParallelSize) {
  using namespace strata;
  auto c = tiny_gpt();
  c.vocab_size = 90;  // padded to 92 rows at tp=1, 96 at tp=2
  for (int tp : {1, 2}) {
    try {
      inprocess::run(tp, [&](inprocess::communicator& world) {
        auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
        models::Gpt<strata_test::ModelPolicy<double, false>> model(ctx, c);
        model.init(ctx, 1);
        auto batch = strata_test::random_batch(c.vocab_size, 2, c.seq_length, 3);
        batch.tokens[3] = static_cast<std::int32_t>(c.vocab_size);  // an input, not a label
        (void)model.forward(ctx, batch.tokens, batch.labels, batch.mask, 0);
      });
      ADD_FAILURE() << "tp=" << tp << ": token id " << c.vocab_size << " of a vocabulary of " << c.vocab_size << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("outside the vocabulary of 90"), std::string::npos) << "tp=" << tp << ": " << e.what();
    }
  }
}

}  // namespace
