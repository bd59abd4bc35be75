// The run-time architecture options of the compiled models (ModelConfig: --add-qkv-bias,
// --qk-layernorm, --apply-layernorm-1p, --kv-channels, --rotary-percent, --rotary-interleaved,
// --use-rope-scaling, --position-embedding-type yarn, --softmax-type off-by-one / learnable,
// --squared-relu, --quick-geglu with gpt-oss's clamp and offset, --window-size with
// --window-attn-skip-freq): each sharded
// over tp in {1, 2, 4}, with and without sequence parallelism, equals the single-rank run in double
// (loss and every gathered gradient); the whole model's gradients match central differences; the
// parameters have the shapes the option implies; impossible shapes are refused before allocation.
#include <strata/checkpoint.hpp>
#include <strata/optim.hpp>

#include "../checkpoint/temp_directory.hpp"
#include "model_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_architecture_options_cases {

namespace {

using strata::models::ModelConfig;

ModelConfig tiny_llama() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.ffn_hidden_size = 48;
  c.vocab_size = 96;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 8;
  c.rope_base = 500.0;
  return c;
}
// Qwen2: biases on q, k, v only.
ModelConfig tiny_qwen2() {
  auto c = tiny_llama();
  c.add_qkv_bias = true;
  return c;
}
// Qwen3: RMSNorm on each head of q and k, and a head dimension of 12 (8 x 12 = 96 != hidden 32).
ModelConfig tiny_qwen3() {
  auto c = tiny_llama();
  c.qk_layernorm = true;
  c.kv_channels = 12;
  return c;
}
ModelConfig tiny_gpt() {
  ModelConfig c = tiny_llama();
  c.num_query_groups = 0;
  return c;
}

// The named parameters' shapes and the (non-)existence of names, on one rank.
template <template <class> class Model>
std::map<std::string, strata::Shape> parameter_shapes(const ModelConfig& config) {
  using namespace strata;
  std::map<std::string, Shape> shapes;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    Model<strata_test::ModelPolicy<double, false>> model(ctx, config);
    model.for_each_parameter([&](Parameter<double>& p) { shapes[p.name] = p.value.shape(); });
  });
  return shapes;
}

TEST(Qwen2, QkvBiasWithoutOutputBias) {
  const auto shapes = parameter_shapes<strata::models::Llama>(tiny_qwen2());
  EXPECT_EQ(shapes.at("layers.0.attention.qkv.bias").numel(), 4 * (2 + 2) * 4);  // groups x (hpg + 2) x d
  EXPECT_EQ(shapes.count("layers.0.attention.proj.bias"), 0u);
  EXPECT_EQ(shapes.count("layers.0.mlp.fc1.bias"), 0u);
}
TEST(Qwen2, ShardedEqualsUnsharded) { strata_test::expect_model_equivalence<strata::models::Llama, double>(tiny_qwen2()); }
TEST(Qwen2, FiniteDifferenceGradients) { strata_test::expect_finite_difference_gradients<strata::models::Llama>(tiny_qwen2()); }

TEST(Qwen3, QkNormWeightsAreOneHeadWideAndProjectionsUseKvChannels) {
  const auto shapes = parameter_shapes<strata::models::Llama>(tiny_qwen3());
  EXPECT_EQ(shapes.at("layers.0.attention.q_norm.weight"), strata::Shape{12});
  EXPECT_EQ(shapes.at("layers.0.attention.k_norm.weight"), strata::Shape{12});
  EXPECT_EQ(shapes.at("layers.0.attention.qkv.weight"), (strata::Shape{4 * (2 + 2) * 12, 32}));
  EXPECT_EQ(shapes.at("layers.0.attention.proj.weight"), (strata::Shape{32, 8 * 12}));
}
TEST(Qwen3, ShardedEqualsUnsharded) { strata_test::expect_model_equivalence<strata::models::Llama, double>(tiny_qwen3()); }
TEST(Qwen3, ShardedEqualsUnshardedFloat) { strata_test::expect_model_equivalence<strata::models::Llama, float>(tiny_qwen3()); }
TEST(Qwen3, FiniteDifferenceGradients) {
  auto c = tiny_qwen3();
  c.kv_channels = 6;
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(c);
}
TEST(Qwen3, SelectiveRecomputeAndFusedLossEqualTheReference) {
  strata_test::expect_fused_classifier_equals_unfused<strata::models::Llama, double>(tiny_qwen3(), {1, 2});
}

