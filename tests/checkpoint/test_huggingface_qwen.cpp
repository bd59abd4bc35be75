// Hugging Face import and export of the Llama model with Qwen2's options (add_qkv_bias:
// Qwen2ForCausalLM) and Qwen3's (qk_layernorm and a head_dim of its own: Qwen3ForCausalLM), and of
// Llama 3.1's RoPE scaling: config.json names the class and its fields; the mapping covers every
// parameter; a transformers-style forward over the exported files (q, k, v biases; an RMSNorm over
// each head of q and k before RoPE; head_dim != hidden / heads; rope_type "llama3") gives the model's
// logits in double; export-then-import is bit for bit exact at tp=1, tp=2 and tp=2 x pp=2; what the
// classes cannot express is refused. Mistral (MistralForCausalLM) is the Llama model with a sliding
// window, checked the same ways.
#include <gtest/gtest.h>

#include <random>

#include "huggingface_helpers.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_huggingface_qwen_cases {

namespace {

using namespace strata;
using strata_test::expect_error;
using strata_test::TempDirectory;

models::ModelConfig tiny_llama() {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 24;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 7;
  c.rope_base = 500.0;
  c.norm_epsilon = 1e-6;
  c.init_method_std = 0.2;
  return c;
}
models::ModelConfig tiny_qwen2() {
  auto c = tiny_llama();
  c.add_qkv_bias = true;
  return c;
}
models::ModelConfig tiny_qwen3() {
  auto c = tiny_llama();
  c.qk_layernorm = true;
  c.kv_channels = 12;  // 4 heads x 12 = 48 != hidden 32
  return c;
}
// Mistral: Llama with a sliding window on every layer; query i sees keys i-3 .. i (transformers'
// sliding_window 4), shorter than the 7 tokens of the prompt.
models::ModelConfig tiny_mistral() {
  auto c = tiny_llama();
  c.window_size = 3;
  return c;
}
models::ModelConfig tiny_llama31() {
  auto c = tiny_llama();
  c.rope_scaling_factor = 8;
  c.rope_original_max_positions = 16;  // every regime of the scaling at head dim 8 and base 500
  return c;
}

// YaRN (rope_type "yarn") on Qwen3 (gpt-oss's settings at the tiny size: factor 32, beta 32 / 1,
// truncate false, an original context of 512 positions so that the correction range, pairs 0.90 ..
// 4.25 of 6 at head dim 12 and base 500, has kept, ramped and interpolated pairs), and on a Llama
// with DeepSeek-V3-style mscale and mscale_all_dim and the rounded range (pairs 0 .. 3 of 4).
models::ModelConfig tiny_qwen3_yarn() {
  auto c = tiny_qwen3();
  c.yarn_scaling_factor = 32;
  c.yarn_original_max_positions = 512;
  c.yarn_round_to_int = false;
  return c;
}
models::ModelConfig tiny_llama_yarn_mscale() {
  auto c = tiny_llama();
  c.yarn_scaling_factor = 40;
  c.yarn_original_max_positions = 512;
  c.yarn_mscale = 0.9;
  c.yarn_mscale_all_dim = 0.5;  // an attention factor of about 1.14
  return c;
}

const std::vector<std::int32_t> kTokens = {3, 17, 36, 0, 11, 29, 5};

// The model of `config`, initialized, with the parameters init leaves constant (biases 0, norm
// weights 1) drawn at random too, so that a misplaced bias or norm weight changes the logits; the
// model's logits and values, and its files in `dir`.
template <class T>
strata_test::ModelState<T> export_random(const models::ModelConfig& config, const std::filesystem::path& dir) {
  strata_test::ModelState<T> state;
  std::mutex mutex;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Llama<strata_test::TestPolicy<T, false>> model(ctx, config);
    model.init(ctx, 2024);
    std::mt19937_64 engine(99);
    std::uniform_real_distribution<double> spread(-0.5, 0.5);
    model.for_each_parameter([&](auto& p) {
      const bool constant_at_init = p.name.find("norm") != std::string::npos || p.name.ends_with(".bias");
      if (constant_at_init)
        for (index_t i = 0; i < p.value.numel(); ++i) p.value[i] = T(double(p.value[i]) + spread(engine));
    });
    hf::save_hf_from_model(ctx, dir, model);
    strata_test::gather_values(ctx, model, state, mutex);
    state.logits = strata_test::all_logits(ctx, model, kTokens);
  });
  return state;
}

