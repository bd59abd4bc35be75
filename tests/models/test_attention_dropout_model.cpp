// Attention dropout through the whole model (ModelConfig::attention_dropout): the training forward
// draws it in every layer (the loss moves), tensor-parallel runs with and without sequence
// parallelism follow the single rank (loss and every gathered gradient), activation recompute
// (selective and full) gives the stored forward's bits, and evaluate / next_token_logits run
// without it (the bits of the model built without attention dropout).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_attention_dropout_model_cases {

namespace {

using namespace strata;
using strata_test::Snapshot;

models::ModelConfig tiny(int heads, int groups) {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = heads;
  c.num_query_groups = groups;
  c.ffn_hidden_size = 64;
  c.vocab_size = 64;
  c.make_vocab_size_divisible_by = 4;  // 64 for tp = 1, 2, 4: the same global shapes
  c.seq_length = 8;
  c.attention_dropout = 0.25;
  return c;
}

// Two micro-batches forward and backward (keys 99, 100); the losses and every gathered gradient.
template <template <class> class Model, bool SP>
Snapshot run_model(int tp, const models::ModelConfig& config, models::RecomputeConfig recompute = {}) {
  using P = strata_test::ModelPolicy<double, SP>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    Model<P> model(ctx, config);
    model.init(ctx, 1234);
    model.set_recompute(recompute);
    for (int micro = 0; micro < 2; ++micro) {
      const auto batch = strata_test::random_batch(config.vocab_size, 2, config.seq_length, 77 + 10 * micro);
      auto [loss, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 99 + micro);
      model.backward(ctx, saved, 1.0 / 30);
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back({loss.loss_sum()});
      }
    }
    strata_test::gather_parameters(ctx, model, snapshot, mutex);
  });
  return snapshot;
}

template <template <class> class Model>
void expect_sharded_equals_unsharded(const models::ModelConfig& config) {
  const Snapshot reference = run_model<Model, false>(1, config);
  for (int tp : {2, 4}) {
    strata_test::expect_equivalent(run_model<Model, false>(tp, config), reference, 1e-12, "tp=" + std::to_string(tp));
    strata_test::expect_equivalent(run_model<Model, true>(tp, config), reference, 1e-12, "tp=" + std::to_string(tp) + " SP");
  }
  auto without = config;
  without.attention_dropout = 0;
  const Snapshot plain = run_model<Model, false>(1, without);
  EXPECT_GT(strata_test::relative_error(reference.outputs[0], plain.outputs[0]), 1e-4) << "attention dropout had no effect";
}

TEST(AttentionDropoutModel, GptShardedEqualsUnsharded) { expect_sharded_equals_unsharded<models::Gpt>(tiny(8, 0)); }
TEST(AttentionDropoutModel, LlamaShardedEqualsUnsharded) { expect_sharded_equals_unsharded<models::Llama>(tiny(8, 4)); }

TEST(AttentionDropoutModel, RecomputeGivesTheStoredForwardsBits) {
  using G = models::RecomputeGranularity;
  using M = models::RecomputeMethod;
  auto config = tiny(8, 4);
  config.hidden_dropout = 0.1;
  for (int tp : {1, 2}) {
    const Snapshot stored = run_model<models::Llama, false>(tp, config);
    for (models::RecomputeConfig r : {models::RecomputeConfig{G::selective, M::uniform, 1}, models::RecomputeConfig{G::full, M::uniform, 1}})
      strata_test::expect_equivalent(run_model<models::Llama, false>(tp, config, r), stored, 0.0,
                                     std::string(r.granularity == G::full ? "full" : "selective") + " tp=" + std::to_string(tp));
  }
}

// evaluate and next_token_logits: the bits of the same model (same initial values) built without
// attention and hidden dropout (Megatron evaluates in eval mode), while the training forward's loss
// differs.
TEST(AttentionDropoutModel, EvaluationAndInferenceRunWithoutIt) {
  auto with = tiny(8, 4);
  with.hidden_dropout = 0.1;
  auto without = with;
  without.attention_dropout = 0;
  without.hidden_dropout = 0;
  struct Losses {
    double forward = 0, evaluated = 0;
    std::vector<double> logits;
  };
  auto losses = [](const models::ModelConfig& config) {
    Losses out;
    inprocess::run(2, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2});
      models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, config);
      model.init(ctx, 1234);
      const auto batch = strata_test::random_batch(config.vocab_size, 2, config.seq_length, 5);
      const double forward = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 42).first.loss_sum();
      const double evaluated = model.evaluate(ctx, batch.tokens, batch.labels, batch.mask, 42).loss_sum();
      Tensor<std::int32_t> prompt(Shape{1, config.seq_length});
      for (index_t i = 0; i < config.seq_length; ++i) prompt[i] = batch.tokens[i];
      const auto logits = model.next_token_logits(ctx, prompt, config.seq_length - 1);
      if (world.rank() == 0) out = {forward, evaluated, logits};
    });
    return out;
  };
  const Losses a = losses(with), b = losses(without);
  EXPECT_EQ(a.evaluated, b.evaluated) << "evaluate drew dropout";
  EXPECT_EQ(a.logits, b.logits) << "next_token_logits drew dropout";
  EXPECT_NE(a.forward, b.forward) << "the training forward did not draw dropout";
}

}  // namespace
}  // namespace test_attention_dropout_model_cases