// --qk-layernorm with GPT's LayerNorm (OLMo-style q/k LayerNorm with bias), and --apply-layernorm-1p.
TEST(QkLayerNorm, GptWithLayerNormOnQAndKShardedEqualsUnsharded) {
  auto c = tiny_gpt();
  c.qk_layernorm = true;
  const auto shapes = parameter_shapes<strata::models::Gpt>(c);
  EXPECT_EQ(shapes.at("layers.1.attention.q_norm.bias"), strata::Shape{4});
  // Without RoPE a bias added to every key shifts each query's scores by one constant, which the
  // softmax removes: the k norm's bias gradient is zero up to rounding, so it is checked to be that,
  // and every other gradient is compared.
  auto without_key_bias = [](strata_test::Snapshot s) {
    for (int layer = 0; layer < 2; ++layer) {
      const std::string name = "layers." + std::to_string(layer) + ".attention.k_norm.bias";
      EXPECT_LE(strata_test::norm(s.grads.at(name)), 1e-12) << name;
      s.grads.erase(name), s.values.erase(name);
    }
    return s;
  };
  const auto reference = without_key_bias(strata_test::run_model<strata::models::Gpt, double, false>(1, c));
  for (int tp : {2, 4}) {
    strata_test::expect_equivalent(without_key_bias(strata_test::run_model<strata::models::Gpt, double, false>(tp, c)),
                                   reference, 1e-12, "tp=" + std::to_string(tp));
    strata_test::expect_equivalent(without_key_bias(strata_test::run_model<strata::models::Gpt, double, true>(tp, c)),
                                   reference, 1e-12, "tp=" + std::to_string(tp) + " sequence parallel");
  }
  strata_test::expect_finite_difference_gradients<strata::models::Gpt>(c);
}

TEST(LayerNorm1p, GptAndLlamaShardedEqualUnshardedAndMatchDifferences) {
  auto gpt = tiny_gpt();
  gpt.apply_layernorm_1p = true;
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(gpt);
  strata_test::expect_finite_difference_gradients<strata::models::Gpt>(gpt);
  auto llama = tiny_llama();
  llama.apply_layernorm_1p = true;
  llama.qk_layernorm = true;  // the qk norms are zero-centred too
  EXPECT_TRUE(parameter_shapes<strata::models::Llama>(llama).count("layers.0.attention.q_norm.weight"));
  strata_test::expect_model_equivalence<strata::models::Llama, double>(llama);
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(llama);
}

// A zero-centred norm initialized to 0 computes what the plain norm initialized to 1 computes: the
// same losses and gradients at initialization.
TEST(LayerNorm1p, AtInitializationEqualsThePlainModel) {
  auto plain = tiny_gpt();
  auto one_p = plain;
  one_p.apply_layernorm_1p = true;
  auto got = strata_test::run_model<strata::models::Gpt, double, false>(2, one_p);
  auto want = strata_test::run_model<strata::models::Gpt, double, false>(2, plain);
  for (auto& [name, values] : got.values)  // the stored norm weights differ by 1 (compared here); losses and gradients do not
    if (name.find("norm") != std::string::npos) {
      for (std::size_t i = 0; i < values.size(); ++i)
        if (name.find(".bias") == std::string::npos) {
          EXPECT_EQ(values[i] + 1.0, want.values.at(name)[i]) << name;
        }
      values = want.values.at(name);
    }
  strata_test::expect_equivalent(got, want, 1e-14, "1p at init");
}