TEST(HuggingFaceQwen, ArchitectureFollowsTheRunTimeOptions) {
  EXPECT_EQ(hf::hf_architecture(hf::Architecture::llama, tiny_llama()), hf::Architecture::llama);
  EXPECT_EQ(hf::hf_architecture(hf::Architecture::llama, tiny_qwen2()), hf::Architecture::qwen2);
  EXPECT_EQ(hf::hf_architecture(hf::Architecture::llama, tiny_qwen3()), hf::Architecture::qwen3);
  EXPECT_EQ(hf::architecture_class(hf::Architecture::qwen3), "Qwen3ForCausalLM");
  auto both = tiny_qwen2();
  both.qk_layernorm = true;
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::llama, both); }, {"add_qkv_bias and qk_layernorm"});
  auto interleaved = tiny_llama();
  interleaved.rotary_interleaved = true;
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::llama, interleaved); }, {"rotary_interleaved"});
  auto geglu = tiny_llama();
  geglu.activation = MlpActivation::quick_geglu;
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::llama, geglu); }, {"activation"});
}

TEST(HuggingFaceQwen, MappingCoversEveryParameterAtTp1AndTp2) {
  for (const auto& c : {tiny_qwen2(), tiny_qwen3()})
    for (int tp : {1, 2})
      inprocess::run(tp, [&](inprocess::communicator& world) {
        auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
        models::Llama<strata_test::TestPolicy<float, false>> model(ctx, c);
        std::map<std::string, Shape> parameters, mapped;
        model.for_each_parameter([&](auto& p) { parameters.emplace(p.name, p.global_shape); });
        for (const auto& m : hf::tensor_mappings(hf::Architecture::llama, c, hf::MappingOptions{.padded_vocab = c.padded_vocab(tp)}))
          mapped.emplace(m.strata_name, m.strata_shape);
        EXPECT_EQ(mapped, parameters);
      });
}

TEST(HuggingFaceQwen, Qwen2ConfigAndBiasesAreWhereTransformersReadsThem) {
  TempDirectory dir("hf_qwen2_layout");
  const auto exported = export_random<double>(tiny_qwen2(), dir.path());
  const hf::HfConfig config = hf::read_config(dir.path());
  EXPECT_EQ(config.architecture, hf::Architecture::qwen2);
  EXPECT_TRUE(config.config.add_qkv_bias);
  EXPECT_FALSE(config.config.qk_layernorm);
  const std::string text = strata_test::read_text(dir.path() / "config.json");
  EXPECT_NE(text.find("\"Qwen2ForCausalLM\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"use_sliding_window\": false"), std::string::npos) << text;
  const SafetensorsDirectory files(dir.path());
  EXPECT_TRUE(files.has("model.layers.1.self_attn.q_proj.bias"));
  EXPECT_FALSE(files.has("model.layers.1.self_attn.o_proj.bias"));
  // k_proj.bias row g*d + j is strata's qkv bias row g*(hpg + 2)*d + hpg*d + j
  const auto k_bias = files.read_tensor<double>("model.layers.1.self_attn.k_proj.bias");
  const auto& qkv_bias = exported.values.at("layers.1.attention.qkv.bias");
  const index_t d = 8, per_group = 2;
  for (index_t g = 0; g < 2; ++g)
    for (index_t j = 0; j < d; ++j) EXPECT_EQ(k_bias[g * d + j], qkv_bias[g * (per_group + 2) * d + per_group * d + j]);
}

