// Multi-latent attention (ModelConfig::multi_latent_attention, Megatron's --multi-latent-attention
// with --q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim), run by the
// Llama and Mixtral models' SelfAttention: sharded over tp in {1, 2, 4}, with and without sequence
// parallelism and with the tensor-parallel rings, equal to the single-rank run in double (loss and
// every gathered gradient), with and without query compression, with and without the latent norms
// (--qk-layernorm under multi-latent attention, as in Megatron), with v narrower than q and k,
// and with a MoE MLP (the loss);
// the whole model's gradients match central differences; selective and full recompute give the
// bits of no recompute; the parameters are Megatron's (replicated down projections and latent norms,
// up and output projections split by heads) and the memory estimate counts them exactly; what it is
// not built for is refused before allocation.
#include <strata/models.hpp>

#include "model_equivalence.hpp"

namespace test_latent_attention_cases {

namespace {

using namespace strata;
using strata::models::ModelConfig;

// A small Llama with DeepSeek-V3's attention (strata_test::with_latent_attention).
ModelConfig tiny_mla(int q_lora_rank = 12) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 40;
  c.vocab_size = 96;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 8;
  c.rope_base = 500.0;
  c = strata_test::with_latent_attention(c);
  c.q_lora_rank = q_lora_rank;
  return c;
}

std::int64_t counted_parameters(const ModelConfig& config, int tp) {
  std::int64_t counted = 0;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, config);
    std::int64_t n = 0;
    model.for_each_parameter([&](Parameter<double>& p) { n += p.value.numel(); });
    if (world.rank() == 0) counted = n;
  });
  return counted;
}

// The loss of one forward of a Llama of `c` on one rank (initialized and fed alike for every `c`).
double loss_of(const ModelConfig& c) {
  double loss = 0;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, c);
    model.init(ctx, 5);
    const auto batch = strata_test::random_batch(c.vocab_size, 2, c.seq_length, 3);
    loss = model.forward(ctx, batch.tokens, batch.labels, batch.mask).first.loss_sum();
  });
  return loss;
}

}  // namespace

TEST(MultiLatentAttention, ShardedEqualsUnsharded) {
  strata_test::expect_model_equivalence<models::Llama, double>(tiny_mla());
}
TEST(MultiLatentAttention, WithoutQueryCompressionShardedEqualsUnsharded) {
  strata_test::expect_model_equivalence<models::Llama, double>(tiny_mla(0));
}
TEST(MultiLatentAttention, WithoutLatentNormsShardedEqualsUnsharded) {  // Megatron's without --qk-layernorm
  auto c = tiny_mla();
  c.qk_layernorm = false;
  strata_test::expect_model_equivalence<models::Llama, double>(c);
  strata_test::expect_finite_difference_gradients<models::Llama>(c);
  EXPECT_NE(loss_of(c), loss_of(tiny_mla()));
  for (const int tp : {1, 2})
    EXPECT_EQ(models::parameters_per_rank(c, models::DecoderShape::llama(), tp), counted_parameters(c, tp)) << "tp=" << tp;
}
TEST(MultiLatentAttention, ValuesAsWideAsKeysShardedEqualsUnsharded) {
  auto c = tiny_mla();
  c.v_head_dim = c.qk_head_dim + c.qk_pos_emb_head_dim;  // no padding of v
  strata_test::expect_model_equivalence<models::Llama, double>(c);
}
TEST(MultiLatentAttention, WithExpertsShardedEqualsUnsharded) {  // DeepSeek's layer: MLA and a MoE MLP
  auto c = tiny_mla();
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.expert_ffn_hidden_size = 24;
  auto loss_at = [&](int tp) {
    double loss = 0;
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      models::Mixtral<strata_test::ModelPolicy<double, true>> model(ctx, c);
      model.init(ctx, 11);
      const auto batch = strata_test::random_batch(c.vocab_size, 2, c.seq_length, 9);
      auto [l, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask);
      model.backward(ctx, saved, 1.0);
      if (world.rank() == 0) loss = l.loss_sum();
    });
    return loss;
  };
  const double one = loss_at(1);
  EXPECT_TRUE(std::isfinite(one));
  for (const int tp : {2, 4}) EXPECT_NEAR(loss_at(tp), one, 1e-12 * std::abs(one)) << "tp=" << tp << " sequence parallel";
}
// DeepSeek-V3's RoPE: interleaved pairs, YaRN (factor 4 over an original context of 4) with the
// softmax scale times mscale(factor, mscale_all_dim)^2.
ModelConfig yarn_mla() {
  auto c = tiny_mla();
  c.rotary_interleaved = true;
  c.yarn_scaling_factor = 4;
  c.yarn_original_max_positions = 4;
  c.yarn_mscale = 1.0;
  c.yarn_mscale_all_dim = 1.0;
  return c;
}
TEST(MultiLatentAttention, YarnAndInterleavedRopeShardedEqualUnshardedAndMatchDifferences) {
  strata_test::expect_model_equivalence<models::Llama, double>(yarn_mla());
  strata_test::expect_finite_difference_gradients<models::Llama>(yarn_mla());
}
TEST(MultiLatentAttention, YarnMscaleAllDimScalesTheSoftmax) {
  // mscale = mscale_all_dim: cos and sin unscaled, so the two differ by the softmax scale alone
  auto without = yarn_mla();
  without.yarn_mscale = without.yarn_mscale_all_dim = 0;
  EXPECT_NE(loss_of(yarn_mla()), loss_of(without));
  // a factor of 1 is plain RoPE (Megatron's default --rotary-scaling-factor under multi-latent attention)
  auto one = yarn_mla(), plain = yarn_mla();
  one.yarn_scaling_factor = 1;
  plain.yarn_scaling_factor = 0;
  EXPECT_EQ(loss_of(one), loss_of(plain));
}