TEST(KvChannels, GptWithHeadDimensionUnlikeHiddenOverHeadsShardedEqualsUnsharded) {
  auto c = tiny_gpt();
  c.kv_channels = 6;  // 8 heads x 6 = 48 != 32
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(c);
  strata_test::expect_finite_difference_gradients<strata::models::Gpt>(c);
}

TEST(RotaryVariants, PartialInterleavedAndLlama31ScaledRopeShardedEqualUnsharded) {
  auto c = tiny_llama();
  c.rotary_percent = 0.5;
  c.rotary_interleaved = true;
  c.rope_scaling_factor = 8;
  c.rope_original_max_positions = 16;  // all three frequency regimes at these sizes
  strata_test::expect_model_equivalence<strata::models::Llama, double>(c);
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(c);
}

// Each rotary option changes the model's loss (it is not silently ignored).
TEST(RotaryVariants, EachOptionChangesTheLoss) {
  const auto reference = strata_test::run_model<strata::models::Llama, double, false>(1, tiny_llama());
  auto loss_of = [](const ModelConfig& c) {
    return strata_test::run_model<strata::models::Llama, double, false>(1, c).outputs[0][0];
  };
  auto c = tiny_llama();
  c.rotary_percent = 0.5;
  EXPECT_NE(loss_of(c), reference.outputs[0][0]);
  c = tiny_llama();
  c.rotary_interleaved = true;
  EXPECT_NE(loss_of(c), reference.outputs[0][0]);
  c = tiny_llama();
  c.rope_scaling_factor = 8;
  c.rope_original_max_positions = 16;
  EXPECT_NE(loss_of(c), reference.outputs[0][0]);
}

// YaRN (--position-embedding-type yarn): gpt-oss's settings scaled to the tiny model (head dim 4,
// base 500: an original context of 512 positions puts the correction range at pairs 0.30 .. 1.42,
// so pair 0 keeps its frequency and pair 1 is on the ramp).
ModelConfig tiny_yarn() {
  auto c = tiny_llama();
  c.yarn_scaling_factor = 32;
  c.yarn_original_max_positions = 512;
  c.yarn_round_to_int = false;
  return c;
}
TEST(Yarn, ShardedEqualsUnshardedAndMatchesDifferences) {
  strata_test::expect_model_equivalence<strata::models::Llama, double>(tiny_yarn());
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(tiny_yarn());
}
TEST(Yarn, ChangesTheLossAndAFactorOfOneDoesNot) {
  auto loss_of = [](const ModelConfig& c) {
    return strata_test::run_model<strata::models::Llama, double, false>(1, c).outputs[0][0];
  };
  const double reference = loss_of(tiny_llama());
  EXPECT_NE(loss_of(tiny_yarn()), reference);
  auto only_mscale = tiny_llama();  // the frequencies of a factor of 1, with an attention factor of 1: plain RoPE
  only_mscale.yarn_scaling_factor = 1;
  EXPECT_NEAR(loss_of(only_mscale), reference, 1e-13 * std::abs(reference));
}