TEST(HuggingFaceQwen, Qwen3ConfigNamesHeadDimAndTheQkNorms) {
  TempDirectory dir("hf_qwen3_layout");
  export_random<double>(tiny_qwen3(), dir.path());
  const hf::HfConfig config = hf::read_config(dir.path());
  EXPECT_EQ(config.architecture, hf::Architecture::qwen3);
  EXPECT_TRUE(config.config.qk_layernorm);
  EXPECT_EQ(config.config.kv_channels, 12);
  const SafetensorsDirectory files(dir.path());
  EXPECT_EQ(files.read_tensor<double>("model.layers.0.self_attn.q_norm.weight").shape(), Shape{12});
  EXPECT_EQ(files.read_tensor<double>("model.layers.0.self_attn.q_proj.weight").shape(), (Shape{4 * 12, 32}));
  EXPECT_EQ(files.read_tensor<double>("model.layers.0.self_attn.o_proj.weight").shape(), (Shape{32, 4 * 12}));
  // A Qwen3 config.json without head_dim means transformers' default of 128.
  const auto path = dir.path() / "config.json";
  strata_test::write_text(path, strata_test::replaced(strata_test::read_text(path), "\"head_dim\": 12,", ""));
  EXPECT_EQ(hf::read_config(dir.path()).config.kv_channels, 128);
}

TEST(HuggingFaceQwen, ExportedFilesGiveTheModelsLogitsInAnIndependentForward) {
  for (const auto& [name, c] : std::vector<std::pair<std::string, models::ModelConfig>>{
           {"qwen2", tiny_qwen2()}, {"qwen3", tiny_qwen3()}, {"llama3.1", tiny_llama31()}, {"qwen3 yarn", tiny_qwen3_yarn()},
           {"llama yarn mscale", tiny_llama_yarn_mscale()}, {"mistral", tiny_mistral()}}) {
    TempDirectory dir("hf_reference_" + name);
    const auto exported = export_random<double>(c, dir.path());
    const hf::HfConfig config = hf::read_config(dir.path());
    const auto reference = strata_test::HfReference(dir.path(), config.architecture).logits(kTokens);
    EXPECT_LE(strata_test::logits_error(exported.logits, reference), 1e-12) << name;
  }
}

TEST(HuggingFaceQwen, RoundTripIsExactAtTp1AndTp2AndTp2Pp2) {
  for (const auto& [name, c] : std::vector<std::pair<std::string, models::ModelConfig>>{
           {"qwen2", tiny_qwen2()}, {"qwen3", tiny_qwen3()}, {"llama3.1", tiny_llama31()}, {"qwen3 yarn", tiny_qwen3_yarn()},
           {"llama yarn mscale", tiny_llama_yarn_mscale()}, {"mistral", tiny_mistral()}}) {
    TempDirectory dir("hf_round_trip_" + name);
    const auto exported = export_random<float>(c, dir.path());
    const auto tp1 = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 1);
    strata_test::expect_same_values(tp1, exported, c.vocab_size, name + " tp=1");
    EXPECT_EQ(tp1.logits, exported.logits) << name;
    const auto tp2 = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 2);
    strata_test::expect_same_values(tp2, exported, c.vocab_size, name + " tp=2");
    EXPECT_LE(strata_test::logits_error(tp2.logits, exported.logits), 1e-5) << name;
    const auto tp2_pp2 = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 2, 2);
    strata_test::expect_same_values(tp2_pp2, exported, c.vocab_size, name + " tp=2 pp=2");
  }
}