TEST(MultiLatentAttention, FiniteDifferenceGradients) {
  strata_test::expect_finite_difference_gradients<models::Llama>(tiny_mla());
  strata_test::expect_finite_difference_gradients<models::Llama>(tiny_mla(0));
}
TEST(MultiLatentAttention, FusedLossEqualsTheReference) {
  strata_test::expect_fused_classifier_equals_unfused<models::Llama, double>(tiny_mla(), {1, 2});
}

TEST(MultiLatentAttention, RecomputeGivesTheSameBits) {
  using G = models::RecomputeGranularity;
  using M = models::RecomputeMethod;
  auto c = tiny_mla();
  c.attention_dropout = 0.25;  // the recomputed core draws the same mask
  for (const int tp : {1, 2}) {
    auto run = [&](models::RecomputeConfig recompute) {
      std::vector<std::vector<double>> grads;
      double loss = 0;
      inprocess::run(tp, [&](inprocess::communicator& world) {
        auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
        models::Llama<strata_test::ModelPolicy<double, true>> model(ctx, c);
        model.init(ctx, 7);
        model.set_recompute(recompute);
        const auto batch = strata_test::random_batch(c.vocab_size, 2, c.seq_length, 31);
        auto [l, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 1234, models::FusedLoss{1.0 / 16});
        model.backward(ctx, saved, 1.0 / 16);
        if (world.rank() != 0) return;
        loss = l.loss_sum();
        model.for_each_parameter([&](Parameter<double>& p) { grads.emplace_back(p.grad.begin(), p.grad.end()); });
      });
      return std::pair{loss, grads};
    };
    const auto plain = run({});
    for (const models::RecomputeConfig r : {models::RecomputeConfig{G::selective, M::uniform, 1},
                                            models::RecomputeConfig{G::full, M::uniform, 1}}) {
      const auto with = run(r);
      EXPECT_EQ(with.first, plain.first) << "tp=" << tp;
      ASSERT_EQ(with.second.size(), plain.second.size());
      for (std::size_t k = 0; k < plain.second.size(); ++k) EXPECT_EQ(with.second[k], plain.second[k]) << "tp=" << tp << " parameter " << k;
    }
  }
}