// Attention sinks (--softmax-type): the learnable logits are a [heads] parameter split over tp with
// the heads; sharded equals unsharded (the sink logits' gradients gathered), every gradient
// matches central differences, off-by-one has no parameter, and both change the loss.
ModelConfig tiny_sinks(strata::SoftmaxType softmax) {
  auto c = tiny_llama();
  c.softmax_type = softmax;
  return c;
}
TEST(AttentionSinks, LearnableLogitsAreOnePerHeadSplitOverTp) {
  const auto shapes = parameter_shapes<strata::models::Llama>(tiny_sinks(strata::SoftmaxType::learnable));
  EXPECT_EQ(shapes.at("layers.0.attention.softmax_offset"), strata::Shape{8});
  EXPECT_EQ(shapes.at("layers.1.attention.softmax_offset"), strata::Shape{8});
  EXPECT_EQ(parameter_shapes<strata::models::Llama>(tiny_sinks(strata::SoftmaxType::off_by_one))
                .count("layers.0.attention.softmax_offset"),
            0u);
}
TEST(AttentionSinks, LearnableLlamaAndOffByOneGptShardedEqualUnshardedAndMatchDifferences) {
  auto learnable = tiny_sinks(strata::SoftmaxType::learnable);
  learnable.window_size = 3;  // gpt-oss: sinks on windowed and full layers
  learnable.window_layers = {1, 0};
  strata_test::expect_model_equivalence<strata::models::Llama, double>(learnable);
  strata_test::expect_model_equivalence<strata::models::Llama, float>(learnable);
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(learnable);
  auto gpt = tiny_gpt();  // GPT reads q, k, v as views of the packed projection
  gpt.softmax_type = strata::SoftmaxType::off_by_one;
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(gpt);
  strata_test::expect_finite_difference_gradients<strata::models::Gpt>(gpt);
  gpt.softmax_type = strata::SoftmaxType::learnable;
  gpt.attention_dropout = 0.2;  // the sink with dropout on the probabilities
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(gpt);
}
// The sink logits are saved under their name and load into another tensor-parallel size (each rank
// its own heads' logits), together with the softmax type the checkpoint records.
TEST(AttentionSinks, CheckpointSavesTheLogitsAndLoadsThemAtAnotherTp) {
  using namespace strata;
  const ModelConfig c = tiny_sinks(SoftmaxType::learnable);
  strata_test::TempDirectory dir("sinks_checkpoint");
  strata_test::Snapshot saved;
  std::mutex mutex;
  inprocess::run(2, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2});
    models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, c);
    model.init(ctx, 1234);
    AdamW<double> optimizer(model);
    save_checkpoint(ctx, dir.path(), 1, model, optimizer, TrainState{.iteration = 1});
    strata_test::gather_parameters(ctx, model, saved, mutex);
  });
  ASSERT_EQ(saved.values.at("layers.1.attention.softmax_offset").size(), 8u);
  for (const int tp : {1, 4}) {
    strata_test::Snapshot loaded;
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, c);
      model.init(ctx, 99);  // other values, overwritten by the load
      AdamW<double> optimizer(model);
      load_checkpoint(ctx, dir.path(), model, optimizer);
      strata_test::gather_parameters(ctx, model, loaded, mutex);
    });
    for (const char* name : {"layers.0.attention.softmax_offset", "layers.1.attention.softmax_offset"})
      EXPECT_EQ(loaded.values.at(name), saved.values.at(name)) << name << " at tp=" << tp;
  }
  // A model without sinks refuses the checkpoint by name.
  std::string message;
  try {
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
      models::Llama<strata_test::ModelPolicy<double, false>> model(ctx, tiny_llama());
      AdamW<double> optimizer(model);
      load_checkpoint(ctx, dir.path(), model, optimizer);
    });
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("softmax"), std::string::npos) << message;
}
TEST(AttentionSinks, ChangeTheLoss) {
  auto loss_of = [](const ModelConfig& c) {
    return strata_test::run_model<strata::models::Llama, double, false>(1, c).outputs[0][0];
  };
  const double reference = loss_of(tiny_llama());
  const double off_by_one = loss_of(tiny_sinks(strata::SoftmaxType::off_by_one));
  const double learnable = loss_of(tiny_sinks(strata::SoftmaxType::learnable));
  EXPECT_NE(off_by_one, reference);
  EXPECT_NE(learnable, reference);
  EXPECT_NE(learnable, off_by_one);
}
TEST(Activations, SquaredReluGptShardedEqualsUnsharded) {
  auto c = tiny_gpt();
  c.activation = strata::MlpActivation::squared_relu;
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(c);
  strata_test::expect_finite_difference_gradients<strata::models::Gpt>(c);
}