// Mistral: the Llama model with a sliding window is MistralForCausalLM, with transformers' window
// (which counts the query's own key) in config.json; the window changes the logits of this prompt,
// so the independent forward above checks it; a window on some layers only, or on Qwen, is refused;
// a file with another window, or none, is refused for the model, and one with sliding_window null
// is Llama.
TEST(HuggingFaceMistral, SlidingWindowIsMistralsAndCountsTheQuerysOwnKey) {
  EXPECT_EQ(hf::hf_architecture(hf::Architecture::llama, tiny_mistral()), hf::Architecture::mistral);
  EXPECT_EQ(hf::architecture_class(hf::Architecture::mistral), "MistralForCausalLM");
  auto some_layers = tiny_mistral();
  some_layers.window_layers = {1, 0};
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::llama, some_layers); }, {"--window-attn-skip-freq"});
  auto qwen = tiny_qwen2();
  qwen.window_size = 3;
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::llama, qwen); }, {"sliding window", "Qwen2"});

  TempDirectory dir("hf_mistral");
  const auto windowed = export_random<double>(tiny_mistral(), dir.path());
  const std::string text = strata_test::read_text(dir.path() / "config.json");
  for (const char* field : {"\"MistralForCausalLM\"", "\"model_type\": \"mistral\"", "\"sliding_window\": 4"})
    EXPECT_NE(text.find(field), std::string::npos) << field << " in " << text;
  EXPECT_EQ(text.find("use_sliding_window"), std::string::npos) << text;
  const hf::HfConfig config = hf::read_config(dir.path());
  EXPECT_EQ(config.architecture, hf::Architecture::mistral);
  EXPECT_EQ(config.config.window_size, 3);
  TempDirectory full("hf_mistral_full");
  const auto unwindowed = export_random<double>(tiny_llama(), full.path());
  EXPECT_GT(strata_test::logits_error(windowed.logits, unwindowed.logits), 1e-6) << "the window must change the logits";

  auto load = [&](const models::ModelConfig& m) {
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
      models::Llama<strata_test::TestPolicy<double, false>> model(ctx, m);
      hf::load_hf(ctx, dir.path(), model);
    });
  };
  load(tiny_mistral());
  auto other = tiny_mistral();
  other.window_size = 5;
  expect_error<ConfigError>([&] { load(other); }, {"sliding_window", "is 4", "window_size + 1=6"});
  expect_error<ConfigError>([&] { load(tiny_llama()); }, {"sliding_window", "is 4", "window_size + 1=-1"});
  const auto path = dir.path() / "config.json";
  strata_test::write_text(path, strata_test::replaced(text, "\"sliding_window\": 4", "\"sliding_window\": null"));
  load(tiny_llama());  // Mistral without a window is Llama
  strata_test::write_text(path, strata_test::replaced(text, "\"sliding_window\": 4", "\"sliding_window\": 0"));
  expect_error<ConfigError>([&] { load(tiny_mistral()); }, {"sliding_window = 0", "at least one key"});
}

// YaRN's config.json: rope_scaling {"rope_type": "yarn", ...} as transformers reads it, and back.
TEST(HuggingFaceQwen, YarnRopeScalingIsWrittenAndReadAsTransformersReadsIt) {
  TempDirectory dir("hf_yarn_config");
  export_random<double>(tiny_qwen3_yarn(), dir.path());
  const auto path = dir.path() / "config.json";
  const std::string text = strata_test::read_text(path);
  EXPECT_NE(text.find("\"rope_type\": \"yarn\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"truncate\": false"), std::string::npos) << text;
  const hf::HfConfig config = hf::read_config(dir.path());
  EXPECT_EQ(config.config.yarn_scaling_factor, 32.0);
  EXPECT_EQ(config.config.yarn_original_max_positions, 512.0);
  EXPECT_FALSE(config.config.yarn_round_to_int);
  // gpt-oss's and Qwen3's own rope_scaling blocks (no mscale: 0.1 ln(factor) + 1; absent beta and
  // truncate: 32, 1, true; a null factor: max_position_embeddings / original).
  auto read = [&](const std::string& rope_scaling) {
    std::string edited = text;
    const std::size_t at = edited.find("\"rope_scaling\"");
    const std::size_t end = edited.find('}', at);
    edited.replace(at, end + 1 - at, "\"rope_scaling\": " + rope_scaling);
    strata_test::write_text(path, edited);
    return hf::read_config(dir.path()).config;
  };
  const auto oss = read(R"({"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                           "rope_type": "yarn", "truncate": false})");
  EXPECT_EQ(oss.yarn_scaling_factor, 32.0);
  EXPECT_EQ(oss.yarn_original_max_positions, 4096.0);
  EXPECT_NEAR(rope_attention_factor(oss.rope_variant()), 0.1 * std::log(32.0) + 1, 1e-15);
  const auto qwen = read(R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2})");
  EXPECT_EQ(qwen.yarn_beta_fast, 32.0);
  EXPECT_EQ(qwen.yarn_beta_slow, 1.0);
  EXPECT_TRUE(qwen.yarn_round_to_int);
  const auto derived = read(R"({"type": "yarn", "factor": null, "original_max_position_embeddings": 2})");
  EXPECT_EQ(derived.yarn_scaling_factor, 7.0 / 2.0);  // max_position_embeddings 7 over 2
  const auto explicit_factor = read(R"({"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.5})");
  EXPECT_NEAR(rope_attention_factor(explicit_factor.rope_variant()), 1.5, 1e-14);
  expect_error<ConfigError>([&] { (void)read(R"({"rope_type": "yarn", "factor": 4.0, "partial_rotary_factor": 0.5})"); },
                            {"rope_scaling.partial_rotary_factor", "cannot be imported"});
  expect_error<ConfigError>([&] { (void)read(R"({"rope_type": "yarn", "factor": 4.0, "beta_fast": 0.5})"); },
                            {"rope_scaling.beta_fast", "beta_slow"});
  strata_test::write_text(path, text);
}