TEST(MultiLatentAttention, ParametersAreMegatronsAndTheEstimateCountsThem) {
  std::map<std::string, Shape> shapes;
  const ModelConfig c = tiny_mla();
  inprocess::run(2, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2});
    models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, c);
    if (world.rank() == 0) model.for_each_parameter([&](Parameter<double>& p) { shapes[p.name] = p.value.shape(); });
  });
  const std::string a = "layers.0.attention";
  auto shape_of = [&](const std::string& name) {
    const auto it = shapes.find(a + name);
    return it == shapes.end() ? std::string("missing") : it->second.str();
  };
  EXPECT_EQ(shape_of(".q_down.weight"), Shape({12, 32}).str());          // replicated
  EXPECT_EQ(shape_of(".q_latent_norm.weight"), Shape({12}).str());
  EXPECT_EQ(shape_of(".q_up.weight"), Shape({2 * 10, 12}).str());       // 2 of 4 heads x (6 + 4)
  EXPECT_EQ(shape_of(".kv_down.weight"), Shape({10 + 4, 32}).str());     // [c_kv | k_pe], replicated
  EXPECT_EQ(shape_of(".kv_latent_norm.weight"), Shape({10}).str());
  EXPECT_EQ(shape_of(".kv_up.weight"), Shape({2 * (6 + 5), 10}).str());  // 2 heads x (k_nope + v)
  EXPECT_EQ(shape_of(".proj.weight"), Shape({32, 2 * 5}).str());
  EXPECT_EQ(shape_of(".qkv.weight"), "missing");
  for (const int q_lora_rank : {12, 0})
    for (const int tp : {1, 2, 4}) {
      const ModelConfig config = tiny_mla(q_lora_rank);
      EXPECT_EQ(models::parameters_per_rank(config, models::DecoderShape::llama(), tp), counted_parameters(config, tp))
          << "tp=" << tp << " q_lora_rank=" << q_lora_rank;
    }
}

TEST(MultiLatentAttention, ChangesTheLossFromTheSameModelWithout) {
  auto without = tiny_mla();
  without.multi_latent_attention = false;
  EXPECT_NE(loss_of(tiny_mla()), loss_of(without));
  EXPECT_TRUE(std::isfinite(loss_of(tiny_mla())));
}

TEST(MultiLatentAttention, RefusesWhatItIsNotBuiltFor) {
  auto refusal = [](const ModelConfig& c, ParallelConfig parallel, auto model_tag) {
    using Model = typename decltype(model_tag)::type;
    try {
      inprocess::run(parallel.world_size(), [&](inprocess::communicator& world) {
        auto ctx = ParallelContext<inprocess::communicator>::create(world, parallel);
        Model model(ctx, c);
      });
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  using Llama = models::Llama<strata_test::ModelPolicy<double, false>>;
  using Gpt = models::Gpt<strata_test::ModelPolicy<double, false>>;
  struct Case {
    const char* what;
    ModelConfig config;
    ParallelConfig parallel;
    bool gpt;
    const char* expected;
  };
  std::vector<Case> cases;
  auto wide_v = tiny_mla();
  wide_v.v_head_dim = 11;
  cases.push_back({"v wider than q/k", wide_v, {}, false, "--v-head-dim 11"});
  auto odd_rope = tiny_mla();
  odd_rope.qk_pos_emb_head_dim = 3;
  cases.push_back({"odd rope part", odd_rope, {}, false, "--qk-pos-emb-head-dim"});
  auto window = tiny_mla();
  window.window_size = 3;
  cases.push_back({"sliding window", window, {}, false, "sliding window"});
  cases.push_back({"GPT's learned positions", tiny_mla(), {}, true, "learned positions"});
  for (const Case& k : cases) {
    const std::string message = k.gpt ? refusal(k.config, k.parallel, std::type_identity<Gpt>{})
                                      : refusal(k.config, k.parallel, std::type_identity<Llama>{});
    EXPECT_NE(message.find(k.expected), std::string::npos) << k.what << ": " << message;
  }
}

}  // namespace test_latent_attention_cases