TEST(Activations, QuickGegluWithGptOssClampAndOffsetShardedEqualsUnsharded) {
  auto c = tiny_llama();
  c.activation = strata::MlpActivation::quick_geglu;
  c.activation_clamp = 0.05;  // small enough that the tiny model's pre-activations cross it
  c.glu_linear_offset = 1.0;
  strata_test::expect_model_equivalence<strata::models::Llama, double>(c);
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(c);
}

// Sliding-window attention (--window-size; --window-attn-skip-freq's per-layer pattern, as gpt-oss
// alternates windowed and full layers): sharded equals unsharded, gradients match differences, the
// window changes the loss, and a window covering the whole sequence (or on no layer) is the plain
// model bit for bit.
TEST(SlidingWindow, LlamaAndGptShardedEqualUnshardedAndMatchDifferences) {
  auto c = tiny_llama();
  c.window_size = 2;  // of seq 8
  strata_test::expect_model_equivalence<strata::models::Llama, double>(c);
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(c);
  auto g = tiny_gpt();
  g.window_size = 3;
  g.window_layers = {1, 0};  // layer 0 windowed, layer 1 full
  strata_test::expect_model_equivalence<strata::models::Gpt, double>(g);
}

TEST(SlidingWindow, ChangesTheLossUnlessItCoversTheSequence) {
  const auto reference = strata_test::run_model<strata::models::Llama, double, false>(1, tiny_llama());
  auto loss_of = [](const ModelConfig& c) {
    return strata_test::run_model<strata::models::Llama, double, false>(1, c).outputs[0][0];
  };
  auto c = tiny_llama();
  c.window_size = 2;
  EXPECT_NE(loss_of(c), reference.outputs[0][0]);
  c.window_size = c.seq_length - 1;  // every causal key
  EXPECT_EQ(loss_of(c), reference.outputs[0][0]);
  c.window_size = 2;
  c.window_layers = {0, 0};  // on no layer
  EXPECT_EQ(loss_of(c), reference.outputs[0][0]);
  c.window_layers = {0, 1};
  EXPECT_NE(loss_of(c), reference.outputs[0][0]);
}

// --- refusals, before anything is allocated ---------------------------------------------------