// Attention sinks have no Hugging Face class here: export refuses them by name.
TEST(HuggingFaceQwen, AttentionSinksAreRefusedOnExport) {
  auto c = tiny_llama();
  c.softmax_type = SoftmaxType::learnable;
  TempDirectory dir("hf_sinks_refused");
  expect_error<ConfigError>([&] { export_random<float>(c, dir.path()); }, {"attention sinks", "learnable"});
}

TEST(HuggingFaceQwen, ModelsWithoutTheFilesOptionsAreRefusedNamingTheDifference) {
  TempDirectory dir("hf_qwen_refused");
  export_random<float>(tiny_qwen3(), dir.path());
  auto load = [&](const models::ModelConfig& m) {
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
      models::Llama<strata_test::TestPolicy<float, false>> model(ctx, m);
      hf::load_hf(ctx, dir.path(), model);
    });
  };
  expect_error<ConfigError>([&] { load(tiny_llama()); }, {"model_type is \"qwen3\"", "is llama", "--qk-layernorm"});
  auto other_head = tiny_qwen3();
  other_head.kv_channels = 16;
  expect_error<ConfigError>([&] { load(other_head); }, {"head_dim is 12", "kv_channels=16"});
  const auto path = dir.path() / "config.json";
  const std::string original = strata_test::read_text(path);
  strata_test::write_text(path, strata_test::replaced(original, "\"use_sliding_window\": false", "\"use_sliding_window\": true"));
  expect_error<ConfigError>([&] { load(tiny_qwen3()); }, {"use_sliding_window", "not mapped"});
  strata_test::write_text(path, original);
  load(tiny_qwen3());
  // A Llama 3.1 file loads into the Llama with the same scaling only.
  TempDirectory scaled("hf_llama31_refused");
  export_random<float>(tiny_llama31(), scaled.path());
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Llama<strata_test::TestPolicy<float, false>> model(ctx, tiny_llama());
    expect_error<ConfigError>([&] { hf::load_hf(ctx, scaled.path(), model); }, {"rope_scaling.factor", "rope_scaling_factor=0"});
  });
  // A YaRN file loads into the model with the same YaRN only (factor, then each parameter).
  TempDirectory yarn("hf_yarn_refused");
  export_random<float>(tiny_llama_yarn_mscale(), yarn.path());
  auto other_mscale = tiny_llama_yarn_mscale();
  other_mscale.yarn_mscale_all_dim = 0.7;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Llama<strata_test::TestPolicy<float, false>> plain(ctx, tiny_llama());
    expect_error<ConfigError>([&] { hf::load_hf(ctx, yarn.path(), plain); }, {"rope_type yarn", "yarn_scaling_factor=0"});
    models::Llama<strata_test::TestPolicy<float, false>> other(ctx, other_mscale);
    expect_error<ConfigError>([&] { hf::load_hf(ctx, yarn.path(), other); }, {"attention factor"});
    models::Llama<strata_test::TestPolicy<float, false>> same(ctx, tiny_llama_yarn_mscale());
    hf::load_hf(ctx, yarn.path(), same);
  });
}

}  // namespace
}  // namespace test_huggingface_qwen_cases