template <template <class> class Model>
std::string refusal(const ModelConfig& c, int tp) {
  using namespace strata;
  try {
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      Model<strata_test::ModelPolicy<double, false>> model(ctx, c);
    });
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ArchitectureRefusals, QueryGroupsOfKvChannelsHeadsNotDividedByTp) {
  auto c = tiny_qwen3();
  c.num_attention_heads = 6;
  c.num_query_groups = 3;  // 3 x 12 key/value features cannot split over tp 2
  const std::string message = refusal<strata::models::Llama>(c, 2);
  EXPECT_NE(message.find("query"), std::string::npos) << message;
  EXPECT_NE(message.find("tp"), std::string::npos) << message;
}
TEST(ArchitectureRefusals, HeadsNotDividingHiddenWithoutKvChannels) {
  auto c = tiny_gpt();
  c.num_attention_heads = 6;
  const std::string message = refusal<strata::models::Gpt>(c, 1);
  EXPECT_NE(message.find("kv_channels"), std::string::npos) << message;
}
TEST(ArchitectureRefusals, OddRotaryWidth) {
  auto c = tiny_llama();
  c.rotary_percent = 0.25;  // 4 x 0.25 = 1 dimension
  const std::string message = refusal<strata::models::Llama>(c, 1);
  EXPECT_NE(message.find("rotary_percent=0.25"), std::string::npos) << message;
}
TEST(ArchitectureRefusals, RotaryPercentOutOfRange) {
  auto c = tiny_llama();
  c.rotary_percent = 1.5;
  EXPECT_NE(refusal<strata::models::Llama>(c, 1).find("(0, 1]"), std::string::npos);
}
TEST(ArchitectureRefusals, ClampOnANonGatedActivation) {
  auto c = tiny_gpt();
  c.activation_clamp = 7;
  const std::string message = refusal<strata::models::Gpt>(c, 1);
  EXPECT_NE(message.find("gated"), std::string::npos) << message;
}
TEST(ArchitectureRefusals, ImpossibleYarnSettings) {
  auto c = tiny_yarn();
  c.yarn_beta_fast = 0.5;  // below beta_slow 1
  EXPECT_NE(refusal<strata::models::Llama>(c, 1).find("beta_slow"), std::string::npos);
  c = tiny_yarn();
  c.rope_scaling_factor = 8;  // and Llama 3.1's
  EXPECT_NE(refusal<strata::models::Llama>(c, 1).find("choose one"), std::string::npos);
  c = tiny_yarn();
  c.yarn_original_max_positions = 0;
  EXPECT_NE(refusal<strata::models::Llama>(c, 1).find("yarn_original_max_positions=0"), std::string::npos);
  c = tiny_yarn();
  c.yarn_scaling_factor = -2;
  EXPECT_NE(refusal<strata::models::Llama>(c, 1).find("yarn_scaling_factor=-2"), std::string::npos);
  c = tiny_yarn();
  c.yarn_mscale_all_dim = -10;  // 0.1 x -10 x ln 32 + 1 < 0
  EXPECT_NE(refusal<strata::models::Llama>(c, 1).find("mscale_all_dim"), std::string::npos);
}
// gpt-oss's linear biases (ModelConfig::add_bias_linear, no --disable-bias-linear): q, k, v and the
// output projection, the MLP's fc1 and fc2; sharded equals one rank, the gradients match central
// differences. With experts, the router's logits and each expert's fc1 / fc2 have biases too
// (quick GeGLU with gpt-oss's clamp and offset): central differences on one rank, and the layouts
// in tests/training/test_training_moe.cpp.
TEST(LinearBiases, LlamaBlockWithBiasesShardedEqualsUnsharded) {
  auto c = tiny_llama();
  c.add_bias_linear = true;
  strata_test::expect_model_equivalence<strata::models::Llama, double>(c);
  strata_test::expect_finite_difference_gradients<strata::models::Llama>(c);
}
TEST(LinearBiases, ExpertsAndRouterBiasesMatchCentralDifferences) {
  auto c = tiny_llama();
  c.add_bias_linear = true;
  c.activation = strata::MlpActivation::quick_geglu;
  c.activation_clamp = 0.2;
  c.glu_linear_offset = 1.0;
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.expert_ffn_hidden_size = 16;
  strata_test::expect_finite_difference_gradients<strata::models::Mixtral>(c);
  int biases = 0;
  strata::inprocess::run(1, [&](strata::inprocess::communicator& world) {
    auto ctx = strata::ParallelContext<strata::inprocess::communicator>::create(world, strata::ParallelConfig{});
    strata::models::Mixtral<strata_test::ModelPolicy<double, false>> model(ctx, c);
    model.for_each_parameter([&](auto& p) {
      if (p.name.find("router.bias") != std::string::npos || p.name.find("experts.0.fc1.bias") != std::string::npos ||
          p.name.find("experts.3.fc2.bias") != std::string::npos)
        ++biases;
    });
  });
  EXPECT_EQ(biases, 3 * c.num_layers) << "each layer's router and experts have their biases";
}
TEST(ArchitectureRefusals, NegativeKvChannels) {
  auto c = tiny_llama();
  c.kv_channels = -4;
  EXPECT_NE(refusal<strata::models::Llama>(c, 1).find("kv_channels=-4"), std::string::npos);
}

}  // namespace
}  // namespace test_architecture_options_cases
